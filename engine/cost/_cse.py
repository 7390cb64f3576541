"""CSE: XLA computes one reshard of a value once per computation.

Owns ``common_reshards``: among the operand reshards of a plan (per pattern, its
collectives), the same value gathered to the same sharding for several readers (a weight
in the forward and the backward pass) is one collective, and a reader that wants a finer
sharding than one already gathered slices it locally; the resharded copies are buffers of
their own, live from their first reader to their last. Pure over the tables (the program's
ops and the patterns); imports ``_kinds`` only.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, NamedTuple

from ._kinds import CollectiveKind

if TYPE_CHECKING:
    from ._tables import Tables


class Reshards(NamedTuple):
    """The plan's operand reshards after CSE."""

    saved: float  # seconds per step the duplicates would have taken
    dup: dict  # (pattern, collective index) -> executions per step that are duplicates
    buffers: list  # the resharded copies: (first reader, after the last reader, bytes)
    dup_ops: frozenset  # (op, collective index) pairs that reuse an earlier reshard


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
    for (region, vid, key, _), e in seen.items():
        uses = e[4]
        # a finer view of a value already gathered coarser: a free local slice
        finer = e[3] == CollectiveKind.ALL_GATHER and any(
            other != key and all(tuple(key[d][:len(other[d])]) == tuple(other[d]) for d in range(len(key)))
            for other in gathered[(region, vid)])
        for n, (pi, k, secs, trip, op_id) in enumerate(uses):
            if n > 0 or finer:
                saved += secs * trip
                dup[(pi, k)] += trip
                dup_ops.add((op_id, k))
    # The resharded copies are buffers of their own, live from first to last reader.
    spans: dict = {}
    for (region, vid, key, _), (a, b, v, *_) in seen.items():
        x = spans.setdefault((region, vid, key), [a, b, v])
        x[0], x[1] = min(x[0], a), max(x[1], b)
    buffers = [(a, b + 1, v) for a, b, v in spans.values()]
    return Reshards(saved, dup, buffers, frozenset(dup_ops))


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
                region = (op.region, late[v][0] <= op_id <= late[v][1]) if late and v in late else op.region
                ident = (region, v, c.view, c.kind)
                e = seen.get(ident)
                if e is None:
                    seen[ident] = [op_id, op_id, c.view_bytes, c.kind, [(pi, k, c.time, op.trip, op_id)]]
                else:
                    e[0], e[1] = min(e[0], op_id), max(e[1], op_id)
                    e[4].append((pi, k, c.time, op.trip, op_id))
    return seen
