"""The checks every library model goes through, shared by the
``tests/test_lib_*.py`` files and ``scripts/library_table.py``.

A library model module (``scripts/libmodels/<lib>.py``) gives ``make(layers=2, size="tiny")``
returning ``(fn, args)`` or ``(fn, args, axis_names)``: the library's own modules at a tiny
config with random init (``size="full"``: the real size as ShapeDtypeStructs).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

import partex

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBMODELS = os.path.join(ROOT, "scripts", "libmodels")
FORMS = os.path.join(ROOT, "scripts", "forms")
MESH = "data=4,model=2"


def _module(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses in it look their module up
    spec.loader.exec_module(module)
    return module


def load(lib: str):
    """scripts/libmodels/<lib>.py as a module."""
    return _module(f"partex_libmodel_{lib}", os.path.join(LIBMODELS, f"{lib}.py"))


def load_form(form: str):
    """scripts/forms/<form>.py as a module."""
    return _module(f"partex_form_{form}", os.path.join(FORMS, f"{form}.py"))


def unpack(made) -> tuple[Any, tuple, Any]:
    fn, args, *rest = made
    return fn, tuple(args), (rest[0] if rest else None)


def session(made, *, mesh: str = MESH, memory=None, hardware: str = "tpu-v4", seed: int = 0) -> partex.Session:
    fn, args, names = unpack(made)
    return partex.Session(fn, args, mesh=mesh, hardware=hardware, memory=memory, seed=seed, axis_names=names)


def decision_groups(made) -> int:
    fn, args, names = unpack(made)
    return len(partex.analyze(fn, *args, axis_names=names).analysis.decision_groups)


def sharded_groups(s: partex.Session, strategy: str) -> dict[str, str]:
    """{group label: mesh axis} of the groups a hand strategy shards, with those the step's
    own sharding constraints fix (kept: they are part of every plan)."""
    fixed = {f["group"]: f["axis"] for f in s.fixed if f["axis"]}
    shards = [d for d in s.strategy(strategy) if isinstance(d, partex.Shard)]
    return {**fixed, **{s.group(d.group).label: d.axis for d in shards if s.group(d.group).label not in fixed}}


def replicated_bytes(s: partex.Session) -> float:
    """Per-device memory of the plan that shards nothing (the step's own sharding
    constraints replaced too)."""
    if s.user_shardings == "keep" and s.fixed:
        s = partex.Session.from_analysis(s.model, mesh=s.mesh, hardware=s.hardware, user_shardings="replace")
    return s.evaluate([]).memory.peak


# --------------------------------------------------------------------------- the checks

def check_depth_independent(mod, depths=(2, 4)) -> list[int]:
    """Decision groups do not grow with depth: the layers are found as one stack."""
    counts = [decision_groups(mod.make(layers=n)) for n in depths]
    assert len(set(counts)) == 1, f"decision groups by depth {dict(zip(depths, counts))}"
    return counts


def check_hand_plans(mod) -> dict[str, dict[str, str]]:
    """dp shards the batch over `data`; megatron also shards weights over `model` (found by
    structure, with or without axis names); zero3 shards the state over `data`."""
    s = session(mod.make())
    plans = {name: sharded_groups(s, name) for name in ("dp", "megatron", "zero3")}
    assert "data" in plans["dp"].values(), plans["dp"]
    assert "model" in plans["megatron"].values(), plans["megatron"]
    if not any(f["axis"] == "model" for f in s.fixed):  # else the user's own constraints are the Megatron part
        assert plans["megatron"] != plans["dp"]
    assert len(plans["zero3"]) > len(plans["dp"]), plans["zero3"]
    for name in plans:
        assert s.evaluate(s.strategy(name)).memory.peak < replicated_bytes(s)
    return plans


def check_search_fits(mod, fraction: float = 0.5, simulations: int = 300, **make_kwargs) -> dict:
    """A search under a budget that forces sharding (``fraction`` of the replicated plan's
    memory) returns a plan that fits per the cost model and per XLA, and runs sharded with
    the same numerics as unsharded."""
    made = mod.make(**make_kwargs)
    budget = fraction * replicated_bytes(session(made))
    s = session(made, memory=budget)
    s.step(simulations)
    assert s.best_plan() is not None, (f"no plan under {partex.format_bytes(budget)} "
                                       f"(smallest {partex.format_bytes(s.smallest_memory)})")
    # the search's best checked by XLA (compile-only; a plan XLA puts over is marked and the
    # next best taken): partex's promise that a plan it returns fits
    s.verified_best()
    plan = s.best_plan()
    assert plan.decisions or any(f["axis"] for f in plan.fixed), "the searched plan shards nothing"
    out = s.verify(plan, run=True, mark=False)
    assert out.fits, (f"XLA puts the searched plan at {partex.format_bytes(out.memory.xla)} over the "
                         f"{partex.format_bytes(budget)} budget (predicted {partex.format_bytes(out.memory.predicted)})")
    assert out.numerics.ok, out.numerics
    return out
