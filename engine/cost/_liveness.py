"""Memory: live ranges over program order, and the per-device peak they give.

Owns ``Liveness`` (built once per analysed program and donation: the intermediates' live
ranges, the arguments and outputs with their roles, the donated pairs), the program facts
it rests on (``fused_values``: what XLA fuses away; ``cpu_combined``: where XLA:CPU's
combined all-reduces free the partial gradients) and ``memory_report``, the peak per device
of one plan from the values' local sizes, the resharded and transient buffers and a
recompute edit. Every buffer counts at its sharded size; arguments live throughout,
outputs counted whole (as XLA reports them), donated outputs aliased: an over-estimate
rather than an under-estimate. Imports ``_facts``, ``_report``, the program and rule types
and ``partex.analysis._recompute``'s ``backward_span``.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import TYPE_CHECKING

import numpy as np

from ..analysis._recompute import backward_span
from ..analysis._rules import FactorKind
from ..tracing._program import NO_PRODUCER
from ._facts import having
from ._report import MemoryReport

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
    inputs: np.ndarray
    outputs: np.ndarray  # sorted
    input_cat: np.ndarray  # per input: parameters, optimizer, activations (the data)
    output_cat: dict[int, str]  # an output that mirrors an input (the updated state): its category
    alias_pairs: tuple[tuple[int, int], ...]  # (input, output) donated pairs
    alias_arrays: tuple[np.ndarray, np.ndarray]  # the same, as two arrays


def fused_values(program) -> np.ndarray:
    """Per value: XLA fuses it away. A value made by an elementwise op and read only by
    one elementwise op or reduction is made and read inside one fusion: never in memory,
    neither written by its maker nor read by its reader."""
    p = program
    fusible, readers = having("fusible"), having("fusion_reader")
    consumers = np.zeros(len(p.values), dtype=np.int64)
    fusible_reader = np.zeros(len(p.values), dtype=bool)
    for op in p.ops:
        for v in set(op.inputs):
            consumers[v] += 1
            fusible_reader[v] = op.primitive in readers
    made_fusible = np.array([v.producer != NO_PRODUCER and p.ops[v.producer].primitive in fusible
                             for v in p.values], dtype=bool)
    out = np.zeros(len(p.values), dtype=bool)
    out[:] = made_fusible & (consumers == 1) & fusible_reader
    out[list(p.outputs)] = False
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


def build_liveness(analysis, donate, fused: np.ndarray) -> Liveness:
    p = analysis.program
    n_ops = len(p.ops)
    end = _last_uses(p)
    prod = np.fromiter((v.producer for v in p.values), dtype=np.int64, count=len(p.values))
    is_mid = np.ones(len(p.values), dtype=bool)
    is_mid[list(set(p.inputs))] = False
    is_mid[list(set(p.outputs))] = False
    is_mid &= prod != NO_PRODUCER
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
        mid_end=mid_end, mid_long=span > max(8, n_ops // 10), inputs=np.array(p.inputs, dtype=np.int64),
        outputs=np.array(sorted(set(p.outputs)), dtype=np.int64), input_cat=np.array(cat),
        output_cat={ovid: in_cat[ivid] for ovid, ivid in roles.mirror.items()}, alias_pairs=tuple(alias_pairs),
        alias_arrays=(np.array([i for i, _ in alias_pairs], dtype=np.int64),
                      np.array([o for _, o in alias_pairs], dtype=np.int64)))


def memory_report(live: Liveness, local: np.ndarray, detail: bool, buffers=(), edit: "Edit | None" = None
                  ) -> MemoryReport:
    """The per-device peak: arguments + outputs + the peak of the live intermediates, the
    resharded and transient ``buffers`` ((from op, to op, bytes)) and an edit's recomputed
    copies and temporaries - the aliased outputs. ``local``: per value, its bytes per device."""
    args = float(local[live.inputs].sum())
    outs = float(local[live.outputs].sum())
    if live.alias_pairs:
        ai, ao = live.alias_arrays
        alias = float(local[ao][np.isclose(local[ai], local[ao])].sum())
    else:
        alias = 0.0
    b = local[live.mid]
    n = live.n_ops + 2
    mid_end = live.mid_end if edit is None else edit.mid_end
    delta = (np.bincount(live.mid_def, weights=b, minlength=n)
             - np.bincount(mid_end, weights=b, minlength=n)).astype(np.float64)
    if edit is not None and len(edit.clone_v):
        size = local[edit.clone_v] * edit.clone_n
        delta += np.bincount(edit.clone_a, weights=size, minlength=n) - np.bincount(edit.clone_b, weights=size, minlength=n)
    if edit is not None and len(edit.tmp_v):
        size = np.maximum.reduceat(local[edit.tmp_v], edit.tmp_seg)
        delta += np.bincount(edit.tmp_at, weights=size, minlength=n) - np.bincount(edit.tmp_at + 1, weights=size, minlength=n)
    if buffers:
        start, stop, size = (np.array(x) for x in zip(*buffers))
        delta += np.bincount(start, weights=size, minlength=n) - np.bincount(stop, weights=size, minlength=n)
    live_bytes = np.cumsum(delta)
    t = int(np.argmax(live_bytes)) if len(live_bytes) else 0
    temps = float(live_bytes[t]) if len(live_bytes) else 0.0
    peak = args + outs + temps - alias
    breakdown = _breakdown(live, local, b, mid_end, t, edit) if detail else {}
    return MemoryReport(peak, args, outs, temps, alias, breakdown)


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
