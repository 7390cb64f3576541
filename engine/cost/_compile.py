"""Compiling the patterns: the program's ops grouped into ``Pattern``s, ops that cost alike.

Ops with the same factors, groups, operand and result signatures, byte sizes and cost facts
are one ``Pattern`` (``PatternKey`` names what makes two ops one). Evaluation is memoised
per pattern, and the patterns do not grow with depth: scoring a plan costs about the same
for 2 or 48 layers. ``compile_patterns`` keys each op (``_op_key``: its factors, the bytes
its kernel reads and writes as XLA fuses the program, XLA:CPU's wider wire types, XLA GPU's
extra layouts, host copies, a shard_map body's own collectives) and makes one record per key.

Building side: imports ``_records``, ``_facts``, ``_kinds``, ``_fusion``' ``kernel_reads``
and the analysis, rule and program types; nothing that prices.
"""

from __future__ import annotations

import math

import numpy as np

from .._decisions import NO_DIM
from ..analysis._rules import PSEUDO_OPS, FactorKind
from ..tracing._program import NO_PRODUCER
from ._facts import facts_of, having
from ._fusion import kernel_reads
from ._kinds import CollectiveKind
from ._records import Contraction, Pattern, PatternKey

REDUCTION = FactorKind.REDUCTION


def _op_key(op, fs, values, ids, vsig, nbytes, cheap, wire, fused, reads, hosted, cpu, gpu, ignore, layouts
            ) -> tuple[tuple, float, tuple]:
    """The pattern key of one op, its FLOPs and its conv halo FLOPs factors (not part of the
    key: the key's factors and shapes fix them). The key is a plain tuple in ``PatternKey``'s
    field order (equal to the record, which is made once per pattern rather than once per
    op: a NamedTuple costs a Python call to make). ids: (analysis.node_base, .node_nd, group
    per nd); vsig, nbytes, cheap, wire, fused: per value, as lists."""
    base, nd, gnd = ids
    facts = facts_of(op.primitive)
    fkeys, ftensors = [], []
    n_in = len(op.inputs)
    dim_factor_in = [[-1] * len(values[i].shape) for i in op.inputs]
    dim_factor_out = [[-1] * len(values[o].shape) for o in op.outputs]
    minors: dict[tuple[str, int, int], list[int]] = {}
    for k, f in enumerate(fs):
        g = NO_DIM
        if f.ties or f.minor_of:
            # a minor part of a merged dim is sharded as its split-side dim is
            i, d = (f.operands[0] if f.operands and f.minor_of != "operand" else (None, None))
            node = (base[op.inputs[i]] + d) if i is not None else (base[op.outputs[f.results[0][0]]] + f.results[0][1])
            g = int(gnd[nd[node]]) if nd[node] != NO_DIM else NO_DIM
        fkeys.append((int(f.kind), f.size, g))
        spans = {i for i, _ in f.operands} | {n_in + j for j, _ in f.results}
        if f.kind == REDUCTION:
            # partial sums over an axis leave the results unshardable along it
            spans |= {n_in + j for j in range(len(op.outputs))}
        ftensors.append(tuple(sorted(spans)))
        for i, d in f.operands:
            if f.minor_of == "operand":
                minors.setdefault(("in", i, d), []).append(k)
            else:
                dim_factor_in[i][d] = k
        for j, d in f.results:
            if f.minor_of == "result":
                minors.setdefault(("out", j, d), []).append(k)
            else:
                dim_factor_out[j][d] = k
    ins = [values[i].shape for i in op.inputs]
    outs = [values[o].shape for o in op.outputs]
    flops = (facts.cpu_flops if cpu and facts.cpu_flops is not None else facts.flops)(op.params, ins, outs)
    halo_flops = ()
    if facts.halo_ratios is not None and any(f.halo is not None for f in fs):
        r = facts.halo_ratios(op.params, ins, outs)
        halo_flops = tuple((k, r.get(f.halo.dim, 1.0)) for k, f in enumerate(fs)
                           if f.halo is not None and f.halo.operand == 0 and r.get(f.halo.dim, 1.0) != 1.0)
    pairs = 0.0
    if any(f.kind == REDUCTION and f.reduce == "index" for f in fs):
        pairs = 1.0 + _element_bytes(values[op.inputs[0]]) / _element_bytes(values[op.outputs[0]])
    key = (tuple(fkeys),  # factors
           tuple((vsig[i], tuple(m)) for i, m in zip(op.inputs, dim_factor_in)),  # operands
           tuple((vsig[o], tuple(m)) for o, m in zip(op.outputs, dim_factor_out)),  # results
           facts.free and not _computes(op, values, fused, reads) and not (gpu and _stacks(op)), flops,
           tuple(ftensors), tuple(cheap[i] for i in op.inputs),
           facts.shift(op, values) if facts.shift is not None else None,  # shift
           tuple(wire[i] for i in op.inputs), tuple(wire[o] for o in op.outputs),
           tuple(nbytes[i] for i in op.inputs), tuple(nbytes[o] for o in op.outputs), pairs,
           tuple(f.halo for f in fs), tuple(sorted((k, tuple(v)) for k, v in minors.items())),  # halos, minors
           facts.grouped is not None and facts.grouped(op.params),  # grouped
           *(_stacking(op, ignore) if gpu and _stacks(op) else _hbm(op, fused, reads)),  # operand/result_hbm
           _manual(facts, op, nbytes, wire),
           facts.hbm_bytes(op.params) if facts.hbm_bytes is not None else 0.0,
           _host_bytes(op, hosted, nbytes), facts.lookup, _contraction(op, fs, values, facts),
           tuple(layouts.get(o, 0) for o in op.outputs) if layouts else (0,) * len(op.outputs))
    return key, flops, halo_flops


def _contraction(op, fs, values, facts) -> Contraction | None:
    """A matmul's or conv's factors by role (``Contraction``); None for other ops."""
    if not facts.contraction or len(op.inputs) < 2:
        return None
    roles: tuple[list[int], list[int], list[int], list[int]] = ([], [], [], [])
    for k, f in enumerate(fs):
        ins = {i for i, _ in f.operands}
        role = 3 if f.kind == REDUCTION else 0 if {0, 1} <= ins else 1 if 0 in ins else 2 if 1 in ins else -1
        if role >= 0:
            roles[role].append(k)
    return Contraction(tuple(roles[0]), tuple(roles[1]), tuple(roles[2]), tuple(roles[3]),
                       str(values[op.inputs[0]].dtype))


# XLA:CPU has no collectives on some narrow types: it converts the buffer, moves it and
# converts back. Bits per element on its wire (the operand type of the compiled HLO's
# all-gather / all-reduce / all-to-all, jax 0.12): bfloat16 as f32, float8 and float4 as
# f16 (e8m0 as f32), int4 / uint4 as 8-bit; the others (float16, int2, int8, ...) as they are.
_CPU_WIRE_BITS = {"bfloat16": 32, "float8_e8m0fnu": 32, "float4_e2m1fn": 16, "int4": 8, "uint4": 8}


def _cpu_wire(v) -> float:
    """How many times its own bytes a value moves in XLA:CPU's collectives."""
    name = str(v.dtype)
    bits = _CPU_WIRE_BITS.get(name, 16 if name.startswith("float8") else 0)
    return bits / 8 / _element_bytes(v) if bits else 1.0


def _computes(op, values, fused, reads) -> bool:
    """TPU and GPU (``reads`` given): an op that moves no data of its own elsewhere is a
    kernel where it writes its result to memory from operands fused into it (a cast of a
    softmax's normalised probabilities), changes its operand's element type there (a weight
    cast to bfloat16) or writes a broadcast out."""
    if reads is None or not op.outputs or op.primitive in PSEUDO_OPS or any(fused[o] for o in op.outputs):
        return False
    if any(fused[i] and w for i, w in zip(op.inputs, reads[op.id])):
        return True
    if op.primitive == "convert_element_type" or op.primitive == "broadcast_in_dim":
        src = values[op.inputs[0]]
        return any(values[o].dtype != src.dtype or values[o].nbytes > src.nbytes for o in op.outputs)
    return False


def _matmul_layouts(p) -> dict[int, int]:
    """XLA GPU: per value that batched matmuls read contracting different dims (attention's
    score gradient, read by the query's and the key's gradient matmuls), the layouts it is
    laid out in beyond one: its producer writes each (a copy of its own, as long-lived as
    the value). A 2-D operand needs none (the kernel reads it transposed as it is)."""
    reads: dict[int, set] = {}
    for op in p.ops:
        if op.primitive != "dot_general":
            continue
        (lc, rc), (lb, rb) = op.params["dimension_numbers"]
        for v, c, b in ((op.inputs[0], lc, lb), (op.inputs[1], rc, rb)):
            if b and p.values[v].producer != NO_PRODUCER:
                reads.setdefault(v, set()).add((tuple(c), tuple(b)))
    return {v: len(k) - 1 for v, k in reads.items() if len(k) > 1}


def _stacks(op) -> bool:
    """A scan's exit that stacks values the body makes (its ``ys``)."""
    return op.primitive == "scan_exit" and len(op.outputs) > op.params["num_carry"]


def _stacking(op, ignore) -> tuple[tuple[float, ...], tuple[bool, ...]]:
    """XLA GPU writes each trip's ``ys`` slice into its stacked buffer with a kernel of its
    own (a dynamic-update-slice reading the slice): the exit op reads each body value once
    per trip and writes the stacks whole (``_hbm``'s form); the carries move nothing, nor
    do the ys it no longer stacks (``ignore``)."""
    nc, length = op.params["num_carry"], float(op.params["length"])
    n_body = len(op.inputs) - nc  # the body's outputs: its carries, then its ys
    stacked = [nc <= k < n_body and (op.id, v) not in ignore for k, v in enumerate(op.inputs)]
    ins = tuple(length if s else 0.0 for s in stacked)
    return ins, tuple(j >= nc and stacked[j] for j in range(len(op.outputs)))


def _hbm(op, fused, reads) -> tuple[tuple[float, ...], tuple[bool, ...]]:
    """The bytes the op reads of each operand per byte of it (``reads``: its kernel's, by
    ``_fusion.kernel_reads``; None: 1 for each operand in memory, 0 for one fused into it)
    and which results it writes (a value fused into its consumer not). A dynamic slice reads its slice, not the whole operand (its
    result's bytes: counted once, as it writes them); a dynamic-update-slice updates its
    buffer in place (a loop's carried buffer), reading and writing the update's bytes
    (counted once, as it reads them): neither touches the whole buffer."""
    ins = [float(not fused[i]) for i in op.inputs] if reads is None else list(reads[op.id])
    outs = [not fused[o] for o in op.outputs]
    if op.primitive == "dynamic_slice" and ins:
        ins[0] = 0.0
    elif op.primitive == "dynamic_update_slice" and ins:
        ins[0] = 0.0
        outs[0] = False
    return tuple(ins), tuple(outs)


def _element_bytes(v) -> float:
    """Bytes per element as the value is laid out (``Value.nbytes``: int4 is half a byte)."""
    n = math.prod(v.shape)
    return v.nbytes / n if n else float(v.dtype.itemsize)


def _manual(facts, op, nbytes, wire) -> tuple:
    """A shard_map body's collective as ((kind, axes, bytes per device),), else (); its
    bytes as they cross the wire (``wire``: XLA:CPU moves bfloat16 in float32)."""
    if facts.manual is None:
        return ()
    kind, rule = facts.manual
    axes, size = rule(op.params, [nbytes[i] * wire[i] for i in op.inputs], [nbytes[o] * wire[o] for o in op.outputs])
    return ((CollectiveKind(kind), axes, size),) if axes and size else ()


def _host_bytes(op, hosted, nbytes) -> tuple[tuple[int, float], ...]:
    """(result, bytes) of each array a ``device_put`` copies between memory spaces (an
    operand in host memory whose result is on the device, or the other way)."""
    if hosted is None or op.primitive != "device_put":
        return ()
    return tuple((j, float(nbytes[o])) for j, (i, o) in enumerate(zip(op.inputs, op.outputs))
                 if hosted[i] != hosted[o])


def compile_patterns(analysis, sigs, vsig, nbytes, fused, lowering: str, seen=None, stand_ins=None,
                     ignore: frozenset[tuple[int, int]] = frozenset(), reads=None, like=None
                     ) -> tuple[tuple[Pattern, ...], np.ndarray, float, dict[tuple, int]]:
    """The program's ops as patterns: (patterns, pattern per op, total FLOPs per step, each
    pattern's key -> its index: two patterns of one key cost alike under any decisions).
    ``stand_ins``: values fused away that stand for others (``_fusion.kernel_reads``);
    ``ignore``: (op, value) reads that do not happen (a loop's stacking of a residual that
    a recompute decision drops: ``_variants.variant_reads``); ``reads``: the kernels'
    reads where known (``_fusion.kernel_reads``). ``like``: (patterns, pattern per op, key
    per pattern, the ops whose key may differ) of a compile of the same program whose other
    ops keep their keys (a recompute variant's: ``_tables.variant_tables``).
    ``seen``: manual axes -> the group of each named dim as partially manual regions manual
    over them see it (``_tables.region_groups``), for the ops of their bodies; a region's
    enter and exit ops take the side outside it."""
    p = analysis.program
    values = p.values
    # values any device can make locally at any sharding (broadcast scalars, iotas):
    # resharding them costs nothing, XLA just builds them at the sharding wanted
    cheap = [False] * len(values)
    local = having("local")
    for op in p.ops:
        made_here = local.get(op.primitive)
        if made_here is not None:
            for o in op.outputs:
                cheap[o] = made_here(op, values)
    wire = [_cpu_wire(v) if lowering == "cpu" else 1.0 for v in values]
    ids = (analysis.node_base, analysis.node_nd,
           np.array([n.group for n in analysis.named_dims] + [NO_DIM], dtype=np.int64))
    region_ids = {m: (ids[0], ids[1], gnd) for m, gnd in (seen or {}).items()}
    manual_axes = p.manual_axes
    # XLA:CPU keeps every value in device memory whatever its memory space (offloading
    # changes nothing there); TPU and GPU copy it to the host and back
    hosted = [v.host for v in values] if lowering != "cpu" and any(v.host for v in values) else None
    # XLA:CPU computes a fused chain where it is made, each op reading its own operands
    if reads is None and lowering != "cpu":
        reads = kernel_reads(p, fused, stand_ins)
    per_value = (vsig.tolist(), nbytes.tolist(), cheap, wire, fused.tolist(), reads, hosted, lowering == "cpu",
                 lowering == "gpu", ignore, _matmul_layouts(p) if lowering == "gpu" else {})
    index: dict[tuple, int] = {}
    keys: list[tuple[PatternKey, tuple]] = []
    members: list[list[int]] = []
    weights: list[float] = []
    op_pattern = np.zeros(len(p.ops), dtype=np.int64)
    total_flops = 0.0
    for op, fs in zip(p.ops, analysis.factors):
        op_ids = ids
        if region_ids:
            side = op.inputs if op.primitive == "shard_map_enter" else op.outputs
            manual = manual_axes.get(side[0]) if side else None
            if manual is not None:
                op_ids = region_ids.get(manual, ids)
        if like is not None and op.id not in like[3]:  # as in the compile it is like
            base = like[0][like[1][op.id]]
            key, flops, halo_flops = like[2][like[1][op.id]], base.flops, base.halo_flops
        else:
            key, flops, halo_flops = _op_key(op, fs, values, op_ids, *per_value)
        total_flops += flops * op.trip
        pi = index.get(key)
        if pi is None:
            pi = index[key] = len(keys)
            keys.append((PatternKey._make(key), halo_flops))
            members.append([])
            weights.append(0.0)
        weights[pi] += op.trip
        members[pi].append(op.id)
        op_pattern[op.id] = pi
    patterns = tuple(_pattern(key, halo_flops, weights[pi], tuple(members[pi]), sigs)
                     for pi, (key, halo_flops) in enumerate(keys))
    return patterns, op_pattern, total_flops, index


def _pattern(key: PatternKey, halo_flops, weight: float, ops: tuple[int, ...], sigs) -> Pattern:
    doubled: dict[int, set[int]] = {}
    for t, (sig, _) in enumerate(key.operands + key.results):  # where a resolution applies
        groups = [g for g, _ in sigs[sig] if g != NO_DIM]
        for g in {g for g in groups if groups.count(g) > 1}:
            doubled.setdefault(g, set()).add(t)
    return Pattern(
        key.factors, key.operands, key.results, key.operand_bytes, key.result_bytes, key.flops, key.free,
        key.slot_tensors, key.cheap, key.shift, key.operand_wire, key.result_wire, key.gather_partials,
        key.halos, key.grouped, dict(key.minors), key.operand_hbm, key.result_hbm, halo_flops, key.manual,
        key.kernel_bytes, key.host_bytes, key.lookup, key.contraction, key.layouts, weight, ops,
        {g: frozenset(ts) for g, ts in doubled.items()})
