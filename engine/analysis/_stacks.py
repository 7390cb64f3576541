"""Layer stacks found in the op graph: an unrolled layer stack is a block of ops traced again
and again, each copy reading the previous copy's result and its own weights.

The program's ops, in trace order, are read as a string of op signatures (primitive, operand
and result shapes and dtypes). A stack of ``L`` layers is a *tandem repeat* in that string:
``L`` consecutive copies of one block, in the forward pass and again (reversed) in the
backward. A repeat is taken as a layer stack only if it is *chained* (every copy reads a value
the copy before it made, as layers do and parallel branches such as the query, key and value
projections of one layer do not) and every copy reads weights of its own. Each weight that a
copy reads then has a *role*: the block and its position in it, the same in every layer and
at every depth. That finds the layers of a model however they are held -- in a list
(keras' ``trainable_variables``), in a dict whose keys say nothing, or under names that
carry the index in a leaf (``layer_3_kernel_momentum``) -- without reading any name.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import re

import numpy as np

from ..tracing._program import NO_PRODUCER, Program, ValueId


@dataclasses.dataclass(frozen=True, slots=True)
class Block:
    """``count`` chained copies of ``period`` ops from op ``start``; the ops after the last
    whole copy that still repeat it (``extent``) belong to the stack too."""

    start: int
    period: int
    count: int
    extent: int  # ops covered from start, >= period * count
    key: str  # a digest of the block's op signatures: the same at every depth


def _signatures(program: Program) -> np.ndarray:
    values = program.values
    ids: dict[tuple, int] = {}
    out = np.empty(len(program.ops), dtype=np.int64)
    for i, op in enumerate(program.ops):
        sig = (op.primitive,
               tuple((values[v].shape, str(values[v].dtype)) for v in op.inputs),
               tuple((values[v].shape, str(values[v].dtype)) for v in op.outputs))
        out[i] = ids.setdefault(sig, len(ids))
    return out


def _tandem_repeats(sig: np.ndarray) -> list[tuple[int, int, int]]:
    """Maximal periodic stretches ``(extent, period, start)`` with at least two whole
    periods: ``sig[i] == sig[i + period]`` for every ``i`` in ``[start, start+extent-period)``."""
    n = len(sig)
    runs = []
    for p in range(1, n // 2 + 1):
        same = sig[:-p] == sig[p:]
        if int(same.sum()) < p:
            continue
        edges = np.diff(np.concatenate(([0], same.view(np.int8), [0])))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        long = ends - starts >= p
        runs += [(int(e - s + p), p, int(s)) for s, e in zip(starts[long], ends[long])]
    return runs


# A layer contracts its weights with its input: a repeat without a contraction (the
# optimizer's per-variable arithmetic, a chain of adds) is not a layer.
_CONTRACTIONS = {"dot_general", "conv_general_dilated", "ragged_dot", "ragged_dot_general"}


def layer_blocks(program: Program) -> list[Block]:
    """The layer stacks of the program: the longest chained tandem repeats that contract and
    whose copies each read inputs of their own, taken greedily (longest first, then the shortest period) so
    that a layer's inner repeats (its q/k/v projections) never count as layers."""
    ops = program.ops
    sig = _signatures(program)
    producer = np.fromiter((v.producer for v in program.values), dtype=np.int64, count=len(program.values))
    is_input = np.zeros(len(program.values), dtype=bool)
    is_input[program.inputs] = True
    taken = np.zeros(len(ops), dtype=bool)
    blocks = []
    for extent, p, a in sorted(_tandem_repeats(sig), key=lambda t: (-t[0], t[1], t[2])):
        if taken[a:a + extent].any() or not any(ops[i].primitive in _CONTRACTIONS for i in range(a, a + p)):
            continue
        count = extent // p
        own: list[set[ValueId]] = []
        chained = True
        for k in range(count):
            lo, hi = a + k * p, a + (k + 1) * p
            reads = [v for op in ops[lo:hi] for v in op.inputs]
            own.append({v for v in reads if is_input[v]})
            if k and not any(lo - p <= producer[v] < lo for v in reads if producer[v] != NO_PRODUCER):
                chained = False
                break
        readers = collections.Counter(v for vs in own for v in vs)
        if not chained or not all(any(readers[v] == 1 for v in vs) for vs in own):
            continue
        digest = hashlib.sha1(repr([_op_key(program, ops[i]) for i in range(a, a + p)]).encode()).hexdigest()[:10]
        blocks.append(Block(a, p, count, extent, digest))
        taken[a:a + extent] = True
    return sorted(blocks, key=lambda b: b.start)


def _op_key(program: Program, op) -> tuple:
    values = program.values
    return (op.primitive, tuple(values[v].shape for v in op.inputs), tuple(values[v].shape for v in op.outputs))


def stack_roles(program: Program, blocks: list[Block] | None = None) -> dict[ValueId, str]:
    """The role of every input read inside a layer stack: where in the block it is read
    (block, offset, operand), over all its reads -- equal for the same weight of every layer.
    Inputs read by every copy alike (a shared rotary table) get no role."""
    blocks = layer_blocks(program) if blocks is None else blocks
    is_input = np.zeros(len(program.values), dtype=bool)
    is_input[program.inputs] = True
    reads: dict[ValueId, set[str]] = collections.defaultdict(set)
    copies: dict[ValueId, dict[str, set[int]]] = collections.defaultdict(lambda: collections.defaultdict(set))
    for b in blocks:
        for i in range(b.start, b.start + b.extent):
            k, off = divmod(i - b.start, b.period)
            for j, v in enumerate(program.ops[i].inputs):
                if is_input[v]:
                    reads[v].add(f"{b.key}+{off}.{j}")
                    copies[v][b.key].add(k)
    return {v: "@" + ";".join(sorted(r)) for v, r in reads.items()
            if all(len(ks) == 1 for ks in copies[v].values())}


_TRANSFORM = re.compile(r"^[A-Za-z_]+\((.*)\)$")


def scope_name(scope: str) -> str:
    """A name stack as a readable path: transformations unwrapped (``jvp(model)`` ->
    ``model``, ``transpose(jvp(model))`` -> ``model``), einsum specs and vmaps dropped."""
    parts = []
    for seg in scope.split("/"):
        m = _TRANSFORM.match(seg)
        while m:
            seg = m.group(1)
            m = _TRANSFORM.match(seg)
        if seg and "->" not in seg and "," not in seg:
            parts.append(seg)
    return "/".join(parts)
