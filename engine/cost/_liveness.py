"""Live ranges: when each buffer of the program is made and when it dies, in program order.

``build_liveness`` makes ``Liveness`` once per analysed program and donation: the
intermediates' live ranges, the arguments and outputs with their roles, the donated pairs.
A value fused into its reader keeps its operands alive until that read; a loop's state and
an update XLA runs in place are one buffer with what they update; a shard_map region's
operands, body arrays and results are one buffer each (``CostFacts.aliases``) unless a plan
gathers one across the boundary (then a copy of its own, to the next boundary that gathers it
again: the region pairs ``_memory`` sizes per plan); under ``lowering="cpu"`` random bits are
threefry's two materialised halves (``_fusion.cpu_random_bits``), made as soon as their key
is ready (``cpu_early_bits``).

Building side: imports ``_records``, ``_fusion``, ``_facts`` and the program types; nothing
that prices.
"""

from __future__ import annotations

import collections

import numpy as np

from ..tracing._program import NO_PRODUCER
from ._facts import having
from ._fusion import alias_roots, cpu_random_bits
from ._records import Liveness


def _last_uses(p) -> np.ndarray:
    """Per value, its last use; a use inside a loop body of a value made outside it lasts
    until the loop's exit op (-1: never used)."""
    region_parent = {r.id: r.parent for r in p.regions}
    region_exit = {r.id: r.exit for r in p.regions}
    op_region = [op.region for op in p.ops]

    def chain(r):
        out = []
        while r > 0:
            out.append(r)
            r = region_parent[r]
        return out

    ancestors = {r.id: set(chain(r.id)) | {0} for r in p.regions}
    end = np.full(len(p.values), -1, dtype=np.int64)
    for op in p.ops:
        for v in op.inputs:
            use = op.id
            if op.region:
                pv = p.values[v].producer
                anc = ancestors[op_region[pv] if pv != NO_PRODUCER else 0]
                r = op.region
                while r not in anc:  # used inside a body it was not made in
                    use = max(use, region_exit[r])
                    r = region_parent[r]
            if use > end[v]:
                end[v] = use
    return end


def _arg_index_of_inputs(p) -> list[int]:
    """The positional argument each input leaf belongs to (a bare array is an argument of one leaf)."""
    counts = [t.num_leaves for t in p.in_tree.children()]
    out = []
    for a, c in enumerate(counts):
        out += [a] * c
    return out + [len(counts)] * (len(p.inputs) - len(out))


def _aliases(p, donate) -> list[tuple[int, int]]:
    """Output leaves that alias an input leaf of a donated arg (same shape and dtype, by name:
    ``dtype.str`` is ``<V1`` for int4 and float8 alike)."""
    pairs: list[tuple[int, int]] = []
    if donate:
        arg_of_input = _arg_index_of_inputs(p)
        pool: dict[tuple, list[int]] = collections.defaultdict(list)
        for k, vid in enumerate(p.inputs):
            if arg_of_input[k] in set(donate):
                v = p.values[vid]
                pool[(v.shape, str(v.dtype))].append(vid)
        for ovid in p.outputs:
            v = p.values[ovid]
            lst = pool.get((v.shape, str(v.dtype)))
            if lst:
                pairs.append((lst.pop(0), ovid))
    return pairs



def _stacked_from_entry(p, prod: np.ndarray) -> None:
    """A scan's stacked results (its ``ys``) are one buffer the loop writes a slot of each
    trip: XLA allocates it before the loop starts (the lowered while loop carries it), so it
    is live from the loop's entry, not from its exit. Moves their producer (in ``prod``) to
    the entry op."""
    enter_of = {r.exit: r.enter for r in p.regions if r.exit >= 0}
    for op in p.ops:
        if op.primitive == "scan_exit":
            for o in op.outputs[op.params["num_carry"]:]:
                prod[o] = enter_of[op.id]


def cpu_early_bits(p, prod: np.ndarray) -> None:
    """XLA:CPU: random bits are made as soon as their key is ready (``CostFacts.cpu_early``:
    its derivation reads nothing that waits), not where the program makes them: each bits
    value's producer (in ``prod``) moves to the last op its key waits for (the step's start,
    0, for a key derived from the arguments alone). Inside a loop body, no earlier than the
    body's start."""
    early, rolled = having("cpu_early"), having("cpu_rolled_bits")
    ready = np.zeros(len(p.values), dtype=np.int64)  # per value: the op it waits for
    enter = {r.id: r.enter for r in p.regions}
    for op in p.ops:
        if op.primitive in early:
            at = max((int(ready[i]) for i in op.inputs), default=0)
            at = max(at, enter[op.region]) if op.region else at
        else:
            at = op.id
        ready[list(op.outputs)] = at
        if op.primitive in rolled:
            prod[list(op.outputs)] = np.minimum(prod[list(op.outputs)], at)


def _reader_counts(p) -> np.ndarray:
    """Per value, how many ops read it."""
    readers = np.zeros(len(p.values), dtype=np.int64)
    for op in p.ops:
        for v in set(op.inputs):
            readers[v] += 1
    return readers


def _loop_carries(p, readers: np.ndarray) -> list[tuple[int, int, int]]:
    """(op, operand, result) pairs that are one buffer as XLA runs a loop: the loop state.
    A carry's initial value is the state the body reads (where nothing else reads it: XLA
    copies one read again after the loop), and a carry the body makes is the loop's result.
    ``readers``: per value, the ops reading it."""
    outer = set(p.inputs) | set(p.outputs)
    enter_of = {r.exit: r.enter for r in p.regions if r.exit >= 0}
    pairs = []
    for op in p.ops:
        if op.primitive in ("scan_enter", "while_enter"):
            n = op.params["num_carry"] if op.primitive == "scan_enter" else len(op.outputs)
            pairs += [(op.id, i, o) for i, o in zip(op.inputs[:n], op.outputs[:n])
                      if readers[i] == 1 and i not in outer and p.values[i].producer != NO_PRODUCER]
        elif op.primitive in ("scan_exit", "while_exit"):
            n = op.params["num_carry"] if op.primitive == "scan_exit" else len(op.outputs)
            enter = enter_of[op.id]
            pairs += [(op.id, i, o) for i, o in zip(op.inputs[:n], op.outputs[:n])
                      if p.values[i].producer > enter and o not in outer]
    return pairs


# Ops XLA runs in place on their first operand's buffer when nothing else reads it.
_IN_PLACE = frozenset({"scatter", "scatter-add", "scatter_add", "scatter-mul", "scatter_mul", "scatter-min",
                       "scatter_min", "scatter-max", "scatter_max", "dynamic_update_slice"})


def _in_place(p, readers: np.ndarray) -> list[tuple[int, int, int]]:
    """(op, operand, result) pairs of a scatter or dynamic-update-slice whose first operand
    only it reads, an intermediate: XLA updates that buffer in place (the zeros a one-hot
    gradient is scattered into are the gradient's buffer). A buffer whose other readers
    only slice it before the update (a loop's buffer read and written at one slot a trip)
    is updated in place too: the slices are read first. ``readers``: per value, the ops
    reading it."""
    outer = set(p.inputs) | set(p.outputs)
    cands = [op for op in p.ops if op.primitive in _IN_PLACE and op.inputs and op.inputs[0] not in outer
             and p.values[op.inputs[0]].producer != NO_PRODUCER and op.outputs[0] not in outer]
    shared = {op.inputs[0] for op in cands if readers[op.inputs[0]] > 1}
    others: dict[int, list] = {v: [] for v in shared}
    if shared:
        for op in p.ops:
            for v in set(op.inputs) & shared:
                others[v].append(op)

    def first_read_by(op) -> bool:
        v = op.inputs[0]
        # (a loop's exit op reads the body's carried state after the body's outputs: the
        # link that keeps the state live through the loop, not a read of its own)
        return readers[v] == 1 or all(o.id == op.id or (o.primitive in _SLICES and o.id < op.id
                                                         and o.inputs[0] == v and v not in o.inputs[1:])
                                      or (o.primitive in ("scan_exit", "while_exit") and v not in _outs_of(o))
                                      for o in others[v])

    pairs = [(op.id, op.inputs[0], op.outputs[0]) for op in cands if first_read_by(op)]
    # a loop body's constraint on a value only it reads (the state a body updates and
    # places again: a pipeline tick's buffers): the same buffer
    pairs += [(op.id, op.inputs[0], op.outputs[0]) for op in p.ops
              if op.primitive == "sharding_constraint" and op.region != 0 and readers[op.inputs[0]] == 1
              and op.outputs[0] not in outer]
    return pairs


_SLICES = frozenset({"dynamic_slice", "slice"})


def _outs_of(exit_op) -> list:
    """A loop exit's operands that are the body's outputs (after them: the carried state)."""
    n = exit_op.params["num_carry"] if exit_op.primitive == "scan_exit" else len(exit_op.outputs)
    return exit_op.inputs[:len(exit_op.inputs) - n] if exit_op.primitive == "scan_exit" else exit_op.inputs[:n]


_BOUNDARY = frozenset({"shard_map_enter", "shard_map_exit"})


def _extend(end: np.ndarray, aliases, carries, fusing) -> np.ndarray:
    for _ in range(8):
        before = end.copy()
        for _, i, o in aliases:
            end[i] = max(end[i], end[o])
        for _, i, o in reversed(carries):
            end[i] = max(end[i], end[o])
        for ins, outs in fusing:
            last = max(end[o] for o in outs)
            for i in ins:
                end[i] = max(end[i], last)
        if np.array_equal(before, end):
            break
    return end


def _region_pairs(p, aliases, boundary: set, is_mid: np.ndarray, end: np.ndarray, near: np.ndarray) -> list:
    """(operand, body value, boundary op, end, end before the next boundary, next pair) of
    each region boundary whose far side is an intermediate: the far side's array lives to the
    end of its uses, or, where the next boundary its buffer reaches is a buffer of its own
    there (``_memory.memory_report`` decides, by the plan's sizes), to that boundary."""
    pairs = sorted((at, i, o) for at, i, o in aliases if at in boundary and is_mid[o])
    by_operand = {i: k for k, (_, i, _) in reversed(list(enumerate(pairs)))}
    inner: dict[int, list[int]] = collections.defaultdict(list)  # value -> what aliases it inside a region
    for at, i, o in aliases:
        if at not in boundary:
            inner[i].append(o)
    out = []
    for at, i, o in pairs:
        seen, todo, nxt = {o}, [o], -1
        while todo:
            v = todo.pop()
            k = by_operand.get(v)
            if k is not None and pairs[k][0] > at and (nxt < 0 or pairs[k][0] < pairs[nxt][0]):
                nxt = k
            for w in inner.get(v, ()):
                if w not in seen:
                    seen.add(w)
                    todo.append(w)
        out.append((i, o, at, max(end[o], at) + 1, max(near[o], at) + 1, nxt))
    return out


def build_liveness(analysis, donate, fused: np.ndarray, lowering: str = "tpu") -> Liveness:
    """The live ranges of ``analysis``' program: ``donate`` the donated arguments (their
    positions), ``fused`` per value whether XLA fuses it away (``_fusion.fused_values``),
    ``lowering`` as ``CostModel``'s."""
    p = analysis.program
    n_ops = len(p.ops)
    end = _last_uses(p)
    prod = np.fromiter((v.producer for v in p.values), dtype=np.int64, count=len(p.values))
    _stacked_from_entry(p, prod)
    aliasing = having("aliases")
    aliases = [(op.id, i, o) for op in reversed(p.ops) if op.primitive in aliasing
               for i, o in zip(op.inputs, op.outputs)]  # last first: a chain's end reaches its first
    readers = _reader_counts(p)
    carries = _loop_carries(p, readers) + _in_place(p, readers)
    # (an operand an elementwise op made XLA computes again there from its own operands, or
    # keeps for its other readers: only a value no fusion can recompute - a matmul's, a
    # reduction's, an argument - is kept for the fused read)
    fusible = having("fusible")
    # (on TPU and GPU a chain of fused values is computed in its last reader's fusion, or in
    # each of its readers', from the chain's operands, which live until then, whatever made
    # them; XLA:CPU computes a fused chain's elementwise operands where they are made)
    kept = [lowering != "cpu" or v.producer == NO_PRODUCER or p.ops[v.producer].primitive not in fusible
            for v in p.values]
    fusing = [([i for i in op.inputs if kept[i]], [o for o in op.outputs if fused[o]]) for op in reversed(p.ops)]
    # XLA:CPU's random bits: a mask computed from them is computed again from their halves
    bits = cpu_random_bits(p)[1] if lowering == "cpu" else {}
    fusing += [(list(src), [v]) for v, src in bits.items()]
    fusing = [(ins, outs) for ins, outs in fusing if outs]
    # A buffer seen under several values (a region's operand and the body's array) lives
    # until the last use of any; a value XLA fuses into its reader is computed there, from
    # its operands, which live until that read (a ReLU's mask read in the backward pass
    # keeps its input). Each can lengthen the other's ranges: repeated until none changes.
    # ``near``: the same, but not through a region's boundary (where a plan may make the
    # array across it a buffer of its own).
    boundary = {op.id for op in p.ops if op.primitive in _BOUNDARY}
    near = _extend(end.copy(), [a for a in aliases if a[0] not in boundary], carries, fusing)
    end = _extend(end, aliases, carries, fusing)
    scale = np.ones(len(p.values), dtype=np.float64)
    if lowering == "cpu":  # random bits: two uint32 halves (cpu_random_bits), made early
        for op in p.ops:
            if op.primitive == "random_bits":
                val = p.values[op.outputs[0]]
                scale[val.id] = 2 * max(4, val.dtype.itemsize) / val.dtype.itemsize
        cpu_early_bits(p, prod)
    is_mid = np.ones(len(p.values), dtype=bool)
    is_mid[list(set(p.inputs))] = False
    is_mid[list(set(p.outputs))] = False
    is_mid &= prod != NO_PRODUCER
    # Where a plan gathers an array across a region's boundary (a ZeRO weight for a body
    # that reads it whole, a residual leaving the region stacked over its manual axes), the
    # far side is a buffer of its own, from the boundary to the last use through it or to
    # the next boundary that gathers it again: _memory.memory_report adds it then.
    split = _region_pairs(p, aliases, boundary, is_mid, end, near)
    # Otherwise it counts once, at its first value; not at all where one of the values is
    # an argument or an output (counted whole already).
    root = alias_roots(p, carries)
    aliased = np.flatnonzero(root != np.arange(len(root)))
    if len(aliased):
        whole = np.zeros(len(root), dtype=bool)
        np.logical_or.at(whole, root[aliased], ~is_mid[aliased])
        is_mid[aliased] = False
        is_mid[whole] = False
    # XLA fuses elementwise chains: a value made by an elementwise op and read only by
    # one elementwise op or reduction is never materialised.
    is_mid &= ~fused
    # a dead intermediate lives only through its producer
    end = np.where(end < 0, prod, end)
    mid = np.flatnonzero(is_mid)
    mid_def = prod[mid]
    mid_end = end[mid] + 1
    span = mid_end - mid_def
    # input categories from the roles the program's structure gives its inputs
    roles = analysis.roles
    cat = [roles.category(vid) for vid in p.inputs]
    alias_pairs = _aliases(p, donate)
    in_cat = dict(zip(p.inputs, cat))
    return Liveness(
        n_ops=n_ops, value_end=np.where(end < 0, n_ops, end + 1).tolist(), mid=mid, mid_def=mid_def,
        mid_end=mid_end, mid_long=span > max(8, n_ops // 10), mid_scale=scale[mid] if (scale != 1).any() else None, inputs=np.array(p.inputs, dtype=np.int64),
        outputs=np.array(sorted(set(p.outputs)), dtype=np.int64), input_cat=np.array(cat),
        output_cat={ovid: in_cat[ivid] for ovid, ivid in roles.mirror.items()}, alias_pairs=tuple(alias_pairs),
        region_pairs=tuple(np.array(x, dtype=np.int64) for x in zip(*split)) if split else (),
        alias_arrays=(np.array([i for i, _ in alias_pairs], dtype=np.int64),
                      np.array([o for _, o in alias_pairs], dtype=np.int64)),
        host=_host_mask(p, lowering))


def _host_mask(p, lowering: str) -> np.ndarray | None:
    """Per value, whether it lives in host memory; None where none does or on XLA:CPU,
    which keeps every value in device memory whatever its memory space."""
    if lowering == "cpu" or not any(v.host for v in p.values):
        return None
    return np.fromiter((v.host for v in p.values), dtype=bool, count=len(p.values))
