"""The analytic cost model: step time, collectives and per-device peak memory of a plan.

A plan is an ordered list of decisions (group, mesh axis). From it follow
- each value's sharding: walking the decisions in order, a decision shards the first dim of
  the value in that group (an intra conflict: the other dim stays unsharded), unless the
  value already uses that mesh axis on another dim (an axis conflict: the earlier decision
  keeps it) or the dim does not divide;
- each op's sharding, the same way over its factors (need-replication factors never shard);
- communication where a value's sharding and its consumer's view differ: an axis dropped is
  an all-gather, an axis moved to another dim an all-to-all, an axis added a free local
  slice; a sharded reduction factor leaves partial sums: an all-reduce, or a reduce-scatter
  when the result value is sharded on that axis. Ring (alpha-beta) costs per mesh axis.
- peak memory per device by liveness over program order, every buffer at its sharded size;
  arguments and outputs counted whole (as XLA reports them), donated outputs aliased.

Evaluation is memoised per value signature and per op pattern (ops with the same shapes,
factors and groups), which do not grow with depth, so scoring a plan costs about the same
for 2 or 48 layers.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import math
from typing import Iterable, Sequence

import numpy as np

from ._analysis import NO_DIM, RESOLVE, Analysis
from ._constraints import NONE as NO_FIXED
from ._constraints import check_mode
from ._mesh import Hardware, MeshSpec
from ._program import NO_PRODUCER
from ._recompute import PREFIX as RECOMPUTE, LoopPlan, backward_span, kind_of, plan_unit, value_readers
from ._rules import FactorKind, PSEUDO_OPS, conv_halo_ratios, factor_rules, op_flops, pointwise_rule

Decision = tuple[int, str]  # (group id, mesh axis)
_SECOND, _NEITHER = RESOLVE + "second", RESOLVE + "neither"
_CPU_COMBINE = 256  # all-reduces XLA:CPU combines into one (CpuAllReduceCombiner's count limit)
Spec = tuple[tuple[str, ...], ...]  # per dim: the mesh axes sharding it, major to minor

# Ops that move no data of their own (views, loop boundaries): no compute or memory time.
_FREE = PSEUDO_OPS | {"reshape", "squeeze", "expand_dims", "broadcast_in_dim", "convert_element_type",
                      "stop_gradient", "copy", "copy_p", "sharding_constraint", "optimization_barrier"}


def _shift(op, values) -> tuple[str, int, tuple[int, ...]] | None:
    """(kind, dim, piece sizes along dim) of a concatenate or split."""
    if op.primitive == "concatenate":
        d = int(op.params["dimension"])
        return ("concatenate", d, tuple(values[i].shape[d] for i in op.inputs))
    if op.primitive == "split":
        d = int(op.params["axis"]) % len(values[op.inputs[0]].shape)
        return ("split", d, tuple(values[o].shape[d] for o in op.outputs))
    return None


def _misaligned(offset: int, size: int, total: int, n: int) -> float:
    """The largest fraction of a device's block of a piece [offset, offset+size) of a dim of
    ``total`` split n ways that sits on another device's block of the whole."""
    worst = 0.0
    for j in range(n):
        lo, hi = offset + j * size / n, offset + (j + 1) * size / n
        overlap = max(0.0, min(hi, (j + 1) * total / n) - max(lo, j * total / n))
        worst = max(worst, 1 - overlap / (size / n))
    return worst


# Ops that only view their operand (cast, reshape, transpose, slice): a view of a value
# there from the start is there from the start.
_VIEWS = (_FREE - PSEUDO_OPS) | {"transpose", "slice", "squeeze", "rev"}

# Collectives of values there from the start (weights) that XLA's scheduler keeps ahead of
# their readers: the one read next and the one after (memory bounds how far it prefetches)
_PREFETCH = 2

# Ops whose result apply pins at the sharding the plan computes it in before resharding it to
# its value's: XLA's partitioner, left to shard the output features of a grouped conv with a
# 1-wide output itself, emits invalid HLO or wrong values (jax 0.12; the property tests found
# it).
_WRITE_AT_VIEW = frozenset({"conv_general_dilated"})

# Elementwise primitives XLA fuses into their consumers.
_FUSIBLE = frozenset(name for name, rule in factor_rules.items() if rule is pointwise_rule) | {
    "broadcast_in_dim", "convert_element_type", "reshape", "transpose", "squeeze", "select_n"}


@dataclasses.dataclass(frozen=True, slots=True)
class CollectiveCost:
    kind: str  # all-reduce, all-gather, reduce-scatter, all-to-all
    axes: tuple[str, ...]
    bytes: float  # per device, one execution: the larger of the buffer before/after
    count: int  # executions per step (ops x trips)
    time: float  # seconds per step, all executions
    op: int  # a representative op
    source: str
    cause: str  # the group (named dimension) responsible
    ops: tuple[int, ...] = ()  # every op of the pattern (one execution each per trip)
    operand: int = -1  # the operand resharded (-1: a result or a reduction)
    # seconds per step it runs under compute that does not wait for it (hardware.overlap:
    # a weight gathered ahead of its use, a gradient reduced while the backward pass goes on)
    hidden: float = 0.0

    @property
    def exposed(self) -> float:
        """Seconds per step the step waits for it."""
        return self.time - self.hidden


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryReport:
    peak: float  # arguments + outputs + peak temporaries - aliased
    arguments: float
    outputs: float
    temporaries: float  # peak of the intermediates
    alias: float
    breakdown: dict  # parameters, optimizer, activations, temporaries (at the peak)


@dataclasses.dataclass(frozen=True, slots=True)
class CostReport:
    step_time: float
    compute_time: float
    comm_time: float
    ideal_time: float  # total FLOPs / (devices x peak)
    mfu: float  # ideal_time / step_time
    memory: MemoryReport
    budget: float
    fits: bool
    collectives: tuple[CollectiveCost, ...] = ()
    # of comm_time, the seconds that overlap compute (0 where hardware.overlap is off):
    # step_time = compute_time + comm_time - hidden_time
    hidden_time: float = 0.0

    @property
    def exposed_time(self) -> float:
        """Communication seconds the step waits for (not hidden under compute)."""
        return self.comm_time - self.hidden_time

    @property
    def collective_bytes(self) -> dict[str, float]:
        out: dict[str, float] = collections.defaultdict(float)
        for c in self.collectives:
            out[c.kind] += c.bytes * c.count
        return dict(out)

    def to_json(self) -> dict:
        m = self.memory
        return {
            "step_time_s": self.step_time, "compute_time_s": self.compute_time,
            "comm_time_s": self.comm_time, "comm_exposed_s": self.exposed_time,
            "comm_hidden_s": self.hidden_time, "ideal_time_s": self.ideal_time, "mfu": self.mfu,
            "memory": {"peak": m.peak, "arguments": m.arguments, "outputs": m.outputs,
                       "temporaries": m.temporaries, "alias": m.alias, **{f"breakdown_{k}": v for k, v in m.breakdown.items()}},
            "budget": self.budget, "fits": self.fits,
            "collective_bytes": self.collective_bytes,
        }


def _mask(groups) -> int:
    m = 0
    for g in groups:
        if g != NO_DIM:
            m |= 1 << g
    return m


def _assign(slots: Sequence[tuple[int, int]], decisions: Sequence[tuple[int, str, int]],
            slot_tensors: Sequence[tuple[int, ...]] | None = None, doubled=None) -> list[list[str]]:
    """Give mesh axes to slots (dims of a value or factors of an op) by ordered decisions.

    slots: (group, size) each; group NO_DIM never shards. slot_tensors: for op factors, the
    tensors (operands and results) each factor spans; None means all slots are dims of one
    tensor. A decision shards every slot of its group that the axis divides, unless a tensor
    holding that slot already uses the axis (then the earlier decision keeps it: an axis
    conflict; or the first such dim keeps it: an intra conflict). A resolution decision
    (axis size 0, ``RESOLVE``) on the group changes that: "second" lets the last such dim
    keep it, "neither" none (``doubled``: group -> the op's tensors holding two of its dims).
    """
    out: list[list[str]] = [[] for _ in slots]
    prod = [1] * len(slots)
    resolved = {g: axis for g, axis, n in decisions if not n} if any(not d[2] for d in decisions) else {}
    order = range(len(slots))
    if slot_tensors is None:
        used: set[str] = set()
        for g, axis, n in decisions:
            if axis in used or not n:
                continue
            ks = order
            how = resolved.get(g)
            if how is not None and sum(sg == g for sg, _ in slots) > 1:
                if how == _NEITHER:
                    continue
                ks = reversed(order)
            for k in ks:
                sg, size = slots[k]
                if sg == g and size % (prod[k] * n) == 0:
                    out[k].append(axis)
                    prod[k] *= n
                    used.add(axis)
                    break
        return out
    tensor_used: dict[int, set[str]] = {}
    for g, axis, n in decisions:
        if not n:
            continue
        how = resolved.get(g)
        skip = doubled.get(g, ()) if how == _NEITHER and doubled else ()
        for k in (reversed(order) if how == _SECOND else order):
            sg, size = slots[k]
            if sg != g or size % (prod[k] * n):
                continue
            ts = slot_tensors[k]
            if any(axis in tensor_used.get(t, ()) for t in ts) or any(t in skip for t in ts):
                continue
            out[k].append(axis)
            prod[k] *= n
            for t in ts:
                tensor_used.setdefault(t, set()).add(axis)
    return out


def _view(fax, fmap, minors, side: str, t: int) -> list[list[str]]:
    """A tensor's sharding as an op computes it: each dim takes its factor's axes, a reshape's
    merged dim its major factor's and then its minor factors'."""
    out = []
    for d, k in enumerate(fmap):
        axes = list(fax[k]) if k >= 0 else []
        for m in minors.get((side, t, d), ()):
            axes += fax[m]
        out.append(axes)
    return out


@dataclasses.dataclass
class _Pattern:
    """Ops with the same factors, groups and operand/result signatures."""

    factors: tuple[tuple[int, int, int], ...]  # (kind, size, group or NO_DIM)
    operands: tuple[tuple[int, tuple[int, ...]], ...]  # (value sig, factor index per dim)
    results: tuple[tuple[int, tuple[int, ...]], ...]
    operand_bytes: tuple[float, ...]
    result_bytes: tuple[float, ...]
    flops: float
    free: bool
    slot_tensors: tuple[tuple[int, ...], ...] = ()  # per factor: the tensors it spans
    cheap: tuple[bool, ...] = ()  # per operand: made locally at any sharding for free
    shift: tuple[str, int] | None = None  # ("concatenate" | "split", dim)
    # per operand / result: bytes a collective of it moves per byte held (2 for 16-bit floats
    # under lowering="cpu": XLA:CPU all-reduces and gathers bf16/f16 in f32)
    operand_wire: tuple[float, ...] = ()
    result_wire: tuple[float, ...] = ()
    # argmax/argmin over a sharded axis: XLA all-gathers each device's partial (value, index)
    # pairs and reduces them locally; the bytes gathered per result byte (value + index)
    gather_partials: float = 0.0
    halos: tuple = ()  # per factor: the conv spatial factor's Halo, or None
    grouped: bool = False  # a conv with batch_group_count > 1 (see _whole_mesh_partials)
    # ("in" | "out", tensor, dim) -> the minor factors of a reshape's merged dim, in order
    minors: dict = dataclasses.field(default_factory=dict)
    weight: float = 0.0  # executions per step: sum of trips
    ops: list = dataclasses.field(default_factory=list)
    doubled: dict = dataclasses.field(default_factory=dict)  # group -> tensors holding two of its dims
    # per operand / result: read from / written to memory (False: a value XLA fuses away,
    # made and read inside one fusion; see _fused_values)
    operand_hbm: tuple[bool, ...] = ()
    result_hbm: tuple[bool, ...] = ()
    # a conv's (spatial factor, FLOPs factor) where sharding that factor with a halo exchange
    # has each device compute on its block extended by the halo rows, the SAME padding's taps
    # included (conv_halo_ratios)
    halo_flops: tuple[tuple[int, float], ...] = ()


@dataclasses.dataclass
class _Edit:
    """What a set of recompute decisions changes in the program the cost model scores."""

    rc: tuple[tuple[int, str], ...]
    extra: list  # [(pattern mask, [(pattern, shared operand indices, executions)])]
    mid_end: np.ndarray  # the intermediates' lifetimes, residuals shortened
    clone_v: np.ndarray  # recomputed values (their local size) ...
    clone_a: np.ndarray  # ... live from the recompute point ...
    clone_b: np.ndarray  # ... to their last backward read
    clone_n: np.ndarray  # copies of each (a value a forward loop stacks: its length)
    late: dict[int, tuple[int, int]]  # weight -> the backward pass's ops: reads there reshard anew
    tmp_v: np.ndarray  # the recomputations' temporaries, per layer from tmp_seg, ...
    tmp_seg: np.ndarray
    tmp_at: np.ndarray  # ... the largest of each live at its recompute point


@dataclasses.dataclass
class _Timeline:
    """The program as the overlap schedule reads it (CostModel._timeline)."""

    region_ops: dict  # region -> its own ops in program order
    child_at: dict  # a loop's or branch's exit op -> its region
    loops: dict  # scan region -> (trips per parent trip, values it carries to the next trip)
    readers: list  # per value: the ops that read it
    static_special: np.ndarray  # per op: visited whatever the plan (a loop's exit)
    early: list  # per value: there at the start of the step or of its loop
    view_op: list  # per op: a view or a loop boundary (no compute of its own)
    ins: list  # per op: its operands
    outs: list  # per op: its results


class _SimState:
    """The streams' clocks while the overlap schedule runs: one for compute, one per mesh
    axis for the collectives over it (a collective over several axes takes them all; those
    over different axes run side by side on their own links)."""

    __slots__ = ("tc", "free", "horizon", "pending", "busy", "readers")

    def __init__(self, axes):
        self.tc = self.horizon = 0.0
        self.readers = collections.deque(maxlen=_PREFETCH)  # the last readers of prefetched values: starts
        self.free = dict.fromkeys(axes, 0.0)  # axis -> when its link is next free
        self.pending: dict = {}  # value -> (time its collective is done, (pattern, collective))
        self.busy: dict = {a: [] for a in axes}  # axis -> [(start, end, (pattern, collective))]

    @property
    def tm(self) -> float:
        return max(self.free.values(), default=0.0)

    def issue(self, ready: float, dur: float, axes, key) -> float:
        """Run a collective over ``axes`` in the first time from ``ready`` on that their
        links are all free for ``dur`` (a weight prefetched into a gap ahead of reductions
        issued before it); returns when it is done."""
        t = ready
        while True:
            t0 = t
            for a in axes:
                t = self._gap(self.busy[a], t, dur)
            if t == t0:
                break
        e = t + dur
        for a in axes:
            lst = self.busy[a]
            lst.insert(bisect.bisect(lst, (t, e, ())), (t, e, key))
            if e > self.free[a]:
                self.free[a] = e
        return e

    @staticmethod
    def _gap(lst, t: float, dur: float) -> float:
        """The first time from t on that the link of the busy list is free for dur."""
        i = bisect.bisect(lst, (t,))
        if i and lst[i - 1][1] > t:
            t = lst[i - 1][1]
        while i < len(lst) and lst[i][0] < t + dur:
            t = max(t, lst[i][1])
            i += 1
        return t

    def wait(self, until: float, key, mult: float, exposed: dict) -> None:
        """The compute stream waits until ``until``: each moment of the wait is charged to
        the collective running then that ends last (a moment no link is busy, to ``key``,
        the one waited for)."""
        a = self.tc
        if until <= a:
            return
        spans = set()
        for lst in self.busy.values():
            for s, e, k in reversed(lst):
                if e <= a:
                    break
                if s < until:
                    spans.add((max(s, a), min(e, until), k))
        if len(spans) == 1:
            ((s, e, k),) = spans
            exposed[k] += (e - s) * mult
            if until - a - (e - s) > 1e-15:
                exposed[key] += (until - a - (e - s)) * mult
            self.tc = until
            return
        cuts = sorted({a, until} | {x for s, e, _ in spans for x in (s, e)})
        for lo, hi in zip(cuts, cuts[1:]):
            live = [(e, k) for s, e, k in spans if s <= lo and e >= hi]
            exposed[max(live)[1] if live else key] += (hi - lo) * mult
        self.tc = until

    def shift(self, since: dict, by: dict) -> None:
        """Move what each link ran after ``since`` later by ``by`` (a loop's trips)."""
        for a, lst in self.busy.items():
            self.busy[a] = [(s + by[a], e + by[a], k) if s >= since[a] else (s, e, k) for s, e, k in lst]
        dm = max(by.values(), default=0.0)
        t0 = min(since.values(), default=0.0)
        self.pending = {v: (t + dm, k) if t > t0 else (t, k) for v, (t, k) in self.pending.items()}
        for a in self.free:
            self.free[a] += by[a]


class CostModel:
    """Scores plans for one analysed program on one mesh and hardware."""

    def __init__(self, analysis: Analysis, mesh: MeshSpec, hardware: Hardware,
                 donate: Iterable[int] | None = None, lowering: str = "tpu", user_shardings: str = "keep"):
        """lowering: "tpu" (TPU and GPU: real reduce-scatters) or "cpu" (XLA:CPU lowers a
        reduce-scatter to an all-reduce of the whole partial result and a local slice, which
        takes a second full-size buffer; used to compare with XLA on simulated devices).
        user_shardings: "keep" (the step's own sharding constraints are fixed decisions ahead
        of every plan's, as XLA honours them; see _constraints) or "replace"."""
        if lowering not in ("tpu", "cpu"):
            raise ValueError(f"lowering must be 'tpu' or 'cpu', got {lowering!r}")
        self.user_shardings = check_mode(user_shardings)
        self.fixed = analysis.fixed(mesh) if user_shardings == "keep" else NO_FIXED
        self.lowering = lowering
        self.analysis = analysis
        self.mesh = mesh
        self.hw = hardware
        self.program = p = analysis.program
        self.axis_size = dict(zip(mesh.axes, mesh.sizes))
        self.axis_bw = {a: mesh.axis_bandwidth(a, hardware) for a in mesh.axes}
        self.axis_lat = {a: mesh.axis_latency(a, hardware) for a in mesh.axes}
        self.group_of_nd = np.array([nd.group for nd in analysis.named_dims] + [NO_DIM], dtype=np.int64)
        values = p.values
        self.nbytes = np.fromiter((v.nbytes for v in values), dtype=np.float64, count=len(values))

        # ---- value signatures: (group, size) per dim
        sig_index: dict[tuple, int] = {}
        self.sigs: list[tuple[tuple[int, int], ...]] = []
        vsig = np.zeros(len(values), dtype=np.int64)
        base = analysis.node_base
        nd = analysis.node_nd
        gnd = self.group_of_nd
        # Dims held whole in one value: those the user's shardings leave replicated there;
        # and, as XLA's SPMD partitioner gets a pad with interior padding wrong when its result
        # is sharded along the padded dim (wrong values or a failed HLO verification, seen on
        # jax 0.10.2), the dims such a pad writes.
        unshardable = {v: set(ds) for v, ds in self.fixed.replicated.items()}
        for op in p.ops:
            if op.primitive == "pad":
                dims = {d for d, (_, _, interior) in enumerate(op.params["padding_config"]) if interior}
                if dims:
                    unshardable.setdefault(op.outputs[0], set()).update(dims)
        for v in values:
            b = base[v.id]
            blocked = unshardable.get(v.id, ())
            sig = tuple((int(gnd[nd[b + d]]) if nd[b + d] != NO_DIM and d not in blocked else NO_DIM, s)
                        for d, s in enumerate(v.shape))
            i = sig_index.get(sig)
            if i is None:
                i = sig_index[sig] = len(self.sigs)
                self.sigs.append(sig)
            vsig[v.id] = i
        self.vsig = vsig

        # ---- op patterns
        # values any device can make locally at any sharding (broadcast scalars, iotas):
        # resharding them costs nothing, XLA just builds them at the sharding wanted
        cheap = [v.producer != NO_PRODUCER and (
            p.ops[v.producer].primitive == "iota"
            or (p.ops[v.producer].primitive == "broadcast_in_dim"
                and not values[p.ops[v.producer].inputs[0]].shape)) for v in values]
        wire = [2.0 if lowering == "cpu" and str(v.dtype) in ("bfloat16", "float16") else 1.0 for v in values]
        fused = self._fused_values()
        pat_index: dict[tuple, int] = {}
        self.patterns: list[_Pattern] = []
        self.op_pattern = np.zeros(len(p.ops), dtype=np.int64)
        self.total_flops = 0.0
        for op, fs in zip(p.ops, analysis.factors):
            fkeys = []
            ftensors = []
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
                if f.kind == FactorKind.REDUCTION:
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
            flops = op_flops(op.primitive, op.params, ins, outs)
            self.total_flops += flops * op.trip
            halo_flops = ()
            if op.primitive == "conv_general_dilated" and any(f.halo is not None for f in fs):
                r = conv_halo_ratios(op.params, ins, outs)
                halo_flops = tuple((k, r.get(f.halo.dim, 1.0)) for k, f in enumerate(fs)
                                   if f.halo is not None and f.halo.operand == 0 and r.get(f.halo.dim, 1.0) != 1.0)
            pairs = 0.0
            if any(f.kind == FactorKind.REDUCTION and f.reduce == "index" for f in fs):
                pairs = 1.0 + values[op.inputs[0]].dtype.itemsize / values[op.outputs[0]].dtype.itemsize
            key = (tuple(fkeys),
                   tuple((int(vsig[i]), tuple(m)) for i, m in zip(op.inputs, dim_factor_in)),
                   tuple((int(vsig[o]), tuple(m)) for o, m in zip(op.outputs, dim_factor_out)),
                   op.primitive in _FREE, flops, tuple(ftensors), tuple(cheap[i] for i in op.inputs),
                   _shift(op, values), tuple(wire[i] for i in op.inputs), tuple(wire[o] for o in op.outputs),
                   tuple(self.nbytes[i] for i in op.inputs), tuple(self.nbytes[o] for o in op.outputs), pairs,
                   tuple(f.halo for f in fs), tuple(sorted((k, tuple(v)) for k, v in minors.items())),
                   op.primitive == "conv_general_dilated" and op.params["batch_group_count"] > 1,
                   tuple(not fused[i] for i in op.inputs), tuple(not fused[o] for o in op.outputs))
            pi = pat_index.get(key)
            if pi is None:
                pi = pat_index[key] = len(self.patterns)
                self.patterns.append(_Pattern(
                    key[0], key[1], key[2],
                    tuple(float(self.nbytes[i]) for i in op.inputs),
                    tuple(float(self.nbytes[o]) for o in op.outputs),
                    flops, key[3], key[5], key[6], key[7], key[8], key[9], pairs, key[13], key[15],
                    dict(key[14]), operand_hbm=key[16], result_hbm=key[17], halo_flops=halo_flops))
                pat = self.patterns[-1]
                for t, (sig, _) in enumerate(pat.operands + pat.results):  # where a resolution applies
                    groups = [g for g, _ in self.sigs[sig] if g != NO_DIM]
                    for g in {g for g in groups if groups.count(g) > 1}:
                        pat.doubled.setdefault(g, set()).add(t)
            pat = self.patterns[pi]
            pat.weight += op.trip
            pat.ops.append(op.id)
            self.op_pattern[op.id] = pi
        # groups each signature / pattern depends on, as bitmasks (hot path)
        self.sig_mask = [_mask(g for g, _ in sig) for sig in self.sigs]
        self.pat_mask = []
        for pt in self.patterns:
            m = _mask(g for _, _, g in pt.factors)
            for sg, _ in pt.operands + pt.results:
                m |= self.sig_mask[sg]
            self.pat_mask.append(m)
        by_mask: dict[int, list[int]] = collections.defaultdict(list)
        for pi, m in enumerate(self.pat_mask):
            by_mask[m].append(pi)
        self.mask_groups = list(by_mask.items())
        self.sig_masks = collections.defaultdict(list)
        for si, m in enumerate(self.sig_mask):
            self.sig_masks[m].append(si)
        self.sig_masks = list(self.sig_masks.items())
        self._agg_cache: dict = {}
        self._reshard_cache: dict = {}
        self._factor_cache: dict = {}

        self._liveness(donate)
        self._combined_until = self._cpu_combined() if lowering == "cpu" else None
        self._sig_cache: dict = {}
        self._pat_cache: dict = {}
        self.units = analysis.units
        self._edits: dict = {}  # recompute decisions -> _Edit
        # The step's own jax.checkpoint: its backward (the recomputation and its transpose)
        # reads the weights through an optimisation barrier (prevent_cse), so a weight the
        # plan gathers is gathered again there, as under a re-gather decision.
        span = backward_span(p)
        self.user_late = {} if span is None else {
            v: span for v in p.barrier_reads if values[v].producer == NO_PRODUCER and v not in p.constants}

    # ------------------------------------------------------------------ liveness
    def _liveness(self, donate) -> None:
        p = self.program
        n_ops = len(p.ops)
        inputs = set(p.inputs)
        outputs = set(p.outputs)
        # region ancestry: for a use inside a loop body of a value defined outside it, the
        # value lives until the loop's exit op
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
        prod = np.fromiter((v.producer for v in p.values), dtype=np.int64, count=len(p.values))
        is_mid = np.ones(len(p.values), dtype=bool)
        is_mid[list(inputs)] = False
        is_mid[list(outputs)] = False
        is_mid &= prod != NO_PRODUCER
        # XLA fuses elementwise chains: a value made by an elementwise op and read only by
        # one elementwise op or reduction is never materialised.
        is_mid &= ~self._fused_values()
        # a dead intermediate lives only through its producer
        end = np.where(end < 0, prod, end)
        self.value_end = np.where(end < 0, n_ops, end + 1).tolist()
        self.mid = np.flatnonzero(is_mid)
        self.mid_def = prod[self.mid]
        self.mid_end = end[self.mid] + 1
        self.n_ops = n_ops
        span = self.mid_end - self.mid_def
        self.mid_long = span > max(8, n_ops // 10)  # saved across much of the step: activations
        self.inputs = np.array(p.inputs, dtype=np.int64)
        self.outputs = np.array(sorted(outputs), dtype=np.int64)
        # input categories from the roles the program's structure gives its inputs
        roles = self.analysis.roles()
        cat = [roles.category(vid) for vid in p.inputs]
        self.input_cat = np.array(cat)
        # donation: output leaves that alias an input leaf of a donated arg (same shape, dtype)
        self.alias_pairs: list[tuple[int, int]] = []
        if donate:
            arg_of_input = self._arg_index_of_inputs()
            pool: dict[tuple, list[int]] = collections.defaultdict(list)
            for k, vid in enumerate(p.inputs):
                if arg_of_input[k] in set(donate):
                    v = p.values[vid]
                    pool[(v.shape, v.dtype.str)].append(vid)
            for ovid in p.outputs:
                v = p.values[ovid]
                lst = pool.get((v.shape, v.dtype.str))
                if lst:
                    self.alias_pairs.append((lst.pop(0), ovid))
        self._alias_arrays = (np.array([i for i, _ in self.alias_pairs], dtype=np.int64),
                              np.array([o for _, o in self.alias_pairs], dtype=np.int64))
        # an output that mirrors an input (the updated state) counts in the input's category
        in_cat = dict(zip(p.inputs, cat))
        self.output_cat = {ovid: in_cat[ivid] for ovid, ivid in roles.mirror.items()}

    def _fused_values(self) -> np.ndarray:
        """Per value: XLA fuses it away. A value made by an elementwise op and read only by
        one elementwise op or reduction is made and read inside one fusion: never in memory,
        neither written by its maker nor read by its reader."""
        f = self.__dict__.get("_fused")
        if f is not None:
            return f
        p = self.program
        consumers = np.zeros(len(p.values), dtype=np.int64)
        fusible_reader = np.zeros(len(p.values), dtype=bool)
        for op in p.ops:
            for v in set(op.inputs):
                consumers[v] += 1
                fusible_reader[v] = op.primitive in _FUSIBLE or op.primitive.startswith("reduce_")
        made_fusible = np.array([v.producer != NO_PRODUCER and p.ops[v.producer].primitive in _FUSIBLE
                                 for v in p.values], dtype=bool)
        out = np.zeros(len(p.values), dtype=bool)
        out[:] = made_fusible & (consumers == 1) & fusible_reader
        out[list(p.outputs)] = False
        self._fused = out
        return out

    def _cpu_combined(self) -> np.ndarray | None:
        """Per op, where XLA:CPU reduces its partial result: XLA:CPU combines independent
        all-reduces without a byte limit, 256 at a time, so the gradient reductions of the
        backward pass, whose results nothing reads before the optimizer, run in groups of 256
        and every partial (full-size) gradient lives until its group's. -1: as the value
        (read during the backward pass: its reduction cannot wait)."""
        p = self.program
        span = backward_span(p)
        if span is None:
            return None
        first, last = span
        # the first op that reads each value other than through views (reshapes, transposes)
        first_read = np.full(len(p.values), len(p.ops), dtype=np.int64)
        for op in reversed(p.ops):
            for v in op.inputs:
                at = min((first_read[o] for o in op.outputs), default=len(p.ops)) \
                    if op.primitive in _FREE or op.primitive == "transpose" else op.id
                first_read[v] = min(first_read[v], at)
        out = np.full(len(p.ops), -1, dtype=np.int64)
        reducing = [op.id for op in p.ops[first:last + 1]
                    if op.outputs and all(first_read[v] > last for v in op.outputs)
                    and any(f.kind == FactorKind.REDUCTION for f in self.analysis.factors[op.id])]
        # combined 256 at a time, in program order: each group reduces after its last
        for k in range(0, len(reducing), _CPU_COMBINE):
            group = reducing[k:k + _CPU_COMBINE]
            out[group] = group[-1] + 1
        return out

    def _arg_index_of_inputs(self) -> list[int]:
        p = self.program
        counts = [len(t.children()) and t.num_leaves for t in p.in_tree.children()] if p.in_tree.children() else []
        out = []
        for a, c in enumerate(counts):
            out += [a] * c
        return out + [len(counts)] * (len(p.inputs) - len(out))

    # ------------------------------------------------------------------ shardings
    def _decisions(self, decisions: Sequence[Decision]) -> list[tuple[int, str, int]]:
        """The sharding decisions, as (group, axis, axis size); recompute decisions left out,
        conflict resolutions with size 0."""
        fixed = self.fixed
        decisions = [d for d in decisions if not d[1].startswith(RECOMPUTE)]
        if fixed.groups:  # the user's shardings first; a plan cannot move a group they fix
            decisions = [*fixed.decisions, *(d for d in decisions if int(d[0]) not in fixed.groups)]
        # a conflict's resolution: axis size 0 (_assign reads it; it shards nothing)
        return [(int(g), a, 0 if a.startswith(RESOLVE) else self.axis_size[a]) for g, a in decisions]

    @staticmethod
    def recompute_of(decisions: Sequence[Decision]) -> tuple[tuple[int, str], ...]:
        """The recompute decisions, as sorted (unit, kind); the last one for a unit counts."""
        out = {int(u): kind_of(a) for u, a in decisions if a.startswith(RECOMPUTE)}
        return tuple(sorted(out.items()))

    # ------------------------------------------------------------------ recompute
    def _edit(self, rc: tuple[tuple[int, str], ...]) -> "_Edit":
        """What the recompute decisions ``rc`` change: the ops run again (by pattern, with
        the operands whose reshard the backward pass shares), the residuals' shortened
        lifetimes and the recomputed copies' own, and the weights re-taken in the backward."""
        e = self._edits.get(rc)
        if e is not None:
            return e
        p = self.program
        readers = getattr(self, "_readers", None)
        if readers is None:
            readers = self._readers = value_readers(p)
        mid_at = {int(v): i for i, v in enumerate(self.mid.tolist())}
        mid_end = self.mid_end.copy()
        extra: collections.Counter = collections.Counter()
        clone_v, clone_a, clone_b, clone_n = [], [], [], []
        tmp_v, tmp_seg, tmp_at = [], [], []
        late: dict[int, tuple[int, int]] = dict(self.user_late)
        for u, kind in rc:
            unit = self.units[u]
            for cp in plan_unit(p, unit, kind):
                if isinstance(cp, LoopPlan):
                    self._edit_loop(unit, cp, extra, mid_at, mid_end, (clone_v, clone_a, clone_b, clone_n),
                                    (tmp_v, tmp_seg, tmp_at))
                    continue
                if cp.at < 0:
                    continue
                for v in cp.weights:
                    late[v] = (unit.boundary, unit.until)
                self._charge(cp.ops, set(cp.weights), extra)
                rec = set(cp.recomputed)
                tmps = []
                for o in cp.ops:
                    for v in p.ops[o].outputs:
                        i = mid_at.get(v)
                        if i is None:
                            continue
                        if v in rec:  # dies after its forward reads; a copy lives to its backward ones
                            fwd = [r for r in readers[v] if r < unit.boundary]
                            mid_end[i] = (max(fwd) if fwd else p.values[v].producer) + 1
                            clone_v.append(v), clone_a.append(cp.at), clone_b.append(self.value_end[v])
                            clone_n.append(1)
                        else:
                            tmps.append(v)
                if tmps:  # the recomputation's own temporaries: freed as it goes, the largest counts
                    tmp_seg.append(len(tmp_v))
                    tmp_v += tmps
                    tmp_at.append(cp.at)
                for v in cp.leaves:  # read again at the recompute point
                    i = mid_at.get(v)
                    if i is not None:
                        mid_end[i] = max(mid_end[i], cp.at + 1)
        by_mask: dict[int, list] = collections.defaultdict(list)
        for (pi, excl), n in extra.items():
            by_mask[self.pat_mask[pi]].append((pi, excl, n))
        e = self._edits[rc] = _Edit(rc, list(by_mask.items()), mid_end, np.array(clone_v, dtype=np.int64),
                                    np.array(clone_a, dtype=np.int64), np.array(clone_b, dtype=np.int64),
                                    np.array(clone_n, dtype=np.float64), late,
                                    *(np.array(x, dtype=np.int64) for x in (tmp_v, tmp_seg, tmp_at)))
        return e

    def _charge(self, ops, shared: set, extra) -> None:
        """Count the ops a recomputation runs again, by pattern, with the operands whose
        reshard it does not pay again: a weight's that the backward pass shares (``shared``),
        and a value's that an earlier op of the same recomputation reshards alike (the same
        pattern reading it at the same place: XLA CSEs the two)."""
        p = self.program
        seen = set()
        for o in ops:
            op = p.ops[o]
            pi = int(self.op_pattern[o])
            excl = []
            for i, v in enumerate(op.inputs):
                if v in shared or (v, pi, i) in seen:
                    excl.append(i)
                seen.add((v, pi, i))
            extra[(pi, tuple(excl))] += op.trip

    def _edit_loop(self, unit, lp: LoopPlan, extra, mid_at, mid_end, clones, tmps) -> None:
        """A scan unit's edit: the body ops run again in the backward loop (each as often as
        the forward's), the stacked residuals it no longer makes, the values it stacks
        instead (live from the forward loop to the backward loop's end), and the
        recomputation's largest temporary in the backward loop's body."""
        p = self.program
        exit_ = p.ops[unit.copies[0][1] - 1]
        self._charge(lp.ops, set(), extra)
        nc = exit_.params["num_carry"]
        stacked_out = exit_.outputs[nc:]
        last = exit_.id + 1
        for j in lp.dropped:
            i = mid_at.get(stacked_out[j])
            if i is not None:
                mid_end[i] = self.mid_def[i]  # never made
                last = max(last, self.value_end[stacked_out[j]])
        clone_v, clone_a, clone_b, clone_n = clones
        for v in lp.stacked:
            clone_v.append(v), clone_a.append(exit_.id), clone_b.append(last), clone_n.append(unit.layers)
        tmp_v, tmp_seg, tmp_at = tmps
        made = [v for o in lp.ops for v in p.ops[o].outputs if v in mid_at]
        if made:
            tmp_seg.append(len(tmp_v))
            tmp_v += made
            tmp_at.append(lp.backward)

    def _extra(self, edit: "_Edit", dec, detail: bool):
        """(compute s, comm s, collectives) of the ops a recompute runs again."""
        compute = comm = 0.0
        colls = []
        for m, items in edit.extra:
            rel = tuple(d for d in dec if (m >> d[0]) & 1)
            key = (edit.rc, m, rel)
            r = self._agg_cache.get(key)
            if r is None:
                c_sum = m_sum = 0.0
                rows = []
                for pi, excl, n in items:
                    c, mm, cl, *_ = self._pattern_cost(pi, rel)
                    shared = sum(x[3] for x in cl if x[5] >= 0 and x[5] in excl)
                    c_sum += c * n
                    m_sum += (mm - shared) * n
                    kept = tuple(x for x in cl if not (x[5] >= 0 and x[5] in excl))
                    if kept:
                        rows.append((pi, kept, n))
                r = self._agg_cache[key] = (c_sum, m_sum, rows)
            compute += r[0]
            comm += r[1]
            if detail:
                colls += r[2]
        return compute, comm, colls

    def sig_spec(self, sig: int, dec: Sequence[tuple[int, str, int]]) -> list[list[str]]:
        m = self.sig_mask[sig]
        rel = tuple(d for d in dec if (m >> d[0]) & 1)
        key = (sig, rel)
        r = self._sig_cache.get(key)
        if r is None:
            r = self._sig_cache[key] = _assign(self.sigs[sig], rel)
        return r

    def _shard(self, spec) -> int:
        n = 1
        for axes in spec:
            for a in axes:
                n *= self.axis_size[a]
        return n

    # ------------------------------------------------------------------ per-pattern costs
    def _pattern_cost(self, pi: int, dec) -> tuple[float, float, tuple, tuple, tuple, tuple]:
        m = self.pat_mask[pi]
        rel = tuple(d for d in dec if (m >> d[0]) & 1)
        key = (pi, rel)
        r = self._pat_cache.get(key)
        if r is None:
            r = self._pat_cache[key] = self._pattern_cost_uncached(self.patterns[pi], rel)
        return r

    def _pattern_cost_uncached(self, pat: _Pattern, dec) -> tuple[float, float, tuple, tuple, tuple, tuple]:
        """(compute s, comm s, collectives, transient buffers, views, work) of one execution
        of the pattern's ops under decisions dec; views: each operand's sharding as the op
        reads it, then each result's as the op writes it (None for a partial result); work:
        (FLOPs, bytes its operands and results hold) per device."""
        fslots = [(g, size) for _, size, g in pat.factors]  # g is NO_DIM unless the factor ties
        fax = _assign(fslots, dec, pat.slot_tensors, pat.doubled)
        self._scatter_major(pat, dec, fax)
        self._whole_mesh_partials(pat, fax)
        self._unaligned_minors(pat, fax)
        shard = 1
        for axes in fax:
            for a in axes:
                shard *= self.axis_size[a]
        colls = []  # (kind, axes, bytes, cause group)
        local_bytes = 0.0
        in_view, out_view = self._shifted_views(pat, dec, fax, colls)
        views = []
        for i, ((sig, fmap), nb) in enumerate(zip(pat.operands, pat.operand_bytes)):
            vspec = self.sig_spec(sig, dec)
            ospec = in_view.get(i) or _view(fax, fmap, pat.minors, "in", i)
            views.append(tuple(tuple(a) for a in ospec))
            if pat.operand_hbm[i]:
                local_bytes += nb / self._shard(ospec)
            n0 = len(colls)
            if not pat.cheap[i]:
                self._reshard(vspec, ospec, nb * pat.operand_wire[i], self.sigs[sig], colls)
            key = tuple(tuple(a) for a in ospec)
            view = nb / self._shard(ospec)  # the resharded buffer the op reads
            colls[n0:] = [c + (i, key, view) for c in colls[n0:]]
            # not a reshard of the value (no CSE: XLA exchanges halos per conv)
            self._halo(pat, i, fax, view * pat.operand_wire[i], colls)
        partial = [a for (kind, _, g), axes in zip(pat.factors, fax) if kind == FactorKind.REDUCTION for a in axes]
        pgroup = next((g for (kind, _, g), axes in zip(pat.factors, fax) if kind == FactorKind.REDUCTION and axes), NO_DIM)
        transient = []
        for j, ((sig, fmap), nb) in enumerate(zip(pat.results, pat.result_bytes)):
            vspec = self.sig_spec(sig, dec)
            ospec = out_view.get(j) or _view(fax, fmap, pat.minors, "out", j)
            lb = nb / self._shard(ospec)
            n0 = len(colls)
            if pat.result_hbm[j]:
                local_bytes += lb
            views.append(None if partial else tuple(tuple(a) for a in ospec))
            # The op writes its result at its own (larger) sharding before the reshard; a
            # partial result is a buffer of its own beside the reduced one. XLA combines the
            # reductions of partial results and issues them late, so such a buffer is taken
            # to live as long as the value (an over-estimate on TPU).
            extra = lb if partial else lb - nb / self._shard(vspec)
            if extra > 0:
                transient.append((j, extra, bool(partial)))
            if partial and pat.gather_partials:
                gathered = lb * self._prod(partial) * pat.gather_partials
                colls.append(("all-gather", tuple(partial), gathered, pgroup))
                transient.append((j, gathered, False))
            elif partial:
                vaxes = {a for axes in vspec for a in axes}
                rs = tuple(a for a in partial if a in vaxes)
                ar = tuple(a for a in partial if a not in vaxes)
                if rs and self.lowering == "cpu":
                    colls.append(("all-reduce", rs, lb, pgroup))
                    transient.append((j, lb, False))  # the all-reduced whole, before the slice
                elif rs:
                    colls.append(("reduce-scatter", rs, lb, pgroup))
                # XLA sums the partials of each reduction factor with an all-reduce of its
                # own (a matmul contracting batch on data and sequence on model: over model,
                # then over data; a conv's filter gradient: over its spatial dims after the
                # others); the factors' own groups, spatial ones last
                parts: dict[int, list[str]] = {}
                owner = {}
                for k, ((kind, _, g), axes, h) in enumerate(zip(pat.factors, fax, pat.halos)):
                    if kind == FactorKind.REDUCTION:
                        for a in axes:
                            owner[a] = (h is not None, k, g)
                for a in ar:
                    parts.setdefault(owner[a], []).append(a)
                for (_, _, g), part in sorted(parts.items()):
                    colls.append(("all-reduce", tuple(part), lb / self._prod(rs), g))
                # after the reduce-scatter the result holds those axes: treat them as present
                ospec = [list(o) for o in ospec]
                for a in rs:
                    for d, axes in enumerate(vspec):
                        if a in axes:
                            ospec[d].append(a)
            self._reshard(ospec, vspec, nb, self.sigs[sig], colls)
            if pat.result_wire[j] != 1.0:
                colls[n0:] = [(k, ax, b * pat.result_wire[j], *rest) for k, ax, b, *rest in colls[n0:]]
        flops = pat.flops / shard
        for k, ratio in pat.halo_flops:
            if fax[k]:
                flops *= ratio
        if pat.free:
            compute = 0.0
        else:
            compute = max(flops / self.hw.peak_flops, local_bytes / self.hw.hbm_bandwidth)
        work = (0.0, 0.0) if pat.free else (flops, local_bytes)
        comm = 0.0
        out = []
        for kind, axes, b, g, *operand in colls:
            t = self._coll_time(kind, axes, b)
            comm += t
            out.append((kind, axes, b, t, g) + (tuple(operand) if operand else (-1, None, 0.0)))
        return compute, comm, tuple(out), tuple(transient), tuple(views), work

    def _halo(self, pat: _Pattern, i: int, fax, local: float, colls) -> None:
        """An operand sharded along a conv's spatial dim or a slice's or pad's cut dim: each
        device receives the rows its block reads beyond its own from its neighbours (XLA: a
        collective-permute each way)."""
        for k, h in enumerate(pat.halos):
            if h is None or h.operand != i or not fax[k]:
                continue
            n = self._prod(fax[k])
            left, right = h.rows(n)
            if left + right:
                colls.append(("collective-permute", tuple(fax[k]), local * (left + right) * n / h.size,
                              pat.factors[k][2]))

    def _unaligned_minors(self, pat: _Pattern, fax) -> None:
        """A merged dim's blocks are its minor dims' blocks only where every factor before the
        minor one is sharded all the way (block size 1): a minor factor after a partly
        sharded one is not sharded here (its split-side dim is resharded instead)."""
        for (side, t, d), ms in pat.minors.items():
            fmap = (pat.operands if side == "in" else pat.results)[t][1]
            k = fmap[d]
            full = k < 0 or self._prod(fax[k]) == pat.factors[k][1]
            for m in ms:
                if not full:
                    fax[m] = []
                full = full and self._prod(fax[m]) == pat.factors[m][1]

    def _whole_mesh_partials(self, pat: _Pattern, fax) -> None:
        """XLA's SPMD partitioner (jax 0.12, Shardy and GSPMD alike) all-reduces over *every*
        device, copies included, the partial filter gradient of a conv whose spatial dims are
        sharded, and of a grouped conv (``batch_group_count`` > 1: a depthwise conv's weight
        gradient) whose batch is: with a mesh axis left out of the reduction the gradient
        comes out that many times too large. Such a conv takes the rest of the mesh on its
        batch (the other reduction; each device then holds a distinct partial sum), or, where
        the batch cannot take it, leaves those reductions unsharded (operands gathered)."""
        affected = [k for k, ((kind, _, _), h) in enumerate(zip(pat.factors, pat.halos))
                    if fax[k] and kind == FactorKind.REDUCTION and (h is not None or pat.grouped)]
        if not affected:
            return
        reduced = {a for (kind, _, _), axes in zip(pat.factors, fax) if kind == FactorKind.REDUCTION for a in axes}
        used = {a for axes in fax for a in axes}
        rest = [a for a in self.mesh.axes if a not in reduced and self.axis_size[a] > 1]
        if not rest:
            return
        if not any(a in used for a in rest):
            for k, (kind, size, _) in enumerate(pat.factors):
                if (kind == FactorKind.REDUCTION and pat.halos[k] is None
                        and size % (self._prod(fax[k]) * self._prod(rest)) == 0):
                    fax[k] = fax[k] + rest
                    return
        for k in affected:
            fax[k] = []

    def _scatter_major(self, pat: _Pattern, dec, fax) -> None:
        """A partial result scattered over an axis that its value puts *major* to the axes the
        op already shards that dim with cannot be a plain reduce-scatter: XLA computes that
        dim whole (gathering the operands along it) and scatters over all its axes. The
        factor of such a dim is unsharded here (in place)."""
        partial = {a for (kind, _, _), axes in zip(pat.factors, fax) if kind == FactorKind.REDUCTION for a in axes}
        if not partial:
            return
        for sig, fmap in pat.results:
            vspec = self.sig_spec(sig, dec)
            for d, k in enumerate(fmap):
                if k < 0 or not fax[k]:
                    continue
                want = tuple(vspec[d])
                if any(a in partial for a in want) and tuple(fax[k]) != want[:len(fax[k])]:
                    fax[k] = []

    def _shifted_views(self, pat: _Pattern, dec, fax, colls):
        """Concatenate and split along a sharded dim, as XLA partitions them: pieces sharded
        like the whole are moved by an all-to-all (concatenate) or, where a piece's blocks do
        not line up with the whole's, a collective-permute (split); a piece sharded where the
        whole is not is gathered; an unsharded piece of a sharded whole is sliced locally."""
        if pat.shift is None:
            return {}, {}
        kind, d, sizes = pat.shift
        total = sum(sizes)

        def own(sig):
            return [list(a) for a in self.sig_spec(sig, dec)]

        if kind == "concatenate":
            axes = self.sig_spec(pat.results[0][0], dec)[d]
            if not axes:
                return {}, {}  # an unsharded result: gather the pieces (the general path)
            in_view = {}
            for i, ((sig, fmap), nb) in enumerate(zip(pat.operands, pat.operand_bytes)):
                spec = self.sig_spec(sig, dec)
                in_view[i] = own(sig)
                if spec[d] == axes:
                    colls.append(("all-to-all", tuple(axes), nb / self._shard(spec), self.sigs[sig][d][0]))
                elif spec[d]:
                    rest = [a for k, x in enumerate(spec) if k != d for a in x]
                    colls.append(("all-gather", tuple(spec[d]), nb / self._prod(rest), self.sigs[sig][d][0]))
            return in_view, {0: own(pat.results[0][0])}
        whole = self.sig_spec(pat.operands[0][0], dec)
        out_view = {}
        offset = 0
        for j, ((sig, fmap), nb) in enumerate(zip(pat.results, pat.result_bytes)):
            spec = self.sig_spec(sig, dec)
            out_view[j] = own(sig)
            if spec[d]:
                frac = _misaligned(offset, sizes[j], total, self._prod(spec[d]))
                if frac > 1e-9:
                    colls.append(("collective-permute", tuple(spec[d]), frac * nb / self._shard(spec),
                                  self.sigs[sig][d][0]))
            elif whole[d]:
                rest = [a for k, x in enumerate(spec) if k != d for a in x]
                colls.append(("all-gather", tuple(whole[d]), nb / self._prod(rest), self.sigs[sig][d][0]))
            offset += sizes[j]
        return {0: own(pat.operands[0][0])}, out_view

    def _prod(self, axes) -> int:
        n = 1
        for a in axes:
            n *= self.axis_size[a]
        return n

    def _reshard(self, have, want, nbytes, sig, colls) -> None:
        """Collectives to turn a buffer sharded as ``have`` into ``want`` (per dim axes)."""
        hv = {a: d for d, axes in enumerate(have) for a in axes}
        wv = {a: d for d, axes in enumerate(want) for a in axes}
        if hv == wv:
            return
        moved = tuple(a for a in hv if a in wv and wv[a] != hv[a])
        kept = [a for a in hv if a in wv and wv[a] == hv[a]]
        gathered = tuple(a for a in hv if a not in wv)
        # Dropping a major axis of a dim while keeping a minor one reorders the blocks: XLA
        # first permutes them (a collective-permute of the local buffer) so that the kept axes
        # are major, then gathers the dropped ones.
        for d, axes in enumerate(have):
            w = set(want[d]) if d < len(want) else set()
            keep = [a for a in axes if a in w]
            if keep and tuple(keep) != tuple(axes[:len(keep)]):
                g = sig[d][0] if d < len(sig) else NO_DIM
                colls.append(("collective-permute", tuple(axes), nbytes / self._prod(hv), g))
                break
        if moved:
            local = nbytes / self._prod(hv)
            g = sig[hv[moved[0]]][0] if hv[moved[0]] < len(sig) else NO_DIM
            colls.append(("all-to-all", moved, local, g))
        if gathered:
            after = nbytes / self._prod(kept + list(moved))
            g = sig[hv[gathered[0]]][0] if hv[gathered[0]] < len(sig) else NO_DIM
            colls.append(("all-gather", gathered, after, g))

    def _coll_time(self, kind: str, axes: tuple[str, ...], nbytes: float) -> float:
        n = self._prod(axes)
        if n <= 1:
            return 0.0
        bw = min(self.axis_bw[a] for a in axes)
        lat = sum(self.axis_lat[a] * (self.axis_size[a] - 1) for a in axes)
        if kind == "all-reduce":
            return 2 * (n - 1) / n * nbytes / bw + 2 * lat
        if kind == "all-to-all":
            # (n-1)/n^2 of the full tensor (n x the local buffer) crosses the links
            return (n - 1) / n * nbytes / bw + lat
        return (n - 1) / n * nbytes / bw + lat

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, decisions: Sequence[Decision], detail: bool = False, overlap: bool | None = None) -> CostReport:
        """The plan's step time, memory and (``detail``) collectives. ``overlap``: schedule
        collectives under compute (default: as the hardware does; False: every collective
        exposed, the step a sum: additive over decisions, as the ILP linearises it)."""
        if overlap is None:
            overlap = self.hw.overlap
        dec = self._decisions(decisions)
        rc = self.recompute_of(decisions)
        edit = self._edit(rc) if rc else None
        # per-signature shard factors -> per-value local bytes (memoised per group mask)
        sig_factor = np.empty(len(self.sigs), dtype=np.float64)
        for m, sigs in self.sig_masks:
            rel = tuple(d for d in dec if (m >> d[0]) & 1)
            f = self._factor_cache.get((m, rel))
            if f is None:
                f = self._factor_cache[(m, rel)] = np.array([self._shard(self.sig_spec(si, rel)) for si in sigs])
            sig_factor[sigs] = f
        local = self.nbytes / sig_factor[self.vsig]
        # time: patterns that depend on the same groups share one memoised aggregate
        compute = comm = 0.0
        colls = []
        resharded = []
        transients = []
        aggs = []
        for m, pis in self.mask_groups:
            rel = tuple(d for d in dec if (m >> d[0]) & 1)
            agg = self._agg_cache.get((m, rel))
            if agg is None:
                agg = self._agg_cache[(m, rel)] = self._aggregate(pis, rel)
            aggs.append(agg)
            compute += agg[0]
            comm += agg[1]
            if agg[2]:
                resharded += agg[2]
            if agg[3]:
                transients += agg[3]
            if detail:
                colls += agg[4]
        extra_colls = []
        xc = xm = 0.0
        if edit is not None:
            xc, xm, extra_colls = self._extra(edit, dec, detail)
            compute += xc
            comm += xm
        late = self.user_late if edit is None else edit.late  # an edit's includes the user's
        rkey = (tuple((pi, tuple(x[:3] + x[5:7] for x in cl if x[5] >= 0)) for pi, cl in resharded),
                rc)  # the recompute decisions fix which weights are re-taken
        common = self._reshard_cache.get(rkey)
        if common is None:
            common = self._reshard_cache[rkey] = self._common_reshards(resharded, late)
        saved, dup_count, buffers, dup_ops = common
        buffers = list(buffers)
        buffers += transients
        comm -= saved
        step = compute + comm
        exposed = None
        if overlap and comm > 0:
            # the recomputation's ops run as one block, their collectives in line
            t, exposed = self._overlapped(aggs, dup_ops)
            step = min(step, t + xc + xm)
        ideal = self.total_flops / (self.mesh.size * self.hw.peak_flops)
        mem = self._memory(local, detail, buffers, edit)
        budget = self.hw.budget
        fits = mem.peak <= self.hw.limit
        report_colls = ()
        if detail:
            report_colls = tuple(self._collective_rows(colls, dup_count, extra_colls, exposed))
        return CostReport(step, compute, comm, ideal, (ideal / step) if step > 0 else 0.0, mem,
                          budget, fits, report_colls, max(0.0, compute + comm - step))

    # ------------------------------------------------------------------ overlap
    def _timeline(self) -> "_Timeline":
        """What the overlap schedule needs of the program, built on first use."""
        tl = self.__dict__.get("_tl")
        if tl is not None:
            return tl
        p = self.program
        values = p.values
        # Values there at the start of the step or of a loop, whatever the plan: the step's
        # inputs, and what views of them make (a weight cast to bf16, transposed, a layer's
        # slice of a stacked weight a scan reads). A collective of one can run ahead of its
        # reader: XLA prefetches FSDP's weight gathers under the previous layer's compute.
        early = np.zeros(len(values), dtype=bool)
        for v in values:
            early[v.id] = v.producer == NO_PRODUCER
        for op in p.ops:
            if op.primitive == "scan_enter":
                nc = op.params["num_carry"]
                for j, (i, o) in enumerate(zip(op.inputs, op.outputs)):
                    early[o] = j >= nc and early[i]
            elif op.primitive in _VIEWS and op.inputs and all(early[i] for i in op.inputs):
                early[list(op.outputs)] = True
        region_ops: dict[int, list[int]] = {r.id: [] for r in p.regions}
        for op in p.ops:
            region_ops[op.region].append(op.id)
        child_at = {r.exit: r.id for r in p.regions[1:] if r.exit >= 0}
        loops = {}  # scan region -> (trips per parent trip, carried-out values)
        for r in p.regions[1:]:
            if r.kind == "scan" and r.exit >= 0:
                ex = p.ops[r.exit]
                parent = p.regions[r.parent].trip
                loops[r.id] = (max(1, r.trip // max(1, parent)), tuple(ex.inputs[:ex.params["num_carry"]]))
        readers: list[list[int]] = [[] for _ in values]
        for op in p.ops:
            for v in set(op.inputs):
                readers[v].append(op.id)
        view_op = np.array([op.primitive in _VIEWS or op.primitive in PSEUDO_OPS for op in p.ops], dtype=bool)
        static_special = np.zeros(len(p.ops), dtype=bool)
        static_special[list(child_at)] = True
        tl = self._tl = _Timeline(
            {r: np.array(ids, dtype=np.int64) for r, ids in region_ops.items()},
            child_at, loops, readers, static_special, early.tolist(), view_op.tolist(),
            [op.inputs for op in p.ops], [op.outputs for op in p.ops])
        return tl

    def _overlapped(self, aggs, dup_ops) -> tuple[float, dict]:
        """The step's time with collectives overlapping compute, as XLA's latency-hiding
        scheduler runs them on TPU and GPU: one compute stream runs the ops in program order,
        one communication stream the collectives in the order they are issued.

        - A collective runs in the first gap from its ready time on that its mesh axes'
          links are free (one link per axis: collectives over different axes run side by
          side).
        - An operand's collective is ready when its value is: a value there from the start
          (an input or a view of one: a weight) once the reader of the collective of such a
          value _PREFETCH before it has started (a layer's weights gathered under the
          previous layer's compute, within a scan too); another value's when its reader is
          next. The reader waits for it.
        - A result's collective (a reduction of partial sums, a reshard) starts when the op
          is done and the link free; the first op that reads the value (other than through
          views) waits for it: a gradient's reduction runs under the rest of the backward
          pass, a tensor-parallel all-reduce that the next op reads does not hide.
        - A scan's body is scheduled twice (the second trip in steady state, its weights
          fetched under the first's compute) and the second trip counted for the rest.

        Returns (seconds, (pattern, collective) -> seconds per step the step waits for it)."""
        tl = self._timeline()
        pat_c = np.zeros(len(self.patterns))
        op_colls: dict[int, list] = {}
        special = tl.static_special.copy()
        for (m, pis), agg in zip(self.mask_groups, aggs):
            pat_c[pis] = agg[5]
            if agg[4]:
                ops, at = self._agg_ops(agg)
                op_colls.update(ops)
                special[at] = True
        for o, k in dup_ops:  # a reshard done before: read again for free
            lst = op_colls.get(o)
            if lst is not None:
                op_colls[o] = [x for x in lst if x[0] != k]
        op_c = pat_c[self.op_pattern]
        st = _SimState(self.mesh.axes)
        exposed: dict = collections.defaultdict(float)

        opc = op_c.tolist()
        ins, outs, early, view_op = tl.ins, tl.outs, tl.early, tl.view_op
        pending = st.pending
        issue, wait = st.issue, st.wait

        def region(rid: int, mult: float) -> None:
            ids = tl.region_ops[rid]
            cum = np.concatenate(([0.0], np.cumsum(op_c[ids]))).tolist()
            sel = np.flatnonzero(special[ids])
            last = 0
            for pos, o in zip(sel.tolist(), ids[sel].tolist()):
                st.tc += cum[pos] - cum[last]
                last = pos + 1
                child = tl.child_at.get(o)
                if child is not None:
                    loop(child, mult)
                start, binding = st.tc, None
                op_in = ins[o]
                for v in op_in:
                    r = pending.get(v)
                    if r is not None and r[0] > start:
                        start, binding = r
                lst = op_colls.get(o, ())
                if not lst:
                    if binding is not None:
                        if view_op[o]:
                            for v in outs[o]:  # a view of a value still being reduced: its reader waits
                                pending[v] = (start, binding)
                        else:
                            wait(start, binding, mult, exposed)
                    st.tc += opc[o]
                    continue
                prefetched = False
                for k, dur, i, pi, axes in lst:
                    if i < 0:
                        continue
                    v = op_in[i]
                    if early[v]:
                        ready, prefetched = st.horizon, True
                    else:
                        r = pending.get(v)
                        ready = st.tc if r is None else max(st.tc, r[0])
                    done = issue(ready, dur, axes, (pi, k))
                    if done > start:
                        start, binding = done, (pi, k)
                if prefetched:  # the next such collective may start once this op's K-1st successor starts
                    st.readers.append(start)
                    if len(st.readers) == _PREFETCH:
                        st.horizon = st.readers[0]
                if binding is not None:
                    wait(start, binding, mult, exposed)
                st.tc += opc[o]
                key = None
                for k, dur, i, pi, axes in lst:
                    if i < 0:
                        key = (pi, k)
                        done = issue(st.tc, dur, axes, key)
                if key is not None:
                    for v in outs[o]:
                        pending[v] = (done, key)
            st.tc += cum[-1] - cum[last]

        def loop(rid: int, mult: float) -> None:
            length, carried = tl.loops.get(rid, (1, ()))
            marks = []
            for trip in range(min(length, 2)):
                region(rid, mult if trip == 0 else mult * (length - 1))
                for v in carried:  # the next trip reads what this one carries
                    r = st.pending.get(v)
                    if r is not None:
                        st.wait(r[0], r[1], mult if trip == 0 else mult * (length - 1), exposed)
                marks.append((st.tc, dict(st.free), st.horizon))
            if len(marks) == 2 and length > 2:
                (c1, m1, h1), (c2, m2, h2) = marks
                n = length - 2
                st.shift(m1, {a: n * (m2[a] - m1[a]) for a in m2})
                st.tc, st.horizon = c2 + n * (c2 - c1), h2 + n * (h2 - h1)

        region(0, 1.0)
        if st.tm > st.tc:  # the step ends when the links are done
            st.wait(st.tm, max((lst[-1][1], lst[-1][2]) for lst in st.busy.values() if lst)[1], 1.0, exposed)
        return st.tc, exposed

    def _agg_ops(self, agg) -> tuple[dict, np.ndarray]:
        """An aggregate's collectives per op, and the ops the overlap schedule visits for
        them: their own, and the readers (through views) of the values they reduce or
        reshard after the op. Kept with the aggregate (memoised with it)."""
        if agg[6]:
            return agg[6][0]
        tl = self._timeline()
        p = self.program
        ops: dict[int, list] = {}
        stack = []
        for pi, cl in agg[4]:
            lst = [(k, x[3], x[5], pi, x[1]) for k, x in enumerate(cl) if x[3] > 0]
            if not lst:
                continue
            result = any(x[2] < 0 for x in lst)
            for o in self.patterns[pi].ops:
                ops[o] = lst
                if result:
                    stack += p.ops[o].outputs
        visit = set(ops)
        seen = set()
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            for r in tl.readers[v]:
                visit.add(r)
                if tl.view_op[r]:
                    stack += p.ops[r].outputs
        agg[6].append((ops, np.fromiter(visit, dtype=np.int64, count=len(visit))))
        return agg[6][0]

    def op_costs(self, decisions: Sequence[Decision]) -> np.ndarray:
        """Per op of the program: [compute seconds, FLOPs per device] per step under
        ``decisions`` (every trip of a loop body; a recomputation's copies not included)."""
        dec = self._decisions(decisions)
        per = np.zeros((len(self.patterns), 2))
        for m, pis in self.mask_groups:
            rel = tuple(d for d in dec if (m >> d[0]) & 1)
            for pi in pis:
                c, _, _, _, _, (f, _) = self._pattern_cost(pi, rel)
                per[pi] = c, f
        trips = np.fromiter((op.trip for op in self.program.ops), dtype=np.float64, count=len(self.program.ops))
        return per[self.op_pattern] * trips[:, None]

    def work(self, decisions: Sequence[Decision], loops_once: bool = False) -> tuple[float, float]:
        """(FLOPs, bytes of operands and results) per device per step under ``decisions``,
        recomputed ops included; ``loops_once``: a loop body's ops counted once, not once per
        trip (XLA's HloCostAnalysis counts a while body once)."""
        dec = self._decisions(decisions)
        flops = nbytes = 0.0
        for m, pis in self.mask_groups:
            rel = tuple(d for d in dec if (m >> d[0]) & 1)
            for pi in pis:
                f, b = self._pattern_cost(pi, rel)[5]
                pat = self.patterns[pi]
                n = len(pat.ops) if loops_once else pat.weight
                flops += f * n
                nbytes += b * n
        rc = self.recompute_of(decisions)
        if rc:
            for m, items in self._edit(rc).extra:
                rel = tuple(d for d in dec if (m >> d[0]) & 1)
                for pi, _, n in items:
                    f, b = self._pattern_cost(pi, rel)[5]
                    if loops_once:  # the copies' trips: a recomputed loop body runs once more
                        n = min(n, len(self.patterns[pi].ops))
                    flops += f * n
                    nbytes += b * n
        return flops, nbytes

    def _aggregate(self, pis, rel):
        """Costs of a set of patterns that depend on the same groups, under decisions rel."""
        compute = comm = 0.0
        resharded, transients, colls = [], [], []
        ops = self.program.ops
        per = np.empty(len(pis))  # one execution's compute, per pattern
        for n, pi in enumerate(pis):
            pat = self.patterns[pi]
            c, m, cl, tr, *_ = self._pattern_cost(pi, rel)
            per[n] = c
            compute += c * pat.weight
            comm += m * pat.weight
            if tr:
                cu = self._combined_until
                # a partial result waits for XLA:CPU's combined reduction (_cpu_combined)
                transients += [(o, max(self.value_end[ops[o].outputs[j]], int(cu[o]) if cu is not None and waits else -1),
                                extra) for o in pat.ops for j, extra, waits in tr]
            if cl:
                colls.append((pi, cl))
                if any(x[5] >= 0 for x in cl):
                    resharded.append((pi, cl))
        return compute, comm, resharded, transients, colls, per, []

    def _common_reshards(self, resharded, late: dict[int, tuple[int, int]] | None = None) -> tuple[float, dict]:
        """XLA computes one reshard of a value once per computation (CSE): the same value
        gathered to the same sharding for several consumers (a weight in the forward and the
        backward pass) is one collective, and a reader that wants a finer sharding than one
        already gathered slices it locally. Returns the time saved, per (pattern,
        collective) the executions that are duplicates, the resharded buffers, and the
        (op, collective) pairs that are duplicates."""
        ops = self.program.ops
        seen: dict = {}  # (region, value, view) -> [first op, last op, bytes, kind, [(pi, k, t, trip)]]
        for pi, cl in resharded:
            for op_id in self.patterns[pi].ops:
                op = ops[op_id]
                for k, (kind, axes, b, t, g, i, key, view) in enumerate(cl):
                    if i < 0:
                        continue
                    v = op.inputs[i]
                    # a weight re-taken in the backward pass (recompute): its reshard there
                    # is one of its own, not the forward's kept alive
                    region = (op.region, late[v][0] <= op_id <= late[v][1]) if late and v in late else op.region
                    ident = (region, v, key, kind)
                    e = seen.get(ident)
                    if e is None:
                        seen[ident] = [op_id, op_id, view, kind, [(pi, k, t, op.trip, op_id)]]
                    else:
                        e[0], e[1] = min(e[0], op_id), max(e[1], op_id)
                        e[4].append((pi, k, t, op.trip, op_id))
        saved = 0.0
        dup: dict[tuple[int, int], int] = collections.Counter()
        dup_ops = set()  # (op, collective index) that reuse an earlier reshard
        gathered: dict = collections.defaultdict(list)  # (region, value) -> views gathered
        for (region, vid, key, kind), e in seen.items():
            if kind == "all-gather":
                gathered[(region, vid)].append(key)
        for (region, vid, key, kind), e in seen.items():
            uses = e[4]
            # a finer view of a value already gathered coarser: a free local slice
            finer = e[3] == "all-gather" and any(
                other != key and all(tuple(key[d][:len(other[d])]) == tuple(other[d]) for d in range(len(key)))
                for other in gathered[(region, vid)])
            for n, (pi, k, t, trip, op_id) in enumerate(uses):
                if n > 0 or finer:
                    saved += t * trip
                    dup[(pi, k)] += trip
                    dup_ops.add((op_id, k))
        # The resharded copies are buffers of their own, live from first to last reader.
        spans: dict = {}
        for (region, vid, key, kind), (a, b, v, *_) in seen.items():
            x = spans.setdefault((region, vid, key), [a, b, v])
            x[0], x[1] = min(x[0], a), max(x[1], b)
        buffers = [(a, b + 1, v) for a, b, v in spans.values()]
        return saved, dup, buffers, frozenset(dup_ops)

    def _collective_rows(self, colls, dup_count, extra=(), exposed=None) -> Iterable[CollectiveCost]:
        """The collectives, one row per pattern and kind; ``extra``: (pattern, collectives,
        executions) of the ops a recompute runs again (in line: none hidden); ``exposed``:
        (pattern, collective) -> seconds per step the step waits for it (None: all of it)."""
        p = self.program
        groups = self.analysis.groups
        rows = [(pi, cl, None) for pi, cl in colls] + list(extra)
        for pi, cl, n in rows:
            pat = self.patterns[pi]
            op = p.ops[pat.ops[0]]
            for k, (kind, axes, b, t, g, *rest) in enumerate(cl):
                count = int(pat.weight) - dup_count.get((pi, k), 0) if n is None else int(n)
                if count <= 0:
                    continue
                cause = groups[g].label if g != NO_DIM and g < len(groups) else "-"
                hidden = 0.0
                if exposed is not None and n is None:
                    hidden = max(0.0, t * count - exposed.get((pi, k), 0.0))
                yield CollectiveCost(kind, tuple(axes), b, count, t * count, op.id, op.source, cause,
                                     tuple(pat.ops), int(rest[0]) if rest else -1, hidden)

    def _memory(self, local: np.ndarray, detail: bool, buffers=(), edit: "_Edit | None" = None) -> MemoryReport:
        args = float(local[self.inputs].sum())
        outs = float(local[self.outputs].sum())
        if self.alias_pairs:
            ai, ao = self._alias_arrays
            alias = float(local[ao][np.isclose(local[ai], local[ao])].sum())
        else:
            alias = 0.0
        b = local[self.mid]
        n = self.n_ops + 2
        mid_end = self.mid_end if edit is None else edit.mid_end
        delta = (np.bincount(self.mid_def, weights=b, minlength=n)
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
        live = np.cumsum(delta)
        t = int(np.argmax(live)) if len(live) else 0
        temps = float(live[t]) if len(live) else 0.0
        peak = args + outs + temps - alias
        breakdown = {}
        if detail:
            at = (self.mid_def <= t) & (mid_end > t)
            acts = float(b[at & self.mid_long].sum())
            tmp = float(b[at & ~self.mid_long].sum())
            if edit is not None and len(edit.clone_v):  # recomputed copies: activations again
                live = (edit.clone_a <= t) & (edit.clone_b > t)
                acts += float((local[edit.clone_v] * edit.clone_n)[live].sum())
            cats = collections.Counter()
            for vid, c in zip(self.inputs.tolist(), self.input_cat.tolist()):
                cats[c] += local[vid]
            aliased_out = {o for i, o in self.alias_pairs if math.isclose(local[i], local[o])}
            for vid in self.outputs.tolist():
                if vid in aliased_out:
                    continue
                cats[self.output_cat.get(vid, "activations")] += local[vid]
            breakdown = {"parameters": cats["parameters"], "optimizer": cats["optimizer"],
                         "activations": cats["activations"] + acts, "temporaries": tmp}
        return MemoryReport(peak, args, outs, temps, alias, breakdown)

    # ------------------------------------------------------------------ plan views
    def value_specs(self, decisions: Sequence[Decision]) -> dict[int, Spec]:
        dec = self._decisions(decisions)
        return {v.id: tuple(tuple(a) for a in self.sig_spec(int(self.vsig[v.id]), dec))
                for v in self.program.values}

    def operand_specs(self, decisions: Sequence[Decision]) -> dict[tuple[int, int], Spec]:
        """(op, operand index) -> the sharding the op consumes the operand in, where it
        differs from the value's own sharding (the resharding points); and, for the ops in
        ``_WRITE_AT_VIEW``, (op, -1 - j) -> the sharding the op writes result j in, where
        coarser than the value's."""
        dec = self._decisions(decisions)
        out = {}
        for op, pi in zip(self.program.ops, self.op_pattern.tolist()):
            pat = self.patterns[pi]
            views = self._pattern_cost(pi, dec)[4]
            for i, ((sig, _), view) in enumerate(zip(pat.operands, views)):
                if tuple(tuple(a) for a in self.sig_spec(sig, dec)) != view:
                    out[(op.id, i)] = view
            if op.primitive in _WRITE_AT_VIEW:
                for j, ((sig, _), view) in enumerate(zip(pat.results, views[len(pat.operands):])):
                    if view is not None and tuple(tuple(a) for a in self.sig_spec(sig, dec)) != view:
                        out[(op.id, -1 - j)] = view
        return out
