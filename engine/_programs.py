"""The programs one model may run -- the step as written and its scanned stacks as
pipelines -- and the searches over them: the mesh (``search_meshes``) and, on one mesh,
the pipeline (``search_pipelines``), each candidate a ``Session`` of its own.

``Session`` hands its ``search_meshes`` and ``search_pipelines`` here: a candidate session
is made by ``Session.fork`` (this module takes the ``Session`` class as a parameter, so it
imports no session), and the halving and UCT over them are ``_meshes``'.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Protocol, Sequence

from ._decisions import Decision
from ._errors import PartexError
from ._loader import ModelAnalysis, ModelSpec
from ._mesh import Hardware, MeshSpec
from ._meshes import MeshSearch, MeshSearcher, MeshTrial, ProgramSearch, StackShape, effort_of, pipelines_over
from ._meshes import mesh_searcher as _mesh_searcher
from ._options import DEFAULT_HARDWARE, as_hardware, as_mesh
from .analysis._pipeline_stacks import pipeline_stacks, pipeline_units
from ._sessionstate import SessionState
from .plan._pipeline_decision import Pipeline, pipelined, trace_mesh


def pipelined_model(model: ModelAnalysis, pipeline: str | Pipeline | None, mesh: MeshSpec) -> ModelAnalysis:
    """``model`` with ``pipeline`` applied (``plan._pipeline_decision.pipelined``); as it is for None."""
    if pipeline is None or pipeline == "":
        return model
    return pipelined(written(model), pipeline if isinstance(pipeline, Pipeline) else Pipeline.parse(pipeline), mesh)


def written(model: ModelAnalysis) -> ModelAnalysis:
    """The step as written: ``model`` itself, or the step its pipeline was made from."""
    return model.base if model.pipeline is not None else model


def _scan_stacks(model: ModelAnalysis) -> list:
    """Per scan stack of ``model``: (its unit, a ``PipelineStack`` or why it cannot be pipelined)."""
    an = model.analysis
    units = pipeline_units(an)
    stacks = pipeline_stacks(an, units, an.roles.batch_groups)
    return [(u, stacks[u.id]) for u in units if u.id in stacks]


def stacks(model: ModelAnalysis) -> dict:
    """Per scan stack of ``model`` (its label), a ``PipelineStack`` or why it cannot be pipelined."""
    return {u.label: st for u, st in _scan_stacks(model)}


def stack_sizes(model: ModelAnalysis) -> list[StackShape]:
    """Each scanned stack of ``model`` that may be pipelined (a stage may recompute it unless
    the step's own checkpoint does already)."""
    return [StackShape(u.label, st.layers, st.batch, bool(u.kinds)) for u, st in _scan_stacks(model)
            if not isinstance(st, str)]


def mesh_searcher(model: ModelAnalysis, devices: int, *, session: Callable[..., Any], topology=None,
                  hardware: str | Hardware = DEFAULT_HARDWARE, memory: str | float | None = None,
                  max_axes: int = 4, seed: int = 0, warm_start: bool = True, spec: ModelSpec | None = None,
                  user_shardings: str = "keep", pipelines: bool | None = None, effort: float = 1.0) -> MeshSearcher:
    """The search over the meshes of ``devices`` with the plan for an analysed model, built
    and not run (``MeshSearcher``: ``run`` it, ``request_stop`` it):
    ``session(model, mesh=..., ...)`` (``Session.from_analysis``) makes each candidate's
    search; the pipelined steps, one per pipeline and stage count (``trace_mesh``), are
    traced once and shared by the meshes."""
    hw = as_hardware(hardware, memory)
    traced: dict = {}

    def make(mesh: MeshSpec, pipeline: Pipeline | None):
        m = model
        if pipeline is not None:
            key = (pipeline, trace_mesh(model.program, pipeline, mesh))
            if key not in traced:
                traced[key] = pipelined(model, pipeline, mesh)
            m = traced[key]
        return session(m, mesh=mesh, hardware=hw, seed=seed, warm_start=warm_start, spec=spec,
                       user_shardings=user_shardings)

    return _mesh_searcher(make, devices, hw.link_bandwidth, topology=topology, max_axes=max_axes, effort=effort,
                          stacks=stack_sizes(model), pipelines=pipelines)


def search_pipelines(s: Any, seconds: float | None, simulations: int | None, callback=None) -> ProgramSearch:
    """``Session.search_pipelines`` (its docstring), on the session ``s``: the step as written
    and every pipeline of its scanned stacks over an axis of its mesh, each a session made
    by ``s.fork`` that keeps ``s``'s pins (``s`` itself for its own program)."""

    def make(mesh: MeshSpec, pipeline: Pipeline | None):
        if pipeline == s.pipeline:
            return s
        other, notes = s.fork(mesh=mesh, pipeline=pipeline)
        if notes:  # a program the user's pins rule out (a pin on the axis its stages take) is not tried
            raise PartexError(f"pipeline {pipeline.text() if pipeline else 'none'}: {notes[0]}")
        return other

    programs = [None, *pipelines_over(s.mesh, stack_sizes(written(s.model)))]
    if s.pipeline is not None and s.pipeline not in programs:
        programs.append(s.pipeline)
    found = ProgramSearch(make, [(s.mesh, p) for p in programs])
    if simulations is not None:
        found.step(simulations)
    elif seconds:
        found.run(seconds, callback=callback)
    return found


class Forked(Protocol):
    """What ``SessionPrograms`` reads of the session it is part of."""

    model: ModelAnalysis
    mesh: MeshSpec
    hardware: Hardware
    seed: int
    warm_start: bool
    spec: ModelSpec | None

    @property
    def pipeline(self) -> Pipeline | None: ...

    @property
    def user_shardings(self) -> str: ...

    @classmethod
    def from_analysis(cls, model: Any, *, mesh: Any, hardware: Any = ..., memory: Any = ..., seed: int = ...,
                      warm_start: bool = ..., spec: Any = ..., user_shardings: str = ..., pipeline: Any = ...
                      ) -> Any: ...

    @property
    def program(self) -> Any: ...

    @property
    def analysis(self) -> Any: ...

    @property
    def pins(self) -> list[Decision]: ...

    @property
    def forbidden(self) -> list[Decision]: ...

    def fork(self, *, mesh: MeshSpec, pipeline: Pipeline | None) -> tuple[Any, list[str]]: ...

    def mesh_searcher(self, devices: int, *, topology=None, max_axes: int = 4, pipelines: bool | None = None,
                      effort: float = 1.0) -> MeshSearcher: ...

    def adopt(self, other: Any) -> list[str]: ...

    def apply_pins(self, pins: Sequence[Any] = (), forbidden: Sequence[Any] = ()) -> list[str]: ...

    def _portable(self, decisions: Sequence[Decision], other: Any) -> list: ...

    def portable(self, decisions: Sequence[Decision]) -> list[tuple[str, str]]: ...

    def consider(self, items: Sequence[Any]) -> float: ...

    def reconfigure(self, *, mesh: Any = None, pipeline: Any = ...) -> list[str]: ...

    _state: SessionState

    def _set(self, model: ModelAnalysis, spec: ModelSpec | None, mesh: MeshSpec, hw: Hardware, seed: int,
             warm_start: bool, state: SessionState) -> None: ...


KEEP: Any = object()  # reconfigure(pipeline=KEEP): the session's pipeline as it is


class SessionPrograms:
    """The ``Session``'s methods that reach beyond its own mesh and program: another mesh,
    hardware or pipeline for it (``reconfigure``), another session of its model (``fork``)
    and continuing as one (``adopt``), the meshes of a number of devices, the pipelines on
    its mesh, and continuing on one they tried (``use_mesh``)."""

    def reconfigure(self: Forked, *, mesh=None, hardware: str | Hardware | None = None,
                    memory: str | float | None = None, seed: int | None = None,
                    pipeline: Any = KEEP) -> list[str]:
        """Another ``mesh``, ``hardware``, ``memory`` budget or ``seed`` (None: as it is), or
        ``pipeline`` (another, or None for the step as written): a new cost model and a new search (statistics from the old cost model
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
        if new_pipe != model.pipeline or (new_pipe is not None and new_mesh != self.mesh):
            # the stages follow the mesh's axis
            model = pipelined_model(model, new_pipe, new_mesh) if new_pipe is not None else written(model)
        state = SessionState.new(model, new_mesh, hw, new_seed, self.warm_start, self.user_shardings)
        self._set(model, self.spec, new_mesh, hw, new_seed, self.warm_start, state)
        return self.apply_pins(pins, forbidden)

    def adopt(self: Forked, other: Any) -> list[str]:
        """Continue as ``other`` (another mesh's or program's session of this model): its
        model, mesh, hardware and search as it stands, with this session's pins and forbids
        where they apply (the notes say which did not)."""
        if other is self:
            return []
        pins, forbidden = self._portable(self.pins, other), self._portable(self.forbidden, other)
        state = dataclasses.replace(other._state)  # its search, and pins of this session's own from here
        self._set(other.model, self.spec, other.mesh, other.hardware, self.seed, self.warm_start, state)
        return self.apply_pins(pins, forbidden)

    def fork(self: Forked, *, mesh: MeshSpec, pipeline: Pipeline | None) -> tuple[Any, list[str]]:
        """A new session on this one's model as written, run as ``pipeline`` (None: as
        written) on ``mesh``, with this one's hardware, seed and mode, and its pins and
        forbids where they still apply: (the session, a note per one dropped)."""
        other = type(self).from_analysis(written(self.model), mesh=mesh, hardware=self.hardware, seed=self.seed,
                                      warm_start=self.warm_start, spec=self.spec,
                                      user_shardings=self.user_shardings, pipeline=pipeline)
        return other, other.apply_pins(self._portable(self.pins, other), self._portable(self.forbidden, other))

    def warm_from(self: Forked, other: Any) -> float:
        """Score ``other``'s best plan (another mesh's or program's session of this model)
        as a candidate of this session's search, as it carries pins (``_portable``; then as
        ``consider``). Returns what the plan promises here (``consider``; inf where ``other``
        has no plan)."""
        best = other.best() if other is not self else None
        if best is None:
            return math.inf
        return self.consider(other._portable(best.decisions, self))

    def consider(self: Forked, items: Sequence[Any]) -> float:
        """Score a plan from elsewhere as a candidate of this session's search, the way the
        hand plans are: ``items`` as ``Session.decisions`` reads them (``Decision``s of this
        model, or (group or layer stack label, slot) pairs: another mesh's or program's plan,
        ``portable``), after the pins, those this mesh and program can take (the rest left
        out: an axis it lacks, a size that does not divide). A better plan becomes the best,
        and the search goes on from it. Returns what the plan promises here: its step time,
        times how far over the memory budget it is where it does not fit."""
        decisions = []
        for item in items:
            try:
                decisions.append(self._state.space.adopt(item) if isinstance(item, Decision) else
                                 self._state.space.decision(*item))
            except PartexError:  # a group or axis this session lacks, or a size its axis does not divide
                continue
        _, e = self._state.search.consider(decisions, self._state.pins)
        hw = self.hardware
        over = max(e.peak / hw.limit, (e.host / hw.host_limit if hw.host_limit > 0 else math.inf) if e.host else 0.0)
        return e.step_time * max(1.0, over)

    def _portable(self: Forked, decisions: Sequence[Decision], other: Any) -> list:
        """This session's decisions as ``other`` takes them: as they are on the same program
        (another mesh), else ``portable``."""
        if other.program is self.program:
            return list(decisions)
        return self.portable(decisions)

    def portable(self: Forked, decisions: Sequence[Decision]) -> list[tuple[str, str]]:
        """``decisions`` by what each decides about and its slot (``("ffn", "model")``,
        ``("stack0", "recompute:full")``): what another session of this model reads back
        (``consider``, ``decisions``), on another mesh, another program of it (a pipelined
        step numbers its groups its own way) or in another process."""
        return [(self.analysis.subject_label(d), d.slot) for d in decisions]

    def mesh_searcher(self: Forked, devices: int, *, topology=None, max_axes: int = 4, pipelines: bool | None = None,
                      effort: float = 1.0) -> MeshSearcher:
        """``search_meshes``'s search, built and not run: ``run(seconds, callback)`` it;
        ``request_stop`` (from a signal handler, say) ends it with the best so far.
        ``devices``, ``topology``, ``max_axes`` and ``pipelines`` as for ``search_meshes``;
        ``effort`` scales its schedule of simulations (``search_meshes``: the seconds given
        over 60, ``effort_of``)."""
        return mesh_searcher(written(self.model), devices, session=type(self).from_analysis, topology=topology,
                             hardware=self.hardware, max_axes=max_axes, seed=self.seed, warm_start=self.warm_start,
                             spec=self.spec, user_shardings=self.user_shardings, pipelines=pipelines, effort=effort)

    def search_meshes(self: Forked, devices: int, *, topology=None, seconds: float | None = None, max_axes: int = 4,
                      callback=None, pipelines: bool | None = None) -> MeshSearch:
        """The mesh as a decision: every factorisation of ``devices`` into up to
        ``max_axes`` axes (``topology``: 'SLICESxDEVICES[@GB/s]', one axis across the slow
        network) searched with the plan, on this session's model (as written: a pipeline is
        one of the candidates), hardware and budget (``partex._meshes.MeshSearcher``): the
        meshes, then the pipelined candidates, each candidate starting from the best plan
        so far, successive halving in each tier; allowing pipelines never gives a worse plan. ``pipelines``: None tries the
        model's scanned stacks as pipelines over the slices of a topology of several, True
        within a slice too, False never. ``seconds`` caps the time and sets the effort
        (``effort_of``): the search returns sooner where every tier converged; None (the
        default) runs the schedule as written to its end, however long that takes.
        ``callback(trials)`` as it goes, the ``MeshTrial``s so far. Returns a
        ``MeshSearch``: the candidates tried, best first; ``use_mesh`` takes one."""
        return self.mesh_searcher(devices, topology=topology, max_axes=max_axes, pipelines=pipelines,
                                  effort=effort_of(seconds)).run(seconds, callback)

    def search_pipelines(self: Forked, seconds: float | None = 60.0, *, simulations: int | None = None,
                         callback=None) -> ProgramSearch:
        """The pipeline as a decision on this session's mesh: the step as written and every
        pipeline of its scanned stacks over an axis of the mesh (``partex._meshes.pipelines_over``:
        microbatches 2S and 4S, each stage saving or recomputing), one search tree each below
        one root, UCT there giving the simulations to the programs that pay
        (``ProgramSearch``); this session's own search is its program's tree, and the others
        keep its pins (a program where one cannot hold is not tried: its row says why). Runs
        ``simulations`` simulations if given (reproducible), else ``seconds`` (None: none, the
        programs built and their hand plans scored), ``callback(trials)`` after each visit;
        returns the ``ProgramSearch``
        (``step``/``run`` go on; ``result()``: the programs best first; ``use_mesh``
        continues on one, this session then holding that program's tree)."""
        return search_pipelines(self, seconds, simulations, callback)

    def use_mesh(self: Forked, trial: MeshTrial) -> list[str]:
        """Continue on ``trial``, a candidate ``search_meshes`` or ``search_pipelines`` tried
        (a ``MeshTrial``: a mesh and the pipeline, if any): its search as it stands where the
        search kept it (``adopt``), else a new one on that mesh (``reconfigure``) that starts
        from the plan the trial found (``MeshTrial.plan``, ``consider``); pins kept where they
        apply. Returns a note per pin or forbid dropped."""
        if trial.session is None:
            notes = self.reconfigure(mesh=trial.mesh, pipeline=trial.pipeline)
            if trial.plan:
                self.consider(trial.plan)
            return notes
        return self.adopt(trial.session)
