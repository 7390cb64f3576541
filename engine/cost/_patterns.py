"""Op patterns: ops that cost alike, compiled once; and the cost of one pattern under decisions.

Ops with the same factors, groups, operand and result signatures, byte sizes and cost facts
are one ``Pattern`` (``PatternKey`` names what makes two ops one). Evaluation is memoised
per pattern, and the patterns do not grow with depth: scoring a plan costs about the same
for 2 or 48 layers. ``pattern_cost`` is one execution of a pattern under the decisions on
its groups: the sharding of each factor (with the corrections XLA's partitioner forces:
``scatter_major``, ``whole_mesh_partials``, ``unaligned_minors``, ``unused_first_axis``),
compute time, the collectives (reshards of operands and results, halos, reductions of
partial sums) and the transient buffers. Imports ``_facts``, ``_shardings``, ``_reshard`` and the analysis and
rule types.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Callable, NamedTuple

import numpy as np

from ..analysis._analysis import NO_DIM
from ..analysis._rules import PSEUDO_OPS, FactorKind
from ..tracing._program import NO_PRODUCER
from ._facts import Shift, facts_of, having
from ._liveness import kernel_reads
from ._pricing import kernel_seconds
from ._reshard import AG, AR, PERMUTE, RS, Coll, Need, coll_time, halo, reshard, shifted_views
from ._kinds import CollectiveKind
from ._shardings import assign, prod, shards, view

if TYPE_CHECKING:
    from ._tables import Tables

REDUCTION = FactorKind.REDUCTION
# the link a host transfer runs over, as the overlap schedule names links (not a mesh axis)
HOST_LINK = "<host>"
SpecFn = Callable[[int, tuple], list]  # (signature, decisions) -> its sharding (memoised)


class PatternKey(NamedTuple):
    """What makes two ops one pattern."""

    factors: tuple[tuple[int, int, int], ...]  # (kind, size, group or NO_DIM) per factor
    operands: tuple[tuple[int, tuple[int, ...]], ...]  # (value sig, factor index per dim)
    results: tuple[tuple[int, tuple[int, ...]], ...]
    free: bool
    flops: float
    slot_tensors: tuple[tuple[int, ...], ...]
    cheap: tuple[bool, ...]
    shift: Shift | None
    operand_wire: tuple[float, ...]
    result_wire: tuple[float, ...]
    operand_bytes: tuple[float, ...]
    result_bytes: tuple[float, ...]
    gather_partials: float
    halos: tuple
    minors: tuple  # sorted ((side, tensor, dim), minor factors)
    grouped: bool
    operand_hbm: tuple[float, ...]
    result_hbm: tuple[bool, ...]
    manual: tuple  # a collective the user wrote in a shard_map body: ((kind, axes, bytes),), else ()
    kernel_bytes: float  # a kernel's HBM bytes by its own estimate (0: none)
    host_bytes: tuple[tuple[int, float], ...]  # (result, bytes) the op copies between host and device memory
    lookup: str  # a gather or scatter looking up sharded rows ("gather" | "scatter"), else ""
    contraction: Contraction | None  # a matmul's or conv's factors by role, else None
    layouts: tuple[int, ...]  # per result: the extra layouts XLA GPU lays it out in (``_matmul_layouts``)


class Contraction(NamedTuple):
    """A matmul's (or conv's) factors by the role they play in its kernel, and its operands'
    dtype: a profile prices the kernel by its local shape (``_pricing``)."""

    batch: tuple[int, ...]  # factors spanning both operands and the result
    m: tuple[int, ...]  # the first operand's and the result's only
    n: tuple[int, ...]  # the second operand's and the result's only
    k: tuple[int, ...]  # contracted (reduction) factors
    dtype: str


@dataclasses.dataclass(frozen=True, slots=True)
class Pattern:
    """Ops with the same factors, groups and operand/result signatures."""

    factors: tuple[tuple[int, int, int], ...]  # (kind, size, group or NO_DIM)
    operands: tuple[tuple[int, tuple[int, ...]], ...]  # (value sig, factor index per dim)
    results: tuple[tuple[int, tuple[int, ...]], ...]
    operand_bytes: tuple[float, ...]
    result_bytes: tuple[float, ...]
    flops: float
    free: bool
    slot_tensors: tuple[tuple[int, ...], ...]  # per factor: the tensors it spans
    cheap: tuple[bool, ...]  # per operand: made locally at any sharding for free
    shift: Shift | None  # a concatenate's or split's cut dim
    # per operand / result: bytes a collective of it moves per byte held (2 for 16-bit floats
    # under lowering="cpu": XLA:CPU all-reduces and gathers bf16/f16 in f32)
    operand_wire: tuple[float, ...]
    result_wire: tuple[float, ...]
    # argmax/argmin over a sharded axis: XLA all-gathers each device's partial (value, index)
    # pairs and reduces them locally; the bytes gathered per result byte (value + index)
    gather_partials: float
    halos: tuple  # per factor: the conv spatial factor's Halo, or None
    grouped: bool  # a conv with batch_group_count > 1 (see whole_mesh_partials)
    # ("in" | "out", tensor, dim) -> the minor factors of a reshape's merged dim, in order
    minors: dict
    # per operand: bytes read from memory per byte of it (0: a value XLA fuses away, made
    # and read inside one fusion, see liveness.fused_values; on TPU and GPU the buffers it
    # is computed from instead, liveness.kernel_reads); per result: written to memory
    operand_hbm: tuple[float, ...]
    result_hbm: tuple[bool, ...]
    # a conv's (spatial factor, FLOPs factor) where sharding that factor with a halo exchange
    # has each device compute on its block extended by the halo rows, the SAME padding's taps
    # included (conv_halo_ratios)
    halo_flops: tuple[tuple[int, float], ...]
    manual: tuple  # ((kind, axes, bytes),) of a collective in a shard_map body, else ()
    # a kernel's HBM bytes by its own cost estimate, unsharded (0: none): its memory time
    # reads at least these, its share per device
    kernel_bytes: float
    # (result, bytes) of each array the op copies between the device's memory and the
    # host's, unsharded (a ``device_put`` across memory spaces): a host transfer of its
    # share per device
    host_bytes: tuple[tuple[int, float], ...]
    lookup: str  # "gather" | "scatter": a lookup XLA may move onto the first axis (unused_first_axis)
    contraction: Contraction | None  # a matmul's or conv's factors by role, else None
    # per result: how many more layouts of it XLA GPU writes out (for matmuls that read it
    # contracting other dims, batched: ``_matmul_layouts``), each a copy beside it
    layouts: tuple[int, ...]
    weight: float  # executions per step: sum of trips
    ops: tuple[int, ...]
    doubled: dict  # group -> the tensors holding two of its dims (frozensets)


class Transient(NamedTuple):
    """A buffer a result needs beside its value's own."""

    result: int
    bytes: float
    partial: bool  # a partial result (waits for its reduction)


class PatternCost(NamedTuple):
    """One execution of a pattern under some decisions."""

    compute: float  # seconds
    comm: float  # seconds of its collectives
    colls: tuple[Coll, ...]
    transients: tuple[Transient, ...]
    # each operand's sharding as the op reads it, then each result's as the op writes it
    # (None for a partial result)
    views: tuple
    work: tuple[float, float]  # (FLOPs, bytes its operands and results hold) per device


# ----------------------------------------------------------------------------- compiling

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
           _manual(facts, op, nbytes),
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
    ``liveness.kernel_reads``; None: 1 for each operand in memory, 0 for one fused into it)
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


def _manual(facts, op, nbytes) -> tuple:
    """A shard_map body's collective as ((kind, axes, bytes per device),), else ()."""
    if facts.manual is None:
        return ()
    kind, rule = facts.manual
    axes, size = rule(op.params, [nbytes[i] for i in op.inputs], [nbytes[o] for o in op.outputs])
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
    ``stand_ins``: values fused away that stand for others (``liveness.kernel_reads``);
    ``ignore``: (op, value) reads that do not happen (a loop's stacking of a residual that
    a recompute decision drops: ``_recompute.variant_reads``); ``reads``: the kernels'
    reads where known (``liveness.kernel_reads``). ``like``: (patterns, pattern per op, key
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


# ----------------------------------------------------------------------------- costing

def pattern_cost(t: "Tables", pat: Pattern, dec, spec: SpecFn) -> PatternCost:
    """(compute s, comm s, collectives, transient buffers, views, work) of one execution
    of the pattern's ops under decisions dec (those on its groups). ``spec``: a value
    signature's sharding under decisions (memoised by the caller)."""
    axis_size = t.axis_size
    fslots = [(g, size) for _, size, g in pat.factors]  # g is NO_DIM unless the factor ties
    fax = assign(fslots, dec, pat.slot_tensors, pat.doubled)
    scatter_major(pat, dec, fax, spec)
    whole_mesh_partials(t, pat, fax)
    unaligned_minors(axis_size, pat, fax)
    shard = shards(axis_size, fax)
    colls: list[Need] = []
    if pat.manual:  # a body's collective moves each device's buffer: its share where the plan shards the body
        n = shards(axis_size, spec(pat.results[0][0], dec)) if pat.results else 1
        colls += [Need(kind, tuple(a for a in axes if a in axis_size), size / n, NO_DIM)
                  for kind, axes, size in pat.manual if any(a in axis_size for a in axes)]
    if pat.host_bytes:  # copies to or from host memory: each device moves its own share of each
        moved = sum(size / shards(axis_size, spec(pat.results[j][0], dec)) for j, size in pat.host_bytes)
        colls.append(Need(CollectiveKind.HOST_TRANSFER, (HOST_LINK,), moved, NO_DIM))
    in_view, out_view = shifted_views(t, pat, dec, colls, spec)
    views: list = []
    local_bytes = _operands(t, pat, dec, fax, in_view, spec, colls, views)
    transient: list[Transient] = []
    local_bytes = _results(t, pat, dec, fax, out_view, spec, colls, views, transient, local_bytes)
    if pat.gather_partials:
        _argmax_index(t, pat, dec, fax, in_view, spec, colls)
    if pat.lookup:
        unused_first_axis(t, pat, dec, fax, spec, colls)
    flops = pat.flops / shard
    if pat.kernel_bytes:
        local_bytes = max(local_bytes, pat.kernel_bytes / shard)
    for k, ratio in pat.halo_flops:
        if fax[k]:
            flops *= ratio
    compute = 0.0 if pat.free else kernel_seconds(t.hw, pat, fax, axis_size, flops, local_bytes)
    work = (0.0, 0.0) if pat.free else (flops, local_bytes)
    comm = 0.0
    out = []
    for c in colls:
        secs = coll_time(t, c.kind, c.axes, c.bytes)
        comm += secs
        out.append(Coll(c.kind, c.axes, c.bytes, secs, c.cause, c.operand, c.view, c.view_bytes))
    return PatternCost(compute, comm, tuple(out), tuple(transient), tuple(views), work)


def _operands(t: "Tables", pat: Pattern, dec, fax, in_view, spec: SpecFn, colls: list, views: list) -> float:
    """Each operand's reshard to the sharding the op reads it in, and its halo; appends the
    views; returns the bytes per device the op reads from memory."""
    axis_size, sigs = t.axis_size, t.sigs
    local_bytes = 0.0
    for i, ((sig, fmap), nb) in enumerate(zip(pat.operands, pat.operand_bytes)):
        vspec = spec(sig, dec)
        ospec = in_view.get(i) or view(fax, fmap, pat.minors, "in", i)
        views.append(tuple(tuple(a) for a in ospec))
        if pat.operand_hbm[i]:
            local_bytes += pat.operand_hbm[i] * nb / shards(axis_size, ospec)
        n0 = len(colls)
        if not pat.cheap[i]:
            reshard(axis_size, vspec, ospec, nb * pat.operand_wire[i], sigs[sig], colls)
        key = tuple(tuple(a) for a in ospec)
        held = nb / shards(axis_size, ospec)  # the resharded buffer the op reads
        colls[n0:] = [Need(c.kind, c.axes, c.bytes, c.cause, i, key, held) for c in colls[n0:]]
        # not a reshard of the value (no CSE: XLA exchanges halos per conv)
        halo(axis_size, pat, i, fax, held * pat.operand_wire[i], colls)
    return local_bytes


def _results(t: "Tables", pat: Pattern, dec, fax, out_view, spec: SpecFn, colls: list, views: list,
             transient: list, local_bytes: float) -> float:
    """Each result's reduction of partial sums (all-reduce, reduce-scatter, or the gathered
    partials of an argmax) and reshard to its value's sharding; appends the views and the
    transient buffers; returns ``local_bytes`` plus the bytes per device the op writes to
    memory (added in order, as one running sum with the operands')."""
    axis_size, sigs = t.axis_size, t.sigs
    partial = [a for (kind, _, g), axes in zip(pat.factors, fax) if kind == REDUCTION for a in axes]
    pgroup = next((g for (kind, _, g), axes in zip(pat.factors, fax) if kind == REDUCTION and axes), NO_DIM)
    for j, ((sig, fmap), nb) in enumerate(zip(pat.results, pat.result_bytes)):
        vspec = spec(sig, dec)
        ospec = out_view.get(j) or view(fax, fmap, pat.minors, "out", j)
        lb = nb / shards(axis_size, ospec)
        n0 = len(colls)
        if pat.result_hbm[j]:
            local_bytes += lb
        views.append(None if partial else tuple(tuple(a) for a in ospec))
        # The op writes its result at its own (larger) sharding before the reshard; a
        # partial result is a buffer of its own beside the reduced one. XLA combines the
        # reductions of partial results and issues them late, so such a buffer is taken
        # to live as long as the value (an over-estimate on TPU).
        extra = lb if partial else lb - nb / shards(axis_size, vspec)
        if extra > 0:
            transient.append(Transient(j, extra, bool(partial)))
        if pat.layouts[j]:  # the other layouts: copies written beside it, as long as it lives
            held = nb / shards(axis_size, vspec)
            transient.append(Transient(j, pat.layouts[j] * held, False))
            local_bytes += 2 * pat.layouts[j] * held
        if partial and pat.gather_partials:
            gathered = lb * prod(axis_size, partial) * pat.gather_partials
            colls.append(Need(AG, tuple(partial), gathered, pgroup))
            transient.append(Transient(j, gathered, False))
        elif partial:
            ospec = _reduce_partials(t, pat, fax, partial, pgroup, vspec, ospec, lb, colls, transient, j)
        reshard(axis_size, ospec, vspec, nb, sigs[sig], colls)
        w = pat.result_wire[j]
        if w != 1.0:
            colls[n0:] = [Need(c.kind, c.axes, c.bytes * w, c.cause, c.operand, c.view, c.view_bytes)
                          for c in colls[n0:]]
    return local_bytes


def _argmax_index(t: "Tables", pat: Pattern, dec, fax, in_view, spec: SpecFn, colls: list) -> None:
    """An argmax's (argmin's) indices: XLA lowers it to a reduce over the operand and an iota
    of its shape (the index dtype), and its partitioner gives the iota the result's sharding
    (on the kept dims; the reduced dim whole), then reshards it to the operand's like any
    operand: an all-to-all where the result keeps the axis the reduced dim is sharded over
    (an MoE router's argmax over experts sharded on `data`, its result on the batch)."""
    (sig, fmap), (rsig, rmap) = pat.operands[0], pat.results[0]
    rv = spec(rsig, dec)
    at = {k: j for j, k in enumerate(rmap)}  # factor -> result dim
    have = [list(rv[at[k]]) if k in at and at[k] < len(rv) else [] for k in fmap]
    want = in_view.get(0) or view(fax, fmap, pat.minors, "in", 0)
    index_bytes = pat.operand_bytes[0] / (pat.gather_partials - 1.0)  # (value, index) bytes per value byte - 1
    reshard(t.axis_size, have, want, index_bytes, t.sigs[sig], colls)


def _reduce_partials(t: "Tables", pat: Pattern, fax, partial, pgroup, vspec, ospec, lb: float, colls: list,
                     transient: list, j: int) -> list:
    """The reduction of result j's partial sums: a reduce-scatter over the axes its value
    is sharded on (under lowering="cpu" an all-reduce and a slice), an all-reduce per
    reduction factor over the rest; returns the result's sharding after it."""
    axis_size = t.axis_size
    vaxes = {a for axes in vspec for a in axes}
    rs = tuple(a for a in partial if a in vaxes)
    ar = tuple(a for a in partial if a not in vaxes)
    if rs and t.lowering == "cpu":
        colls.append(Need(AR, rs, lb, pgroup))
        transient.append(Transient(j, lb, False))  # the all-reduced whole, before the slice
    elif rs:
        colls.append(Need(RS, rs, lb, pgroup))
    # XLA sums the partials of each reduction factor with an all-reduce of its own (a
    # matmul contracting batch on data and sequence on model: over model, then over data;
    # a conv's filter gradient: over its spatial dims after the others); the factors' own
    # groups, spatial ones last
    parts: dict[tuple, list[str]] = {}
    owner = {}
    for k, ((kind, _, g), axes, h) in enumerate(zip(pat.factors, fax, pat.halos)):
        if kind == REDUCTION:
            for a in axes:
                owner[a] = (h is not None, k, g)
    for a in ar:
        parts.setdefault(owner[a], []).append(a)
    for (_, _, g), part in sorted(parts.items()):
        colls.append(Need(AR, tuple(part), lb / prod(axis_size, rs), g))
    # after the reduce-scatter the result holds those axes: treat them as present
    ospec = [list(o) for o in ospec]
    for a in rs:
        for d, axes in enumerate(vspec):
            if a in axes:
                ospec[d].append(a)
    return ospec


# ------------------------------------------------------- XLA's partitioner, corrected for

def unaligned_minors(axis_size: dict[str, int], pat: Pattern, fax) -> None:
    """A merged dim's blocks are its minor dims' blocks only where every factor before the
    minor one is sharded all the way (block size 1): a minor factor after a partly
    sharded one is not sharded here (its split-side dim is resharded instead)."""
    for (side, t, d), ms in pat.minors.items():
        fmap = (pat.operands if side == "in" else pat.results)[t][1]
        k = fmap[d]
        full = k < 0 or prod(axis_size, fax[k]) == pat.factors[k][1]
        for m in ms:
            if not full:
                fax[m] = []
            full = full and prod(axis_size, fax[m]) == pat.factors[m][1]


def whole_mesh_partials(t: "Tables", pat: Pattern, fax) -> None:
    """XLA's SPMD partitioner (jax 0.12, Shardy and GSPMD alike) all-reduces over *every*
    device, copies included, the partial filter gradient of a conv whose spatial dims are
    sharded, and of a grouped conv (``batch_group_count`` > 1: a depthwise conv's weight
    gradient) whose batch is: with a mesh axis left out of the reduction the gradient
    comes out that many times too large. Such a conv takes the rest of the mesh on its
    batch (the other reduction; each device then holds a distinct partial sum), or, where
    the batch cannot take it, leaves those reductions unsharded (operands gathered)."""
    affected = [k for k, ((kind, _, _), h) in enumerate(zip(pat.factors, pat.halos))
                if fax[k] and kind == REDUCTION and (h is not None or pat.grouped)]
    if not affected:
        return
    axis_size = t.axis_size
    reduced = {a for (kind, _, _), axes in zip(pat.factors, fax) if kind == REDUCTION for a in axes}
    used = {a for axes in fax for a in axes}
    rest = [a for a in t.axes if a not in reduced and axis_size[a] > 1]
    if not rest:
        return
    if not any(a in used for a in rest):
        for k, (kind, size, _) in enumerate(pat.factors):
            if (kind == REDUCTION and pat.halos[k] is None
                    and size % (prod(axis_size, fax[k]) * prod(axis_size, rest)) == 0):
                fax[k] = fax[k] + rest
                return
    for k in affected:
        fax[k] = []


def scatter_major(pat: Pattern, dec, fax, spec: SpecFn) -> None:
    """A partial result scattered over an axis that its value puts *major* to the axes the
    op already shards that dim with cannot be a plain reduce-scatter: XLA computes that
    dim whole (gathering the operands along it) and scatters over all its axes. The
    factor of such a dim is unsharded here (in place)."""
    partial = {a for (kind, _, _), axes in zip(pat.factors, fax) if kind == REDUCTION for a in axes}
    if not partial:
        return
    for sig, fmap in pat.results:
        vspec = spec(sig, dec)
        for d, k in enumerate(fmap):
            if k < 0 or not fax[k]:
                continue
            want = tuple(vspec[d])
            if any(a in partial for a in want) and tuple(fax[k]) != want[:len(fax[k])]:
                fax[k] = []


def unused_first_axis(t: "Tables", pat: Pattern, dec, fax, spec: SpecFn, colls: list) -> None:
    """A lookup in shards that leaves the mesh's first axis (of more than one device) out:
    a gather whose indexed operand dims and whose indices are both sharded (an embedding's
    masked lookup, its batch sharded), or a scatter whose indexed dims and whose updates'
    scatter dims are (its gradient). XLA's SPMD partitioner (jax 0.12) then computes the
    lookup with its indexed dims on the first axis instead, moving the smaller of two sets
    of blocks there with a collective-permute: a gather's operand block (a scatter's
    result, at its value's sharding), or its indices' and result's blocks (a scatter's
    indices' and updates'). An axis left out of the op other than the first costs nothing:
    so on every placement over three axes (tests/test_cost_plan.py); over four, XLA also
    moves 2 of 46 placements whose looked-up dims take the first axis and the third or
    fourth, which this does not model."""
    axis_size = t.axis_size
    first = next((a for a in t.axes if axis_size[a] > 1), None)
    if first is None or any(first in axes for axes in fax) or len(pat.operands) != (2 if pat.lookup == "gather" else 3):
        return
    table, index = pat.operands[0][1], pat.operands[1][1]
    if any(k >= 0 and k in table for k in index):
        return  # a batched lookup (take_along_axis): XLA splits it along the batch first, moving nothing

    def block(side: str, i: int, nbytes: float, fmap) -> float:
        return nbytes / shards(axis_size, view(fax, fmap, pat.minors, side, i))

    indices = block("in", 1, pat.operand_bytes[1], index)
    if pat.lookup == "gather":
        rows = [k for k, (kind, _, _) in enumerate(pat.factors) if kind == REDUCTION]
        batch = [k for k in index if k >= 0]
        held = block("in", 0, pat.operand_bytes[0], table)
        looked_up = indices + block("out", 0, pat.result_bytes[0], pat.results[0][1])
    else:
        updates = pat.operands[2][1]
        rows = [k for k in table if k >= 0 and k not in updates and k not in index]
        batch = [k for k, (kind, _, _) in enumerate(pat.factors) if kind == REDUCTION]
        held = pat.result_bytes[0] / shards(axis_size, spec(pat.results[0][0], dec))
        looked_up = indices + block("in", 2, pat.operand_bytes[2], updates)
    axes = tuple(a for k in rows for a in fax[k])
    if not axes or not any(fax[k] for k in batch):
        return
    g = next((pat.factors[k][2] for k in rows if fax[k]), NO_DIM)
    colls.append(Need(PERMUTE, (first, *axes), min(held, looked_up), g))
