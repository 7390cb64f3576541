"""Recompute: what a set of recompute decisions changes in the program the cost model scores.

Owns ``Edit`` (built once per set of recompute decisions, ``(unit, kind)`` pairs: the ops
run again, by pattern, with the operands whose reshard the backward pass shares; the
residuals' shortened lifetimes; the recomputed copies' own; the recomputation's
temporaries; the weights re-taken in the backward pass) and ``extra_cost``, the time and
collectives of an edit's re-run ops under some decisions. Which ops a unit re-runs is
``partex.analysis._recompute``'s (``plan_unit``); this module only prices it. Imports
``partex.analysis._recompute`` and ``_liveness``'s ``alias_roots``.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..analysis._recompute import LoopPlan, plan_unit
from ._liveness import alias_roots

if TYPE_CHECKING:
    from ._patterns import PatternCost
    from ._tables import Tables


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Edit:
    """What a set of recompute decisions changes in the program the cost model scores."""

    rc: tuple[tuple[int, str], ...]  # the recompute decisions, as sorted (unit, kind)
    extra: list  # [(pattern mask, [(pattern, shared operand indices, executions)])]
    mid_end: np.ndarray  # the intermediates' lifetimes, residuals shortened
    clone_v: np.ndarray  # recomputed values (their local size) ...
    clone_a: np.ndarray  # ... live from the recompute point ...
    clone_b: np.ndarray  # ... to their last backward read
    clone_n: np.ndarray  # copies of each (a value a forward loop stacks: its length)
    late: dict[int, tuple[int, int]]  # weight -> the backward pass's ops: reads there reshard anew
    # the recomputations' temporaries: (row, value) pairs, a row a set of values live at
    # once; a recomputation's rows from tmp_seg on; the largest row of each, live at its
    # recompute point (tmp_at)
    tmp_row: np.ndarray
    tmp_v: np.ndarray
    tmp_seg: np.ndarray
    tmp_at: np.ndarray


def build_edit(t: "Tables", rc: tuple[tuple[int, str], ...], units, readers) -> Edit:
    """What the recompute decisions ``rc`` change: the ops run again (by pattern, with
    the operands whose reshard the backward pass shares), the residuals' shortened
    lifetimes and the recomputed copies' own, and the weights re-taken in the backward.
    readers: per value, the ops that read it (``partex.analysis._recompute.value_readers``)."""
    p, live = t.program, t.live
    mid_at = {int(v): i for i, v in enumerate(live.mid.tolist())}
    mid_end = live.mid_end.copy()
    extra: collections.Counter = collections.Counter()
    clone_v, clone_a, clone_b, clone_n = [], [], [], []
    tmps = _Temporaries()
    root = alias_roots(p)
    late: dict[int, tuple[int, int]] = dict(t.user_late)
    for u, kind in rc:
        unit = units[u]
        for cp in plan_unit(p, unit, kind):
            if isinstance(cp, LoopPlan):
                _edit_loop(t, unit, cp, extra, mid_at, mid_end, (clone_v, clone_a, clone_b, clone_n), tmps)
                continue
            if cp.at < 0:
                continue
            for v in cp.weights:
                late[v] = (unit.boundary, unit.until)
            _charge(t, cp.ops, set(cp.weights), extra)
            rec = set(cp.recomputed)
            made = []
            for o in cp.ops:
                for v in p.ops[o].outputs:
                    i = mid_at.get(v)
                    if i is None:
                        continue
                    if v in rec:  # dies after its forward reads; a copy lives to its backward ones
                        fwd = [r for r in readers[v] if r < unit.boundary]
                        mid_end[i] = (max(fwd) if fwd else p.values[v].producer) + 1
                        clone_v.append(v)
                        clone_a.append(cp.at)
                        clone_b.append(live.value_end[v])
                        clone_n.append(1)
                    else:
                        made.append(v)
            # the recomputation's own temporaries, each live from its op to its last read
            # there (a region's body value that is a recomputed result's buffer is that copy)
            copies = {int(root[v]) for v in rec}
            made = [v for v in made if v not in copies]
            if made:
                tmps.add(_live_sets(p, cp.ops, made, root), cp.at)
            for v in cp.leaves:  # read again at the recompute point
                i = mid_at.get(v)
                if i is not None:
                    mid_end[i] = max(mid_end[i], cp.at + 1)
    by_mask: dict[int, list] = collections.defaultdict(list)
    for (pi, excl), n in extra.items():
        by_mask[t.pat_mask[pi]].append((pi, excl, n))
    return Edit(rc, list(by_mask.items()), mid_end, np.array(clone_v, dtype=np.int64),
                np.array(clone_a, dtype=np.int64), np.array(clone_b, dtype=np.int64),
                np.array(clone_n, dtype=np.float64), late,
                *(np.array(x, dtype=np.int64) for x in (tmps.row, tmps.v, tmps.seg, tmps.at)))


class _Temporaries:
    """The recomputations' temporaries as Edit holds them (rows of values live at once)."""

    def __init__(self):
        self.row: list[int] = []
        self.v: list[int] = []
        self.seg: list[int] = []
        self.at: list[int] = []
        self.rows = 0

    def add(self, rows: list[list[int]], at: int) -> None:
        self.seg.append(self.rows)
        for r in rows:
            self.row += [self.rows] * len(r)
            self.v += r
            self.rows += 1
        self.at.append(at)


def _live_sets(p, ops, made: list[int], root) -> list[list[int]]:
    """The sets of ``made`` values live at once as ``ops`` run in order: after each op
    that makes one, those made so far whose last read among ``ops`` (through an alias:
    ``root``, per value the value whose buffer it is) is not behind."""
    pos = {o: k for k, o in enumerate(ops)}
    first = {v: pos[p.values[v].producer] for v in made}
    last = dict(first)
    for k, o in enumerate(ops):
        for v in p.ops[o].inputs:
            v = int(root[v])
            if v in last:
                last[v] = max(last[v], k)
    # a sweep over the ops that make them; a set is kept only where one of its values dies
    # before the next is made (any other is contained in a later one)
    rows, alive = [], []
    for k in sorted(set(first.values())):
        kept = [v for v in alive if last[v] >= k]
        if len(kept) < len(alive):
            rows.append(alive)
        alive = kept + [v for v in made if first[v] == k]
    return rows + [alive]


def _charge(t: "Tables", ops, shared: set, extra) -> None:
    """Count the ops a recomputation runs again, by pattern, with the operands whose
    reshard it does not pay again: a weight's that the backward pass shares (``shared``),
    and a value's that an earlier op of the same recomputation reshards alike (the same
    pattern reading it at the same place: XLA CSEs the two)."""
    p = t.program
    seen = set()
    for o in ops:
        op = p.ops[o]
        pi = int(t.op_pattern[o])
        excl = []
        for i, v in enumerate(op.inputs):
            if v in shared or (v, pi, i) in seen:
                excl.append(i)
            seen.add((v, pi, i))
        extra[(pi, tuple(excl))] += op.trip


def _edit_loop(t: "Tables", unit, lp: LoopPlan, extra, mid_at, mid_end, clones, tmps) -> None:
    """A scan unit's edit: the body ops run again in the backward loop (each as often as
    the forward's), the stacked residuals it no longer makes, the values it stacks
    instead (live from the forward loop to the backward loop's end), and the
    recomputation's largest temporary in the backward loop's body."""
    p, live = t.program, t.live
    exit_ = p.ops[unit.copies[0][1] - 1]
    _charge(t, lp.ops, set(), extra)
    nc = exit_.params["num_carry"]
    stacked_out = exit_.outputs[nc:]
    last = exit_.id + 1
    for j in lp.dropped:
        i = mid_at.get(stacked_out[j])
        if i is not None:
            mid_end[i] = live.mid_def[i]  # never made
            last = max(last, live.value_end[stacked_out[j]])
    clone_v, clone_a, clone_b, clone_n = clones
    for v in lp.stacked:
        clone_v.append(v)
        clone_a.append(exit_.id)
        clone_b.append(last)
        clone_n.append(unit.layers)
    made = [v for o in lp.ops for v in p.ops[o].outputs if v in mid_at]
    if made:  # the largest (a loop body's live sets: not modelled)
        tmps.add([[v] for v in made], lp.backward)


def extra_cost(items, rel, pattern_cost: Callable[[int, tuple], "PatternCost"]) -> tuple[float, float, list]:
    """(compute s, comm s, [(pattern, collectives, executions)]) of an edit's re-run ops of
    one pattern mask (``items``: (pattern, shared operand indices, executions)) under the
    decisions ``rel`` on its groups; the shared operands' reshards are not paid again."""
    c_sum = m_sum = 0.0
    rows = []
    for pi, excl, n in items:
        c, mm, cl, *_ = pattern_cost(pi, rel)
        shared = sum(x.time for x in cl if x.operand >= 0 and x.operand in excl)
        c_sum += c * n
        m_sum += (mm - shared) * n
        kept = tuple(x for x in cl if not (x.operand >= 0 and x.operand in excl))
        if kept:
            rows.append((pi, kept, n))
    return c_sum, m_sum, rows
