"""The mesh's shape as a decision: the factorisations of a job's devices into named axes,
searched with the plan.

A job is ``devices`` chips, optionally laid out as ``granules`` slices (or hosts) of ``per``
chips joined by a slower network (a ``Topology``: TPU multislice over DCN, GPU nodes over
InfiniBand). A candidate mesh takes one axis across the granules (``data``: its size a
multiple of theirs, its links the slow ones) and factors what is left inside a granule into
up to ``max_axes`` axes in all (``fsdp``, ``tensor``, ``seq`` by falling size: the search
decides what each shards, so only the sizes and which axis crosses the slow network tell
meshes apart). A layer stack under ``scan`` may also be pipelined (``partex.Pipeline``): over
the slow axis, its size the slices (``stage``: each slice a stage, the activations crossing
the slow network once a tick), or within one slice over a ``stage`` axis of 2 or 4 devices;
``candidate_pipelines`` gives those meshes with the pipelines to try on each (microbatches
2S and 4S where the batch divides, each stage saving or recomputing its layers).
``MeshSearcher`` runs one search per candidate (a ``Searched``: a ``Session`` each), in tiers
narrowest first (the meshes, then the pipelined candidates: ``mesh_tiers``), each tier after
the one before is done, every candidate starting from its hand plans and the best plan found so
far translated onto it (``warm_from``); within a tier a short descent of each screens them, the
best earn simulations, and successive halving gives the better half twice as many until one is
left, searched until its best stops moving. The schedule counts simulations (reproducible for
a seed), the time only caps it: a wider search runs the narrower one's schedule first, so it is
never worse. ``Session.search_meshes`` runs one at the effort of its seconds.

On one mesh the pipeline is a decision of the search itself (``ProgramSearch``): the step as
written and each of its pipelines over an axis of the mesh (``pipelines_over``) are the
children of one root, each with its own tree, and UCT at the root decides which tree the next
simulations go to, incrementally, as one session's search. Owns ``Topology``,
``candidate_meshes``, ``candidate_pipelines``, ``pipelines_over``, ``MeshTrial``,
``MeshSearcher``, ``mesh_searcher`` and ``ProgramSearch``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from typing import Any, Callable, NamedTuple, Protocol, Sequence

from ._errors import PartexError
from ._mesh import MeshSpec
from ._results import SearchStats
from .plan._pipeline_decision import Pipeline


class Searched(Protocol):
    """What the mesh and program searches need of one candidate's search (``partex.Session``
    is one): run it, step it, stop it, and read its best plan and statistics."""

    def run(self, seconds: float, callback: Any = None, *, simulations: int | None = None) -> Any: ...

    def warm_from(self, other: Any) -> float: ...  # another candidate's best plan, tried on this one

    def portable(self, decisions: Sequence[Any]) -> list[tuple[str, str]]: ...  # a plan another session reads

    def step(self, n: int = 1) -> Any: ...

    def probe(self, evaluations: int) -> Any: ...

    def settle(self, seconds: float) -> bool: ...  # the local search's polish and kicks of the best plan

    def request_stop(self) -> None: ...

    def best(self) -> Any: ...  # a ``SearchResult`` (``.report``, ``.seconds``) or None

    def stats(self) -> SearchStats: ...

# the inner axes' names, by falling size (after ``data``, which crosses the slow network)
INNER = ("fsdp", "tensor", "seq")


@dataclasses.dataclass(frozen=True)
class Topology:
    """``granules`` slices or hosts of ``per`` devices; ``dcn_bandwidth``: bytes/s per
    device over the network between them (None: no slower than inside one)."""

    granules: int
    per: int
    dcn_bandwidth: float | None = None

    @property
    def devices(self) -> int:
        """The devices in all: ``granules * per``."""
        return self.granules * self.per

    def text(self) -> str:
        """The topology as ``parse`` reads it: ``SLICESxDEVICES[@GB/s]``."""
        bw = f"@{self.dcn_bandwidth / 1e9:g}" if self.dcn_bandwidth else ""
        return f"{self.granules}x{self.per}{bw}"

    @classmethod
    def parse(cls, text: str, devices: int | None = None) -> "Topology":
        """The ``Topology`` ``text`` spells: '4x64@6.25', 4 slices of 64 devices, 6.25 GB/s
        per device between slices; '256', one slice of 256. ``devices``, where given, must be
        their product. PartexError for text it cannot read."""
        m = re.fullmatch(r"\s*(\d+)\s*(?:x\s*(\d+))?\s*(?:@\s*([0-9.eE+]+))?\s*", str(text))
        if not m:
            raise PartexError(f"cannot read topology {text!r}: write SLICESxDEVICES[@GB/s], e.g. 4x64@6.25 "
                              "(4 slices of 64 devices, 6.25 GB/s per device between them), or DEVICES")
        a, b, bw = int(m.group(1)), m.group(2), m.group(3)
        granules, per = (a, int(b)) if b is not None else (1, a)
        if granules < 1 or per < 1:
            raise PartexError(f"topology {text!r}: slices and devices must be positive")
        dcn = float(bw) * 1e9 if bw else None
        if dcn is not None and not (math.isfinite(dcn) and dcn > 0):
            raise PartexError(f"topology {text!r}: the bandwidth must be a positive number of GB/s")
        t = cls(granules, per, dcn)
        if devices is not None and t.devices != devices:
            raise PartexError(f"topology {text!r} holds {t.devices} devices but --devices is {devices}")
        return t


def _factorings(n: int, parts: int, largest: int | None = None) -> list[tuple[int, ...]]:
    """The ways to write n as a product of at most ``parts`` factors >= 2, largest first."""
    if n == 1:
        return [()]
    if parts == 0:
        return []
    out = []
    top = n if largest is None else min(n, largest)
    for f in range(top, 1, -1):
        if n % f == 0:
            out += [(f,) + rest for rest in _factorings(n // f, parts - 1, f)]
    return out


def candidate_meshes(devices: int, topology: Topology | None = None, max_axes: int = 4,
                     link_bandwidth: float | None = None) -> list[MeshSpec]:
    """The meshes of ``devices`` to try (module docstring), as ``MeshSpec``s: one axis
    across the granules of ``topology`` (None: one granule of all the devices), the rest
    factored into up to ``max_axes`` axes in all. ``link_bandwidth``: bytes/s of the links
    inside a granule, for the meshes that name per-axis bandwidths (those with a slow axis).
    PartexError for a ``devices`` or ``max_axes`` out of range, or a topology of another size."""
    if devices < 1:
        raise PartexError(f"--devices must be a positive number, got {devices}")
    if not 1 <= max_axes <= 1 + len(INNER):
        raise PartexError(f"--max-axes must be between 1 and {1 + len(INNER)}, got {max_axes}")
    topo = topology or Topology(1, devices)
    if topo.devices != devices:
        raise PartexError(f"topology {topo.text()} holds {topo.devices} devices, not {devices}")
    out = []
    slow = topo.granules > 1
    for k in (d for d in range(1, topo.per + 1) if topo.per % d == 0) if slow else (None,):
        across = topo.granules * k if k is not None else None
        inner = topo.per // k if k is not None else devices
        for sizes in _factorings(inner, max_axes - (1 if slow else 0)):
            if slow:
                axes = ("data",) + INNER[:len(sizes)]
                all_sizes = (across,) + sizes
                bw = None
                if topo.dcn_bandwidth is not None and link_bandwidth is not None:
                    bw = (min(topo.dcn_bandwidth, link_bandwidth),) + (link_bandwidth,) * len(sizes)
                out.append(MeshSpec.create(axes, all_sizes, bw))
            else:
                names = (("data",) + INNER)[-len(sizes):] if len(sizes) > len(INNER) else INNER[:len(sizes)]
                out.append(MeshSpec.create(names or ("data",), sizes or (1,)))
    return out


# a stage axis within one slice: this many devices (where the layers divide)
STAGES_WITHIN = (2, 4)


class StackShape(NamedTuple):
    """A scanned stack that may be pipelined, as the candidates need it."""

    label: str
    layers: int
    batch: int
    recomputes: bool = True  # a stage may recompute its layers (False: the step's own checkpoint does)


def _shapes(stacks) -> list[StackShape]:
    return [s if isinstance(s, StackShape) else StackShape(*s) for s in stacks]


def _recomputes(st: StackShape) -> tuple[str | None, ...]:
    return (None, "full") if st.recomputes else (None,)


def candidate_pipelines(stacks: Sequence[StackShape | tuple[str, int, int]], devices: int, topology: Topology | None = None,
                        max_axes: int = 4, link_bandwidth: float | None = None, within: bool = False
                        ) -> list[tuple[MeshSpec, Pipeline]]:
    """The pipelined candidates (module docstring): per stack that may be pipelined (a
    ``StackShape``, or ``(label, layers, batch)``), the meshes with a ``stage`` axis over the slices (a topology of more
    than one) or, ``within`` on one slice, of 2 or 4 of its devices, the rest factored as
    ``candidate_meshes`` factors a slice; on each, microbatches 2S and 4S (S where neither
    divides the batch), each with the stage saving its layers' residuals or recomputing them
    (``full``)."""
    topo = topology or Topology(1, devices)
    out: list[tuple[MeshSpec, Pipeline]] = []
    stage_options = []
    if topo.granules > 1:
        bw = min(topo.dcn_bandwidth, link_bandwidth) if topo.dcn_bandwidth and link_bandwidth else None
        stage_options.append((topo.granules, topo.per, bw))
    if within and topo.granules == 1:  # (over several slices, the stages take the slow axis)
        stage_options += [(s, devices // s, None) for s in STAGES_WITHIN if topo.per % s == 0 and s < topo.per]
    for st in _shapes(stacks):
        for stages, rest, bw in stage_options:
            if st.layers % stages:
                continue
            ms = _microbatches(stages, st.batch)
            for sizes in _factorings(rest, max_axes - 1):
                axes = ("stage",) + INNER[:len(sizes)]
                bws = None
                if link_bandwidth is not None and topo.granules > 1:
                    bws = (bw or link_bandwidth,) + (link_bandwidth,) * len(sizes)
                mesh = MeshSpec.create(axes, (stages,) + sizes, bws)
                out += [(mesh, Pipeline(st.label, "stage", m, recompute=rc)) for m in ms for rc in _recomputes(st)]
    return out


def _microbatches(stages: int, batch: int) -> list[int]:
    """The microbatch counts to try on ``stages`` stages: 2S and 4S where they divide the
    batch (a bubble of about 1/3 and 1/5), else S where it does, else none."""
    return [m for m in (2 * stages, 4 * stages) if batch % m == 0] or ([stages] if batch % stages == 0 else [])


def pipelines_over(mesh: MeshSpec, stacks: Sequence[StackShape | tuple[str, int, int]]) -> list[Pipeline]:
    """The pipelines of ``stacks`` on a given mesh: each stack over each axis whose size
    divides its layers (that axis then holds the stages alone), in the microbatches
    ``candidate_pipelines`` tries, each stage saving or recomputing (where it may)."""
    return [Pipeline(st.label, axis, m, recompute=rc)
            for st in _shapes(stacks)
            for axis, stages in zip(mesh.axes, mesh.sizes) if stages > 1 and st.layers % stages == 0
            for m in _microbatches(stages, st.batch) for rc in _recomputes(st)]


@dataclasses.dataclass(eq=False)
class MeshTrial:
    """One candidate mesh (and the pipeline its step runs, if any) and what its search found."""

    mesh: MeshSpec
    pipeline: Pipeline | None = None
    warm_step: float | None = None  # the best hand plan that fits: seconds (None: none fits)
    step_time: float | None = None  # the best plan found that fits
    mfu: float | None = None
    memory: float | None = None  # that plan's peak bytes per device
    simulations: int = 0
    seconds: float = 0.0  # search seconds spent on it
    rounds: int = 0  # rounds of the halving it took part in (a ProgramSearch: visits of its tree)
    note: str = ""  # why it was not searched (a mesh the model cannot use)
    tier: int = 0  # its tier of a MeshSearcher: the narrowest space is 0
    lead: float = math.inf  # the plan last carried onto it, as ``Searched.warm_from`` rates it
    # open (not reached yet), scored (its hand plans), searching, dropped (by the halving),
    # converged, not searched (a mesh the model cannot use); where the search ended first:
    # not reached (never built), time up or stopped (built, its search cut short); left out
    # (a wider tier's candidate farther from the best meshes than the effort reaches)
    status: str = "open"
    session: "Searched | None" = dataclasses.field(default=None, repr=False)
    # its best plan that fits, as (group or layer stack label, slot) pairs (``Searched.portable``):
    # kept when the session is let go, so that a new search on its mesh starts from it (``use_mesh``)
    plan: tuple[tuple[str, str], ...] = ()

    @property
    def bubble(self) -> float | None:
        """The pipeline's bubble: the share of its ticks a stage idles (None: not pipelined)."""
        p = self.pipeline
        return p.bubble(self.mesh.sizes[self.mesh.index(p.axis)]) if p is not None else None

    def text(self) -> str:
        """The mesh, and the pipeline where there is one."""
        return self.mesh.text() + (f" | {self.pipeline.text()}" if self.pipeline is not None else "")

    def to_json(self) -> dict:
        """The trial as JSON data: the mesh (text and ``MeshSpec.to_json``), the pipeline, and
        what its search found (``*_s`` in seconds, ``memory_bytes`` per device)."""
        return {"mesh": self.mesh.text(), "mesh_json": self.mesh.to_json(),
                "pipeline": self.pipeline.to_json() if self.pipeline is not None else None,
                "bubble": self.bubble, "warm_step_s": self.warm_step,
                "step_time_s": self.step_time, "mfu": self.mfu, "memory_bytes": self.memory,
                "simulations": self.simulations, "search_s": self.seconds, "rounds": self.rounds,
                "note": self.note, "tier": self.tier, "status": self.status}


def _score(trial: MeshTrial) -> float:
    return trial.step_time if trial.step_time is not None else math.inf


def _inner(mesh: MeshSpec) -> tuple:
    """A mesh's axes past its first (the one across slices, or the stages), with their sizes."""
    return tuple(zip(mesh.axes[1:], mesh.sizes[1:]))


def _lead(trial: MeshTrial) -> float:
    """How promising a candidate is: its best plan that fits, or the plan last carried onto
    it from another (``warm_from``) where that promises more: a plan over the memory budget
    there counts its step time times how far over (the search's first polish often gets it
    under, at a small cost in time)."""
    return min(_score(trial), trial.lead)


def _record(trial: MeshTrial) -> None:
    s = trial.session
    assert s is not None
    best = s.best()
    st = s.stats()
    trial.simulations = st.simulations
    trial.seconds = st.seconds
    if best is not None:
        r = best.report
        trial.step_time, trial.mfu, trial.memory = r.step_time, r.mfu, r.memory.peak
        trial.plan = tuple(s.portable(best.decisions))


# The mesh search's schedule, in simulations, so that the same seed, candidates and effort
# give the same plan however fast the machine (the time only caps it). In each tier every
# candidate is screened by its hand plans and the best plan so far (translated onto it), and
# one that none of these fits gets simulations of its own until a plan does (PATIENCE at most); the
# leader is searched a simulation (its first polishes its best plan: most of what a search
# finds), its plan tried on the rest, and the best SCREEN of them earn a simulation each; then
# twice as many to the better half each round; the last one standing runs until its best has
# not moved over PATIENCE simulations (or half of those it took to find it, where that is
# more) nor under the local search's last word (its polish and kicks: ``Searched.settle``).
# SCREEN and PATIENCE scale with the search's effort.
SCREEN = 0.0625
SCREEN_LEAST = 4  # ... but never fewer than this many
PROBE = 96  # plans scored by the screen's descent on each candidate
PROBE_WITHIN = 2.5  # ... that promises a step within this factor of the incumbent's
WIDER = 4  # a wider tier builds this many times the screen's share of its candidates
PATIENCE = 8
CALLBACK_EVERY = 0.25  # seconds: the most often a running search reports its trials


def effort_of(seconds: float | None, reference: float = 60.0) -> float:
    """The effort a search of ``seconds`` makes: its schedule's simulations scale with the
    time given (``reference`` seconds: the schedule as written, and the effort of a search
    given no time limit, which runs that schedule to its end)."""
    return 1.0 if seconds is None else max(0.25, float(seconds) / reference)


class MeshSearcher:
    """The anytime search over candidate meshes (and pipelines), one tier after another,
    narrowest first: a tier is searched only once those before it are done, and its
    candidates start from the best plan found so far (the incumbent, translated onto their
    mesh and program: ``warm_from``), so that widening the space (pipelines, stages within
    a slice, more axes) only adds candidates after the narrower search's own, and never
    makes the answer worse. Within a tier: successive halving in simulations (module
    docstring), the round's leader's plan shared with the rest before each cut, then the
    last one searched until it converges.

    ``make(mesh, pipeline)`` builds a candidate's session (its hand plans scored; a
    PartexError for a mesh the model cannot use); ``tiers``: the candidates, by tier (a
    mesh, or a mesh and the pipeline its step runs); ``topology``: the ``Topology`` they
    were made for (None: one slice), kept for the result; ``effort`` scales the schedule.
    ``run(seconds)`` searches until every tier is done or the time is spent, and
    ``request_stop`` (signal-safe) ends it after the simulations in hand: the incumbent
    (``best``) only ever improves, and ``result()`` at any moment gives the candidates
    tried, best first."""

    def __init__(self, make: Callable[[MeshSpec, Pipeline | None], Searched],
                 tiers: Sequence[Sequence[MeshSpec | tuple[MeshSpec, Pipeline | None]]], *,
                 topology: Topology | None = None, effort: float = 1.0):
        self.tiers = [[MeshTrial(*m) if isinstance(m, tuple) else MeshTrial(m) for m in tier] for tier in tiers]
        self.tiers = [tier for tier in self.tiers if tier]
        if not self.tiers:
            raise PartexError("no candidate meshes: give --devices a number the model's dimensions divide")
        for k, tier in enumerate(self.tiers):
            for t in tier:
                t.tier = k
        self.trials = [t for tier in self.tiers for t in tier]
        self.make = make
        self.topology = topology
        self.screen = min(1.0, SCREEN * effort)
        self.probe = round(PROBE * max(1.0, effort))
        self.patience = max(4, round(PATIENCE * effort))
        self._short = False  # a candidate ran fewer simulations than the schedule gave it
        self.best: MeshTrial | None = None  # the incumbent: the fastest plan that fits found so far
        self.best_at: float | None = None  # search seconds when it was found
        self._best_step = math.inf  # its step time then
        self.seconds = 0.0  # seconds run, sessions built and searched
        self.converged = False  # every tier searched to the end of its schedule
        self.stopped = False  # request_stop ended the search
        self._stop = False
        self._current: Searched | None = None
        self._t0 = self._deadline = 0.0
        self._callback: Callable[[list[MeshTrial]], None] | None = None
        self._told = 0.0

    def request_stop(self) -> None:
        """End a running ``run`` after the simulations in hand (a flag: safe in a signal handler)."""
        self._stop = True
        s = self._current
        if s is not None:
            s.request_stop()

    @property
    def open(self) -> list[MeshTrial]:
        """The candidates still to be searched or still searching."""
        return [t for t in self.trials if t.status in ("open", "scored", "searching")]

    def run(self, seconds: float | None, callback: Callable[[list[MeshTrial]], None] | None = None) -> "MeshSearch":
        """Search for at most ``seconds`` (None: until every tier's schedule is done;
        ``callback(trials)`` as it goes, at most every ``CALLBACK_EVERY`` seconds and after
        each round); returns ``result()``."""
        self._t0 = time.perf_counter()
        self._deadline = self._t0 + (math.inf if seconds is None else float(seconds))
        self._callback, self._stop = callback, False
        done = True
        try:
            for tier in self.tiers:
                if self._left() <= 0:
                    done = False
                    break
                done = self._tier(tier) and done
        finally:
            self.seconds = time.perf_counter() - self._t0
            self._current = None
        self.converged, self.stopped = done, self._stop
        for t in self.trials:
            if t.status == "open":
                t.status = "not reached"
            elif t.status in ("scored", "searching"):
                t.status = "stopped" if self._stop else "time up"
            if t is not self.best:  # the best one's session goes on (``use_mesh``); the rest are let go
                t.session = None
        self._tell(force=True)
        return self.result()

    def result(self) -> "MeshSearch":
        """The candidates tried, best first, and the time to the best."""
        return MeshSearch(_ranked(self.trials), self.seconds, self.topology, best_at=self.best_at,
                          converged=self.converged, stopped=self.stopped)

    # ------------------------------------------------------------------ the tiers
    def _left(self) -> float:
        return 0.0 if self._stop else self._deadline - time.perf_counter()

    def _tell(self, force: bool = False) -> None:
        now = time.perf_counter()
        if self._callback is not None and (force or now - self._told >= CALLBACK_EVERY):
            self._told = now
            self._callback(self.trials)

    def _tier(self, tier: list[MeshTrial]) -> bool:
        """Search one tier (class docstring); False where the time ran out or a stop came first."""
        live = []
        if tier[0].tier > 0:  # a wider tier: its candidates nearest the best meshes so far first, and
            # only as many as the effort allows (the rest stay open: a longer search reaches them)
            ranked = sorted(tier, key=self._near)
            tier = ranked[:max(1, math.ceil(len(tier) * min(1.0, WIDER * self.screen)))]
            for t in ranked[len(tier):]:
                t.status = "left out"
        for t in tier:
            if self._left() <= 0:
                return False
            self._build(t)
            if t.session is not None:
                live.append(t)
            self._tell()
        if not live:
            return True
        # the screen: the incumbent's plan tried on each; a short descent of its own on each
        # that no hand plan fits (not known to be poor: every one while none fits) and on the
        # most promising, up to twice as many as the screen keeps, within PROBE_WITHIN of the
        # incumbent; the leader's plan tried on the others; the best earn simulations
        kept = min(len(live), max(SCREEN_LEAST, math.ceil(len(live) * self.screen)))
        probed = 0
        for t in sorted(live, key=_lead):
            if self._left() <= 0:
                return False
            self._carry(t)
            if self.best is None or self.best.step_time is None or t.warm_step is None or (
                    probed < 2 * kept and _lead(t) <= PROBE_WITHIN * self.best.step_time):
                probed += t.warm_step is not None
                t.session.probe(self.probe)
                _record(t)
                self._offer(t, self.seconds_now(), 0.0)
                if t.step_time is None:
                    self._fit(t)
            self._tell()
        live = self._cut(live, kept)
        n = 1
        while len(live) > 1 and self._left() > 0:
            for t in live:
                self._advance(t, n)
            live = self._cut(live, math.ceil(len(live) / 2))
            n *= 2
        for t in live:  # the one left: until its best stops moving
            if self._finish(t):
                t.status = "converged"
        self._tell(force=True)
        return all(t.status == "converged" for t in live) and not self._short

    def _fit(self, t: MeshTrial) -> None:
        """Simulations of ``t``'s own, one at a time, until a plan fits it or ``patience`` of
        them found none: a candidate that neither its hand plans, the incumbent's plan nor
        the probe's descent fits is not known to be poor (on a model far over the budget the
        descent from a rollout stops at a local optimum over it, where a simulation's rollout
        and polish most often find a plan that fits; a mesh the screen cannot score would be
        dropped however fast its plans are)."""
        for _ in range(self.patience):
            if t.step_time is not None or self._left() <= 0:
                break
            self._advance(t, 1, round_=False)
        if t.status == "searching":
            t.status = "scored"

    def _finish(self, t: MeshTrial) -> bool:
        """The last candidate of a tier: simulations until its best stops moving, then the
        local search's last word on it (``settle``: its polish and kicks), and again where
        that moved it. True where it converged in the time left."""
        s = t.session
        assert s is not None
        while self._left() > 0:
            if not self._settled(t):
                self._advance(t, self.patience)
                continue
            t.status = "searching"
            self._current = s
            start, before = self.seconds_now(), s.stats().seconds
            moved = s.settle(self._left())
            self._current = None
            _record(t)
            self._offer(t, start, before)
            self._tell()
            if not moved:
                return self._left() > 0
        return False

    def _near(self, t: MeshTrial) -> float:
        """How near ``t`` is to the best meshes searched so far: the best step time found on
        a mesh of a narrower tier with the same axes inside a slice (a pipelined candidate's
        inner axes are a plain mesh's); inf where none."""
        inner = _inner(t.mesh)
        return min((_score(o) for o in self.trials if o.tier < t.tier and _inner(o.mesh) == inner), default=math.inf)

    def _cut(self, live: list[MeshTrial], kept: int) -> list[MeshTrial]:
        """The leader's plan tried on the others' meshes, then the ``kept`` best of ``live``."""
        leader = min(live, key=_score)
        if leader.step_time is not None:
            for t in live:
                if t is not leader:
                    self._warm(t, leader)
        live = sorted(live, key=_lead)
        for t in live[kept:]:
            t.status = "dropped"
            if t is not self.best:
                t.session = None
        self._tell(force=True)
        return live[:kept]

    def _build(self, t: MeshTrial) -> None:
        """``t``'s session, its hand plans scored and the incumbent's plan tried on it."""
        if _start(t, self.make):
            self._carry(t)

    def _carry(self, t: MeshTrial) -> None:
        """The incumbent's plan tried on ``t`` (where it is another's)."""
        if t.session is not None and self.best is not None and self.best is not t and self.best.session is not None:
            t.lead = min(t.lead, t.session.warm_from(self.best.session))
        _record(t)
        self._offer(t, self.seconds_now(), 0.0)

    def _warm(self, t: MeshTrial, source: MeshTrial) -> None:
        assert t.session is not None and source.session is not None
        t.lead = t.session.warm_from(source.session)
        _record(t)
        self._offer(t, self.seconds_now(), 0.0)

    def seconds_now(self) -> float:
        """Seconds since ``run`` began."""
        return time.perf_counter() - self._t0

    def _advance(self, t: MeshTrial, n: int, round_: bool = True) -> None:
        """``n`` more simulations of ``t`` in the time left (where fewer ran, the search is
        short of its schedule: not converged), a round of its own where ``round_``. Only the
        search's deadline cuts them: a schedule in simulations, not shares of time, is what
        makes it reproducible."""
        s = t.session
        assert s is not None
        if self._left() <= 0:
            return
        t.status = "searching"
        self._current = s
        start, before = self.seconds_now(), s.stats().seconds

        def tick(_session) -> None:
            _record(t)
            self._offer(t, start, before)
            self._tell()

        sims = s.stats().simulations
        s.run(max(0.0, self._left()), callback=tick, simulations=n)
        self._current = None
        t.rounds += round_
        _record(t)
        self._offer(t, start, before)
        if s.stats().simulations - sims < n:
            self._short = True

    def _offer(self, t: MeshTrial, start: float, before: float) -> None:
        """``t`` as the incumbent where it is faster; when it was found: ``start`` seconds
        into the run, and its session's seconds then (``before``)."""
        # the incumbent's own step time as it was when it became the incumbent: a trial that
        # betters itself is a new incumbent too (its ``step_time`` has already moved)
        if t.step_time is not None and (self.best is None or t.step_time < self._best_step * (1 - 1e-9)):
            found = t.session.best() if t.session is not None else None
            at = start + max(0.0, found.seconds - before) if found is not None and before else self.seconds_now()
            self.best, self._best_step, self.best_at = t, t.step_time, min(at, self.seconds_now())

    def _settled(self, t: MeshTrial) -> bool:
        """Whether ``t``'s search has converged: its best unchanged over ``patience``
        simulations, or half of those it took to find it where that is more."""
        s = t.session
        assert s is not None
        sims = s.stats().simulations
        best = s.best()
        found = best.simulation if best is not None else 0
        return sims - found >= max(self.patience, found // 2)


def _trials(make: Callable[[MeshSpec, Pipeline | None], Searched],
            candidates: Sequence[MeshSpec | tuple[MeshSpec, Pipeline | None]]
            ) -> tuple[list[MeshTrial], list[MeshTrial]]:
    """Every candidate as a trial, its session built and its hand plans scored (one the
    model cannot use keeps the reason and no session): (all of them, the searchable ones)."""
    if not candidates:
        raise PartexError("no candidate meshes: give --devices a number the model's dimensions divide")
    trials = [MeshTrial(*m) if isinstance(m, tuple) else MeshTrial(m) for m in candidates]
    live = []
    for t in trials:
        if _start(t, make):
            _record(t)
            live.append(t)
    return trials, live


def _start(t: MeshTrial, make: Callable[[MeshSpec, Pipeline | None], Searched]) -> bool:
    """``t``'s session built (``make``) and its hand plans scored; False for a mesh the model
    cannot use (``t.note`` says why)."""
    try:
        t.session = make(t.mesh, t.pipeline)
    except PartexError as e:  # an axis that divides no dimension of the model
        t.note, t.status = str(e), "not searched"
        return False
    best = t.session.best()
    t.warm_step = best.report.step_time if best is not None else None
    t.status = "scored"
    return True


def _ranked(trials: list[MeshTrial]) -> list[MeshTrial]:
    """Best first; those no plan fits on, then those the model cannot use, last."""
    return sorted(trials, key=lambda t: (t.note != "", _score(t), t.warm_step if t.warm_step is not None else math.inf))


# UCT at the root of the search over programs: the exploration constant (UCB1's sqrt 2, on
# rewards in [0, 1]), and the simulations one visit of a program's tree runs (a few, so that
# the root's bookkeeping stays small beside them)
ROOT_C = math.sqrt(2.0)
ROOT_CHUNK = 8


class ProgramSearch:
    """The pipeline as the search's first decision, on one mesh: the root's children are the
    programs -- the step as written, and each pipeline of its scanned stacks over an axis of
    the mesh (``pipelines_over``) -- each with its own tree (a ``Session``: the decisions
    within that program, its hand plans scored first). UCT at the root picks the tree the
    next ``chunk`` simulations go to: a program's reward is the best step time any program
    found over its own best (1 for the leader; 0 where no plan fits yet), explored by
    ``c * sqrt(ln N / n)`` (N visits in all, n its own; every program visited once first),
    so a program that cannot pay is left after a few looks and one that can takes the
    simulations. Incremental like one session: ``step(n)``, ``run(seconds)``, again to
    resume; ``result()``: the programs tried, best first, and the time to the best.

    ``make(mesh, pipeline)`` builds a candidate's session; ``candidates``: the (mesh,
    pipeline) pairs, pipeline None for the step as written; ``c``: the exploration constant;
    ``chunk``: the simulations one visit runs. Raises PartexError for ``chunk`` < 1."""

    def __init__(self, make: Callable[[MeshSpec, Pipeline | None], Searched],
                 candidates: Sequence[tuple[MeshSpec, Pipeline | None]], *, c: float = ROOT_C,
                 chunk: int = ROOT_CHUNK):
        if chunk < 1:
            raise PartexError(f"a visit runs at least one simulation, got chunk={chunk}")
        t0 = time.perf_counter()
        self.trials, self._live = _trials(make, candidates)
        self.setup_s = time.perf_counter() - t0  # seconds building the programs' sessions
        self.c, self.chunk = float(c), int(chunk)
        self.visits = [0] * len(self._live)
        self.seconds = 0.0  # search seconds, all the trees'
        self._best = min((_score(t) for t in self._live), default=math.inf)
        # search seconds when the best step time so far was found (0: a hand plan, before any)
        self.best_at: float | None = 0.0 if self._best < math.inf else None
        self._stop = False

    def request_stop(self) -> None:
        """Ask a running ``step``/``run`` to return after the simulation in hand (signal-safe)."""
        self._stop = True
        for t in self._live:
            if t.session is not None:
                t.session.request_stop()

    def _pick(self) -> int:
        total = sum(self.visits) + 1
        top = self._best

        def ucb(k: int) -> float:
            n = self.visits[k]
            if n == 0:
                return math.inf
            score = _score(self._live[k])
            return (top / score if score < math.inf else 0.0) + self.c * math.sqrt(math.log(total) / n)

        return max(range(len(self._live)), key=ucb)

    def _visit(self, k: int, n: int) -> None:
        t = self._live[k]
        assert t.session is not None
        before = t.session.stats().seconds
        t.session.step(n)
        self.visits[k] += 1
        t.rounds = self.visits[k]
        _record(t)
        if _score(t) < self._best:
            best = t.session.best()
            assert best is not None
            self._best = _score(t)
            self.best_at = self.seconds + max(0.0, best.seconds - before)
        self.seconds += t.session.stats().seconds - before

    def step(self, n: int) -> "ProgramSearch":
        """Run ``n`` simulations in all, ``chunk`` at a time in the tree UCT picks."""
        left, self._stop = int(n), False
        while left > 0 and self._live and not self._stop:
            m = min(self.chunk, left)
            self._visit(self._pick(), m)
            left -= m
        return self

    def run(self, seconds: float, callback: Callable[[list[MeshTrial]], None] | None = None) -> "ProgramSearch":
        """Simulations for about ``seconds`` (the visit in hand is finished); ``callback(trials)``
        after each visit."""
        deadline, self._stop = time.perf_counter() + float(seconds), False
        while self._live and time.perf_counter() < deadline and not self._stop:
            self._visit(self._pick(), self.chunk)
            if callback is not None:
                callback(self.trials)
        return self

    def result(self) -> "MeshSearch":
        """The programs tried, best first (every session kept: each can go on)."""
        return MeshSearch(_ranked(self.trials), self.setup_s + self.seconds, best_at=self.best_at)


@dataclasses.dataclass
class MeshSearch:
    """The meshes (or one mesh's programs: ``ProgramSearch``) tried, best first, and the
    session of the best one (None: no plan fits on any)."""

    trials: list[MeshTrial]
    seconds: float  # wall seconds in all: sessions built and searched
    topology: Topology | None = None
    best_at: float | None = None  # seconds into the search when its best plan was found (time-to-best)
    converged: bool = False  # a MeshSearcher's: every tier searched to the end of its schedule
    stopped: bool = False  # a MeshSearcher's: request_stop ended it

    def how(self) -> str:
        """How the search ended, for people: converged, stopped, or the time up with
        candidates still open; and when it found its best."""
        at = f"; best found after {self.best_at:.1f} s" if self.best_at is not None else ""
        if self.converged:
            out = sum(t.status == "left out" for t in self.trials)
            return ("searched to convergence" + (f", {out} pipelined candidate{'s' if out != 1 else ''} farther from "
                                                 "the best meshes left out (a longer search tries them)" if out else "")
                    + at)
        if self.stopped:
            return "stopped: the best so far" + at
        still = sum(t.status in ("time up", "not reached") for t in self.trials)
        return (f"the time ran out with {still} candidate{'s' if still != 1 else ''} not searched to the end "
                "(give it more time)" if still else "the time ran out") + at

    @property
    def best(self) -> MeshTrial | None:
        """The first trial, when a plan fits on it (None: no plan fits on any)."""
        t = self.trials[0] if self.trials else None
        return t if t is not None and t.step_time is not None else None

    @property
    def session(self) -> "Searched | None":
        """The best trial's session (a ``Session``), where the search kept it, else None."""
        return self.best.session if self.best is not None else None

    def table(self) -> str:
        """The meshes tried, as text: one row each, best first."""
        from ._mesh import format_bytes

        piped = any(t.pipeline is not None for t in self.trials)
        pw = max([len(t.pipeline.text()) for t in self.trials if t.pipeline is not None] + [8])
        head = f" {'pipeline':<{pw}} {'bubble':>6}" if piped else ""
        rows = [f"  {'mesh':<34}{head} {'hand plans':>12} {'searched':>12} {'MFU':>7} {'memory':>11} "
                f"{'sims':>6} {'rounds':>6}"]
        for t in self.trials:
            pipe = ""
            if piped:
                b = t.bubble
                pipe = f" {t.pipeline.text() if t.pipeline else '-':<{pw}} {f'{b:.0%}' if b is not None else '-':>6}"
            if t.note:
                rows.append(f"  {t.mesh.text():<34}{pipe} not searched: {t.note}")
                continue
            if t.status in ("open", "not reached", "left out"):
                rows.append(f"  {t.mesh.text():<34}{pipe} " + ("left out: farther from the best meshes than this "
                                                              "search's effort reaches" if t.status == "left out" else
                                                              "not reached: the search ended first"))
                continue
            warm = f"{t.warm_step * 1e3:.2f} ms" if t.warm_step is not None else "none fits"
            step = f"{t.step_time * 1e3:.2f} ms" if t.step_time is not None else "none fits"
            mfu = f"{t.mfu:.1%}" if t.mfu is not None else "-"
            rows.append(f"  {t.mesh.text():<34}{pipe} {warm:>12} {step:>12} {mfu:>7} {format_bytes(t.memory):>11} "
                        f"{t.simulations:>6} {t.rounds:>6}")
        return "\n".join(rows)

    def to_json(self) -> dict:
        """The search as JSON data: topology, seconds, the chosen mesh and pipeline, and every
        trial (``MeshTrial.to_json``), best first."""
        best = self.best
        return {"topology": self.topology.text() if self.topology else None, "seconds": self.seconds,
                "best_at_s": self.best_at, "converged": self.converged, "stopped": self.stopped,
                "chosen": best.mesh.text() if best else None,
                "chosen_pipeline": best.pipeline.text() if best and best.pipeline else None,
                "meshes": [t.to_json() for t in self.trials]}


def mesh_tiers(devices: int, link_bandwidth: float | None, *, topology: Topology | None = None, max_axes: int = 4,
               stacks: Sequence[StackShape | tuple[str, int, int]] = (), pipelines: bool | None = None
               ) -> list[list]:
    """The candidates of a mesh search, by tier, narrowest first: the meshes of up to
    ``max_axes`` axes, then the pipelined candidates (``pipelines``: None over the slices of
    a topology of several, True within a slice too, False none). A search without pipelines
    is a prefix of one with them."""
    tiers: list[list] = [list(candidate_meshes(devices, topology, max_axes, link_bandwidth))]
    if pipelines is not False and stacks and (pipelines or (topology is not None and topology.granules > 1)):
        tiers.append(candidate_pipelines(stacks, devices, topology, max_axes, link_bandwidth, within=bool(pipelines)))
    return [tier for tier in tiers if tier]


def mesh_searcher(make: Callable[[MeshSpec, Pipeline | None], Searched], devices: int, link_bandwidth: float, *,
                  topology: "str | Topology | None" = None, max_axes: int = 4, effort: float = 1.0,
                  stacks: Sequence[StackShape | tuple[str, int, int]] = (), pipelines: bool | None = None
                  ) -> MeshSearcher:
    """The search over the meshes of ``devices`` (module docstring), built, not run:
    ``make(mesh, pipeline)`` a session on one (``Session.search_meshes`` and
    ``partex.search_meshes`` pass the model's); ``link_bandwidth``: bytes/s of the links
    inside a slice; ``topology``: 'SLICESxDEVICES[@GB/s]' or a Topology. ``stacks``: the
    model's stacks that may be pipelined (``StackShape``s); ``pipelines``: None tries them
    over the slow axis of a topology of several slices, True within a slice too, False never.
    ``effort``: the schedule's scale (``effort_of``)."""
    topo = Topology.parse(topology, devices) if isinstance(topology, str) else topology
    tiers = mesh_tiers(devices, link_bandwidth, topology=topo, max_axes=max_axes, stacks=stacks, pipelines=pipelines)
    return MeshSearcher(make, tiers, topology=topo, effort=effort)
