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
``search_meshes`` runs one search per candidate (a ``Searched``: a ``Session`` each) by successive halving:
every candidate starts from its hand plans, then rounds of MCTS, each giving the better half
of the candidates still in twice the time, until one is left or the time is spent.

On one mesh the pipeline is a decision of the search itself (``ProgramSearch``): the step as
written and each of its pipelines over an axis of the mesh (``pipelines_over``) are the
children of one root, each with its own tree, and UCT at the root decides which tree the next
simulations go to, incrementally, as one session's search. Owns ``Topology``,
``candidate_meshes``, ``candidate_pipelines``, ``pipelines_over``, ``MeshTrial``,
``search_meshes`` and ``ProgramSearch``.
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

    def run(self, seconds: float) -> Any: ...

    def step(self, n: int = 1) -> Any: ...

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
    session: "Searched | None" = dataclasses.field(default=None, repr=False)

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
                "note": self.note}


def _score(trial: MeshTrial) -> float:
    return trial.step_time if trial.step_time is not None else math.inf


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


def search_meshes(make: Callable[[MeshSpec, Pipeline | None], Searched],
                  meshes: Sequence[MeshSpec | tuple[MeshSpec, Pipeline | None]], seconds: float, *,
                  keep: int = 1, callback: Callable[[list[MeshTrial]], None] | None = None
                  ) -> list[MeshTrial]:
    """Successive halving over ``meshes`` (module docstring; a mesh, or a mesh and the
    pipeline its step runs): ``make(mesh, pipeline)`` builds a session (its hand plans
    scored), then rounds of MCTS share ``seconds`` until ``keep`` candidates are left.
    Returns every trial, best first (one no plan fits on, or that the model cannot use,
    last); the survivors keep their sessions, the rest drop them. ``callback(trials)`` after
    each round."""
    trials, live = _trials(make, meshes)
    if callback is not None:
        callback(trials)
    rounds = max(1, math.ceil(math.log2(max(len(live), 1)))) if len(live) > keep else 1
    deadline = time.perf_counter() + seconds
    for r in range(rounds):
        left = deadline - time.perf_counter()
        if left <= 0 or not live:
            break
        share = left / (rounds - r) / len(live)
        for t in live:
            assert t.session is not None
            t.session.run(share)
            t.rounds += 1
            _record(t)
        live.sort(key=_score)
        survivors = live[:max(keep, math.ceil(len(live) / 2))] if r < rounds - 1 else live[:keep]
        for t in live[len(survivors):]:
            t.session = None
        live = survivors
        if callback is not None:
            callback(trials)
    kept = {id(t) for t in live}
    for t in trials:
        if id(t) not in kept:
            t.session = None
    return _ranked(trials)


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
        try:
            t.session = make(t.mesh, t.pipeline)
        except PartexError as e:  # an axis that divides no dimension of the model
            t.note = str(e)
            continue
        best = t.session.best()
        t.warm_step = best.report.step_time if best is not None else None
        _record(t)
        live.append(t)
    return trials, live


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
    best_at: float | None = None  # a ProgramSearch's search seconds to its best plan (time-to-best)

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
                "best_at_s": self.best_at,
                "chosen": best.mesh.text() if best else None,
                "chosen_pipeline": best.pipeline.text() if best and best.pipeline else None,
                "meshes": [t.to_json() for t in self.trials]}


def mesh_search(make: Callable[[MeshSpec, Pipeline | None], Searched], devices: int, link_bandwidth: float, *,
                topology: "str | Topology | None" = None, seconds: float = 60.0, max_axes: int = 4,
                callback: Callable[[list[MeshTrial]], None] | None = None,
                stacks: Sequence[StackShape | tuple[str, int, int]] = (), pipelines: bool | None = None) -> MeshSearch:
    """Search the meshes of ``devices`` with the plan (module docstring): ``make(mesh,
    pipeline)`` a session on one (``Session.search_meshes`` and ``partex.search_meshes`` pass
    the model's); ``link_bandwidth``: bytes/s of the links inside a slice; ``topology``:
    'SLICESxDEVICES[@GB/s]' or a Topology. ``stacks``: the model's stacks that may be
    pipelined (``StackShape``s); ``pipelines``: None tries them over the slow axis
    of a topology of several slices, True within a slice too, False never."""
    t0 = time.perf_counter()
    topo = Topology.parse(topology, devices) if isinstance(topology, str) else topology
    meshes: list = list(candidate_meshes(devices, topo, max_axes, link_bandwidth))
    if pipelines is not False and stacks and (pipelines or (topo is not None and topo.granules > 1)):
        meshes += candidate_pipelines(stacks, devices, topo, max_axes, link_bandwidth, within=bool(pipelines))
    trials = search_meshes(make, meshes, seconds, callback=callback)
    return MeshSearch(trials, time.perf_counter() - t0, topo)
