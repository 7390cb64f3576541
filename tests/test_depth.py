"""Evaluation whose cost does not grow with depth: unrolled layers scheduled a few at a time
and counted (the overlap schedule's periodic stretches), and CSE worked out once per class of
values read alike. The figures are the exact schedule's and the per-value CSE's."""

from __future__ import annotations

import random

import numpy as np
import pytest

import partex
from partex import get_hardware
from partex.cost import _cse, _overlap
from partex.cost._overlap import build_timeline

# compute comparable to communication at these tiny sizes: links busy, backlogs on them
SLOW = dict(peak_flops=2e9, hbm_bandwidth=1e12, link_bandwidth=2e9, link_latency=0.0)


def _plans(s, n_random=5):
    plans = {}
    for name in ("replicated", "dp", "megatron", "zero3", "zero3+remat"):
        try:
            plans[name] = list(s.strategy(name))
        except Exception:  # a strategy the model has no use for (zero3+remat without layers)
            continue
    z = plans["zero3"]
    for i in range(len(z)):
        plans[f"zero3-{i}"] = z[:i] + z[i + 1:]
    rng = random.Random(0)
    base = plans.get("zero3+remat", z)
    for j in range(n_random):
        plans[f"random{j}"] = [d for d in base if rng.random() < 0.7]
    return plans


def _figures(r):
    return r.step_time, r.comm_time, r.memory.peak, sorted((c.op, c.kind, c.hidden) for c in r.collectives)


CASES = [
    ("transformer", dict(overrides=["layers=8"], mesh="data=4,model=2")),
    ("transformer", dict(overrides=["layers=8"], mesh="data=2,model=4", slow=True)),
    ("llama", dict(mesh="data=4,model=2")),
    ("moe", dict(mesh="data=4,model=2")),
    ("gns", dict(mesh="data=4,model=2", slow=True)),
    ("unet", dict(mesh="data=8")),
    ("transformer-scan", dict(mesh="data=4,model=2")),
]


@pytest.mark.parametrize("model,kw", CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(CASES)])
def test_periodic_schedule_gives_the_exact_schedules_figures(model, kw, monkeypatch):
    kw = dict(kw)
    hw = get_hardware("tpu-v4", **SLOW) if kw.pop("slow", False) else "tpu-v4"
    s = partex.Session.from_spec(model, preset="tiny", hardware=hw, **kw)
    cm = s.cost_model
    exact = build_timeline(cm.tables, periodic=False)
    periodic = build_timeline(cm.tables)
    repeats = []
    real = _overlap._repeat
    monkeypatch.setattr(_overlap, "_repeat", lambda *a: (repeats.append(a[3]), real(*a)))
    for name, plan in _plans(s).items():
        cm._tl = exact
        want = _figures(cm.evaluate(plan, detail=True))
        cm._tl = periodic
        got = _figures(cm.evaluate(plan, detail=True))
        assert got[:3] == pytest.approx(want[:3], rel=1e-9), name
        assert [x[:2] for x in got[3]] == [x[:2] for x in want[3]], name
        assert np.allclose([x[2] for x in got[3]], [x[2] for x in want[3]], rtol=1e-9, atol=1e-15), name
    if model == "transformer":  # unrolled layers: the forward and backward passes are counted, not run
        assert periodic.periodic and sum(repeats) > 0


def _visits(layers: int, monkeypatch) -> int:
    s = partex.Session.from_spec("transformer", preset="tiny", overrides=[f"layers={layers}"], mesh="data=4,model=2",
                                 hardware="tpu-v4")
    n = [0]
    real = _overlap._visit
    monkeypatch.setattr(_overlap, "_visit", lambda *a: (n.__setitem__(0, n[0] + 1), real(*a)))
    s.cost_model.evaluate(s.strategy("zero3"))
    monkeypatch.setattr(_overlap, "_visit", real)
    return n[0]


def test_the_schedule_visits_as_many_ops_at_any_depth(monkeypatch):
    """zero3 on 6 and 24 unrolled layers: the overlap schedule visits the same number of ops
    (the layers between the first few and the last are counted), where the exact schedule
    visits four times as many."""
    assert _visits(24, monkeypatch) == _visits(6, monkeypatch)


def test_cse_of_a_class_is_its_members_cse(monkeypatch):
    """Each class's CSE worked out once and counted for its members is what working it out
    for every member gives (duplicates, the copies' lives, hoisted reshards, seconds saved)."""
    s = partex.Session.from_spec("transformer", preset="tiny", overrides=["layers=6"], mesh="data=4,model=2",
                                 hardware="tpu-v4")
    cm = s.cost_model

    def each_member(t, c, cl_of, late):
        flags = None
        if late:
            spans = [late.get(v) for v in c.values.tolist()]
            lo = np.array([x[0] if x else 0 for x in spans])[:, None]
            hi = np.array([x[1] if x else -1 for x in spans])[:, None]
            flags = (c.ops >= lo) & (c.ops <= hi)
        return _cse._merge([_cse._expand(c, [j], _cse._one(c, j, cl_of, None if flags is None or late.get(
            int(c.values[j])) is None else flags[j])) for j in range(len(c.values))])

    def reshards(decisions):
        cm._reshard_cache.clear()
        cm._cse_memo.clear()
        r = cm.evaluate(decisions, detail=True)
        return r, cm._reshard_cache[next(iter(cm._reshard_cache))] if cm._reshard_cache else None

    classes = cm._classes or _cse.read_classes(cm.tables)
    assert max(len(c.values) for c in classes.classes) >= 6  # one weight of each layer, read alike
    for name, plan in _plans(s).items():
        r1, a = reshards(plan)
        monkeypatch.setattr(_cse, "_class_result", each_member)
        r2, b = reshards(plan)
        monkeypatch.undo()
        assert r1.step_time == pytest.approx(r2.step_time, rel=1e-12) and r1.memory.peak == r2.memory.peak, name
        if a is None:
            continue
        assert a.saved == pytest.approx(b.saved, rel=1e-12)
        assert dict(a.dup) == dict(b.dup) and a.hoisted == b.hoisted
        assert sorted(zip(*(x.tolist() for x in a.buffers))) == sorted(zip(*(x.tolist() for x in b.buffers)))
        assert sorted(zip(*(x.tolist() for x in a.dup_ops))) == sorted(zip(*(x.tolist() for x in b.dup_ops)))


def test_unrolled_llama_is_the_scanned_one_layer_by_layer():
    """llama scan=false holds its layers in a list and runs them in a Python loop: the same
    loss as the scanned model on the same weights, one recompute unit of all its layers, and
    the same decision groups (an intermediate-only one named by another op)."""
    import jax
    import jax.numpy as jnp

    from partex import demo_models

    scanned = demo_models.build("llama", "tiny", {"layers": "3"})
    unrolled = demo_models.build("llama", "tiny", {"layers": "3", "scan": "false"})
    params, _, batch = scanned.args
    layers = [jax.tree.map(lambda w, i=i: w[i], params["layers"]) for i in range(3)]
    as_list = {**params, "layers": layers}
    loss = demo_models.MODELS["llama"].loss
    a = loss(scanned.config, params, batch)
    b = loss(unrolled.config, as_list, batch)
    assert jnp.allclose(a, b, rtol=1e-5), (a, b)
    s = partex.Session.from_spec("llama", preset="tiny", overrides=["layers=3", "scan=false"], mesh="data=4,model=2",
                                 hardware="tpu-v4")
    assert [u.layers for u in s.analysis.units] == [3]
    scan = partex.Session.from_spec("llama", preset="tiny", overrides=["layers=3"], mesh="data=4,model=2",
                                    hardware="tpu-v4")
    def named(sess):  # the groups the parameters and the batch name (not intermediate-only ones)
        return sorted(g.label for g in sess.groups if "[" not in g.label)

    assert named(s) == named(scan) and len(s.groups) == len(scan.groups)
