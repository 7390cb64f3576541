"""CSE: XLA computes one reshard of a value once per computation.

Owns ``common_reshards``: among the operand reshards of a plan (per pattern, its
collectives), the same value gathered to the same sharding for several readers (a weight
in the forward and the backward pass) is one collective, and a reader that wants a finer
sharding than one already gathered slices it locally; the resharded copies are buffers of
their own, live from their first reader to their last. A reshard inside a loop body of a
value made outside the loop (a weight a gradient-accumulation loop reads in every
microbatch) is loop-invariant: XLA's while-loop invariant code motion hoists it out of the
loop, so it runs once per trip of the region the value is made in, and its copy lives
through the whole loop. A reshard only a ``shard_map`` region's boundary reads is the region's
own array of the value (the liveness counts it), not another buffer. Pure over the tables
(the program's ops and the patterns); imports ``_kinds`` and ``_facts``.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, NamedTuple

from ._facts import having
from ._kinds import CollectiveKind

if TYPE_CHECKING:
    from ._tables import Tables


class Reshards(NamedTuple):
    """The plan's operand reshards after CSE."""

    saved: float  # seconds per step the duplicates would have taken
    dup: dict  # (pattern, collective index) -> executions per step that are duplicates
    buffers: list  # the resharded copies: (first reader, after the last reader, bytes)
    dup_ops: frozenset  # (op, collective index) pairs that reuse an earlier reshard
    hoisted: dict  # (op, collective index) -> the loops it is hoisted out of (innermost first), run on their first trip only


def common_reshards(t: "Tables", resharded, late: dict[int, tuple[int, int]] | None = None) -> Reshards:
    """``resharded``: [(pattern, its collectives)] of the patterns with operand reshards;
    ``late``: weight -> the backward pass's ops, where a recompute re-takes it (its reshard
    there is one of its own, not the forward's kept alive)."""
    seen = _readers(t, resharded, late)
    saved = 0.0
    dup: dict[tuple[int, int], int] = collections.Counter()
    dup_ops = set()  # (op, collective index) that reuse an earlier reshard
    gathered: dict = collections.defaultdict(list)  # (region, value) -> views gathered
    for (region, vid, key, kind) in seen:
        if kind == CollectiveKind.ALL_GATHER:
            gathered[(region, vid)].append(key)
    hoisted: dict = {}
    for (region, vid, key, _), e in seen.items():
        uses = e[4]
        # a finer view of a value already gathered coarser: a free local slice
        finer = e[3] == CollectiveKind.ALL_GATHER and any(
            other != key and all(tuple(key[d][:len(other[d])]) == tuple(other[d]) for d in range(len(key)))
            for other in gathered[(region, vid)])
        for n, (pi, k, secs, trip, op_id, once, loops) in enumerate(uses):
            if n > 0 or finer:
                saved += secs * trip
                dup[(pi, k)] += trip
                dup_ops.add((op_id, k))
            elif once < trip:  # hoisted out of its loops: once per trip of the region outside them
                saved += secs * (trip - once)
                dup[(pi, k)] += trip - once
                hoisted[(op_id, k)] = loops
    # The resharded copies are buffers of their own, live from first to last reader; but
    # where only a shard_map region's boundary reads one, it is the region's own array of
    # that value (``Liveness.region_pairs``), counted there.
    aliasing = having("aliases")
    ops = t.program.ops
    spans: dict = {}
    for (region, vid, key, _), (a, b, v, _, uses) in seen.items():
        if all(ops[u[4]].primitive in aliasing for u in uses):
            continue
        x = spans.setdefault((region, vid, key), [a, b, v])
        x[0], x[1] = min(x[0], a), max(x[1], b)
    buffers = [(a, b + 1, v) for a, b, v in spans.values()]
    return Reshards(saved, dup, buffers, frozenset(dup_ops), hoisted)


def _invariant(t: "Tables", op, v) -> tuple[int, int, tuple[int, int], tuple[int, ...]]:
    """Where XLA computes a reshard of value ``v`` read by ``op``: (region, its trips, the
    enter and exit ops of the loops it is hoisted out of, those loops innermost first).
    Out of each enclosing loop whose body does not make ``v``; the op's own region and trip
    where none."""
    p = t.program
    regions = p.regions
    producer = p.values[v].producer
    home = p.ops[producer].region if producer >= 0 else 0
    r, loops = op.region, []
    while r != home and regions[r].kind in ("scan", "while") and regions[r].enter >= 0:
        loops.append(r)
        r = regions[r].parent
    if not loops:
        return op.region, op.trip, (op.id, op.id), ()
    out = regions[loops[-1]]
    return r, regions[r].trip, (out.enter, out.exit), tuple(loops)


def _readers(t: "Tables", resharded, late) -> dict:
    """(region, value, view, kind) -> [first op, last op, bytes, kind, [(pattern,
    collective index, seconds, trips, op)]]: the reads of each reshard, in program order of
    the patterns."""
    ops = t.program.ops
    seen: dict = {}
    for pi, cl in resharded:
        for op_id in t.patterns[pi].ops:
            op = ops[op_id]
            for k, c in enumerate(cl):
                i = c.operand
                if i < 0:
                    continue
                v = op.inputs[i]
                # a weight re-taken in the backward pass (recompute): its reshard there
                # is one of its own, not the forward's kept alive
                where, once, (a, b), loops = _invariant(t, op, v)  # a hoisted copy lives through its loops
                region = (where, late[v][0] <= op_id <= late[v][1]) if late and v in late else where
                ident = (region, v, c.view, c.kind)
                e = seen.get(ident)
                use = (pi, k, c.time, op.trip, op_id, once, loops)
                if e is None:
                    seen[ident] = [a, b, c.view_bytes, c.kind, [use]]
                else:
                    e[0], e[1] = min(e[0], a), max(e[1], b)
                    e[4].append(use)
    return seen
