"""Fusion: which values XLA fuses away, what its kernels read, which values share a buffer.

Program facts the tables are built from, each a function of the program (and the lowering):
``fused_values`` (a value made and read inside one fusion is never in memory; on TPU and GPU
also one XLA computes again in each reader's fusion, ``_recomputed_at_reads``),
``kernel_reads`` (per op, per operand, the bytes its kernel reads from memory),
``fusion_readers``, ``made_in_place``, ``cpu_random_bits`` (XLA:CPU's random bits, computed
again from their halves), ``cpu_combined`` (where XLA:CPU's combined all-reduces free the
partial gradients) and ``alias_roots`` (the value whose buffer each value is).

Building side: imports ``_facts``, the program and rule types and
``partex.analysis._recompute``'s ``backward_span``; nothing that prices.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..analysis._recompute import backward_span
from ..analysis._rules import FactorKind
from ..tracing._program import NO_PRODUCER
from ._facts import having

_CPU_COMBINE = 256  # all-reduces XLA:CPU combines into one (CpuAllReduceCombiner's count limit)


def fused_values(program, lowering: str = "tpu", ignore: frozenset[tuple[int, int]] = frozenset()) -> np.ndarray:
    """Per value: XLA fuses it away. A value made by an elementwise op and read only by
    one elementwise op or reduction is made and read inside one fusion: never in memory,
    neither written by its maker nor read by its reader. Under ``lowering="cpu"`` also what
    is computed from random bits elementwise and read only inside fusions
    (``cpu_random_bits``). ``ignore``: (op, value) reads left out (a residual's stacking,
    which a recompute decision drops: ``_variants.variant_reads``)."""
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
