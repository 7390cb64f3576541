"""CSE: XLA computes one reshard of a value once per computation.

Owns ``common_reshards``: among the operand reshards of a plan (per pattern, its
collectives), the same value gathered to the same sharding for several readers (a weight
in the forward and the backward pass) is one collective, and a reader that wants a finer
sharding than one already gathered slices it locally; the resharded copies are buffers of
their own, live from their first reader to their last. A reshard inside a loop body of a
value the loop does not change -- made outside the loop (a weight a gradient-accumulation
loop reads in every microbatch), or in it from such values alone (``invariant_homes``) -- is
loop-invariant: XLA's while-loop invariant code motion hoists it out of the loop, so it runs
once per trip of the region the value is made in, and its copy lives through the whole loop. A reshard only a ``shard_map`` region's boundary reads is the region's
own array of the value (the liveness counts it), not another buffer.

What CSE finds for a value depends only on the reads of it: which patterns read it at
which operand, in which region and loops. The values read alike (``ReadClasses``: the same
weight of every unrolled layer) form a class; a plan's CSE is worked out for one value of
each class its reshards touch, memoised on the class and those patterns' reshards, and
counted for the rest, whose copies live over their own readers (``_expand``). Pure over the
tables (the program's ops and the patterns).

Pricing side: imports ``_records``, ``_kinds``, ``_facts`` and the program types.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import NamedTuple

import numpy as np

from ._facts import having
from ..tracing._program import TOP_REGION as TOP, Program
from ._kinds import CollectiveKind
from ._records import Tables


class Reshards(NamedTuple):
    """The plan's operand reshards after CSE."""

    saved: float  # seconds per step the duplicates would have taken
    dup: dict  # (pattern, collective index) -> executions per step that are duplicates
    buffers: tuple  # the resharded copies: (first reader, after the last reader, bytes), three arrays
    dup_ops: tuple  # (ops, collective indices), two arrays: the reads that reuse an earlier reshard
    hoisted: dict  # (op, collective index) -> the loops it is hoisted out of (innermost first), run on their first trip only


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class ReadClass:
    """Values read alike: position p of every member is a read by one pattern at one operand,
    in one region, its trips and loops the same."""

    values: np.ndarray  # the members
    ops: np.ndarray  # (members, positions): the op of each read
    first: np.ndarray  # (members, positions): where a reshard of the read is computed, from ...
    last: np.ndarray  # ... to (the op, or the loops it is hoisted out of)
    pattern: tuple  # per position: the reading op's pattern
    operand: tuple  # per position: the operand index
    group: tuple  # per position: its (pattern rank, op) group: reads by one op share one
    where: tuple  # per position: the region a reshard is computed in
    trip: tuple  # per position: the reading op's trips per step
    once: tuple  # per position: the trips of the region a reshard is computed in
    loops: tuple  # per position: the loops a reshard is hoisted out of
    aliasing: tuple  # per position: the reader aliases its operand (a shard_map boundary)
    patterns: tuple  # the patterns of the reads, sorted


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class ReadClasses:
    """Every value the program's ops read, by class; built once per tables."""

    classes: tuple  # ReadClass
    by_operand: dict  # (pattern, operand index) -> the classes read there


def read_classes(t: Tables) -> ReadClasses:
    p = t.program
    ops = p.ops
    homes = invariant_homes(p)
    rank = np.empty(len(t.patterns), dtype=np.int64)
    order = [pi for _, pis in t.mask_groups for pi in pis]
    rank[order] = np.arange(len(order))
    aliasing = having("aliases")
    reads: dict[int, list] = collections.defaultdict(list)
    for pi, pat in enumerate(t.patterns):
        for n, op_id in enumerate(pat.ops):
            for i, v in enumerate(ops[op_id].inputs):
                reads[v].append((int(rank[pi]), n, i, pi, op_id))
    shapes: dict[tuple, list] = {}
    for v, rs in reads.items():
        rs.sort()
        rows, g, prev = [], -1, None
        for r, n, i, pi, op_id in rs:
            if (r, n) != prev:
                g, prev = g + 1, (r, n)
            op = ops[op_id]
            where, once, (a, b), loops = _invariant(t, op, int(homes[v]))
            rows.append(((pi, i, g, where, op.trip, once, loops, op.primitive in aliasing), (op_id, a, b)))
        shape = tuple(x for x, _ in rows)
        shapes.setdefault(shape, []).append((v, [y for _, y in rows]))
    classes = []
    by_operand: dict = collections.defaultdict(list)
    for shape, members in shapes.items():
        arr = np.array([m[1] for m in members], dtype=np.int64).reshape(len(members), len(shape), 3)
        pattern, operand, group, where, trip, once, loops, aliasing = (tuple(x) for x in zip(*shape))
        c = ReadClass(np.array([m[0] for m in members], dtype=np.int64), arr[:, :, 0], arr[:, :, 1], arr[:, :, 2],
                      pattern, operand, group, where, trip, once, loops, aliasing, tuple(sorted(set(pattern))))
        for key in set(zip(c.pattern, c.operand)):
            by_operand[key].append(len(classes))
        classes.append(c)
    return ReadClasses(tuple(classes), dict(by_operand))


def common_reshards(t: Tables, classes: ReadClasses, resharded, late: dict | None, memo: dict,
                    late_key=None) -> Reshards:
    """``resharded``: [(pattern, its collectives)] of the patterns with operand reshards;
    ``late``: weight -> the backward pass's ops, where a recompute re-takes it (its reshard
    there is one of its own, not the forward's kept alive), ``late_key`` naming it in
    ``memo`` (class results, kept across plans)."""
    cl_of = dict(resharded)
    okey = {pi: tuple((k, x.reshard_key()) for k, x in enumerate(cl) if x.operand >= 0) for pi, cl in resharded}
    touched = sorted({c for pi, cl in resharded for x in cl if x.operand >= 0
                      for c in classes.by_operand.get((pi, x.operand), ())})
    saved = 0.0
    dup: dict = collections.Counter()
    starts, stops, sizes, dop, dk = [], [], [], [], []
    hoisted: dict = {}
    for ci in touched:
        c = classes.classes[ci]
        key = (ci, late_key, tuple(okey.get(pi) for pi in c.patterns))
        r = memo.get(key)
        if r is None:
            r = memo[key] = _class_result(t, c, cl_of, late)
        saved += r[0]
        dup.update(r[1])
        if len(r[2]):
            starts.append(r[2])
            stops.append(r[3])
            sizes.append(r[4])
        if len(r[5]):
            dop.append(r[5])
            dk.append(r[6])
        hoisted.update(r[7])

    def cat(xs, dtype):
        return np.concatenate(xs) if xs else np.zeros(0, dtype=dtype)

    return Reshards(saved, dup, (cat(starts, np.int64), cat(stops, np.int64), cat(sizes, np.float64)),
                    (cat(dop, np.int64), cat(dk, np.int64)), hoisted)


def _class_result(t: Tables, c: ReadClass, cl_of: dict, late: dict | None) -> tuple:
    """(seconds saved, duplicate executions per (pattern, collective), the copies' first
    readers, ends and bytes, the duplicate reads' ops and collectives, the hoisted reads) of
    a class's values under the collectives ``cl_of``."""
    m = len(c.values)
    flags = None
    if late:
        spans = [late.get(v) for v in c.values.tolist()]
        held = np.array([s is not None for s in spans])
        if held.any():
            lo = np.array([s[0] if s else 0 for s in spans])[:, None]
            hi = np.array([s[1] if s else -1 for s in spans])[:, None]
            flags = (c.ops >= lo) & (c.ops <= hi)
            if not (held.all() and (flags == flags[0]).all()):  # not read alike under this recompute
                parts = [_expand(c, [j], _one(c, j, cl_of, flags[j] if held[j] else None)) for j in range(m)]
                return _merge(parts)
    return _expand(c, np.arange(m), _one(c, 0, cl_of, None if flags is None else flags[0]))


def _one(c: ReadClass, j: int, cl_of: dict, flags) -> tuple:
    """CSE for member ``j`` of a class: (seconds saved, [(pattern, collective, duplicate
    executions)], [(position, collective)] read again, [(position, collective, loops)]
    hoisted, [(positions, bytes)] per resharded copy)."""
    items = []
    for p, (pi, i, g) in enumerate(zip(c.pattern, c.operand, c.group)):
        cl = cl_of.get(pi)
        if cl is not None:
            items += [(g, k, p) for k, x in enumerate(cl) if x.operand == i]
    items.sort()
    seen: dict = {}
    for _, k, p in items:
        x = cl_of[c.pattern[p]][k]
        region = c.where[p] if flags is None else (c.where[p], bool(flags[p]))
        ident = (region, x.view, x.kind)
        use = (c.pattern[p], k, x.time, c.trip[p], p, c.once[p], c.loops[p])
        e = seen.get(ident)
        if e is None:
            seen[ident] = [x.view_bytes, x.kind, [use]]
        else:
            e[2].append(use)
    gathered: dict = collections.defaultdict(list)
    for (region, view, kind) in seen:
        if kind == CollectiveKind.ALL_GATHER:
            gathered[region].append(view)
    saved = 0.0
    dup, again, hoisted = [], [], []
    for (region, view, _), (_, kind, uses) in seen.items():
        # a finer view of a value already gathered coarser: a free local slice
        finer = kind == CollectiveKind.ALL_GATHER and any(
            other != view and all(tuple(view[d][:len(other[d])]) == tuple(other[d]) for d in range(len(view)))
            for other in gathered[region])
        for n, (pi, k, secs, trip, p, once, loops) in enumerate(uses):
            if n > 0 or finer:
                saved += secs * trip
                dup.append((pi, k, trip))
                again.append((p, k))
            elif once < trip:  # hoisted out of its loops: once per trip of the region outside them
                saved += secs * (trip - once)
                dup.append((pi, k, trip - once))
                hoisted.append((p, k, loops))
    # The resharded copies are buffers of their own, live from first to last reader; but
    # where only a shard_map region's boundary reads one, it is the region's own array of
    # that value (``Liveness.region_pairs``), counted there.
    copies: dict = {}
    for (region, view, _), (nbytes, _, uses) in seen.items():
        if all(c.aliasing[u[4]] for u in uses):
            continue
        x = copies.setdefault((region, view), [[], nbytes])
        x[0] += [u[4] for u in uses]
    return saved, dup, again, hoisted, list(copies.values())


def _expand(c: ReadClass, rows, r: tuple) -> tuple:
    """One member's CSE (``_one``) counted for members ``rows`` of the class, in
    ``_class_result``'s form."""
    saved, dup, again, hoisted, copies = r
    n = len(rows)
    counts: dict = collections.Counter()
    for pi, k, x in dup:
        counts[(pi, k)] += x * n
    if copies:
        starts = np.concatenate([c.first[rows][:, ps].min(axis=1) for ps, _ in copies])
        stops = np.concatenate([c.last[rows][:, ps].max(axis=1) + 1 for ps, _ in copies])
        sizes = np.concatenate([np.full(n, float(b)) for _, b in copies])
    else:
        starts = stops = np.zeros(0, dtype=np.int64)
        sizes = np.zeros(0)
    if again:
        dop = np.concatenate([c.ops[rows, p] for p, _ in again])
        dk = np.repeat(np.array([k for _, k in again], dtype=np.int64), n)
    else:
        dop = dk = np.zeros(0, dtype=np.int64)
    hoist = {(o, k): loops for p, k, loops in hoisted for o in c.ops[rows, p].tolist()}
    return saved * n, counts, starts, stops, sizes, dop, dk, hoist


def _merge(parts: list) -> tuple:
    counts: dict = collections.Counter()
    hoist: dict = {}
    for r in parts:
        counts.update(r[1])
        hoist.update(r[7])
    return (sum(r[0] for r in parts), counts, *(np.concatenate([r[i] for r in parts]) for i in range(2, 7)), hoist)


def invariant_homes(p: Program) -> np.ndarray:
    """Per value, the region whose every trip computes it alike: XLA's while-loop invariant
    code motion hoists out of a loop the ops whose operands the loop does not change, so a
    value is made where its producer runs unless all its operands are made outside that
    loop (an op of no operands, an iota or a constant, anywhere). A loop's own body inputs
    change every trip, except in a ``scan`` of length 1: XLA removes that loop, and its
    body reads the operands themselves (one layer per pipeline stage: the stage's weights
    are the tick loop's invariants). Branches and ``shard_map`` regions keep what they make;
    a loop's results are made where it runs."""
    regions = p.regions
    depth = np.zeros(len(regions), dtype=np.int64)
    for r in regions[1:]:
        depth[r.id] = depth[r.parent] + 1
    loops = ("scan", "while")
    homes = np.zeros(len(p.values), dtype=np.int64)
    for op in p.ops:
        kind = regions[op.region].kind
        if op.primitive == "scan_enter" and op.params.get("length") == 1:
            for i, v in zip(op.inputs, op.outputs):
                homes[v] = homes[i]
            continue
        if op.primitive.endswith(("_enter", "_exit")) or kind not in loops:
            home = op.region
        else:
            home = max((int(homes[v]) for v in op.inputs), key=lambda r: depth[r], default=TOP)
        for v in op.outputs:
            homes[v] = home
    return homes


def _invariant(t: Tables, op, home: int) -> tuple[int, int, tuple[int, int], tuple[int, ...]]:
    """Where XLA computes a reshard of a value read by ``op`` and made, invariantly, in region
    ``home`` (``invariant_homes``): (region, its trips, the enter and exit ops of the loops it
    is hoisted out of, those loops innermost first). Out of each enclosing loop up to
    ``home``; the op's own region and trip where none."""
    regions = t.program.regions
    r, loops = op.region, []
    while r != home and regions[r].kind in ("scan", "while") and regions[r].enter >= 0:
        loops.append(r)
        r = regions[r].parent
    if not loops:
        return op.region, op.trip, (op.id, op.id), ()
    out = regions[loops[-1]]
    return r, regions[r].trip, (out.enter, out.exit), tuple(loops)
