"""Memory: live ranges over program order, and the per-device peak they give.

Owns ``Liveness`` (built once per analysed program and donation: the intermediates' live
ranges, the arguments and outputs with their roles, the donated pairs), the program facts
it rests on (``fused_values``: what XLA fuses away; ``cpu_combined``: where XLA:CPU's
combined all-reduces free the partial gradients) and ``memory_report``, the peak per device
of one plan from the values' local sizes, the resharded and transient buffers and a
recompute edit. Every buffer counts at its sharded size; arguments live throughout,
outputs counted whole (as XLA reports them), donated outputs aliased: an over-estimate
rather than an under-estimate. A value fused into its reader keeps its operands alive until
that read; a shard_map region's operands, body arrays and results are one buffer each
(``CostFacts.aliases``) unless the plan gathers one across the boundary (then a copy of its
own, to the next boundary that gathers it again);
under ``lowering="cpu"`` random bits are threefry's two materialised halves
(``cpu_random_bits``). Imports ``_facts``, ``_report``, the program and rule types
and ``partex.analysis._recompute``'s ``backward_span``.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..analysis._recompute import backward_span
from ..analysis._rules import FactorKind
from ..tracing._program import NO_PRODUCER
from ._facts import having
from ._report import HeldBuffer, MemoryReport

if TYPE_CHECKING:
    from ._recompute import Edit

_CPU_COMBINE = 256  # all-reduces XLA:CPU combines into one (CpuAllReduceCombiner's count limit)


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Liveness:
    """Live ranges and roles of the program's buffers (ops numbered in program order)."""

    n_ops: int
    value_end: list[int]  # per value: the op after its last use (a loop body's: the loop's exit)
    mid: np.ndarray  # the intermediates (made by an op, neither inputs nor outputs, not fused away)
    mid_def: np.ndarray  # ... the op making each
    mid_end: np.ndarray  # ... the op after its last use
    mid_long: np.ndarray  # ... saved across much of the step: activations
    mid_scale: np.ndarray | None  # ... its buffers per byte of its value (XLA:CPU's random bits: two halves); None: 1
    inputs: np.ndarray
    outputs: np.ndarray  # sorted
    input_cat: np.ndarray  # per input: parameters, optimizer, activations (the data)
    output_cat: dict[int, str]  # an output that mirrors an input (the updated state): its category
    alias_pairs: tuple[tuple[int, int], ...]  # (input, output) donated pairs
    # a region boundary's (operand, body value, boundary op, end of the body value's uses,
    # end of its uses up to the next boundary its buffer crosses, that boundary's pair or -1),
    # as six arrays (empty: none): one buffer where the plan gives both the same size
    region_pairs: tuple[np.ndarray, ...]
    alias_arrays: tuple[np.ndarray, np.ndarray]  # the same, as two arrays
    # per value, in host memory (an offloaded residual, a parameter kept on the host): not
    # on the device; None where none is or the backend keeps every value on the device
    host: np.ndarray | None = None


def fused_values(program, lowering: str = "tpu", ignore: frozenset[tuple[int, int]] = frozenset()) -> np.ndarray:
    """Per value: XLA fuses it away. A value made by an elementwise op and read only by
    one elementwise op or reduction is made and read inside one fusion: never in memory,
    neither written by its maker nor read by its reader. Under ``lowering="cpu"`` also what
    is computed from random bits elementwise and read only inside fusions
    (``cpu_random_bits``). ``ignore``: (op, value) reads left out (a residual's stacking,
    which a recompute decision drops: ``_recompute.variant_reads``)."""
    out = _fused(program, ignore)
    if lowering == "cpu":
        out |= cpu_random_bits(program)[0]
        out[alias_roots(program)[list(program.outputs)]] = False
    else:
        out |= _recomputed_at_reads(program, out, keep_upcasts=lowering == "gpu", ignore=ignore)
    return out


def _recomputed_at_reads(program, fused: np.ndarray, most: int = 4, keep_upcasts: bool = False,
                         ignore: frozenset[tuple[int, int]] = frozenset()) -> np.ndarray:
    """TPU and GPU: per value, made by an elementwise op, read by several readers each
    inside a fusion, and larger than what it is computed from: XLA computes it in each
    reader's fusion (a cheap producer is duplicated into its consumers; an expensive one,
    such as ``exp``, is recomputed there by the rematerialisation pass under memory
    pressure) from its operands, which stay in memory instead: the float32 log-softmax
    chain over a bfloat16 [batch, seq, vocab] logits block is never in memory, its logits
    are. A value computed from more than ``most`` kept buffers, or from as many bytes as it
    takes, is kept (XLA keeps what is no cheaper to hold than to recompute), and so is one
    the optimizer reads after the backward pass (a gradient cast up for the update: computed
    from the reduced gradient, which the plan holds sharded, not from the unreduced one).
    XLA:CPU neither duplicates such producers nor rematerialises: not under
    ``lowering="cpu"``. XLA GPU keeps a float32 upcast of a matmul's narrower result that
    several kernels read (the gradient of attention probabilities, cast up for the softmax's
    backward) rather than casting again in each (``keep_upcasts``, ``_kept_upcast``)."""
    p = program
    fusible, readers, aliasing = having("fusible"), having("fusion_reader"), having("aliases")
    root = alias_roots(p)
    span = backward_span(p)
    after = span[1] if span is not None else len(p.ops)
    read_in_fusion = np.ones(len(p.values), dtype=bool)
    read = np.zeros(len(p.values), dtype=bool)
    for op in p.ops:
        if op.primitive in aliasing:
            continue
        for v in op.inputs:
            if (op.id, v) in ignore:
                continue
            read[root[v]] = True
            read_in_fusion[root[v]] &= op.primitive in readers and op.id <= after
    outputs = set(root[list(p.outputs)].tolist())
    nbytes = [v.nbytes for v in p.values]
    out = np.zeros(len(p.values), dtype=bool)
    # per value computed in fusions: the kept buffers it is computed from. Values a fusion
    # makes in place (an iota, a broadcast scalar: a causal mask's) and scalars are no
    # buffers it reads: they neither count toward ``most`` nor cost bytes
    free = made_in_place(p)
    sources: dict[int, frozenset[int]] = {}
    for op in p.ops:
        if op.primitive not in fusible or not op.outputs:
            continue
        src: set[int] = set()
        for i in op.inputs:
            src |= sources.get(i, set() if free[i] else {i})
        if len(src) > most:
            continue
        cost = sum(nbytes[i] for i in src)
        if keep_upcasts and _kept_upcast(p, op, fused):
            src = {op.outputs[0]}  # a kept upcast: its readers read it
            cost = nbytes[op.outputs[0]]
        for o in op.outputs:
            if fused[o] or (read[o] and read_in_fusion[o] and o not in outputs and cost < nbytes[o]):
                out[o] = not fused[o]
                sources[o] = frozenset(src)
    return out


def _kept_upcast(p, op, fused: np.ndarray) -> bool:
    """A cast to a wider type of a matmul's result, read by several kernels (not fused into
    one reader): XLA GPU writes it out once."""
    if op.primitive != "convert_element_type" or fused[op.outputs[0]]:
        return False
    src = p.values[op.inputs[0]]
    return (src.producer != NO_PRODUCER and p.ops[src.producer].primitive == "dot_general"
            and p.values[op.outputs[0]].dtype.itemsize > src.dtype.itemsize)


def made_in_place(program) -> np.ndarray:
    """Per value: a fusion makes it where it reads it, from no buffer (an iota, a broadcast
    scalar, a scalar): it is no buffer a kernel reads."""
    p = program
    local = having("local")
    free = np.array([not v.shape for v in p.values], dtype=bool)
    for op in p.ops:
        made_here = local.get(op.primitive)
        if made_here is not None and made_here(op, p.values):
            free[list(op.outputs)] = True
    return free


def kernel_reads(program, fused: np.ndarray, stand_ins: dict[int, int] | None = None) -> list[tuple[float, ...]]:
    """TPU and GPU: per op, per operand, the bytes the op's kernel reads from memory per
    byte of the operand. An op whose results are all fused away is no kernel of its own
    (0 for every operand): its consumers compute it. A kernel reads each of its operands in
    memory once, and for an operand fused away the buffers it is computed from (through
    any chain of fused values; values made in place excluded), each once per kernel
    however many of its operands reach it: a softmax's reductions and its normalisation
    each read the scores, not the float32 exponentials fused into them. ``stand_ins``: a
    value fused away that stands for another (a backward loop's slice of a residual the
    recomputation makes again: the residual), computed from the same buffers."""
    stand_ins = stand_ins or {}
    p = program
    free = made_in_place(p)
    nbytes = [v.nbytes for v in p.values]
    sources: dict[int, frozenset[int]] = {}
    for op in p.ops:
        fused_outs = [o for o in op.outputs if fused[o]]
        if not fused_outs:
            continue
        src: set[int] = set()
        for i in op.inputs:
            src |= _sources(i, sources, stand_ins) if fused[i] else (set() if free[i] else {i})
        for o in fused_outs:
            sources[o] = frozenset(src)
    out: list[tuple[float, ...]] = []
    for op in p.ops:
        if op.outputs and all(fused[o] for o in op.outputs):
            out.append((0.0,) * len(op.inputs))
            continue
        seen: set[int] = set()
        weights = []
        for i in op.inputs:
            if not fused[i]:
                weights.append(0.0 if i in seen else 1.0)
                seen.add(i)
                continue
            read = _sources(i, sources, stand_ins) - seen
            seen |= read
            weights.append(sum(nbytes[x] for x in read) / nbytes[i] if nbytes[i] else 0.0)
        out.append(tuple(weights))
    return out


def fusion_readers(program) -> np.ndarray:
    """Per value: read, and only by ops that read inside a fusion (elementwise ops and
    reductions)."""
    p = program
    readers = having("fusion_reader")
    read = np.zeros(len(p.values), dtype=bool)
    only = np.ones(len(p.values), dtype=bool)
    for op in p.ops:
        for v in op.inputs:
            read[v] = True
            only[v] &= op.primitive in readers
    return read & only


def _sources(v: int, sources: dict[int, frozenset[int]], stand_ins: dict[int, int]) -> frozenset[int]:
    """The buffers fused value ``v`` is computed from (those of the value it stands for)."""
    return sources.get(stand_ins.get(v, v), frozenset())


def cpu_random_bits(program) -> tuple[np.ndarray, dict[int, tuple[int, ...]]]:
    """XLA:CPU's random bits (``CostFacts.cpu_rolled_bits``): per value, whether it is
    computed from random bits by elementwise ops alone and read only inside fusions (XLA
    computes it again in each reader's fusion from the bits' halves: never in memory); and
    each such value's random-bits values, whose halves live until its last read."""
    p = program
    rolled, fusible, readers = having("cpu_rolled_bits"), having("fusible"), having("fusion_reader")
    source: dict[int, tuple[int, ...]] = {}  # a value computed from random bits alone -> the bits
    for op in p.ops:
        if op.primitive in rolled:
            for o in op.outputs:
                source[o] = (o,)
        elif op.primitive in fusible and op.outputs:
            big = [v for v in op.inputs if math.prod(p.values[v].shape) > 1]  # scalars broadcast in
            if big and all(v in source for v in big):
                src = tuple(dict.fromkeys(b for v in big for b in source[v]))
                for o in op.outputs:
                    source[o] = src
    read_in_fusion = dict.fromkeys(source, True)
    read = set()
    for op in p.ops:
        for v in op.inputs:
            if v in source:
                read.add(v)
                read_in_fusion[v] &= op.primitive in readers
    unmade = np.zeros(len(p.values), dtype=bool)
    for v in source:
        unmade[v] = v in read and read_in_fusion[v] and p.ops[p.values[v].producer].primitive not in rolled
    return unmade, {v: source[v] for v in np.flatnonzero(unmade).tolist()}


def _fused(program, ignore: frozenset[tuple[int, int]] = frozenset()) -> np.ndarray:
    p = program
    fusible, readers, aliasing = having("fusible"), having("fusion_reader"), having("aliases")
    root = alias_roots(p)  # a value read through a region's boundary is read where the body reads it
    consumers = np.zeros(len(p.values), dtype=np.int64)
    fusion_read = np.ones(len(p.values), dtype=bool)  # every reader reads it inside a fusion
    for op in p.ops:
        if op.primitive in aliasing:
            continue
        for v in {int(root[v]) for v in op.inputs if (op.id, v) not in ignore}:
            consumers[v] += 1
            fusion_read[v] &= op.primitive in readers
    made = [p.ops[v.producer].primitive if v.producer != NO_PRODUCER else None for v in p.values]
    made_fusible = np.array([m in fusible for m in made], dtype=bool)
    out = made_fusible & fusion_read & (consumers == 1)
    out[root[list(p.outputs)]] = False
    return out


def cpu_combined(program, factors) -> np.ndarray | None:
    """Per op, where XLA:CPU reduces its partial result: XLA:CPU combines independent
    all-reduces without a byte limit, 256 at a time, so the gradient reductions of the
    backward pass, whose results nothing reads before the optimizer, run in groups of 256
    and every partial (full-size) gradient lives until its group's. -1: as the value
    (read during the backward pass: its reduction cannot wait)."""
    p = program
    span = backward_span(p)
    if span is None:
        return None
    first, last = span
    # the first op that reads each value other than through views (reshapes, transposes)
    first_read = np.full(len(p.values), len(p.ops), dtype=np.int64)
    relayout = having("relayout")
    for op in reversed(p.ops):
        for v in op.inputs:
            at = min((first_read[o] for o in op.outputs), default=len(p.ops)) \
                if op.primitive in relayout else op.id
            first_read[v] = min(first_read[v], at)
    out = np.full(len(p.ops), -1, dtype=np.int64)
    reducing = [op.id for op in p.ops[first:last + 1]
                if op.outputs and all(first_read[v] > last for v in op.outputs)
                and any(f.kind == FactorKind.REDUCTION for f in factors[op.id])]
    # combined 256 at a time, in program order: each group reduces after its last
    for k in range(0, len(reducing), _CPU_COMBINE):
        group = reducing[k:k + _CPU_COMBINE]
        out[group] = group[-1] + 1
    return out


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


def alias_roots(p, carries: Sequence[tuple[int, int, int]] = ()) -> np.ndarray:
    """Per value, the value whose buffer it is (itself, or through ops that only alias their
    operands: a shard_map region's boundary; ``carries``: a loop's state) - the first of
    its chain."""
    root = np.arange(len(p.values), dtype=np.int64)
    aliasing = having("aliases")
    for op in p.ops:  # program order: an operand's root is settled before its result's
        if op.primitive in aliasing:
            for i, o in zip(op.inputs, op.outputs):
                root[o] = root[i]
    for _, i, o in sorted(carries):
        root[o] = root[i]
    return root


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
    there (``memory_report`` decides, by the plan's sizes), to that boundary."""
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
    if lowering == "cpu":  # random bits: two uint32 halves (cpu_random_bits)
        for op in p.ops:
            if op.primitive == "random_bits":
                val = p.values[op.outputs[0]]
                scale[val.id] = 2 * max(4, val.dtype.itemsize) / val.dtype.itemsize
    is_mid = np.ones(len(p.values), dtype=bool)
    is_mid[list(set(p.inputs))] = False
    is_mid[list(set(p.outputs))] = False
    is_mid &= prod != NO_PRODUCER
    # Where a plan gathers an array across a region's boundary (a ZeRO weight for a body
    # that reads it whole, a residual leaving the region stacked over its manual axes), the
    # far side is a buffer of its own, from the boundary to the last use through it or to
    # the next boundary that gathers it again: memory_report adds it then.
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


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Moved:
    """What keeping sets of the step's state in host memory (a plan's ``Memory``
    decisions) changes in device memory: the arguments and their updates are in host memory
    (``host``, with the program's own host values); a device copy of each argument lives
    from its first read to its last, and each update from where it is made to the end of the
    step, whence it is copied out."""

    host: np.ndarray  # per value: in host memory
    copy_v: np.ndarray  # the device copies' values ...
    copy_a: np.ndarray  # ... live from ...
    copy_b: np.ndarray  # ... to
    copy_cat: tuple[str, ...]  # ... each one's category (parameters, optimizer)


def moved_state(program, live: Liveness, inputs: Sequence[int], outputs: Sequence[int]) -> Moved:
    """``Moved`` for state arguments ``inputs`` and their updates ``outputs`` in host memory."""
    p = program
    first = np.full(len(p.values), -1, dtype=np.int64)
    for op in reversed(p.ops):
        first[list(op.inputs)] = op.id
    host = np.zeros(len(p.values), dtype=bool) if live.host is None else live.host.copy()
    cat = dict(zip(live.inputs.tolist(), live.input_cat.tolist()))
    copies: list[tuple[int, int, int, str]] = []  # (value, from, to, category)
    for v in inputs:
        host[v] = True
        if first[v] >= 0:  # an argument nothing reads needs no copy
            copies.append((v, int(first[v]), live.value_end[v], cat[v]))
    for o in outputs:
        host[o] = True
        made = p.values[o].producer
        if made != NO_PRODUCER:
            copies.append((o, made, live.n_ops, live.output_cat.get(o, "activations")))
    cv, ca, cb = (np.array([c[k] for c in copies], dtype=np.int64) for k in range(3))
    return Moved(host, cv, ca, cb, tuple(c[3] for c in copies))


def _host_mask(p, lowering: str) -> np.ndarray | None:
    """Per value, whether it lives in host memory; None where none does or on XLA:CPU,
    which keeps every value in device memory whatever its memory space."""
    if lowering == "cpu" or not any(v.host for v in p.values):
        return None
    return np.fromiter((v.host for v in p.values), dtype=bool, count=len(p.values))


def host_peak(live: Liveness, local: np.ndarray, mask: np.ndarray | None = None) -> float:
    """The most host memory per device the step holds at once: its arguments and results in
    host memory (a donated argument and the result that reuses its buffer once) and the
    peak of its offloaded intermediates. ``mask``: per value, in host memory (default
    ``live.host``)."""
    mask = live.host if mask is None else mask
    if mask is None:
        return 0.0
    hb = np.where(mask, local, 0.0)
    n = live.n_ops + 2
    b = hb[live.mid]
    delta = np.bincount(live.mid_def, weights=b, minlength=n) - np.bincount(live.mid_end, weights=b, minlength=n)
    mids = float(np.cumsum(delta).max()) if len(delta) else 0.0
    alias = 0.0
    if live.alias_pairs:
        ai, ao = live.alias_arrays
        alias = float(hb[ao][np.isclose(hb[ai], hb[ao])].sum())
    return float(hb[live.inputs].sum() + hb[live.outputs].sum()) - alias + max(mids, 0.0)


def memory_report(live: Liveness, local: np.ndarray, detail: bool, buffers=(), edit: "Edit | None" = None,
                  moved: Moved | None = None) -> MemoryReport:
    """The per-device peak: arguments + outputs + the peak of the live intermediates, the
    resharded and transient ``buffers`` ((from op, to op, bytes): three arrays), an edit's recomputed
    copies and temporaries and the device copies of state kept in host memory (``moved``)
    - the aliased outputs. ``local``: per value, its bytes per device. Values in host
    memory take none of the device's; ``host`` is their own peak."""
    mask = live.host if moved is None else moved.host
    host = host_peak(live, local, mask)
    has_copies = moved is not None and len(moved.copy_v) > 0
    copies = local[moved.copy_v] if moved is not None and has_copies else None
    if mask is not None:
        local = np.where(mask, 0.0, local)
    args = float(local[live.inputs].sum())
    outs = float(local[live.outputs].sum())
    if live.alias_pairs:
        ai, ao = live.alias_arrays
        alias = float(local[ao][np.isclose(local[ai], local[ao])].sum())
    else:
        alias = 0.0
    b = local[live.mid] if live.mid_scale is None else local[live.mid] * live.mid_scale
    n = live.n_ops + 2
    mid_end = live.mid_end if edit is None else edit.mid_end
    delta = (np.bincount(live.mid_def, weights=b, minlength=n)
             - np.bincount(mid_end, weights=b, minlength=n)).astype(np.float64)
    if edit is not None and len(edit.clone_v):
        size = local[edit.clone_v] * edit.clone_n
        delta += np.bincount(edit.clone_a, weights=size, minlength=n) - np.bincount(edit.clone_b, weights=size, minlength=n)
    if edit is not None and len(edit.tmp_v):
        rows = np.bincount(edit.tmp_row, weights=local[edit.tmp_v])
        size = np.maximum.reduceat(rows, edit.tmp_seg)
        delta += np.bincount(edit.tmp_at, weights=size, minlength=n) - np.bincount(edit.tmp_at + 1, weights=size, minlength=n)
    if copies is not None and moved is not None:
        delta += np.bincount(moved.copy_a, weights=copies, minlength=n) - np.bincount(moved.copy_b, weights=copies, minlength=n)
    if live.region_pairs:
        outer, body, at, stop = _region_arrays(live, local)
        own = _gathered(local[outer], local[body])
        if own.any():
            size = local[body][own]
            delta += np.bincount(at[own], weights=size, minlength=n) - np.bincount(stop[own], weights=size, minlength=n)
    if buffers and len(buffers[0]):
        start, stop, size = buffers
        delta += np.bincount(start, weights=size, minlength=n) - np.bincount(stop, weights=size, minlength=n)
    live_bytes = np.cumsum(delta)
    t = int(np.argmax(live_bytes)) if len(live_bytes) else 0
    temps = float(live_bytes[t]) if len(live_bytes) else 0.0
    peak = args + outs + temps - alias
    if not detail:
        return MemoryReport(peak, args, outs, temps, alias, {}, host=host)
    breakdown = _breakdown(live, local, b, mid_end, t, edit)
    held = _held(live, local, b, mid_end, t, edit, buffers)
    if copies is not None and moved is not None:  # a state copy on the device counts as its state
        on = (moved.copy_a <= t) & (moved.copy_b > t)
        for k in np.flatnonzero(on).tolist():
            c = moved.copy_cat[k]
            breakdown[c] = breakdown.get(c, 0.0) + float(copies[k])
        held = tuple(sorted(held + tuple(HeldBuffer(float(copies[k]), int(moved.copy_a[k]), int(moved.copy_b[k]),
                                                    "device copy", int(moved.copy_v[k]))
                                         for k in np.flatnonzero(on).tolist()), key=lambda h: -h.bytes))
    return MemoryReport(peak, args, outs, temps, alias, breakdown, t, held, host)


def _region_arrays(live: Liveness, local: np.ndarray) -> tuple[np.ndarray, ...]:
    """The region pairs' (operand, body value, boundary op, end) under a plan's sizes: a
    gathered array crossing a boundary lives to the end of its uses, or, where the next
    boundary its buffer reaches gathers it again into a buffer of its own, to that boundary."""
    outer, body, at, stop, near, nxt = live.region_pairs
    has = nxt >= 0
    if has.any():
        k = nxt[has]
        again = np.zeros(len(nxt), dtype=bool)
        again[has] = _gathered(local[outer[k]], local[body[k]])
        stop = np.where(again, near, stop)
    return outer, body, at, stop


def _gathered(before, after):
    """Where a region's boundary gathers its value (the array across it bigger than the one it
    is read from): a copy of its own. A block sliced from it is read where it lies."""
    return after > before * (1 + 1e-9)


def _held(live: Liveness, local: np.ndarray, b: np.ndarray, mid_end: np.ndarray, t: int,
          edit: "Edit | None", buffers) -> tuple[HeldBuffer, ...]:
    """What the peak at op t holds, largest first (the terms memory_report sums there)."""
    at = np.flatnonzero((live.mid_def <= t) & (mid_end > t))
    out = [HeldBuffer(float(size), int(a), int(e), "value", int(v))
           for v, a, e, size in zip(live.mid[at].tolist(), live.mid_def[at].tolist(), mid_end[at].tolist(),
                                    b[at].tolist())]
    if buffers:
        out += [HeldBuffer(float(size), int(a), int(e), "buffer")
                for a, e, size in zip(*(x.tolist() for x in buffers)) if a <= t < e]
    if edit is not None:
        out += [HeldBuffer(float(local[v] * n), int(a), int(e), "recomputed copy", int(v))
                for v, a, e, n in zip(edit.clone_v.tolist(), edit.clone_a.tolist(), edit.clone_b.tolist(),
                                      edit.clone_n.tolist()) if a <= t < e]
        if len(edit.tmp_v):
            sizes = np.maximum.reduceat(np.bincount(edit.tmp_row, weights=local[edit.tmp_v]), edit.tmp_seg)
            out += [HeldBuffer(float(size), int(at), int(at) + 1, "recomputation temporaries")
                    for at, size in zip(edit.tmp_at.tolist(), sizes.tolist()) if at == t]
    if live.region_pairs:
        outer, body, at, stop = _region_arrays(live, local)
        out += [HeldBuffer(float(local[v]), int(a), int(e), "region array", int(v))
                for o, v, a, e in zip(outer.tolist(), body.tolist(), at.tolist(), stop.tolist())
                if a <= t < e and _gathered(local[o], local[v])]
    return tuple(sorted(out, key=lambda h: -h.bytes))


def _breakdown(live: Liveness, local: np.ndarray, b: np.ndarray, mid_end: np.ndarray, t: int,
               edit: "Edit | None") -> dict:
    """What the peak at op t holds: parameters, optimizer state, activations, temporaries."""
    at = (live.mid_def <= t) & (mid_end > t)
    acts = float(b[at & live.mid_long].sum())
    tmp = float(b[at & ~live.mid_long].sum())
    if edit is not None and len(edit.clone_v):  # recomputed copies: activations again
        alive = (edit.clone_a <= t) & (edit.clone_b > t)
        acts += float((local[edit.clone_v] * edit.clone_n)[alive].sum())
    cats: dict[str, float] = {}  # category -> bytes (0 where none)
    for vid, c in zip(live.inputs.tolist(), live.input_cat.tolist()):
        cats[c] = cats.get(c, 0) + float(local[vid])
    aliased_out = {o for i, o in live.alias_pairs if math.isclose(local[i], local[o])}
    for vid in live.outputs.tolist():
        if vid in aliased_out:
            continue
        c = live.output_cat.get(vid, "activations")
        cats[c] = cats.get(c, 0) + float(local[vid])
    return {"parameters": cats.get("parameters", 0), "optimizer": cats.get("optimizer", 0),
            "activations": cats.get("activations", 0) + acts, "temporaries": tmp}
