"""``partex.Session``: one analysed model on one mesh and hardware, with its baselines, its
search, its pins, its plans and XLA's checks of them.

The CLI and the explorer are two thin faces on this object, and a training script or a
notebook uses it directly::

    s = partex.Session(train_step, (params, opt_state, batch), mesh="data=4,model=2",
                       hardware="tpu-v4", memory="16GiB")
    s.pin("heads", "model")
    s.run(30)                      # or s.step(200), as often as you like
    plan = s.best_plan()
    s.verify(plan)                 # XLA's figures beside the prediction
    s.save("my.session.json")      # partex.Session.load(...) resumes it; so does
                                   # `partex search --resume` and the explorer

A session file is one JSON document (format ``partex-session``: ``_sessionfile``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from typing import Any, Callable, Mapping, Sequence, overload

from ._decisions import Decision
from ._bench import bench
from ._errors import PartexError
from ._loader import LoadedModel, ModelAnalysis, analyze_loaded, analyze_model
from ._mesh import Hardware, MeshSpec, format_bytes, get_hardware, parse_bytes
from ._meshes import ProgramSearch, StackShape, mesh_search, pipelines_over
from .analysis._pipeline import pipeline_stacks, pipeline_units
from .plan._pipelined import Pipeline, pipelined, trace_mesh
from ._results import BenchRow, Measured, SearchStats, VerifyReport
from ._sessionfile import ModelSpec, model_spec, read_session, session_json, session_parts, write_session
from .analysis._analysis import Group
from .analysis._space import GroupRef
from .cost import CostModel, CostReport
from .plan._plan import Plan
from .plan._planned import fixed_json, resolve_decisions
from .plan._planning import make_plan
from .plan._specs import check_signature, signature_of
from .plan._measure import measure, measure_loaded
from .plan._verify import verify, verify_loaded, verify_many
from .planner._exhaustive import ExhaustiveResult, exhaustive, exhaustive_limits, space_size
from .planner._ilp import solve_ilp
from .planner._pins import Pins
from .planner._search import Restored, Search, SearchResult, check_mesh_axes, search_inputs
from .planner._strategies import baseline_names, strategy_decisions

DEFAULT_HARDWARE = "tpu-v4"


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A plan candidate scored by the cost model: a baseline, the search's best, an upload."""

    name: str
    decisions: tuple[Decision, ...]
    report: CostReport  # detailed (collectives listed)


STEP_MESH = "step"  # mesh= the mesh the step's own shardings name
KEEP: Any = object()  # reconfigure(pipeline=KEEP): the session's pipeline as it is


def as_mesh(mesh: str | MeshSpec | Mapping[str, int], model=None) -> MeshSpec:
    """'data=4,model=2', {'data': 4, 'model': 2} or a MeshSpec -> MeshSpec; ``"step"``: the mesh
    the step's own shardings name (its explicit-mode types, its shard_map regions, its
    sharding constraints), with its axis names, given ``model`` (a ModelAnalysis)."""
    if isinstance(mesh, MeshSpec):
        return mesh
    if mesh == STEP_MESH:
        named = {us.mesh for us in model.analysis.user_shardings if us.mesh} if model is not None else set()
        if not named:
            raise PartexError("mesh='step': the step names no mesh of its own (no explicit-mode shardings, "
                              "shard_map regions or sharding constraints): give one, e.g. mesh='data=4,model=2'")
        if len(named) > 1:
            raise PartexError("mesh='step': the step's own shardings name several meshes ("
                              + "; ".join(",".join(f"{a}={n}" for a, n in m) for m in sorted(named))
                              + "): give the plan's mesh")
        (axes,) = named
        return MeshSpec.create(tuple(a for a, _ in axes), tuple(n for _, n in axes))
    if isinstance(mesh, str):
        return MeshSpec.parse(mesh)
    if isinstance(mesh, Mapping):
        return MeshSpec.create(tuple(mesh), tuple(int(n) for n in mesh.values()))
    raise PartexError(f"mesh must be text like 'data=4,model=2', a dict of axis sizes or a MeshSpec, "
                      f"got {type(mesh).__name__}")


DEFAULT_MARGIN = 0.1  # see Hardware.memory_margin and the README ("The memory promise")


def as_hardware(hardware: str | Hardware | None, memory: str | float | None = None,
                margin: float | None = None) -> Hardware:
    """A preset name ('tpu-v4') or a Hardware, with an optional per-device budget ('16GiB')
    and memory margin (a preset name gets DEFAULT_MARGIN unless one is given)."""
    if hardware is None:
        hardware = DEFAULT_HARDWARE
    hw = get_hardware(hardware) if isinstance(hardware, str) else hardware
    if not isinstance(hw, Hardware):
        raise PartexError(f"hardware must be a preset name or a Hardware, got {type(hardware).__name__}")
    if memory is not None and memory != "":
        hw = hw.replace(memory_budget=parse_bytes(memory))
    if margin is not None:
        hw = hw.replace(memory_margin=float(margin))
    elif isinstance(hardware, str):
        hw = hw.replace(memory_margin=DEFAULT_MARGIN)
    return hw


def _pipelined(model: ModelAnalysis, pipeline: str | Pipeline | None, mesh: MeshSpec) -> ModelAnalysis:
    """``model`` with ``pipeline`` applied (``plan._pipelined.pipelined``); as it is for None."""
    if pipeline is None or pipeline == "":
        return model
    if model.pipeline is not None:
        model = model.base
    return pipelined(model, pipeline if isinstance(pipeline, Pipeline) else Pipeline.parse(pipeline), mesh)


def _scan_stacks(model: ModelAnalysis) -> list:
    """Per scan stack of ``model``: (its unit, a ``PipelineStack`` or why it cannot be pipelined)."""
    an = model.analysis
    units = pipeline_units(an)
    stacks = pipeline_stacks(an, units, an.roles.batch_groups)
    return [(u, stacks[u.id]) for u in units if u.id in stacks]


def _stacks(model: ModelAnalysis) -> dict:
    """Per scan stack of ``model`` (its label), a ``PipelineStack`` or why it cannot be pipelined."""
    return {u.label: st for u, st in _scan_stacks(model)}


def _stack_sizes(model: ModelAnalysis) -> list[StackShape]:
    """Each scanned stack of ``model`` that may be pipelined (a stage may recompute it unless
    the step's own checkpoint does already)."""
    return [StackShape(u.label, st.layers, st.batch, bool(u.kinds)) for u, st in _scan_stacks(model)
            if not isinstance(st, str)]


def analyze_spec(spec: ModelSpec) -> ModelAnalysis:
    return analyze_model(spec.spec, spec.preset, list(spec.overrides))


class Session:
    """One model (a function and example args, or a MODEL spec) on one mesh and hardware:
    its analysis, baselines, search, pins, plans and XLA checks. It owns the cost model, the
    decision space and the pins; the search (``planner.Search``) runs on them. (The public
    API's one object: its length is its many short methods, each handing on to a stage.)

    mesh: 'data=4,model=2' (optionally ``name=size@GB/s``), a dict or a MeshSpec.
    hardware: a preset (tpu-v4, tpu-v5e, tpu-v5p, tpu-v6e, a100-40gb, h100-80gb, cpu) or a Hardware.
    memory: per-device budget ('16GiB', bytes); default: the hardware's HBM.
    seed: the search's RNG seed: the same seed and simulations give the same plan.
    axis_names: optional logical axis names mirroring ``args`` (labels only).
    user_shardings: "keep" (default): the step's own sharding constraints (with_sharding_
      constraint, flax's logical constraints, reshard, a called jit's shardings) are fixed
      decisions, as XLA honours them, shown as the user's own pins (``fixed``); "replace":
      the plan places those values too, and apply re-places the constraints.
    warm_start: score the hand strategies first, as PartIR composes tactics with search.
    """

    def __init__(self, fn: Callable, args: Sequence[Any], *, mesh, hardware: str | Hardware = DEFAULT_HARDWARE,
                 memory: str | float | None = None, seed: int = 0, axis_names=None, warm_start: bool = True,
                 name: str | None = None, user_shardings: str = "keep", pipeline: str | Pipeline | None = None):
        if not callable(fn):
            raise PartexError(f"Session needs a callable training step, got {type(fn).__name__}")
        if not isinstance(args, (tuple, list)):
            raise PartexError("Session(fn, args, ...): args must be a tuple of fn's example arguments")
        model = LoadedModel(name or getattr(fn, "__name__", "fn"), fn, tuple(args), axis_names, "custom", None)
        analysed = analyze_loaded(model)
        spec_mesh = as_mesh(mesh, analysed)
        self._setup(_pipelined(analysed, pipeline, spec_mesh), None, spec_mesh, as_hardware(hardware, memory), seed,
                    warm_start, user_shardings=user_shardings)

    @classmethod
    def from_spec(cls, spec: str, *, preset: str = "tiny", overrides: Sequence[str] | Mapping | None = None,
                  mesh, hardware: str | Hardware = DEFAULT_HARDWARE, memory: str | float | None = None,
                  seed: int = 0, warm_start: bool = True, user_shardings: str = "keep",
                  pipeline: str | Pipeline | None = None) -> "Session":
        """A session on a MODEL spec: a demo name (``transformer``) or ``module:attr`` /
        ``path/file.py:attr`` naming a callable that returns ``(fn, example_args)``."""
        ms = model_spec(spec, preset, overrides)
        return cls.from_analysis(analyze_spec(ms), mesh=mesh, hardware=hardware, memory=memory, seed=seed,
                                 warm_start=warm_start, spec=ms, user_shardings=user_shardings, pipeline=pipeline)

    @classmethod
    def from_analysis(cls, model, *, mesh, hardware: str | Hardware = DEFAULT_HARDWARE,
                      memory: str | float | None = None, seed: int = 0, warm_start: bool = True,
                      spec: ModelSpec | None = None, user_shardings: str = "keep",
                      pipeline: str | Pipeline | None = None) -> "Session":
        """A session on an already analysed model (a ModelAnalysis, e.g. from ``partex.analyze``);
        ``pipeline`` (``Pipeline`` or ``STACK:AXIS:MICROBATCHES``): one of its layer stacks
        run as a pipeline over a mesh axis (``partex.Pipeline``)."""
        self = cls.__new__(cls)
        spec_mesh = as_mesh(mesh, model)
        model = _pipelined(model, pipeline, spec_mesh)
        self._setup(model, spec, spec_mesh, as_hardware(hardware, memory), seed, warm_start,
                    user_shardings=user_shardings)
        return self

    def _setup(self, model, spec: ModelSpec | None, mesh: MeshSpec, hw: Hardware, seed: int, warm_start: bool,
               restored: Restored | None = None,
               user_shardings: str = "keep") -> None:
        # the search first: a mesh or budget it refuses leaves the session as it was
        if restored is None:
            cm, space = search_inputs(model, mesh, hw, user_shardings=user_shardings)
            check_mesh_axes(space)
            search, pins = Search(cm, space, seed=int(seed), warm_start=bool(warm_start)), Pins()
        else:
            cm, space, search, pins = restored
            check_mesh_axes(space)
        self.model = model  # ModelAnalysis: .model (LoadedModel), .program, .analysis
        self.spec = spec
        self.mesh = mesh
        self.hardware = hw
        self.seed = int(seed)
        self.warm_start = bool(warm_start)
        self._cost_model = cm
        self._space = space  # the decisions of this model on this mesh, and what names them
        self._pins = pins
        self._search = search
        self._baselines: dict[str, Candidate] | None = None

    # ------------------------------------------------------------------ the analysis
    @property
    def analysis(self):
        return self.model.analysis

    @property
    def program(self):
        return self.model.program

    @property
    def pipeline(self) -> Pipeline | None:
        """The layer stack the session's step runs as a pipeline (None: the step as written)."""
        return self.model.pipeline

    @property
    def signature(self) -> dict:
        """The paths, shapes and dtypes of the inputs and outputs (a plan's ``signature``)."""
        return signature_of(self.program)

    @property
    def groups(self) -> list[Group]:
        """The decision groups (named dimensions with one role, one decision each)."""
        return self.analysis.decision_groups

    @property
    def units(self):
        """The layer stacks of the forward pass a recompute decision can cover."""
        return self.analysis.units

    def pipeline_stacks(self) -> dict:
        """Per layer stack of the step as written (its label: ``stack0``), a
        ``PipelineStack`` (its layers, batch and loops) where it may run as a pipeline, else
        the one-line reason it may not."""
        return _stacks(self.model.base if self.model.pipeline is not None else self.model)

    @property
    def conflicts(self):
        return self.analysis.conflicts

    @property
    def user_shardings(self) -> str:
        """"keep" or "replace" (see the class docstring)."""
        return self.cost_model.user_shardings

    @property
    def fixed(self) -> list[dict]:
        """The user's own pins: what the step's sharding constraints fix on this mesh
        ({group, axis (None: unsharded), source, kind}); under "replace" only a shard_map
        region's specs (its body is written for them)."""
        return list(fixed_json(self.cost_model))

    @property
    def cost_model(self) -> CostModel:
        return self._cost_model

    @property
    def donate(self) -> tuple[int, ...]:
        return self._cost_model.donate

    @property
    def title(self) -> str:
        return self.spec.title if self.spec else f"{self.model.model.name} (custom)"

    def group(self, ref: GroupRef) -> Group:
        """A group by id, label, or anchor ``input/path:dim`` (an input leaf and dim in it)."""
        return self._space.group(ref)

    def label(self, decision: Decision) -> str:
        return self.analysis.decision_label(decision)

    def decisions(self, items: Sequence[Decision | tuple[GroupRef, str]]) -> list[Decision]:
        """Decisions from what a user writes: [(group id / label / anchor, slot)], the slot
        a mesh axis, ``resolve:<resolution>`` or ``recompute:<kind>`` (its group a layer
        stack's id or label); a ``Decision`` passes as it is."""
        return self._space.decisions(items)

    # ------------------------------------------------------------------ plans and baselines
    def evaluate(self, decisions: Sequence[Decision | tuple[GroupRef, str]], detail: bool = True) -> CostReport:
        """The cost model's figures for these decisions (step time, memory, collectives)."""
        return self.cost_model.evaluate(self.decisions(decisions), detail=detail)

    def strategy(self, name: str) -> list[Decision]:
        """A hand strategy's decisions: replicated, dp, megatron, zero3, expert (MoE)."""
        return strategy_decisions(name, self.analysis, self.mesh, self.cost_model.fixed)

    def plan(self, decisions: Sequence[Decision | tuple[GroupRef, str]] | None = None, *, strategy: str | None = None,
             pinned: Sequence[Decision] = ()) -> Plan:
        """A Plan from decisions, or from a hand strategy (``plan(strategy="megatron")``)."""
        if decisions is None:
            if strategy is None:
                raise PartexError("give decisions or a strategy name")
            decisions = self.strategy(strategy)
        dec = self.decisions(decisions)
        plan = make_plan(self.model, self.mesh, self.hardware, dec, strategy=strategy, pinned=pinned,
                         donate=self.donate, cost_model=self.cost_model)
        if self.spec is not None:
            plan = dataclasses.replace(plan, model=self.spec.to_json())
        return plan

    def baselines(self) -> dict[str, Candidate]:
        """The hand strategies scored on this cost model (replicated, dp, megatron, zero3,
        and expert for a mixture of experts)."""
        if self._baselines is None:
            self._baselines = {name: Candidate(name, tuple(dec), self.cost_model.evaluate(dec, detail=True))
                               for name in baseline_names(self.analysis) for dec in [self.strategy(name)]}
        return dict(self._baselines)

    def scored(self, plan: Plan, name: str = "uploaded") -> Candidate:
        """A plan (e.g. uploaded) for this model, scored on its own mesh and hardware."""
        check_signature(plan, self.program)
        decisions = resolve_decisions(plan, self.analysis)
        cm = CostModel(self.analysis, plan.mesh, plan.hardware, donate=plan.donate,
                       user_shardings=plan.user_shardings)
        return Candidate(name, tuple(decisions), cm.evaluate(decisions, detail=True))

    # ------------------------------------------------------------------ the search
    def step(self, n: int = 1) -> "Session":
        """Run n simulations of the search."""
        self._search.step(int(n), self._pins)
        return self

    def run(self, seconds: float, callback: Callable[["Session"], None] | None = None) -> "Session":
        """Search for about ``seconds``; ``callback(session)`` after each chunk. Returns
        early when ``request_stop`` is called (e.g. from a signal handler)."""
        self._search.stop_requested = False
        self._search.run(seconds, self._pins, callback=None if callback is None else (lambda _s: callback(self)))
        return self

    def request_stop(self) -> None:
        """Ask a running ``run`` to return after the simulation in hand (signal-safe)."""
        self._search.request_stop()

    @property
    def stop_requested(self) -> bool:
        return self._search.stop_requested

    def stats(self) -> SearchStats:
        """Simulations, nodes, depth, speed, best step time over time, root actions."""
        return self._search.stats(self._pins)

    def best(self) -> SearchResult | None:
        """The fastest plan found that fits (None until one does)."""
        return self._search.best()

    def best_plan(self) -> Plan | None:
        b = self.best()
        if b is None:
            return None
        return self.plan(list(b.decisions), strategy="mcts", pinned=self._pins.pinned)

    @property
    def smallest_memory(self) -> float:
        """The smallest predicted peak memory met so far (when nothing fits)."""
        return self._search.smallest_memory[0]

    # ------------------------------------------------------------------ pins
    @property
    def pins(self) -> list[Decision]:
        return list(self._pins.pinned)

    @property
    def forbidden(self) -> list[Decision]:
        return sorted(self._pins.forbidden)

    def pin(self, group: GroupRef, axis: str) -> Decision:
        """Fix a decision: the search keeps it, first, and never undoes it. ``axis`` is a mesh
        axis, or ``recompute:<kind>`` (regather, dots, full) with ``group`` a layer stack
        (``Session.units``)."""
        return self._change("pin", self._ref(group, axis))

    def forbid(self, group: GroupRef, axis: str) -> Decision:
        """Never take this decision."""
        return self._change("forbid", self._ref(group, axis))

    def unpin(self, group: GroupRef, axis: str) -> Decision:
        """Remove a pin or a forbid."""
        return self._change("unpin", self._ref(group, axis))

    def _ref(self, group: GroupRef, axis: str) -> Decision:
        """The decision a pin, forbid or unpin names (``decisions``)."""
        return self._space.decision(group, axis)

    def _change(self, how: str, d: Decision) -> Decision:
        """Pin, forbid or unpin ``d``; the search's best then honours the new pins."""
        if how != "unpin":
            self._space.check_takeable(d)
        pins = getattr(self._pins, how)(d, self.label)
        if pins != self._pins:
            self._pins = pins
            self._search.rebest(pins)
        return d

    def mark_infeasible(self, decisions: Sequence[Decision], measured_bytes: float) -> None:
        """XLA measured this plan over the budget: it no longer counts as fitting, and the
        best plan becomes the next best that fits."""
        self._search.mark_infeasible(list(decisions), float(measured_bytes), self._pins)

    # ------------------------------------------------------------------ XLA's check
    def verify(self, plan: Plan | None = None, *, run: bool = False, constrain: bool = True,
               mark: bool = True, timeout: float = 1800, explain: bool = False) -> VerifyReport:
        """Compile ``plan`` (default: the best plan) with XLA and compare with the prediction:
        per-device memory, argument bytes and collective bytes by kind (a ``VerifyReport``;
        ``verify --json`` prints its ``to_json()``). With ``run``, also run it (real example arrays) and compare the outputs with
        the unsharded function. A MODEL-spec session compiles in a fresh process on
        simulated CPU devices; a function session compiles here, on this process's devices.
        With ``mark`` (default), a plan XLA puts over the budget is marked infeasible and
        the search's best moves to the next plan that fits (``out.marked_infeasible``).
        With ``explain``, ``out.explain``: XLA's collectives by source line, matched to
        the predicted ones (``matched_fraction``: the share of XLA's bytes matched)."""
        if plan is None:
            plan = self.best_plan()
            if plan is None:
                raise PartexError("nothing to verify: the search has found no plan that fits yet")
        out = verify_plan(plan, spec=self.spec, model=self.model.model, run=run, constrain=constrain,
                          timeout=timeout, explain=explain)
        marked = mark and not out.fits
        if marked:
            self.mark_infeasible(resolve_decisions(plan, self.analysis), out.xla_memory.get("device", out.memory.xla))
        return out.replace(marked_infeasible=marked)

    def top_plans(self, k: int = 3) -> list[Plan]:
        """The ``k`` fastest distinct plans that fit that the search has scored, by prediction,
        fastest first (plans the cost model cannot tell apart count once)."""
        if k < 1:
            raise PartexError(f"top_plans needs k >= 1, got {k}")
        return [self.plan(list(d), strategy="mcts" if i == 0 else f"mcts#{i + 1}", pinned=self._pins.pinned)
                for i, d in enumerate(self._search.top(k, self._pins))]

    def measure(self, plans: Sequence[Plan] | None = None, *, steps: int = 5, warmup: int = 2,
                labels: Sequence[str] | None = None, timeout: float = 1800) -> list[Measured]:
        """Run plans (default: the best plan) on the local devices for ``warmup`` + ``steps``
        steps and return each one's measured step time (median) and peak device memory
        beside its prediction (``Measured``). A MODEL-spec session runs each plan in a fresh
        process (its peak its own: on a GPU or TPU the devices JAX finds, on the CPU as many
        simulated devices as the mesh has); a function session runs them here, on this
        process's devices. A plan that does not fit the device comes back with ``error``."""
        if plans is None:
            best = self.best_plan()
            if best is None:
                raise PartexError("nothing to measure: the search has found no plan that fits yet")
            plans = [best]
        plans = list(plans)
        labels = list(labels) if labels is not None else [p.strategy or f"plan {i + 1}" for i, p in enumerate(plans)]
        if self.spec is not None:
            return measure(self.spec.spec, plans, preset=self.spec.preset, overrides=list(self.spec.overrides),
                           steps=steps, warmup=warmup, labels=labels, timeout=timeout)
        return [measure_loaded(self.model.model, p, steps=steps, warmup=warmup, label=lab)
                for p, lab in zip(plans, labels)]

    def measure_top(self, k: int = 3, *, steps: int = 5, warmup: int = 2, timeout: float = 1800
                    ) -> list[tuple[Plan, Measured]]:
        """Measure the ``k`` best distinct plans the search found (``top_plans``) and return
        them fastest measured first (those that did not run last). A plan that ran out of
        device memory is marked infeasible, as a plan XLA puts over the budget is."""
        plans = self.top_plans(k)
        if not plans:
            raise PartexError("nothing to measure: the search has found no plan that fits yet")
        rows = list(zip(plans, self.measure(plans, steps=steps, warmup=warmup, timeout=timeout)))
        for plan, m in rows:
            if m.error is not None:
                self.mark_infeasible(resolve_decisions(plan, self.analysis),
                                     max(m.peak_bytes or 0.0, m.xla_bytes or 0.0, self.hardware.budget * 1.01))
        return sorted(rows, key=lambda r: (r[1].step_time is None, r[1].step_time or 0.0))

    def verify_all(self, plans: Sequence[Plan], *, timeout: float = 1800) -> list[VerifyReport]:
        """Compile several plans with XLA (compile-only; a MODEL-spec session in one fresh
        process) and return ``verify``'s report for each. Marks nothing."""
        if self.spec is None:
            return [self.verify(p, mark=False, timeout=timeout) for p in plans]
        return verify_specs(plans, self.spec, timeout)

    def verified_best(self, tries: int = 5, on_reject: Callable[[SearchResult, VerifyReport], None] | None = None
                      ) -> tuple[SearchResult, VerifyReport]:
        """The best plan checked by XLA: while XLA puts it over the budget, it is marked
        infeasible and the next best is checked (up to ``tries`` plans)."""
        for _ in range(tries):
            best = self.best()
            if best is None:
                break
            out = self.verify(self.plan(list(best.decisions), strategy="mcts", pinned=self._pins.pinned))
            if not out.marked_infeasible:
                return best, out
            if on_reject is not None:
                on_reject(best, out)
        raise PartexError(f"no plan checked by XLA fits the {format_bytes(self.hardware.budget)} budget after "
                          f"{tries} tries; search longer, raise the memory budget or use a larger mesh")

    # ------------------------------------------------------------------ configuration
    def reconfigure(self, *, mesh=None, hardware: str | Hardware | None = None,
                    memory: str | float | None = None, seed: int | None = None,
                    pipeline: Any = KEEP) -> list[str]:
        """Another mesh, hardware or budget (or ``pipeline``: another, or None for the step
        as written): a new cost model and a new search (statistics from the old cost model
        would mislead it), keeping the pins and forbids that still apply. Returns a note per
        pin or forbid dropped (its axis left the mesh, or no longer divides its dimension)."""
        new_mesh = self.mesh if mesh is None else as_mesh(mesh, self.model)
        hw = self.hardware if hardware is None else as_hardware(hardware)
        if memory is not None:
            hw = as_hardware(hw, memory)
        new_seed = self.seed if seed is None else int(seed)
        new_pipe = self.pipeline if pipeline is KEEP else (Pipeline.parse(pipeline) if isinstance(pipeline, str) else pipeline)
        if (new_mesh, hw, new_seed, new_pipe) == (self.mesh, self.hardware, self.seed, self.pipeline):
            return []
        pins, forbidden = self.pins, self.forbidden
        model = self.model
        base = model.base if model.pipeline is not None else model
        if new_pipe != model.pipeline or (new_pipe is not None and new_mesh != self.mesh):
            # the stages follow the mesh's axis
            model = pipelined(base, new_pipe, new_mesh) if new_pipe is not None else base
        self._setup(model, self.spec, new_mesh, hw, new_seed, self.warm_start,
                    user_shardings=self.user_shardings)
        return self.apply_pins(pins, forbidden)

    def apply_pins(self, pins: Sequence[Decision | tuple[GroupRef, str]] = (),
                   forbidden: Sequence[Decision | tuple[GroupRef, str]] = ()) -> list[str]:
        """Pin and forbid what still applies: decisions of this model (another session's,
        on another mesh, say) or what a user names; a note for each that does not apply (its
        group or axis is gone, or the axis does not divide the group)."""
        notes = []
        for how, items in (("pin", pins), ("forbid", forbidden)):
            for item in items:
                try:
                    d = self._space.adopt(item) if isinstance(item, Decision) else self._ref(*item)
                    self._change(how, d)
                except PartexError as e:
                    what = self.label(item) if isinstance(item, Decision) else \
                        f"{self.group(item[0]).label if isinstance(item[0], int) else item[0]}->{item[1]}"
                    notes.append(f"{how} {what} dropped: {e}")
        return notes

    def search_meshes(self, devices: int, *, topology=None, seconds: float = 60.0, max_axes: int = 4,
                      callback=None, pipelines: bool | None = None):
        """The mesh as a decision: every factorisation of ``devices`` into up to
        ``max_axes`` axes (``topology``: 'SLICESxDEVICES[@GB/s]', one axis across the slow
        network) searched with the plan by successive halving within ``seconds``, on this
        session's model (as written: a pipeline is one of the candidates), hardware and
        budget (``partex._meshes``). ``pipelines``: None tries the model's scanned stacks as
        pipelines over the slices of a topology of several, True within a slice too, False
        never. Returns a ``MeshSearch``: the candidates tried, best first; ``use_mesh``
        takes one."""
        base = self.model.base if self.model.pipeline is not None else self.model
        return search_meshes(base, devices, topology=topology, hardware=self.hardware, seconds=seconds,
                             max_axes=max_axes, seed=self.seed, warm_start=self.warm_start, spec=self.spec,
                             user_shardings=self.user_shardings, callback=callback, pipelines=pipelines)

    def search_pipelines(self, seconds: float | None = 60.0, *, simulations: int | None = None,
                         callback=None) -> ProgramSearch:
        """The pipeline as a decision on this session's mesh: the step as written and every
        pipeline of its scanned stacks over an axis of the mesh (``partex._meshes.pipelines_over``:
        microbatches 2S and 4S, each stage saving or recomputing), one search tree each below
        one root, UCT there giving the simulations to the programs that pay
        (``ProgramSearch``); this session's own search is its program's tree, and the others
        keep its pins (a program where one cannot hold is not tried: its row says why). Runs
        ``simulations`` simulations if given (reproducible), else ``seconds`` (None: none, the
        programs built and their hand plans scored); returns the
        ``ProgramSearch`` (``step``/``run`` go on; ``result()``: the programs best first;
        ``use_mesh`` continues on one, this session then holding that program's tree: go on
        with the session from there, as after ``search_meshes``)."""
        base = self.model.base if self.model.pipeline is not None else self.model
        hw = self.hardware

        def make(mesh: MeshSpec, pipeline: Pipeline | None) -> "Session":
            if pipeline == self.pipeline:
                return self
            other = Session.from_analysis(base, mesh=mesh, hardware=hw, seed=self.seed, warm_start=self.warm_start,
                                          spec=self.spec, user_shardings=self.user_shardings, pipeline=pipeline)
            notes = other.apply_pins(self._portable(self.pins, other), self._portable(self.forbidden, other))
            if notes:  # a program the user's pins rule out (a pin on the axis its stages take) is not tried
                raise PartexError(f"pipeline {pipeline.text() if pipeline else 'none'}: {notes[0]}")
            return other

        programs = [None, *pipelines_over(self.mesh, _stack_sizes(base))]
        if self.pipeline is not None and self.pipeline not in programs:
            programs.append(self.pipeline)
        found = ProgramSearch(make, [(self.mesh, p) for p in programs])
        if simulations is not None:
            found.step(simulations)
        elif seconds:
            found.run(seconds, callback=callback)
        return found

    def _portable(self, decisions: Sequence[Decision], other: "Session") -> list:
        """This session's decisions as ``other`` takes them: as they are on the same program
        (another mesh), else by what they decide about and their slot (``ffn``, ``model``):
        another program of the model (a pipelined step) numbers its groups its own way."""
        if other.program is self.program:
            return list(decisions)
        return [(self.analysis.subject_label(d), d.slot) for d in decisions]

    def use_mesh(self, trial) -> list[str]:
        """Continue on a candidate ``search_meshes`` tried (a ``MeshTrial``: a mesh and the
        pipeline, if any): its search as it stands where the halving kept it, else a new one
        on that mesh; pins kept where they apply (the notes say which did not)."""
        if trial.session is None:
            return self.reconfigure(mesh=trial.mesh, pipeline=trial.pipeline)
        other = trial.session
        if other is self:
            return []
        pins, forbidden = self._portable(self.pins, other), self._portable(self.forbidden, other)
        self.model = other.model
        self.mesh, self.hardware = other.mesh, other.hardware
        self._cost_model, self._space, self._search = other._cost_model, other._space, other._search
        self._pins, self._baselines = other._pins, other._baselines
        return self.apply_pins(pins, forbidden)

    # ------------------------------------------------------------------ the bench
    def ilp(self, time_limit: float = 30.0):
        """The Alpa-style ILP baseline's plan on this session's cost model (an ``ILPResult``:
        decisions, report, status, solve seconds)."""
        return solve_ilp(self.cost_model, time_limit=time_limit)

    def exhaustive_size(self, per_axis: int = 3) -> int:
        """How many plans of at most ``per_axis`` decisions per mesh axis ``exhaustive``
        would score."""
        return space_size(self.cost_model, self._space.actions, per_axis)

    @overload
    def exhaustive(self, per_axis: int = 3, *, seconds: float | None = None,
                   budgets: None = None) -> ExhaustiveResult: ...

    @overload
    def exhaustive(self, per_axis: int = 3, *, seconds: float | None = None,
                   budgets: Sequence[str | float]) -> list[ExhaustiveResult]: ...

    def exhaustive(self, per_axis: int = 3, *, seconds: float | None = None,
                   budgets: Sequence[str | float] | None = None) -> ExhaustiveResult | list[ExhaustiveResult]:
        """The true optimum over every plan of at most ``per_axis`` decisions per mesh axis
        (the actions the search takes): an ``ExhaustiveResult``. With ``budgets`` (per-device
        memory budgets, the hardware's margin kept free of each), one result per budget from
        one pass. ``seconds``: give up once the first plans project the space past it."""
        if budgets is None:
            return exhaustive(self.cost_model, self._space.actions, per_axis, seconds=seconds)
        hw = self.hardware
        limits = [as_hardware(hw, b).limit for b in budgets]
        return exhaustive_limits(self.cost_model, self._space.actions, limits, per_axis, seconds=seconds)

    def bench(self, seconds: float = 60.0, *, ilp_time: float = 30.0, simulations: int | None = None,
              callback: Callable[["Session"], None] | None = None, verify: bool = False,
              exhaustive: int = 3, exhaustive_limit: int = 200_000,
              exhaustive_seconds: float | None = None) -> list[BenchRow]:
        """Hand plans, the Alpa-style ILP and the MCTS search side by side, on this cost
        model: one row per strategy (step time, MFU, memory, fits, search seconds); where
        the step has layer stacks to recompute, the hand plans again with every layer
        rematerialised (``+remat``) and the best plan without recompute that the search
        scored (``mcts-no-remat``). The
        search runs ``simulations`` simulations if given (reproducible), else ``seconds``.
        Where the space of plans with at most ``exhaustive`` decisions per mesh axis holds
        at most ``exhaustive_limit`` plans, an ``exhaustive`` row gives its optimum (0: no
        such row); a larger space gets the row with its size and no plan, and so does a
        space whose first plans project it past ``exhaustive_seconds`` (``projected_s``)."""
        return bench(self, seconds, ilp_time=ilp_time, simulations=simulations, callback=callback, verify=verify,
                     exhaustive=exhaustive, exhaustive_limit=exhaustive_limit, exhaustive_seconds=exhaustive_seconds)

    # ------------------------------------------------------------------ files
    def to_json(self) -> dict:
        """The session as JSON data (the format: ``_sessionfile`` and the README)."""
        return session_json(self)

    def save(self, path: str | os.PathLike) -> None:
        """Write the session (one JSON file, written atomically)."""
        write_session(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike, *, fn: Callable | None = None, args: Sequence[Any] | None = None,
             axis_names=None, analyses: Callable[[ModelSpec], ModelAnalysis] | None = None) -> "Session":
        """Resume a saved session (from ``save``, ``partex search`` or the explorer). A
        MODEL-spec session re-builds its model from the spec (``analyses(spec)`` if given,
        e.g. a cache); a session of a function given in Python needs ``fn`` and ``args``."""
        return cls.from_json(read_session(path), where=os.fspath(path), fn=fn, args=args, axis_names=axis_names,
                             analyses=analyses)

    @classmethod
    def from_json(cls, d: Any, *, where: str = "session", fn=None, args=None, axis_names=None,
                  analyses: Callable[[ModelSpec], ModelAnalysis] | None = None) -> "Session":
        model, spec, mesh, hw, seed, warm, restored, user = session_parts(
            d, where=where, fn=fn, args=args, axis_names=axis_names, analyses=analyses or analyze_spec)
        self = cls.__new__(cls)
        self._setup(model, spec, mesh, hw, seed, warm, restored, user_shardings=user)
        return self


def search_meshes(model, devices: int, *, topology=None, hardware: str | Hardware = DEFAULT_HARDWARE,
                  memory: str | float | None = None, seconds: float = 60.0, max_axes: int = 4, seed: int = 0,
                  warm_start: bool = True, spec: ModelSpec | None = None, user_shardings: str = "keep",
                  callback=None, pipelines: bool | None = None):
    """The meshes of ``devices`` searched with the plan for an analysed model (a
    ModelAnalysis): ``Session.search_meshes`` without a session first (``partex search
    --devices``). Returns a ``MeshSearch``."""
    hw = as_hardware(hardware, memory)
    traced: dict = {}  # one pipelined step per pipeline and stage count (``trace_mesh``): the meshes share it

    def make(mesh: MeshSpec, pipeline: Pipeline | None) -> "Session":
        m = model
        if pipeline is not None:
            key = (pipeline, trace_mesh(model.program, pipeline, mesh))
            if key not in traced:
                traced[key] = pipelined(model, pipeline, mesh)
            m = traced[key]
        return Session.from_analysis(m, mesh=mesh, hardware=hw, seed=seed, warm_start=warm_start, spec=spec,
                                     user_shardings=user_shardings)

    return mesh_search(make, devices, hw.link_bandwidth, topology=topology, seconds=seconds, max_axes=max_axes,
                       callback=callback, stacks=_stack_sizes(model), pipelines=pipelines)


def verify_specs(plans: Sequence[Plan], spec: ModelSpec, timeout: float) -> list[VerifyReport]:
    """XLA's figures for plans of a MODEL spec, compile-only, all in one fresh process."""
    if not plans:
        return []
    paths = []
    try:
        for p in plans:
            fd, path = tempfile.mkstemp(prefix="partex-verify-", suffix=".json")
            os.close(fd)
            paths.append(path)
            p.save(path)
        return verify_many(spec.spec, paths, preset=spec.preset, overrides=list(spec.overrides) or None,
                           timeout=timeout)
    finally:
        for path in paths:
            with contextlib.suppress(OSError):
                os.remove(path)


def verify_plan(plan: Plan, *, spec: ModelSpec | None, model: LoadedModel | None = None, run: bool = False,
                constrain: bool = True, timeout: float = 1800, export: str | None = None,
                explain: bool = False) -> VerifyReport:
    """XLA's figures for a plan: in a fresh process for a MODEL spec, else in this one."""
    if spec is not None:
        fd, path = tempfile.mkstemp(prefix="partex-verify-", suffix=".json")
        os.close(fd)
        try:
            plan.save(path)
            return verify(spec.spec, path, preset=spec.preset, overrides=list(spec.overrides) or None, run=run,
                          timeout=timeout, constrain=constrain, export=export, explain=explain)
        finally:
            with contextlib.suppress(OSError):
                os.remove(path)
    if model is None:
        raise PartexError("verify needs the function the plan was made for")
    return verify_loaded(model, plan, run=run, constrain=constrain, export=export, explain=explain)
