"""Recompute: what a set of recompute decisions changes in the program the cost model scores.

``build_edit`` makes the ``Edit`` (``_records``) of one set of recompute decisions,
``(unit, kind)`` pairs: the ops run again, by pattern, with the operands whose reshard the
backward pass shares; the residuals' shortened lifetimes; the recomputed copies' own; the
recomputation's temporaries; the weights re-taken in the backward pass; the ops with a
workspace (``Tables.workspace``) run again and where. ``extra_cost`` is
the time and collectives of an edit's re-run ops under some decisions. Which ops a unit
re-runs is ``partex.analysis._recompute``'s (``plan_unit``); how XLA fuses the program
under the decisions is ``_variants``'.

Pricing side: imports ``_records``, ``_fusion``' ``alias_roots`` and
``partex.analysis._recompute``.
"""

from __future__ import annotations

import collections
from typing import Callable

import numpy as np

from ..analysis._recompute import LoopPlan, plan_unit
from ._fusion import alias_roots
from ._records import Edit, PatternCost, Tables


def build_edit(t: Tables, rc: tuple[tuple[int, str], ...], units, readers) -> Edit:
    """What the recompute decisions ``rc`` change: the ops run again (by pattern, with
    the operands whose reshard the backward pass shares), the residuals' shortened
    lifetimes and the recomputed copies' own, and the weights re-taken in the backward.
    readers: per value, the ops that read it (``partex.analysis._recompute.value_readers``)."""
    p, live = t.program, t.live
    mid_at = {int(v): i for i, v in enumerate(live.mid.tolist())}
    mid_end = live.mid_end.copy()
    extra: collections.Counter = collections.Counter()
    clone_v, clone_a, clone_b, clone_n = [], [], [], []
    barrier: list[tuple[int, float]] = []  # (value, trips)
    tmps = _Temporaries()
    root = alias_roots(p)
    late: dict[int, tuple[int, int]] = dict(t.user_late)
    # XLA:CPU keeps every value in device memory (it ignores memory spaces): there an
    # offloaded residual is a saved one
    on_host = t.lowering != "cpu"
    host: list[tuple[int, float, int]] = []  # (value, copies, unit)
    # the ops with a workspace, each run again at its recompute point: (op, point)
    has_work = set(t.workspace[0].tolist()) if t.workspace else set()
    work: list[tuple[int, int]] = []

    def back_at(v: int, i: int, at: int, boundary: int) -> None:
        """Intermediate ``v`` (its index ``i``) dies after its forward reads (those before
        ``boundary``); a copy of it (recomputed, or back from host memory) lives from ``at``
        to its last backward read."""
        fwd = [r for r in readers[v] if r < boundary]
        mid_end[i] = (max(fwd) if fwd else p.values[v].producer) + 1
        clone_v.append(v)
        clone_a.append(at)
        clone_b.append(live.value_end[v])
        clone_n.append(1)

    for u, kind in rc:
        unit = units[u]
        for cp in plan_unit(p, unit, kind):
            if isinstance(cp, LoopPlan):
                _edit_loop(t, unit, cp, extra, mid_at, mid_end, (clone_v, clone_a, clone_b, clone_n), tmps,
                           host if on_host else None)
                barrier += [(v, float(unit.layers)) for v in (*cp.stacked, *(v for v, _ in cp.reuse))]
                work += [(o, cp.backward) for o in cp.ops if o in has_work]
                continue
            if cp.at < 0:
                continue
            for v in cp.weights:
                late[v] = (unit.boundary, unit.until)
            _charge(t, cp.ops, set(cp.weights), extra)
            work += [(o, cp.at) for o in cp.ops if o in has_work]
            rec = set(cp.recomputed)
            made = []
            for o in cp.ops:
                for v in p.ops[o].outputs:
                    i = mid_at.get(v)
                    if i is None:
                        continue
                    if v in rec:  # dies after its forward reads; a copy lives to its backward ones
                        back_at(v, i, cp.at, unit.boundary)
                    else:
                        made.append(v)
            _release_fused_roots(t, rec, unit.boundary, readers, mid_at, mid_end)
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
            for v in cp.offloaded if on_host else ():  # on the host from its last forward read to ``at``
                i = mid_at.get(v)
                if i is not None:
                    back_at(v, i, cp.at, unit.boundary)
                    host.append((v, 1.0, u))
    by_mask: dict[int, list] = collections.defaultdict(list)
    for (pi, excl), n in extra.items():
        by_mask[t.pat_mask[pi]].append((pi, excl, n))
    return Edit(rc, list(by_mask.items()), mid_end, np.array(clone_v, dtype=np.int64),
                np.array(clone_a, dtype=np.int64), np.array(clone_b, dtype=np.int64),
                np.array(clone_n, dtype=np.float64), late,
                np.array(tmps.row, dtype=np.int64), np.array(tmps.v, dtype=np.int64),
                np.array(tmps.seg, dtype=np.int64), np.array(tmps.at, dtype=np.int64),
                np.array([v for v, _, _ in host], dtype=np.int64), np.array([n for _, n, _ in host], dtype=np.float64),
                tuple(u for _, _, u in host), np.array([v for v, _ in barrier], dtype=np.int64),
                np.array([n for _, n in barrier], dtype=np.float64), np.array([o for o, _ in work], dtype=np.int64),
                np.array([a for _, a in work], dtype=np.int64))


def _release_fused_roots(t: Tables, rec: set, boundary: int, readers, mid_at, mid_end) -> None:
    """A recomputed residual XLA fuses into its backward readers kept what it is computed
    from alive until then (``_liveness.build_liveness``); recomputed, it no longer does: each such
    operand (read by no backward op itself) dies after its last forward read, and its fused
    values', unless a fused value it makes is read in the backward pass and not recomputed."""
    p, fused = t.program, t.fused
    roots: set[int] = set()
    for v in rec:
        if not fused[v]:
            continue
        todo = [v]
        while todo:
            x = todo.pop()
            for i in p.ops[p.values[x].producer].inputs:
                if fused[i]:
                    todo.append(i)
                elif i in mid_at:
                    roots.add(i)
    for r in roots:
        if any(o >= boundary for o in readers[r]):
            continue
        last, todo, seen, ok = p.values[r].producer, [r], {r}, True
        while todo and ok:
            x = todo.pop()
            for o in readers[x]:
                if o >= boundary:
                    ok = x in rec
                    continue
                last = max(last, o)
                for y in p.ops[o].outputs:
                    if fused[y] and y not in seen:
                        seen.add(y)
                        todo.append(y)
        if ok:
            i = mid_at[r]
            mid_end[i] = min(mid_end[i], last + 1)


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


def _charge(t: Tables, ops, shared: set, extra) -> None:
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


def _edit_loop(t: Tables, unit, lp: LoopPlan, extra, mid_at, mid_end, clones, tmps, host) -> None:
    """A scan unit's edit: the body ops run again in the backward loop (each as often as
    the forward's), the stacked residuals it no longer makes, the values it stacks
    instead (live from the forward loop to the backward loop's end), and the
    recomputation's largest temporary in the backward loop's body. ``host`` (None: memory
    spaces ignored): where the stacks an ``offload`` keeps in host memory go (a slice at a
    time on the device: not counted)."""
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
    for j in lp.host_ys:
        i = mid_at.get(stacked_out[j])
        if host is not None and i is not None:
            mid_end[i] = live.mid_def[i]  # in host memory
            host.append((stacked_out[j], 1.0, unit.id))
    clone_v, clone_a, clone_b, clone_n = clones
    for k, v in enumerate(lp.stacked):
        if host is not None and k in lp.host_stacked:
            host.append((v, float(unit.layers), unit.id))
            continue
        clone_v.append(v)
        clone_a.append(exit_.id)
        clone_b.append(last)
        clone_n.append(unit.layers)
    # GPU: a residual made again in the backward loop lives from the body's start to the
    # body's last read of it, unless XLA fuses it into its readers there
    # (``Tables.variant_fused``: as XLA fuses the program under the recompute decisions): the
    # llama's matmul outputs saved, the rest recomputed, 1.00 of XLA GPU's peak (0.93
    # without). On XLA:CPU the recomputation's largest temporary alone (below) matches its
    # peak (a transformer's stack recomputed on four axes: 1.00 of XLA's; 1.23 with these);
    # TPU is taken to schedule as the CPU does here (not checked)
    enter = p.ops[lp.backward]
    fused = t.variant_fused if t.variant_fused is not None else t.fused
    stand = {enter.outputs[k]: r for k, r in lp.feeds if not fused[r]} if t.lowering == "gpu" else {}
    last_read: dict[int, int] = {}
    for op in p.ops[lp.backward + 1:p.regions[enter.region].exit]:  # the backward loop's body
        for v in op.inputs:
            if v in stand:
                last_read[v] = op.id
    for s, r in stand.items():
        if s in last_read:
            clone_v.append(r)
            clone_a.append(lp.backward)
            clone_b.append(last_read[s] + 1)
            clone_n.append(1)
    made = [v for o in lp.ops for v in p.ops[o].outputs if v in mid_at]
    if made:  # the largest (a loop body's live sets: not modelled)
        tmps.add([[v] for v in made], lp.backward)


def extra_cost(items, rel, pattern_cost: Callable[[int, tuple], PatternCost]) -> tuple[float, float, list]:
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
