"""The overlap schedule: collectives run under compute, as XLA's latency-hiding scheduler runs them.

Owns ``Timeline`` (the program as the schedule reads it, built once per program, with its
periodic stretches: ``_periodic``), ``schedule_of`` (an aggregate's collectives per pattern,
memoised on the aggregate) and ``overlapped`` (one plan's step time with collectives
overlapping compute, and the seconds the step waits for each collective). One compute stream
runs the ops in program order; one link per mesh axis runs the collectives over it
(``SimState``). Unrolled layers are run until their schedule repeats and then counted
(``_periodic``, ``_repeat``), so a plan's schedule costs about the same at any depth.

Pricing side: imports ``_records``, ``_facts``, ``_periodic`` and the program and rule
types; reads the tables and the aggregates, changes neither.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
from typing import NamedTuple, Sequence

import numpy as np

from ..analysis._rules import PSEUDO_OPS
from ..tracing._program import NO_PRODUCER
from ._facts import having
from ._periodic import Periodic, periodic_stretches
from ._records import HOST_LINK, Aggregate, Tables

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
    # region -> its periodic stretches (unrolled layers: ``_periodic``), by start; empty
    # where the schedule runs every op
    periodic: dict = dataclasses.field(default_factory=dict)
    pos: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # per op: its position in its region's ops
    # value -> (its stretch and place in a period, as one number; the period) where a stretch makes it
    made_in: dict = dataclasses.field(default_factory=dict)
    op_pattern: list = dataclasses.field(default_factory=list)  # per op: its pattern
    pattern_group: list = dataclasses.field(default_factory=list)  # per pattern: its aggregate (tables' mask group)
    pattern_ops: list = dataclasses.field(default_factory=list)  # per pattern: its ops (an array)
    readers_of: dict = dataclasses.field(default_factory=dict)  # pattern -> _result_readers, filled as asked
    region_patterns: dict = dataclasses.field(default_factory=dict)  # region -> its ops' patterns (an array)


def build_timeline(t: Tables, periodic: bool = True) -> Timeline:
    """``periodic``: extrapolate the periodic stretches (found by the ops' patterns: ops of
    one pattern cost alike under every plan); False: run every op."""
    p = t.program
    op_pattern = t.op_pattern if periodic else None
    pattern_group = np.zeros(len(t.patterns), dtype=np.int64)
    for g, (_, pis) in enumerate(t.mask_groups):
        pattern_group[pis] = g
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
    region_ids = {r: np.array(ids, dtype=np.int64) for r, ids in region_ops.items()}
    stretches, pos = {}, np.zeros(len(p.ops), dtype=np.int64)
    early_l = early.tolist()
    for r, ids in region_ids.items():
        pos[ids] = np.arange(len(ids))
        if op_pattern is not None and len(ids):
            sym = op_pattern[ids].astype(np.int64)
            exits = static_special[ids]
            sym[exits] = -1 - np.arange(int(exits.sum()))  # no stretch runs across a loop
            found = periodic_stretches(p, ids, sym, early_l, readers, view_op)
            if found:
                stretches[r] = found
    made_in, places = {}, 0
    for found in stretches.values():
        for per in found:
            for j, row in enumerate(per.outs.tolist()):
                for q, v in enumerate(row):
                    made_in[v] = (places + q, j)
            places += per.outs.shape[1]
    return Timeline(
        region_ids, child_at, loops, readers, static_special, early_l, view_op.tolist(),
        [op.inputs for op in p.ops], [op.outputs for op in p.ops], stretches, pos, made_in,
        t.op_pattern.tolist(), pattern_group.tolist(), [np.array(pt.ops, dtype=np.int64) for pt in t.patterns], {},
        {r: t.op_pattern[ids] for r, ids in region_ids.items()})


def schedule_of(t: Tables, tl: Timeline, agg: Aggregate) -> tuple[dict, np.ndarray]:
    """An aggregate's collectives per pattern (``Issue``s: every op of a pattern issues
    them), and the ops the overlap schedule visits for them: their own, and the readers
    (through views) of the values they reduce or reshard after the op. Memoised on the
    aggregate (``Aggregate.schedule``)."""
    if agg.schedule is not None:
        return agg.schedule
    issues: dict[int, list] = {}
    visit = []
    for pi, cl in agg.colls:
        lst = [Issue(k, x.time, x.operand, pi, x.axes) for k, x in enumerate(cl) if x.time > 0]
        if not lst:
            continue
        issues[pi] = lst
        visit.append(tl.pattern_ops[pi])
        if any(x.operand < 0 for x in lst):
            visit.append(_result_readers(t, tl, pi))
    at = np.unique(np.concatenate(visit)) if visit else np.zeros(0, dtype=np.int64)
    agg.schedule = (issues, at)
    return agg.schedule


def _result_readers(t: Tables, tl: Timeline, pi: int) -> np.ndarray:
    """The ops that read (through views) what a pattern's ops make: where the schedule
    waits for a reduction of their results. Kept on the timeline, per pattern."""
    r = tl.readers_of.get(pi)
    if r is None:
        p = t.program
        stack = [v for o in t.patterns[pi].ops for v in p.ops[o].outputs]
        seen, out = set(), set()
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            for x in tl.readers[v]:
                out.add(x)
                if tl.view_op[x]:
                    stack += p.ops[x].outputs
        r = tl.readers_of[pi] = np.fromiter(out, dtype=np.int64, count=len(out))
    return r


class SimState:
    """The streams' clocks while the overlap schedule runs: one for compute, one per mesh
    axis for the collectives over it (a collective over several axes takes them all; those
    over different axes run side by side on their own links)."""

    __slots__ = ("tc", "free", "horizon", "pending", "busy", "readers", "log", "later", "later_end")

    def __init__(self, axes):
        self.tc = self.horizon = 0.0
        self.readers = collections.deque(maxlen=PREFETCH)  # the last readers of prefetched values: starts
        self.free = dict.fromkeys(axes, 0.0)  # axis -> when its link is next free
        self.pending: dict = {}  # value -> (time its collective is done, (pattern, collective))
        self.busy: dict = {a: [] for a in axes}  # axis -> [(start, end, (pattern, collective))]
        self.log: dict = {a: [] for a in axes}  # axis -> its busy entries in the order they were issued
        # Counted periods' collectives (``_repeat``) that ended before the schedule's window:
        # (axis, a period's entries, periods, time per period); put on the busy lists only
        # when a collective is placed from a time before ``later_end`` (a stale prefetch
        # horizon), the one thing that reads that far back
        self.later: list = []
        self.later_end = -np.inf

    @property
    def tm(self) -> float:
        return max(self.free.values(), default=0.0)

    def issue(self, ready: float, dur: float, axes, key) -> float:
        """Run a collective over ``axes`` in the first time from ``ready`` on that their
        links are all free for ``dur`` (a weight prefetched into a gap ahead of reductions
        issued before it); returns when it is done."""
        if ready < self.later_end:
            self.place_later()
        t = ready
        while True:
            t0 = t
            for a in axes:
                t = self._gap(self.busy[a], t, dur)
            if t == t0:
                break
        e = t + dur
        entry = (t, e, key)
        for a in axes:
            lst = self.busy[a]
            lst.insert(bisect.bisect(lst, (t, e, ())), entry)
            self.log[a].append(entry)
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

    def place_later(self) -> None:
        """Put the counted periods' collectives on the busy lists (``later``)."""
        for a, chunk, n, g in self.later:
            lst = self.busy[a]
            lst += [(s0 + j * g, e0 + j * g, key) for j in range(1, n + 1) for s0, e0, key in chunk]
            lst.sort()
        self.later = []
        self.later_end = -np.inf

    def shift(self, since: dict, by: dict) -> None:
        """Move what each link ran after ``since`` later by ``by`` (a loop's trips)."""
        if self.later:
            self.place_later()
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

    __slots__ = ("st", "tl", "pat_c", "secs", "by_group", "dup", "special", "exposed", "pending", "hoisted", "later",
                 "dup_ops", "uniform", "ptime", "_marks", "counted")

    def __init__(self, st: SimState, tl: Timeline, pat_c: np.ndarray, by_group: list, special: np.ndarray,
                 hoisted: dict | None, dup_ops: tuple):
        self.st, self.tl, self.by_group, self.special = st, tl, by_group, special
        self.pat_c = pat_c  # per pattern: one execution's compute seconds
        self.secs = pat_c.tolist()
        self.dup = np.zeros(len(special), dtype=bool)  # per op: CSE finds one of its reshards done
        self.dup[dup_ops[0]] = True
        # op -> {collective index: the loops XLA hoists it out of}: issued on their first trip only
        self.hoisted: dict[int, dict[int, tuple[int, ...]]] = {}
        for (o, k), loops in (hoisted or {}).items():
            self.hoisted.setdefault(o, {})[k] = loops
        self.dup_ops = dup_ops
        self.later: set[int] = set()  # the loops being scheduled in a later trip than their first
        self.exposed: dict = collections.defaultdict(float)
        # The regions read and write the pending dict the run starts with; SimState.shift
        # (a loop's steady state) gives the state a new one, which loops read.
        self.pending = st.pending
        self.ptime = np.full(len(tl.early), -np.inf)  # per value: its pending time (-inf: none)
        # a stretch's place (Timeline.made_in) -> (period, periods counted after it, pending
        # time there, time per period, collective): the pending values of counted periods (``_repeat``)
        self.counted: dict = {}
        self.uniform: dict = {}  # id(Periodic) -> its first period whose ops issue as the rest's
        self._marks = None

    def colls(self, o: int) -> Sequence:
        """The collectives op ``o`` issues under the plan (``Issue``s), but the reshards CSE
        finds done before (read again for free)."""
        tl = self.tl
        pi = tl.op_pattern[o]
        issues = self.by_group[tl.pattern_group[pi]]
        lst = issues.get(pi, ()) if issues is not None else ()
        if lst and self.dup[o]:
            done = set(self.dup_ops[1][self.dup_ops[0] == o].tolist())
            lst = [x for x in lst if x.position not in done]
        return lst

    def marks(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The (op, collective) pairs CSE finds done, and those hoisted out of loops, as
        (ops, a code per pair: equal for equal collective indices and loops)."""
        if self._marks is None:
            out = []
            if len(self.dup_ops[0]):
                out.append(self.dup_ops)
            if self.hoisted:
                codes: dict = {}
                items = [(o, codes.setdefault((k, loops), len(codes))) for o, h in self.hoisted.items()
                         for k, loops in h.items()]
                arr = np.array(items, dtype=np.int64).reshape(-1, 2)
                out.append((arr[:, 0], arr[:, 1]))
            self._marks = out
        return self._marks


def _counted(run: _Run, v: int):
    """The pending entry of a value a counted period makes (``_repeat``), or None."""
    x = run.tl.made_in.get(v)
    if x is None:
        return None
    place, j = x
    e = run.counted.get(place)
    if e is None or not e[0] < j <= e[0] + e[1]:
        return None
    return e[2] + (j - e[0]) * e[3], e[4]


def overlapped(t: Tables, tl: Timeline, aggs, dup_ops, hoisted=None) -> tuple[float, dict]:
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
    - Unrolled layers (the timeline's periodic stretches) are scheduled one by one until
      two end in the same state relative to the clock; the layers after them but the last
      repeat that one and are counted, not run (``_periodic``).

    ``aggs``: the plan's aggregates, one per entry of ``t.mask_groups``; ``dup_ops``: the
    (op, collective) pairs CSE makes free (two arrays); ``hoisted``: (op, collective) -> the loops XLA
    hoists it out of (``Reshards.hoisted``), issued on their first trip only. Returns (seconds, (pattern, collective) ->
    seconds per step the step waits for it)."""
    pat_c = np.zeros(len(t.patterns))
    # per aggregate, its ops' collectives (an op's pattern is in one aggregate: _Run.colls)
    by_group: list = []
    special = tl.static_special.copy()
    for (_, pis), agg in zip(t.mask_groups, aggs):
        pat_c[pis] = agg.per
        if agg.colls:
            ops, at = schedule_of(t, tl, agg)
            by_group.append(ops)
            special[at] = True
        else:
            by_group.append(None)
    st = SimState(t.axes + (HOST_LINK,))
    run = _Run(st, tl, pat_c, by_group, special, hoisted, dup_ops)
    _region(run, 0, 1.0)
    if st.tm > st.tc:  # the step ends when the links are done
        st.wait(st.tm, max((lst[-1][1], lst[-1][2]) for lst in st.busy.values() if lst)[1], 1.0, run.exposed)
    return st.tc, run.exposed


def _region(run: _Run, rid: int, mult: float) -> None:
    """Schedule one trip of a region's ops (``mult``: the trips it stands for). Only the
    ops that issue or wait for a collective, and loop exits, are visited one by one; the
    compute between them is added in one sum."""
    ids = run.tl.region_ops[rid]
    cum = np.concatenate(([0.0], np.cumsum(run.pat_c[run.tl.region_patterns[rid]])))
    sel = np.flatnonzero(run.special[ids])
    at = 0
    for per in run.tl.periodic.get(rid, ()):
        a, b = np.searchsorted(sel, (per.start, per.start + per.period * per.count)).tolist()
        if a == b:  # nothing to visit there: compute only, summed with the ops around it
            continue
        _span(run, ids, cum, sel, at, per.start, mult)
        _periodic(run, rid, ids, cum, sel, per, mult)
        at = per.start + per.period * per.count
    _span(run, ids, cum, sel, at, len(ids), mult)


def _span(run: _Run, ids: np.ndarray, cum: np.ndarray, sel: np.ndarray, lo: int, hi: int, mult: float) -> None:
    """Schedule the region's ops at positions ``lo`` to ``hi`` (``cum``: their compute
    seconds summed; ``sel``: the positions to visit)."""
    st = run.st
    a, b = np.searchsorted(sel, (lo, hi)).tolist()
    at = sel[a:b]
    before = cum[at].tolist()
    after = cum[at + 1].tolist()
    last = float(cum[lo])
    for o, c0, c1 in zip(ids[at].tolist(), before, after):
        st.tc += c0 - last
        last = c1
        _visit(run, o, mult)
    st.tc += float(cum[hi]) - last


def _visit(run: _Run, o: int, mult: float) -> None:
    """Schedule op ``o``: the loop it ends, the collectives it waits for, its compute and
    the collectives it issues."""
    st, tl, exposed, pending = run.st, run.tl, run.exposed, run.pending
    ins, outs, early = tl.ins, tl.outs, tl.early
    issue, wait = st.issue, st.wait
    if tl.child_at:
        child = tl.child_at.get(o)
        if child is not None:
            _loop(run, child, mult)
    start, binding = st.tc, None
    op_in = ins[o]
    counted = run.counted
    for v in op_in:
        r = pending.get(v)
        if r is None and counted and v in tl.made_in:
            r = _counted(run, v)
        if r is not None and r[0] > start:
            start, binding = r
    pi = tl.op_pattern[o]
    issues = run.by_group[tl.pattern_group[pi]]
    lst = issues.get(pi, ()) if issues is not None else ()
    if lst and run.dup[o]:
        lst = run.colls(o)
    if lst and run.later and o in run.hoisted:  # hoisted out of a loop in a later trip: done
        h = run.hoisted[o]
        lst = [x for x in lst if not (x[0] in h and run.later.intersection(h[x[0]]))]
    secs = run.secs[pi]
    if not lst:
        if binding is not None:
            if tl.view_op[o]:
                for v in outs[o]:  # a view of a value still being reduced: its reader waits
                    pending[v] = (start, binding)
                    run.ptime[v] = start
            else:
                wait(start, binding, mult, exposed)
        st.tc += secs
        return
    prefetched = False
    for k, dur, i, pi, axes in lst:
        if i < 0:
            continue
        v = op_in[i]
        if early[v]:
            ready, prefetched = st.horizon, True
        else:
            r = pending.get(v)
            if r is None and counted and v in tl.made_in:
                r = _counted(run, v)
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
    st.tc += secs
    key, done = None, 0.0
    for k, dur, i, pi, axes in lst:
        if i < 0:
            key = (pi, k)
            done = issue(st.tc, dur, axes, key)
    if key is not None:
        for v in outs[o]:
            pending[v] = (done, key)
            run.ptime[v] = done


# Two states are the same when their times, relative to the clock, differ by at most this
# much of the clock (rounding)
SAME = 1e-10


class _Links(NamedTuple):
    """How a plan's collectives in a periodic stretch use the links (``_links``)."""

    first: int  # the first period from which every period but the last issues as the last but one does
    last: bool  # the last period issues as the one before does (and no own link's result is read there)
    axes: tuple  # the links the stretch's collectives run on
    own: frozenset  # of those, the links that may run on a clock of their own (``_links``)
    key_axes: dict  # (pattern, collective) -> its links, for the collectives the stretch issues
    prefetches: bool  # whether the stretch prefetches (collectives of values there from the start)


def _periodic(run: _Run, rid: int, ids: np.ndarray, cum: np.ndarray, sel: np.ndarray, per: Periodic,
              mult: float) -> None:
    """Schedule a periodic stretch: its periods one by one until two end in the same state
    (``_state``); then the periods after them repeat the second, each that one's time later
    (``_repeat``). The last is scheduled where it differs (its ops issue otherwise, or it
    reads what an own link reduces)."""
    p, c, s = per.period, per.count, per.start
    links = _links(run, rid, per)
    tail = 1 if links.last else 2  # the periods at the end the counted ones stop before, + 1
    prev = None
    old = -np.inf  # the latest pending time of values the periods before the last two made
    k = 0
    while k < c:
        lo = s + k * p
        before = {a: run.st.free[a] for a in links.own}
        marks = {a: len(run.st.log[a]) for a in links.axes}
        _span(run, ids, cum, sel, lo, lo + p, mult)
        n = c - k - tail  # the periods after this one that may be counted
        if n < 1:
            k += 1
            continue
        if k >= 2:
            old = max(old, _latest(run, per.outs[k - 2], links))
        cur = _state(run, per, k, old, links, before)
        if prev is not None and k >= links.first and _same(prev, cur) \
                and _settled(run, per, k, n, cur[0] - prev[0], cur[4]):
            issued = {a: run.st.log[a][m:] for a, m in marks.items()}
            _repeat(run, per, k, n, cur[0] - prev[0], prev[5], cur[6], links, issued)
            k += n
        prev = cur
        k += 1


def _links(run: _Run, rid: int, per: Periodic) -> _Links:
    """The stretch's links under this plan. A link is ``own`` when every collective on it
    reduces a result that no period but the last reads (a gradient's reduction, which the
    optimizer reads after the backward pass) and runs on such links only: the compute never
    waits for it inside the stretch, so a backlog on it may grow period by period."""
    r = run.uniform.get(id(per))
    if r is not None:
        return r
    p, c, s = per.period, per.count, per.start
    ids = run.tl.region_ops[rid]
    rows = run.special[ids[s:s + p * c]].reshape(c, p)
    same = (rows == rows[c - 2]).all(axis=1)
    # the reshards CSE finds done, and those hoisted out of loops: the same in each period
    for o, code in run.marks():
        x = run.tl.pos[o] - s
        inside = (x >= 0) & (x < p * c)
        x, code, o = x[inside], code[inside], o[inside]
        inside = ids[s + x] == o
        x, code = x[inside], code[inside]
        if not len(x):
            continue
        period = x // p
        code = code * p + x % p
        ref = np.unique(code[period == c - 2])
        per_count = np.bincount(period, minlength=c)
        same &= per_count == len(ref)
        same[np.unique(period[~np.isin(code, ref)])] = False
    bad = np.flatnonzero(~same[:c - 1])
    first = int(bad[-1]) + 1 if len(bad) else 0
    last = bool(same[c - 1])
    axes: set = set()
    shared: set = set()
    key_axes = {}
    row = ids[s + (c - 2) * p:s + (c - 1) * p]
    prefetches = False
    early, ins = run.tl.early, run.tl.ins
    offs = np.flatnonzero(run.special[row])
    for off, o in zip(offs.tolist(), row[offs].tolist()):
        for x in run.colls(o):
            axes.update(x.axes)
            prefetches = prefetches or (x.operand >= 0 and early[ins[o][x.operand]])
            key_axes[(x.pattern, x.position)] = x.axes
            if x.operand >= 0 or not per.late[off]:
                shared.update(x.axes)
            elif not per.after[off]:
                last = False  # the last period reads what an own link reduces
    own = set(axes) - shared
    for ax in key_axes.values():  # a collective over an own link and a shared one ties them
        if not own.issuperset(ax):
            own.difference_update(ax)
    r = run.uniform[id(per)] = _Links(first, last, tuple(sorted(axes)), frozenset(own), key_axes, prefetches)
    return r


def _latest(run: _Run, values: np.ndarray, links: _Links) -> float:
    """The latest pending time of ``values``, but those reduced on own links."""
    times = run.ptime[values]
    own = links.own
    if not own:
        return float(times.max()) if len(times) else -np.inf
    out = -np.inf
    for v in values[times > -np.inf].tolist():
        r = run.pending.get(v) or _counted(run, v)
        if r is not None and r[0] > out and not own.issuperset(links.key_axes.get(r[1], ())):
            out = r[0]
    return out


def _state(run: _Run, per: Periodic, k: int, old: float, links: _Links, before: dict) -> tuple:
    """The schedule's state after period ``k``, as it bears on the periods to come:
    (clock, times relative to the clock, what they are of, whether ``old`` (the pending
    values of earlier periods) is settled, the window's start, the exposure so far, per own
    link the time its backlog grew by). Only the stretch's links count, and of those the
    collectives that end after the window's start: the earliest time a collective issued
    later may start (the prefetch horizon where the stretch prefetches, the clock
    otherwise). An own link with a backlog counts by what this period added to its end."""
    st = run.st
    t = st.tc
    w = min(st.horizon, t) if links.prefetches else t
    times, what = [], []
    if links.prefetches:
        times += [st.horizon - t, *(x - t for x in st.readers)]
        what.append(len(st.readers))
    grew = {}
    for a in links.axes:
        lst = st.busy[a]
        f = st.free[a]
        if a in links.own and f > t:  # a backlog: this period's collectives, from its end before
            f0 = before[a]
            n = 0
            end = f0
            for s0, _, _ in reversed(lst):
                if s0 < f0 - SAME * t:
                    break
                n += 1
            chunk = lst[len(lst) - n:]
            for s0, e0, key in chunk:
                if abs(s0 - end) > SAME * t:  # not back to back: not a backlog the period only appends to
                    what.append(None)
                end = e0
                times += (s0 - f0, e0 - f0)
                what.append(key)
            what.append(("own", n))
            grew[a] = f - f0
            continue
        times.append(max(f, w) - t)
        n = 0
        for s0, e0, key in reversed(lst):
            if e0 <= w:
                break
            times += (s0 - t, e0 - t)
            what.append(key)
            n += 1
        what.append(n)
    own = links.own
    for rel, j in ((-1, k - 1), (0, k)):
        if j < 0:
            continue
        made = per.outs[j]
        for q in np.flatnonzero(run.ptime[made] > w).tolist():
            r = run.pending[int(made[q])]
            if not (own and own.issuperset(links.key_axes.get(r[1], ()))):
                times.append(r[0] - t)
                what.append((rel, q, r[1]))
    return t, np.array(times), tuple(what), old <= w, w, dict(run.exposed), grew


def _same(a: tuple, b: tuple) -> bool:
    if not (a[3] and b[3] and a[2] == b[2] and len(a[1]) == len(b[1]) and None not in b[2]):
        return False
    tol = SAME * max(abs(b[0]), 1e-300)
    if not bool(np.all(np.abs(a[1] - b[1]) <= tol)):
        return False
    dt = b[0] - a[0]
    # an own link's backlog: grown alike, and no less than the clock (it stays ahead of it)
    return all(abs(a[6][x] - g) <= tol and g >= dt - tol for x, g in b[6].items())


def _settled(run: _Run, per: Periodic, k: int, n: int, dt: float, w: float) -> bool:
    """Whether what the ``n`` periods after period ``k`` read from outside the stretch is
    there for each of them as it was for period ``k``: settled by the window's start, or
    pending until the same time relative to the period (``dt`` a period)."""
    if not per.outside.shape[1]:
        return True
    ptime = run.ptime
    ref = ptime[per.outside[k]]
    later = per.outside[k + 1:k + n + 1]
    times = ptime[later]
    shift = dt * np.arange(1, n + 1)[:, None]
    busy = times > w + shift
    busy_ref = ref > w
    if not busy.any():
        return not busy_ref.any()
    if not (busy == busy_ref[None, :]).all():
        return False
    tol = SAME * max(abs(run.st.tc), 1e-300)
    if not bool(np.all(np.abs(times - ref[None, :] - shift)[busy] <= tol)):
        return False
    pending = run.pending
    def key(v):
        r = pending.get(v) or _counted(run, v)
        assert r is not None  # a pending time > -inf has its entry
        return r[1]

    keys = [key(v) for v in per.outside[k][busy_ref].tolist()]
    return all([key(v) for v in row[busy_ref].tolist()] == keys for row in later)


def _repeat(run: _Run, per: Periodic, k: int, n: int, dt: float, exposed_before: dict, grew: dict,
            links: _Links, issued: dict) -> None:
    """Count ``n`` periods after period ``k``, each as period ``k``, ``dt`` later than the
    one before (an own link's collectives by its growth): their exposure, the values they
    make (pending where period ``k``'s are), the collectives they run on the links
    (``issued``: period ``k``'s, per link), and the clocks after the last of them."""
    st, pending = run.st, run.pending
    d = n * dt
    ex = run.exposed
    for key, x in list(ex.items()):
        diff = x - exposed_before.get(key, 0.0)
        if diff:
            ex[key] = x + n * diff
    outs = per.outs
    made = outs[k]
    for q in np.flatnonzero(run.ptime[made] > -np.inf).tolist():
        r = pending.get(int(made[q]))
        if r is not None:
            t0, key = r
            ax = links.key_axes.get(key, ())
            step = grew[ax[0]] if ax and ax[0] in grew and links.own.issuperset(ax) else dt
            run.ptime[outs[k + 1:k + n + 1, q]] = t0 + step * np.arange(1, n + 1)
            run.counted[run.tl.made_in[int(made[q])][0]] = (k, n, t0, step, key)
    w = (min(st.horizon, st.tc) if links.prefetches else st.tc) + d  # the window's start after them
    for a in links.axes:
        g = grew.get(a, dt)
        chunk = issued[a]
        if chunk:
            # the copies that may still run after the window starts go on the busy list; the
            # rest only if a collective is ever placed from before it (SimState.later)
            lst = st.busy[a]
            end = max(e0 for _, e0, _ in chunk)
            m = min(n, max(0, int((w - end) / g))) if g > 0 else 0
            while m and end + m * g > w:
                m -= 1
            lst += [(s0 + j * g, e0 + j * g, key) for j in range(m + 1, n + 1) for s0, e0, key in chunk]
            lst.sort()
            if m:
                st.later.append((a, chunk, m, g))
                st.later_end = max(st.later_end, end + m * g)
            st.free[a] = max(st.free[a], end + n * g)
    st.tc += d
    st.horizon += d if links.prefetches else 0.0
    st.readers = collections.deque((x + (d if links.prefetches else 0.0) for x in st.readers), maxlen=PREFETCH)


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
