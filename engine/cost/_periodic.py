"""Periodic stretches of a region's ops: unrolled layers, which the overlap schedule runs a few
of and extrapolates.

A stretch of ``count`` copies of ``period`` ops is periodic when each op costs what the op a
period before it costs (the same pattern: the same compute and collectives under every plan)
and reads what that op reads, one period on: a value made ``d`` ops before it inside the
stretch (the same ``d``), or a value made before the stretch or in another region (of the
same kind: there from the start or not). Its schedule then repeats once the schedule's state
(the links' busy times, the prefetch horizon, the values still being reduced) repeats
relative to the clock; ``_overlap`` runs periods until two end in the same state and
extrapolates the rest. Owns ``Periodic`` and ``periodic_stretches``; pure over the program
and a symbol per op.

Pricing side (the overlap schedule's): imports nothing of partex.
"""

from __future__ import annotations

import dataclasses

import numpy as np

# A stretch is taken when it has at least this many copies: the schedule runs two to find
# the steady state, one to repeat, and the last as it is
MIN_COPIES = 4
# Candidate periods: the distances between an op and its m-th next op of the same symbol,
# for m up to MOST (a layer holds an op of some kind at most this many times), the KEEP
# most frequent
MOST = 4
KEEP = 32


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Periodic:
    """``count`` copies of ``period`` ops from position ``start`` of a region's ops."""

    start: int
    period: int
    count: int
    outs: np.ndarray  # (count, results per period): the values each period's ops make, in op order
    # (count, reads per period): the values made outside the stretch that each period's ops
    # read, in op and operand order (the same place in every period)
    outside: np.ndarray
    # per op of a period: its results (and views of them) are read by no op of the stretch
    # but the last period's (a gradient the optimizer reads after the backward pass)
    late: np.ndarray
    # per op of a period: its results (and views of them) are read by no op of the stretch
    after: np.ndarray


def _candidates(sym: np.ndarray) -> list[int]:
    """Periods worth testing: the most frequent distances between ops of one symbol."""
    order = np.argsort(sym, kind="stable")
    cuts = np.flatnonzero(np.diff(sym[order])) + 1
    ds = []
    for pos in np.split(order, cuts):
        for m in range(1, min(MOST, len(pos) - 1) + 1):
            ds.append(pos[m:] - pos[:-m])
    if not ds:
        return []
    vals, counts = np.unique(np.concatenate(ds), return_counts=True)
    keep = counts >= MIN_COPIES - 1
    vals, counts = vals[keep], counts[keep]
    return vals[np.argsort(-counts, kind="stable")][:KEEP].tolist()


def _stretches(same: np.ndarray, p: int) -> list[tuple[int, int]]:
    """(start, length) of the runs of True in ``same`` (``sym[i] == sym[i + p]``) long enough
    for MIN_COPIES copies."""
    edges = np.diff(np.concatenate(([0], same.view(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    long = ends - starts >= (MIN_COPIES - 1) * p
    return list(zip(starts[long].tolist(), (ends - starts)[long].tolist()))


def periodic_stretches(program, ids: np.ndarray, sym: np.ndarray, early, readers, view_op) -> list[Periodic]:
    """The periodic stretches of one region's ops ``ids`` (in program order), ``sym`` per op
    of the region (equal symbols cost alike), ``early`` per value (there from the start),
    sorted by start; longest first where they overlap."""
    n = len(ids)
    if n < MIN_COPIES * 2:
        return []
    found = []
    for p in _candidates(sym):
        for s, length in _stretches(sym[:-p] == sym[p:], p):
            found.append((s, p, (length + p) // p))
    found.sort(key=lambda x: (-x[1] * x[2], x[1], x[0]))
    taken = np.zeros(n, dtype=bool)
    out = []
    ops, values = program.ops, program.values
    where = {int(o): i for i, o in enumerate(ids.tolist())}
    for s, p, c in found:
        if taken[s:s + p * c].any():
            continue
        per = _refine(ops, values, early, readers, view_op, ids, where, s, p, c)
        if per is not None and not taken[per.start:per.start + per.period * per.count].any():
            out.append(per)
            taken[per.start:per.start + per.period * per.count] = True
    return sorted(out, key=lambda x: x.start)


def _refine(ops, values, early, readers, view_op, ids, where, s: int, p: int, c: int) -> Periodic | None:
    """The longest part of a candidate stretch whose ops also read alike (module docstring),
    with its values; None if under MIN_COPIES copies remain."""
    # a read counts by its distance back where the value was made inside the candidate
    # stretch (from ``s``), as one from outside otherwise (the forward pass's residuals
    # the backward pass reads, layer by layer further back)
    end = s + p * c
    tokens: dict = {}
    tok = np.empty(end - s, dtype=np.int64)
    for i in range(s, end):
        op = ops[int(ids[i])]
        key = []
        for j, v in enumerate(op.inputs):
            q = where.get(values[v].producer, -1)
            key.append((j, i - q) if q >= s else (j, -1 - early[v]))
        tok[i - s] = tokens.setdefault(tuple(key), len(tokens))
    best = max(_stretches(tok[:-p] == tok[p:], p), key=lambda x: x[1], default=None)
    if best is None:
        return None
    a, length = best
    count, start, s0 = (length + p) // p, s + a, s
    outs, outside = [], []
    for k in range(count):
        lo, hi = start + k * p, start + (k + 1) * p
        made, read = [], []
        for i in range(lo, hi):
            op = ops[int(ids[i])]
            made += op.outputs
            read += [v for v in op.inputs if where.get(values[v].producer, -1) < s0]
        outs.append(made)
        outside.append(read)
    last, end = start + (count - 1) * p, start + count * p
    late = np.zeros(p, dtype=bool)
    after = np.zeros(p, dtype=bool)
    for off in range(p):  # in the period before the last but one: its successors are counted, not run
        stack = list(ops[int(ids[last - 2 * p + off])].outputs)
        first = end  # the first op of this region that reads it (through views)
        while stack and first >= 0:
            v = stack.pop()
            for r in readers[v]:
                q = where.get(r, -1)
                first = min(first, q)
                if q >= 0 and view_op[r]:
                    stack += ops[r].outputs
        late[off], after[off] = first >= last, first >= end
    return Periodic(start, p, count, np.array(outs, dtype=np.int64).reshape(count, -1),
                    np.array(outside, dtype=np.int64).reshape(count, -1), late, after)
