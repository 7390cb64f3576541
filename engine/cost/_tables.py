"""The cost model's tables: everything about one (analysis, mesh, hardware) that no plan changes.

``build_tables`` makes the ``Tables`` (``_records``) once: the value signatures (per value,
(group or NO_DIM, size) per dim, deduplicated -- values with one signature shard alike
under every plan; ``region_groups``: a group as partially manual regions see it), the
patterns (``_compile``), what XLA fuses and its kernels read (``_fusion``), the live ranges
(``_liveness``) and the bitmasks that key the memo tables. ``variant_tables`` makes a
recompute variant's (``_variants``). Every pricing module is pure over these tables.

Building side: imports ``_records``, ``_compile``, ``_fusion``, ``_liveness``, ``_facts``,
``_shardings``, the analysis, mesh and program types and ``partex.analysis._recompute``'s
``backward_span``; nothing that prices.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from .._mesh import Hardware, MeshSpec
from .._decisions import NO_DIM
from ..analysis._types import Analysis
from ..analysis._recompute import backward_span
from ..tracing._program import NO_PRODUCER
from ._compile import compile_patterns
from ._facts import having, op_workspace
from ._fusion import cpu_combined, fused_values, fusion_readers, kernel_reads
from ._liveness import build_liveness
from ._records import Tables
from ._shardings import Sig, mask


def region_groups(analysis: Analysis) -> tuple[tuple[tuple[int, frozenset[str]], ...], dict[frozenset[str], np.ndarray]]:
    """The groups as partially manual ``shard_map`` regions see them. A body's dims are its
    operands' (``_rules``: one named dim across the boundary), but no plan shards them over
    an axis the region is manual over: each group a body holds is another group id there,
    which a decision on the group shards over the region's other axes only
    (``CostModel._decisions``). A plan that puts an operand's dim on a manual axis then
    gathers it where it enters (XLA: the region's in_specs leave it whole there), and a body
    sharded over the others costs and holds its share.

    Returns ((group, manual axes) per view id, from len(analysis.groups) on; manual axes ->
    the group of each named dim as those regions see it, NO_DIM last)."""
    p = analysis.program
    gnd = np.array([n.group for n in analysis.named_dims] + [NO_DIM], dtype=np.int64)
    if not p.manual_axes:
        return (), {}
    base, nd = analysis.node_base, analysis.node_nd
    first = len(analysis.groups)
    ids: dict[tuple[int, frozenset[str]], int] = {}
    for v, manual in p.manual_axes.items():
        for d in range(len(p.values[v].shape)):
            n = nd[base[v] + d]
            if n != NO_DIM:
                ids.setdefault((int(gnd[n]), manual), first + len(ids))
    seen: dict[frozenset[str], np.ndarray] = {}
    for (g, manual), vid in ids.items():
        arr = seen.get(manual)
        if arr is None:
            arr = seen[manual] = gnd.copy()
        arr[gnd == g] = vid
    return tuple(ids), seen


def _signatures(analysis: Analysis, fixed, seen: dict[frozenset[str], np.ndarray]) -> tuple[list[Sig], np.ndarray]:
    """The distinct value signatures, and each value's (a partially manual region's value's
    groups as the region sees them: ``region_groups``)."""
    p = analysis.program
    base, nd = analysis.node_base, analysis.node_nd
    gnd_all = np.array([n.group for n in analysis.named_dims] + [NO_DIM], dtype=np.int64)
    # Dims held whole in one value: those the user's shardings leave replicated there, and
    # those XLA's partitioner may not shard (CostFacts.blocked_dims: an interior pad's).
    unshardable = {v: set(ds) for v, ds in fixed.replicated.items()}
    blocking = having("blocked_dims")
    for op in p.ops:
        blocked = blocking.get(op.primitive)
        if blocked is not None:
            dims = blocked(op)
            if dims:
                unshardable.setdefault(op.outputs[0], set()).update(dims)
    index: dict[Sig, int] = {}
    sigs: list[Sig] = []
    vsig = np.zeros(len(p.values), dtype=np.int64)
    for v in p.values:
        b = base[v.id]
        held = unshardable.get(v.id, ())
        manual = p.manual_axes.get(v.id)
        gnd = gnd_all if manual is None else seen.get(manual, gnd_all)
        sig = tuple((int(gnd[nd[b + d]]) if nd[b + d] != NO_DIM and d not in held else NO_DIM, s)
                    for d, s in enumerate(v.shape))
        i = index.get(sig)
        if i is None:
            i = index[sig] = len(sigs)
            sigs.append(sig)
        vsig[v.id] = i
    return sigs, vsig


def _by_mask(masks: list[int]) -> list[tuple[int, list[int]]]:
    out: dict[int, list[int]] = collections.defaultdict(list)
    for i, m in enumerate(masks):
        out[m].append(i)
    return list(out.items())


def _read_only(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def build_tables(analysis: Analysis, mesh: MeshSpec, hardware: Hardware, donate, lowering: str,
                 fixed) -> Tables:
    """``fixed``: the user's own shardings the plans keep (``Analysis.fixed``), or none."""
    p = analysis.program
    values = p.values
    nbytes = np.fromiter((v.nbytes for v in values), dtype=np.float64, count=len(values))
    views, seen = region_groups(analysis)
    sigs, vsig = _signatures(analysis, fixed, seen)
    fused = fused_values(p, lowering)
    reads = kernel_reads(p, fused) if lowering != "cpu" else None
    patterns, op_pattern, total_flops, keys = compile_patterns(analysis, sigs, vsig, nbytes, fused, lowering, seen,
                                                               reads=reads)
    # groups each signature / pattern depends on, as bitmasks (hot path)
    sig_mask = [mask(g for g, _ in sig) for sig in sigs]
    pat_mask = []
    for pt in patterns:
        m = mask(g for _, _, g in pt.factors)
        for sg, _ in pt.operands + pt.results:
            m |= sig_mask[sg]
        pat_mask.append(m)
    span = backward_span(p)
    user_late = {} if span is None else {
        v: span for v in p.barrier_reads if values[v].producer == NO_PRODUCER and v not in p.constants}
    return Tables(
        analysis=analysis, program=p, mesh=mesh, hw=hardware, lowering=lowering, axes=tuple(mesh.axes),
        axis_size=dict(zip(mesh.axes, mesh.sizes)),
        axis_bw={a: mesh.axis_bandwidth(a, hardware) for a in mesh.axes},
        axis_lat={a: mesh.axis_latency(a, hardware) for a in mesh.axes},
        nbytes=_read_only(nbytes), sigs=sigs, vsig=_read_only(vsig), sig_mask=sig_mask, sig_masks=_by_mask(sig_mask),
        patterns=patterns, op_pattern=_read_only(op_pattern), pat_mask=pat_mask, mask_groups=_by_mask(pat_mask),
        total_flops=total_flops, fused=_read_only(fused), live=build_liveness(analysis, donate, fused, lowering),
        combined_until=cpu_combined(p, analysis.factors) if lowering == "cpu" else None, user_late=user_late,
        views=views, pattern_keys=keys, reads=reads, workspace=workspace_table(p, lowering))


def workspace_table(p, lowering: str) -> tuple[np.ndarray, ...]:
    """``Tables.workspace``: each op's workspace (``_facts.op_workspace``) under ``lowering``,
    one entry per part (its fixed bytes an entry of their own)."""
    rows: list[tuple] = []  # (op, slot, scale, fixed, early, copy, common key or -1)
    keys: dict = {}  # (how a common part is made, from which values) -> its key
    fusible = having("fusible")
    for op in p.ops:
        w = op_workspace(op, p.values, lowering == "cpu")
        # (a part made from a value an elementwise chain makes is made from that chain, fused
        # into it: alike only where XLA happens to fuse it alike, taken as not)
        common = {slot: keys.setdefault((token, tuple(op.inputs[k] for k in made_from)), len(keys))
                  for slot, token, made_from in w.common
                  if p.values[op.inputs[slot]].producer == NO_PRODUCER
                  or p.ops[p.values[op.inputs[slot]].producer].primitive not in fusible}
        rows += [(op.id, slot, scale, 0.0, False, False, common.get(slot, -1)) for slot, scale in w.scaled if scale > 0]
        rows += [(op.id, slot, scale, 0.0, True, slot in w.copies, -1) for slot, scale in w.early if scale > 0]
        if w.fixed > 0:
            rows.append((op.id, 0 if op.inputs else -1, 0.0, w.fixed, False, False, -1))
    if not rows:
        return ()
    cols = list(zip(*rows))
    return (np.array(cols[0], dtype=np.int64), np.array(cols[1], dtype=np.int64),
            np.array(cols[2], dtype=np.float64), np.array(cols[3], dtype=np.float64), np.array(cols[4], dtype=bool),
            np.array(cols[5], dtype=bool), np.array(cols[6], dtype=np.int64))


def variant_tables(t: Tables, ignore: frozenset[tuple[int, int]], stand_ins: dict[int, int]) -> Tables:
    """``t`` with its ops priced as XLA fuses them once some reads are gone and some values
    stand for others (a recompute decision's: ``_variants.variant_reads``): a residual no
    longer stacked for the backward pass is fused into its readers where they are
    fusions, and the backward loop's slice of it, made again there, into its readers. The
    memory (liveness) stays ``t``'s: the recompute edit changes it."""
    p = t.program
    fused = fused_values(p, t.lowering, ignore)
    readers = fusion_readers(p)
    stand = {}
    for s, r in stand_ins.items():
        if not fused[r]:
            continue
        if readers[s]:
            fused[s] = True
            stand[s] = r
        else:  # a slice a matmul reads is written out again by the recomputation
            fused[r] = False
    # the ops whose key may differ from the program's: those that touch a value fused
    # otherwise, whose kernel reads otherwise, or that read what is no longer read
    reads = kernel_reads(p, fused, stand) if t.lowering != "cpu" else None
    moved = set(np.flatnonzero(fused != t.fused).tolist()) | set(stand)
    changed = {op.id for op in p.ops if moved.intersection(op.inputs) or moved.intersection(op.outputs)}
    changed |= {o for o, _ in ignore}
    if reads is not None and t.reads is not None:
        changed |= {k for k, (a, b) in enumerate(zip(reads, t.reads)) if a != b}
    keys_of = [None] * len(t.patterns)
    for key, pi in t.pattern_keys.items():
        keys_of[pi] = key
    patterns, op_pattern, _, keys = compile_patterns(
        t.analysis, t.sigs, t.vsig, t.nbytes, fused, t.lowering, region_groups(t.analysis)[1], stand, ignore,
        reads, (t.patterns, t.op_pattern, keys_of, changed) if t.reads is not None or t.lowering == "cpu" else None)
    same = np.full(len(patterns), -1, dtype=np.int64)
    for key, pi in keys.items():
        same[pi] = t.pattern_keys.get(key, -1)
    pat_mask = []
    for pt in patterns:
        m = mask(g for _, _, g in pt.factors)
        for sg, _ in pt.operands + pt.results:
            m |= t.sig_mask[sg]
        pat_mask.append(m)
    return dataclasses.replace(t, patterns=patterns, op_pattern=_read_only(op_pattern), pat_mask=pat_mask,
                               mask_groups=_by_mask(pat_mask), variant_fused=_read_only(fused), pattern_keys=keys,
                               same_pattern=_read_only(same), reads=reads)
