"""The overlap schedule: collectives run under compute, as XLA's latency-hiding scheduler runs them.

Owns ``Timeline`` (the program as the schedule reads it, built once per program),
``schedule_of`` (an aggregate's collectives per op, memoised on the aggregate) and
``overlapped`` (one plan's step time with collectives overlapping compute, and the seconds
the step waits for each collective). One compute stream runs the ops in program order; one
link per mesh axis runs the collectives over it (``SimState``). Imports ``_facts`` and the
program and rule types; reads the tables and the aggregates, changes neither.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..analysis._rules import PSEUDO_OPS
from ..tracing._program import NO_PRODUCER
from ._facts import having
from ._patterns import HOST_LINK

if TYPE_CHECKING:
    from ._aggregate import Aggregate
    from ._tables import Tables

# Collectives of values there from the start (weights) that XLA's scheduler keeps ahead of
# their readers: the one read next and the one after (memory bounds how far it prefetches)
PREFETCH = 2


class Issue(NamedTuple):
    """A collective an op issues, as the schedule reads it."""

    position: int  # the collective's index in its pattern's collectives
    seconds: float  # one execution
    operand: int  # the operand it reshards (-1: a result's, issued after the op)
    pattern: int
    axes: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Timeline:
    """The program as the overlap schedule reads it."""

    region_ops: dict  # region -> its own ops in program order
    child_at: dict  # a loop's or branch's exit op -> its region
    loops: dict  # scan region -> (trips per parent trip, values it carries to the next trip)
    readers: list  # per value: the ops that read it
    static_special: np.ndarray  # per op: visited whatever the plan (a loop's exit)
    early: list  # per value: there at the start of the step or of its loop
    view_op: list  # per op: a view or a loop boundary (no compute of its own)
    ins: list  # per op: its operands
    outs: list  # per op: its results


def build_timeline(program) -> Timeline:
    p = program
    values = p.values
    views = having("view")
    # Values there at the start of the step or of a loop, whatever the plan: the step's
    # inputs, and what views of them make (a weight cast to bf16, transposed, a layer's
    # slice of a stacked weight a scan reads) or copies of them (``device_put``: a weight a
    # step keeps in host memory, copied to the device). A collective of one can run ahead
    # of its reader: XLA prefetches FSDP's weight gathers under the previous layer's compute.
    early = np.zeros(len(values), dtype=bool)
    for v in values:
        early[v.id] = v.producer == NO_PRODUCER
    for op in p.ops:
        if op.primitive == "scan_enter":
            nc = op.params["num_carry"]
            for j, (i, o) in enumerate(zip(op.inputs, op.outputs)):
                early[o] = j >= nc and early[i]
        elif (op.primitive in views or op.primitive == "device_put") and op.inputs and all(early[i] for i in op.inputs):
            early[list(op.outputs)] = True
    region_ops: dict[int, list[int]] = {r.id: [] for r in p.regions}
    for op in p.ops:
        region_ops[op.region].append(op.id)
    child_at = {r.exit: r.id for r in p.regions[1:] if r.exit >= 0}
    loops = {}  # scan region -> (trips per parent trip, carried-out values)
    for r in p.regions[1:]:
        if r.kind == "scan" and r.exit >= 0:
            ex = p.ops[r.exit]
            parent = p.regions[r.parent].trip
            loops[r.id] = (max(1, r.trip // max(1, parent)), tuple(ex.inputs[:ex.params["num_carry"]]))
    readers: list[list[int]] = [[] for _ in values]
    for op in p.ops:
        for v in set(op.inputs):
            readers[v].append(op.id)
    view_op = np.array([op.primitive in views or op.primitive in PSEUDO_OPS for op in p.ops], dtype=bool)
    static_special = np.zeros(len(p.ops), dtype=bool)
    static_special[list(child_at)] = True
    return Timeline(
        {r: np.array(ids, dtype=np.int64) for r, ids in region_ops.items()},
        child_at, loops, readers, static_special, early.tolist(), view_op.tolist(),
        [op.inputs for op in p.ops], [op.outputs for op in p.ops])


def schedule_of(t: "Tables", tl: Timeline, agg: "Aggregate") -> tuple[dict, np.ndarray]:
    """An aggregate's collectives per op (``Issue``s), and the ops the overlap schedule
    visits for them: their own, and the readers (through views) of the values they reduce
    or reshard after the op. Memoised on the aggregate (``Aggregate.schedule``)."""
    if agg.schedule is not None:
        return agg.schedule
    p = t.program
    ops: dict[int, list] = {}
    stack = []
    for pi, cl in agg.colls:
        lst = [Issue(k, x.time, x.operand, pi, x.axes) for k, x in enumerate(cl) if x.time > 0]
        if not lst:
            continue
        result = any(x.operand < 0 for x in lst)
        for o in t.patterns[pi].ops:
            ops[o] = lst
            if result:
                stack += p.ops[o].outputs
    visit = set(ops)
    seen = set()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        for r in tl.readers[v]:
            visit.add(r)
            if tl.view_op[r]:
                stack += p.ops[r].outputs
    agg.schedule = (ops, np.fromiter(visit, dtype=np.int64, count=len(visit)))
    return agg.schedule


class SimState:
    """The streams' clocks while the overlap schedule runs: one for compute, one per mesh
    axis for the collectives over it (a collective over several axes takes them all; those
    over different axes run side by side on their own links)."""

    __slots__ = ("tc", "free", "horizon", "pending", "busy", "readers")

    def __init__(self, axes):
        self.tc = self.horizon = 0.0
        self.readers = collections.deque(maxlen=PREFETCH)  # the last readers of prefetched values: starts
        self.free = dict.fromkeys(axes, 0.0)  # axis -> when its link is next free
        self.pending: dict = {}  # value -> (time its collective is done, (pattern, collective))
        self.busy: dict = {a: [] for a in axes}  # axis -> [(start, end, (pattern, collective))]

    @property
    def tm(self) -> float:
        return max(self.free.values(), default=0.0)

    def issue(self, ready: float, dur: float, axes, key) -> float:
        """Run a collective over ``axes`` in the first time from ``ready`` on that their
        links are all free for ``dur`` (a weight prefetched into a gap ahead of reductions
        issued before it); returns when it is done."""
        t = ready
        while True:
            t0 = t
            for a in axes:
                t = self._gap(self.busy[a], t, dur)
            if t == t0:
                break
        e = t + dur
        for a in axes:
            lst = self.busy[a]
            lst.insert(bisect.bisect(lst, (t, e, ())), (t, e, key))
            if e > self.free[a]:
                self.free[a] = e
        return e

    @staticmethod
    def _gap(lst, t: float, dur: float) -> float:
        """The first time from t on that the link of the busy list is free for dur."""
        i = bisect.bisect(lst, (t,))
        if i and lst[i - 1][1] > t:
            t = lst[i - 1][1]
        while i < len(lst) and lst[i][0] < t + dur:
            t = max(t, lst[i][1])
            i += 1
        return t

    def wait(self, until: float, key, mult: float, exposed: dict) -> None:
        """The compute stream waits until ``until``: each moment of the wait is charged to
        the collective running then that ends last (a moment no link is busy, to ``key``,
        the one waited for)."""
        a = self.tc
        if until <= a:
            return
        spans = set()
        for lst in self.busy.values():
            for s, e, k in reversed(lst):
                if e <= a:
                    break
                if s < until:
                    spans.add((max(s, a), min(e, until), k))
        if len(spans) == 1:
            ((s, e, k),) = spans
            exposed[k] += (e - s) * mult
            if until - a - (e - s) > 1e-15:
                exposed[key] += (until - a - (e - s)) * mult
            self.tc = until
            return
        cuts = sorted({a, until} | {x for s, e, _ in spans for x in (s, e)})
        for lo, hi in zip(cuts, cuts[1:]):
            live = [(e, k) for s, e, k in spans if s <= lo and e >= hi]
            exposed[max(live)[1] if live else key] += (hi - lo) * mult
        self.tc = until

    def shift(self, since: dict, by: dict) -> None:
        """Move what each link ran after ``since`` later by ``by`` (a loop's trips)."""
        for a, lst in self.busy.items():
            self.busy[a] = [(s + by[a], e + by[a], k) if s >= since[a] else (s, e, k) for s, e, k in lst]
        dm = max(by.values(), default=0.0)
        t0 = min(since.values(), default=0.0)
        self.pending = {v: (t + dm, k) if t > t0 else (t, k) for v, (t, k) in self.pending.items()}
        for a in self.free:
            self.free[a] += by[a]


class _Run:
    """One run of the schedule: the clocks, the plan's per-op compute seconds and
    collectives, and what it charges the collectives."""

    __slots__ = ("st", "tl", "op_c", "opc", "op_colls", "special", "exposed", "pending", "hoisted", "later")

    def __init__(self, st: SimState, tl: Timeline, op_c: np.ndarray, op_colls: dict, special: np.ndarray,
                 hoisted: dict | None = None):
        self.st, self.tl, self.op_c, self.op_colls, self.special = st, tl, op_c, op_colls, special
        # op -> {collective index: the loops XLA hoists it out of}: issued on their first trip only
        self.hoisted: dict[int, dict[int, tuple[int, ...]]] = {}
        for (o, k), loops in (hoisted or {}).items():
            self.hoisted.setdefault(o, {})[k] = loops
        self.later: set[int] = set()  # the loops being scheduled in a later trip than their first
        self.opc = op_c.tolist()
        self.exposed: dict = collections.defaultdict(float)
        # The regions read and write the pending dict the run starts with; SimState.shift
        # (a loop's steady state) gives the state a new one, which loops read.
        self.pending = st.pending


def overlapped(t: "Tables", tl: Timeline, aggs, dup_ops, hoisted=None) -> tuple[float, dict]:
    """The step's time with collectives overlapping compute, as XLA's latency-hiding
    scheduler runs them on TPU and GPU: one compute stream runs the ops in program order,
    one communication stream the collectives in the order they are issued.

    - A collective runs in the first gap from its ready time on that its mesh axes'
      links are free (one link per axis: collectives over different axes run side by
      side).
    - An operand's collective is ready when its value is: a value there from the start
      (an input or a view of one: a weight) once the reader of the collective of such a
      value PREFETCH before it has started (a layer's weights gathered under the
      previous layer's compute, within a scan too); another value's when its reader is
      next. The reader waits for it.
    - A result's collective (a reduction of partial sums, a reshard) starts when the op
      is done and the link free; the first op that reads the value (other than through
      views) waits for it: a gradient's reduction runs under the rest of the backward
      pass, a tensor-parallel all-reduce that the next op reads does not hide.
    - A scan's body is scheduled twice (the second trip in steady state, its weights
      fetched under the first's compute) and the second trip counted for the rest.

    ``aggs``: the plan's aggregates, one per entry of ``t.mask_groups``; ``dup_ops``: the
    (op, collective) pairs CSE makes free; ``hoisted``: (op, collective) -> the loops XLA
    hoists it out of (``Reshards.hoisted``), issued on their first trip only. Returns (seconds, (pattern, collective) ->
    seconds per step the step waits for it)."""
    pat_c = np.zeros(len(t.patterns))
    op_colls: dict[int, list] = {}
    special = tl.static_special.copy()
    for (_, pis), agg in zip(t.mask_groups, aggs):
        pat_c[pis] = agg.per
        if agg.colls:
            ops, at = schedule_of(t, tl, agg)
            op_colls.update(ops)
            special[at] = True
    for o, k in dup_ops:  # a reshard done before: read again for free
        lst = op_colls.get(o)
        if lst is not None:
            op_colls[o] = [x for x in lst if x.position != k]
    st = SimState(t.axes + (HOST_LINK,))
    run = _Run(st, tl, pat_c[t.op_pattern], op_colls, special, hoisted)
    _region(run, 0, 1.0)
    if st.tm > st.tc:  # the step ends when the links are done
        st.wait(st.tm, max((lst[-1][1], lst[-1][2]) for lst in st.busy.values() if lst)[1], 1.0, run.exposed)
    return st.tc, run.exposed


def _region(run: _Run, rid: int, mult: float) -> None:
    """Schedule one trip of a region's ops (``mult``: the trips it stands for). Only the
    ops that issue or wait for a collective, and loop exits, are visited one by one; the
    compute between them is added in one sum."""
    st, tl, exposed, pending = run.st, run.tl, run.exposed, run.pending
    opc, op_colls, ins, outs, early, view_op = run.opc, run.op_colls, tl.ins, tl.outs, tl.early, tl.view_op
    issue, wait = st.issue, st.wait
    ids = tl.region_ops[rid]
    cum = np.concatenate(([0.0], np.cumsum(run.op_c[ids]))).tolist()
    sel = np.flatnonzero(run.special[ids])
    last = 0
    for pos, o in zip(sel.tolist(), ids[sel].tolist()):
        st.tc += cum[pos] - cum[last]
        last = pos + 1
        child = tl.child_at.get(o)
        if child is not None:
            _loop(run, child, mult)
        start, binding = st.tc, None
        op_in = ins[o]
        for v in op_in:
            r = pending.get(v)
            if r is not None and r[0] > start:
                start, binding = r
        lst = op_colls.get(o, ())
        if lst and run.later and o in run.hoisted:  # hoisted out of a loop in a later trip: done
            h = run.hoisted[o]
            lst = [x for x in lst if not (x[0] in h and run.later.intersection(h[x[0]]))]
        if not lst:
            if binding is not None:
                if view_op[o]:
                    for v in outs[o]:  # a view of a value still being reduced: its reader waits
                        pending[v] = (start, binding)
                else:
                    wait(start, binding, mult, exposed)
            st.tc += opc[o]
            continue
        prefetched = False
        for k, dur, i, pi, axes in lst:
            if i < 0:
                continue
            v = op_in[i]
            if early[v]:
                ready, prefetched = st.horizon, True
            else:
                r = pending.get(v)
                ready = st.tc if r is None else max(st.tc, r[0])
            done = issue(ready, dur, axes, (pi, k))
            if done > start:
                start, binding = done, (pi, k)
        if prefetched:  # the next such collective may start once this op's K-1st successor starts
            st.readers.append(start)
            if len(st.readers) == PREFETCH:
                st.horizon = st.readers[0]
        if binding is not None:
            wait(start, binding, mult, exposed)
        st.tc += opc[o]
        key, done = None, 0.0
        for k, dur, i, pi, axes in lst:
            if i < 0:
                key = (pi, k)
                done = issue(st.tc, dur, axes, key)
        if key is not None:
            for v in outs[o]:
                pending[v] = (done, key)
    st.tc += cum[-1] - cum[last]


def _loop(run: _Run, rid: int, mult: float) -> None:
    """A loop's body: two trips scheduled, the second in steady state, the rest of the
    trips as copies of the second (the links' timelines shifted)."""
    st = run.st
    length, carried = run.tl.loops.get(rid, (1, ()))
    marks = []
    for trip in range(min(length, 2)):
        if trip:
            run.later.add(rid)
        _region(run, rid, mult if trip == 0 else mult * (length - 1))
        for v in carried:  # the next trip reads what this one carries
            r = st.pending.get(v)
            if r is not None:
                st.wait(r[0], r[1], mult if trip == 0 else mult * (length - 1), run.exposed)
        marks.append((st.tc, dict(st.free), st.horizon))
    run.later.discard(rid)
    if len(marks) == 2 and length > 2:
        (c1, m1, h1), (c2, m2, h2) = marks
        n = length - 2
        st.shift(m1, {a: n * (m2[a] - m1[a]) for a in m2})
        st.tc, st.horizon = c2 + n * (c2 - c1), h2 + n * (h2 - h1)
