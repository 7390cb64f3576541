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

What one configuration of a session holds -- its cost model, decision space, search, pins
and scored baselines -- is one record (``_sessionstate.SessionState``): a new mesh or
hardware makes a new one, and ``adopt`` takes another session's. The class holds the
analysis, the plans, the search and the pins; its other methods come by responsibility from
``_checks.SessionChecks`` (XLA's checks and measurements), ``_bench.SessionBench`` (the ILP,
the exhaustive optimum, the bench), ``_programs.SessionPrograms`` (another mesh, hardware or
pipeline: ``reconfigure``, ``fork``, ``adopt``, the mesh and pipeline searches) and
``_sessionfile.SessionFiles`` (the session file), each over a protocol of what it reads of
the session.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

from ._bench import SessionBench
from ._checks import SessionChecks
from ._decisions import Decision
from ._errors import PartexError
from ._loader import LoadedModel, ModelAnalysis, ModelSpec, analyze_loaded, analyze_spec, model_spec
from ._mesh import Hardware, MeshSpec
from ._meshes import MeshSearch
from ._options import DEFAULT_HARDWARE, as_hardware, as_mesh
from ._programs import SessionPrograms, pipelined_model, stacks, written
from ._meshes import MeshSearcher, effort_of
from ._programs import mesh_searcher as _mesh_searcher
from ._results import SearchStats
from ._sessionfile import SessionFiles
from ._sessionstate import Candidate, SessionState
from .analysis._types import Group
from .analysis._space import GroupRef
from .cost import CostModel, CostReport
from .plan._pipeline_decision import Pipeline
from .plan._plan import Plan
from .plan._planned import fixed_json, resolve_decisions
from .plan._planning import make_plan
from .plan._specs import check_signature, signature_of
from .planner._search import Search, SearchResult
from .planner._strategies import baseline_names, strategy_decisions

class Session(SessionChecks, SessionBench, SessionPrograms, SessionFiles):
    """One model (a function and example args, or a MODEL spec) on one mesh and hardware:
    its analysis, baselines, search, pins, plans and XLA checks.

    fn, args: the training step and a tuple of its example arguments (arrays or
      ``jax.ShapeDtypeStruct`` pytrees; nothing is allocated). ``Session.from_spec`` and
      ``Session.from_analysis`` make a session on a MODEL spec or an analysed model.
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
    pipeline: ``STACK:AXIS:MICROBATCHES`` or a ``Pipeline``: a layer stack run as a pipeline.
    name: the model's name in titles and files (default: ``fn.__name__``).
    Raises PartexError for an ``fn`` that is not callable or ``args`` that are not a tuple or list.
    """

    def __init__(self, fn: Callable, args: Sequence[Any], *, mesh, hardware: str | Hardware = DEFAULT_HARDWARE,
                 memory: str | float | None = None, seed: int = 0, axis_names=None, warm_start: bool = True,
                 name: str | None = None, user_shardings: str = "keep", pipeline: str | Pipeline | None = None):
        if not callable(fn):
            raise PartexError(f"Session needs a callable training step, got {type(fn).__name__}")
        if not isinstance(args, (tuple, list)):
            raise PartexError("Session(fn, args, ...): args must be a tuple of fn's example arguments")
        analysed = analyze_loaded(LoadedModel(name or getattr(fn, "__name__", "fn"), fn, tuple(args), axis_names,
                                              "custom", None))
        self._start(analysed, None, mesh, as_hardware(hardware, memory), seed, warm_start, user_shardings, pipeline)

    @classmethod
    def from_spec(cls, spec: str, *, preset: str = "tiny", overrides: Sequence[str] | Mapping | None = None,
                  mesh, hardware: str | Hardware = DEFAULT_HARDWARE, memory: str | float | None = None,
                  seed: int = 0, warm_start: bool = True, user_shardings: str = "keep",
                  pipeline: str | Pipeline | None = None) -> "Session":
        """A session on a MODEL spec: ``spec`` a demo name (``transformer``) or ``module:attr``
        / ``path/file.py:attr`` naming a callable that returns ``(fn, example_args)``;
        ``preset`` and ``overrides`` (``["layers=4"]`` or ``{"layers": 4}``) size a demo model
        (a ``module:attr`` takes neither). ``mesh``, ``hardware``, ``memory``, ``seed``,
        ``warm_start``, ``user_shardings`` and ``pipeline`` as for ``Session``. Returns the
        ``Session``, its ``spec`` recorded (the session file and XLA's checks rebuild the model
        from it)."""
        ms = model_spec(spec, preset, overrides)
        return cls.from_analysis(analyze_spec(ms), mesh=mesh, hardware=hardware, memory=memory, seed=seed,
                                 warm_start=warm_start, spec=ms, user_shardings=user_shardings, pipeline=pipeline)

    @classmethod
    def from_analysis(cls, model, *, mesh, hardware: str | Hardware = DEFAULT_HARDWARE,
                      memory: str | float | None = None, seed: int = 0, warm_start: bool = True,
                      spec: ModelSpec | None = None, user_shardings: str = "keep",
                      pipeline: str | Pipeline | None = None) -> "Session":
        """A session on an already analysed ``model`` (a ModelAnalysis, e.g. from
        ``partex.analyze``); ``pipeline`` (``Pipeline`` or ``STACK:AXIS:MICROBATCHES``): one of
        its layer stacks run as a pipeline over a mesh axis (``partex.Pipeline``). ``mesh``,
        ``hardware``, ``memory``, ``seed``, ``warm_start`` and ``user_shardings`` as for
        ``Session``; ``spec``: the ``ModelSpec`` the model was built from, if any (None: a
        function session). Returns the ``Session``."""
        self = cls.__new__(cls)
        self._start(model, spec, mesh, as_hardware(hardware, memory), seed, warm_start, user_shardings, pipeline)
        return self

    def _start(self, model: ModelAnalysis, spec: ModelSpec | None, mesh, hw: Hardware, seed: int, warm_start: bool,
               user_shardings: str, pipeline: str | Pipeline | None) -> None:
        mesh = as_mesh(mesh, model)
        model = pipelined_model(model, pipeline, mesh)
        self._set(model, spec, mesh, hw, seed, warm_start,
                  SessionState.new(model, mesh, hw, seed, warm_start, user_shardings))

    def _set(self, model: ModelAnalysis, spec: ModelSpec | None, mesh: MeshSpec, hw: Hardware, seed: int,
             warm_start: bool, state: SessionState) -> None:
        self.model = model  # ModelAnalysis: .model (LoadedModel), .program, .analysis
        self.spec = spec
        self.mesh = mesh
        self.hardware = hw
        self.seed = int(seed)
        self.warm_start = bool(warm_start)
        self._state = state

    # ------------------------------------------------------------------ the analysis
    @property
    def analysis(self):
        """The model's ``Analysis``: named dimensions, decision groups, conflicts."""
        return self.model.analysis

    @property
    def program(self):
        """The traced step, a ``Program``."""
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
        return stacks(written(self.model))

    @property
    def conflicts(self):
        """The analysis's ``Conflict``s: where one named dimension meets another."""
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
        """The analytic cost model of this model on this mesh and hardware."""
        return self._state.cost_model

    @property
    def _search(self) -> Search:
        return self._state.search

    @property
    def actions(self) -> list[Decision]:
        """The decisions the search takes, in its order (``DecisionSpace.actions``)."""
        return list(self._state.space.actions)

    @property
    def donate(self) -> tuple[int, ...]:
        """The positions of the step's arguments whose buffers the outputs reuse, as the
        cost model counts them and the plans record them (jit's ``donate_argnums``)."""
        return self.cost_model.donate

    @property
    def title(self) -> str:
        """The model's title: its spec's (``ModelSpec.title``), else ``name (custom)``."""
        return self.spec.title if self.spec else f"{self.model.model.name} (custom)"

    def group(self, ref: GroupRef) -> Group:
        """The ``Group`` ``ref`` names: a group id, a label, or an anchor ``input/path:dim``
        (an input leaf and dim in it). Raises PartexError for a ref that names none."""
        return self._state.space.group(ref)

    def label(self, decision: Decision) -> str:
        """``decision`` as text: ``group->axis`` (``Analysis.decision_label``)."""
        return self.analysis.decision_label(decision)

    def decisions(self, items: Sequence[Decision | tuple[GroupRef, str]]) -> list[Decision]:
        """Decisions from what a user writes, ``items``: [(group id / label / anchor, slot)], the slot
        a mesh axis, ``resolve:<resolution>`` or ``recompute:<kind>`` (its group a layer
        stack's id or label); a ``Decision`` passes as it is. Returns the ``Decision``s, in
        order; PartexError for an item that names no decision of this model and mesh."""
        return self._state.space.decisions(items)

    # ------------------------------------------------------------------ plans and baselines
    def evaluate(self, decisions: Sequence[Decision | tuple[GroupRef, str]], detail: bool = True) -> CostReport:
        """The cost model's ``CostReport`` for ``decisions`` (as ``decisions`` reads them):
        step time, memory and, with ``detail`` (default), the collectives listed."""
        return self.cost_model.evaluate(self.decisions(decisions), detail=detail)

    def strategy(self, name: str) -> list[Decision]:
        """The decisions of the hand strategy ``name``: replicated, dp, megatron, zero3,
        expert (MoE), on this mesh."""
        return strategy_decisions(name, self.analysis, self.mesh, self.cost_model.fixed)

    def plan(self, decisions: Sequence[Decision | tuple[GroupRef, str]] | None = None, *, strategy: str | None = None,
             pinned: Sequence[Decision] = ()) -> Plan:
        """A ``Plan`` from ``decisions`` (as ``decisions`` reads them), or from the hand
        strategy ``strategy`` (``plan(strategy="megatron")``); ``pinned``: the decisions the
        plan records as pinned. Raises PartexError when neither is given."""
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

    def pinned_plan(self, decisions: Sequence[Decision], strategy: str) -> Plan:
        """A ``Plan`` of the search's ``decisions`` (``strategy``: its name in the plan,
        ``mcts``, ``mcts#2``), recording the pins it honoured."""
        return self.plan(list(decisions), strategy=strategy, pinned=self._state.pins.pinned)

    def baselines(self) -> dict[str, Candidate]:
        """The hand strategies scored on this cost model (replicated, dp, megatron, zero3,
        and expert for a mixture of experts)."""
        st = self._state
        if st.baselines is None:
            st.baselines = {name: Candidate(name, tuple(dec), st.cost_model.evaluate(dec, detail=True))
                            for name in baseline_names(self.analysis) for dec in [self.strategy(name)]}
        return dict(st.baselines)

    def scored(self, plan: Plan, name: str = "uploaded", *, hardware: Hardware | None = None) -> Candidate:
        """``plan`` (e.g. uploaded) for this model, scored on its own mesh and on ``hardware``
        (None: the hardware its file names; the explorer passes its own, so an upload is priced
        like the plans beside it): a ``Candidate`` called ``name``. Raises PartexError for a
        plan made for another model."""
        check_signature(plan, self.program)
        decisions = resolve_decisions(plan, self.analysis)
        cm = CostModel(self.analysis, plan.mesh, plan.hardware if hardware is None else hardware, donate=plan.donate,
                       user_shardings=plan.user_shardings)
        return Candidate(name, tuple(decisions), cm.evaluate(decisions, detail=True))

    # ------------------------------------------------------------------ the search
    def step(self, n: int = 1) -> "Session":
        """Run ``n`` simulations of the search; returns the session."""
        self._state.search.stop_requested = False  # a stop asked of an earlier run is done with
        self._state.search.step(int(n), self._state.pins)
        return self

    def run(self, seconds: float, callback: Callable[["Session"], None] | None = None, *,
            simulations: int | None = None) -> "Session":
        """Search for about ``seconds``, or until ``simulations`` more have run where that
        comes first; ``callback(session)`` after each chunk. Returns early when
        ``request_stop`` is called (e.g. from a signal handler). Returns the session."""
        search = self._state.search
        search.stop_requested = False
        search.run(seconds, self._state.pins, callback=None if callback is None else (lambda _s: callback(self)),
                   simulations=simulations)
        return self

    def probe(self, evaluations: int) -> "Session":
        """A short descent from the best plan so far, of at most ``evaluations`` plans scored
        (the mesh search's screen of a candidate: reproducible, unlike a slice of time)."""
        self._state.search.stop_requested = False
        self._state.search.probe(evaluations, self._state.pins)
        return self

    def settle(self, seconds: float) -> bool:
        """The local search's last word on the best plan so far (``Search.settle``): its
        polish and kicks, until none improves it or ``seconds`` pass; True where it moved."""
        self._state.search.stop_requested = False
        return self._state.search.settle(seconds, self._state.pins)

    def request_stop(self) -> None:
        """Ask a running ``run`` to return after the simulation in hand (signal-safe)."""
        self._state.search.request_stop()

    @property
    def stop_requested(self) -> bool:
        """True when ``request_stop`` asked the running ``run`` to return (its simulation in
        hand and any polish in it end at the next plan); ``run``, ``step``, ``probe`` and
        ``settle`` start with it false."""
        return self._state.search.stop_requested

    def stats(self) -> SearchStats:
        """Simulations, nodes, depth, speed, best step time over time, root actions."""
        return self._state.search.stats(self._state.pins)

    def best(self) -> SearchResult | None:
        """The fastest plan found that fits (None until one does)."""
        return self._state.search.best()

    def best_plan(self) -> Plan | None:
        """The search's best plan (``best``) as a ``Plan`` (None until one fits)."""
        b = self.best()
        return None if b is None else self.pinned_plan(b.decisions, "mcts")

    def best_without_recompute(self) -> tuple[Decision, ...] | None:
        """The fastest plan that fits among those the search scored with no recompute decision."""
        return self._state.search.best_without_recompute()

    def top_plans(self, k: int = 3) -> list[Plan]:
        """The ``k`` fastest distinct plans that fit that the search has scored, by prediction,
        fastest first (plans the cost model cannot tell apart count once)."""
        if k < 1:
            raise PartexError(f"top_plans needs k >= 1, got {k}")
        return [self.pinned_plan(d, "mcts" if i == 0 else f"mcts#{i + 1}")
                for i, d in enumerate(self._state.search.top(k, self._state.pins))]

    @property
    def smallest_memory(self) -> float:
        """The smallest predicted peak memory met so far (when nothing fits)."""
        return self._state.search.smallest_memory[0]

    # ------------------------------------------------------------------ pins
    @property
    def pins(self) -> list[Decision]:
        """The pinned decisions, in the order they were pinned."""
        return list(self._state.pins.pinned)

    @property
    def forbidden(self) -> list[Decision]:
        """The forbidden decisions, sorted."""
        return sorted(self._state.pins.forbidden)

    def pin(self, group: GroupRef, axis: str) -> Decision:
        """Fix a decision: the search keeps it, first, and never undoes it. ``axis`` is a mesh
        axis, or ``recompute:<kind>`` (regather, dots, full) with ``group`` a layer stack
        (``Session.units``). Returns the ``Decision``; PartexError for one the session cannot take."""
        return self._change("pin", self._state.space.decision(group, axis))

    def forbid(self, group: GroupRef, axis: str) -> Decision:
        """Never take the decision ``group``->``axis`` (as ``pin`` reads them); returns it."""
        return self._change("forbid", self._state.space.decision(group, axis))

    def unpin(self, group: GroupRef, axis: str) -> Decision:
        """Remove the pin or forbid of ``group``->``axis`` (as ``pin`` reads them); returns the decision."""
        return self._change("unpin", self._state.space.decision(group, axis))

    def _change(self, how: str, d: Decision) -> Decision:
        """Pin, forbid or unpin ``d``; the search's best then honours the new pins."""
        st = self._state
        if how != "unpin":
            st.space.check_takeable(d)
        pins = getattr(st.pins, how)(d, self.label)
        if pins != st.pins:
            st.pins = pins
            st.search.rebest(pins)
        return d

    def mark_infeasible(self, decisions: Sequence[Decision], measured_bytes: float) -> None:
        """XLA measured the plan of ``decisions`` at ``measured_bytes`` per device, over the
        budget: it no longer counts as fitting, and the best plan becomes the next best that
        fits. Returns None."""
        self._state.search.mark_infeasible(list(decisions), float(measured_bytes), self._state.pins)

    def apply_pins(self, pins: Sequence[Decision | tuple[GroupRef, str]] = (),
                   forbidden: Sequence[Decision | tuple[GroupRef, str]] = ()) -> list[str]:
        """Pin ``pins`` and forbid ``forbidden`` where they still apply: decisions of this
        model (another session's, on another mesh, say) or (group, slot) pairs a user names.
        Returns a note for each that does not apply (its group or axis is gone, or the axis
        does not divide the group)."""
        notes = []
        for how, items in (("pin", pins), ("forbid", forbidden)):
            for item in items:
                try:
                    d = self._state.space.adopt(item) if isinstance(item, Decision) else \
                        self._state.space.decision(*item)
                    self._change(how, d)
                except PartexError as e:
                    what = self.label(item) if isinstance(item, Decision) else \
                        f"{self.group(item[0]).label if isinstance(item[0], int) else item[0]}->{item[1]}"
                    notes.append(f"{how} {what} dropped: {e}")
        return notes


def mesh_searcher(model, devices: int, *, topology=None, hardware: str | Hardware = DEFAULT_HARDWARE,
                  memory: str | float | None = None, max_axes: int = 4, seed: int = 0, warm_start: bool = True,
                  spec: ModelSpec | None = None, user_shardings: str = "keep", pipelines: bool | None = None,
                  effort: float = 1.0) -> MeshSearcher:
    """``search_meshes``'s search, built and not run: ``run(seconds, callback)`` it and
    ``request_stop`` it (``partex search --devices`` does, on Ctrl-C, keeping the best so far).

    Args:
      model, devices, topology, hardware, memory, max_axes, seed, warm_start, spec,
        user_shardings, pipelines: as for ``search_meshes``.
      effort: the scale of its schedule of simulations (``effort_of(seconds)``).

    Returns:
      A ``MeshSearcher``.
    """
    return _mesh_searcher(model, devices, session=Session.from_analysis, topology=topology, hardware=hardware,
                          memory=memory, max_axes=max_axes, seed=seed, warm_start=warm_start, spec=spec,
                          user_shardings=user_shardings, pipelines=pipelines, effort=effort)


def search_meshes(model, devices: int, *, topology=None, hardware: str | Hardware = DEFAULT_HARDWARE,
                  memory: str | float | None = None, seconds: float | None = None, max_axes: int = 4, seed: int = 0,
                  warm_start: bool = True, spec: ModelSpec | None = None, user_shardings: str = "keep",
                  callback=None, pipelines: bool | None = None) -> MeshSearch:
    """The meshes of ``devices`` searched with the plan for an analysed ``model`` (a
    ModelAnalysis): ``Session.search_meshes`` without a session first (``partex search
    --devices``).

    Args:
      model: the ``ModelAnalysis`` (``partex.analyze``, ``analyze_model``).
      devices: the number of devices the meshes factor.
      topology: 'SLICESxDEVICES[@GB/s]' or a ``Topology`` (None: one slice): one axis
        crosses the slow network between slices.
      hardware, memory, seed, warm_start, user_shardings: each candidate session's, as for
        ``Session``.
      seconds: the most time the search takes; it sets the effort (``effort_of``), and the
        search returns sooner where every tier of candidates converged. None (the default):
        the schedule as written, run to its end (however long that takes).
      max_axes: the most axes a mesh has.
      spec: the ``ModelSpec`` the model was built from, if any.
      callback: ``callback(trials)`` as the search goes, the ``MeshTrial``s so far.
      pipelines: None tries the model's scanned stacks as pipelines over the slices of a
        topology of several, True within a slice too, False never.

    Returns:
      A ``MeshSearch``: the candidates tried, best first.
    """
    return mesh_searcher(model, devices, topology=topology, hardware=hardware, memory=memory, max_axes=max_axes,
                         seed=seed, warm_start=warm_start, spec=spec, user_shardings=user_shardings,
                         pipelines=pipelines, effort=effort_of(seconds)).run(seconds, callback)
