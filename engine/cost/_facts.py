"""Per-primitive cost facts: a registry beside ``_rules.factor_rules``.

Owns ``cost_facts`` (primitive name -> ``CostFacts``) and ``facts_of`` (the lookup, with a
default for primitives nothing is known of: an elementwise op that moves its bytes through
memory). What the factor rule of a primitive says (which dims move together) is
``_rules``'; what it costs -- its FLOPs, whether it moves data at all, whether XLA fuses it,
the quirks of XLA's partitioner on it -- is here, one entry per primitive, registered in
families right after the helpers that define them.

Shared by both sides (building and pricing): imports ``_rules`` (the factor-rule registry,
and the helpers and primitive sets that count FLOPs as XLA does) and ``_kernels`` (what a
kernel costs).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple, Sequence

from ..analysis._rules import (
    _MOVES,
    _REDUCTIONS,
    PSEUDO_OPS,
    _conv_flops,
    conv_halo_ratios,
    factor_rules,
    pointwise_rule,
)
from ._kernels import (NO_WORKSPACE, Workspace, call_flops, call_hbm_bytes, call_op_workspace, pallas_flops,
                       pallas_hbm_bytes, pallas_op_workspace, ragged_dot_cpu_flops, ragged_dot_flops,
                       ragged_dot_workspace)

Shape = tuple[int, ...]
FlopsRule = Callable[[dict, Sequence[Shape], Sequence[Shape]], float]


class Shift(NamedTuple):
    """A concatenate's or split's cut dim: XLA moves whole pieces along it."""

    kind: str  # "concatenate" | "split"
    dim: int
    sizes: tuple[int, ...]  # the pieces' sizes along dim, in order


# ----------------------------------------------------------------------------- FLOPs
# As XLA's HloCostAnalysis counts them (its FLOPs plus its transcendentals), checked op by
# op against ``compiled.cost_analysis()`` in tests/test_rules.py.

def elementwise_flops(params, ins, outs) -> float:
    """One per element of each result (the default)."""
    return float(sum(math.prod(s) for s in outs))


def no_flops(params, ins, outs) -> float:
    """An op that only moves or views data, or a loop boundary."""
    return 0.0


def dot_flops(params, ins, outs) -> float:
    """2 per multiply-add: result elements x contracted size."""
    (lc, _), _ = params["dimension_numbers"]
    k = math.prod(ins[0][a] for a in lc)
    return 2.0 * math.prod(outs[0]) * k


def logistic_flops(params, ins, outs) -> float:
    """XLA expands it: 1 / (1 + exp(-x)), 3 FLOPs and a transcendental per element."""
    return 4.0 * math.prod(outs[0])


def reduction_flops(params, ins, outs) -> float:
    """One combine per input element beyond the first of each output."""
    return float(max(math.prod(ins[0]) - math.prod(outs[0]), 0))


# ----------------------------------------------------------------------------- structure

def _concatenate_shift(op, values) -> Shift:
    d = int(op.params["dimension"])
    return Shift("concatenate", d, tuple(values[i].shape[d] for i in op.inputs))


def _split_shift(op, values) -> Shift:
    d = int(op.params["axis"]) % len(values[op.inputs[0]].shape)
    return Shift("split", d, tuple(values[o].shape[d] for o in op.outputs))


def _scalar_broadcast(op, values) -> bool:
    return not values[op.inputs[0]].shape


def _interior_padded(op) -> set[int]:
    return {d for d, (_, _, interior) in enumerate(op.params["padding_config"]) if interior}


@dataclasses.dataclass(frozen=True, slots=True)
class CostFacts:
    """What the cost model knows of one primitive beyond its factor rule."""

    flops: FlopsRule = elementwise_flops  # FLOPs of one execution, unsharded
    # moves no data of its own (a view, a cast XLA folds, a loop boundary): no compute or
    # memory time
    free: bool = False
    # only views its operand: a view of a value there from the start of the step is there
    # from the start too (a weight's cast or transpose: its gather can be prefetched)
    view: bool = False
    # its result is its operand's data in another shape or layout (free ops, transpose): a
    # value read through it is read where the result is (XLA:CPU's combined reductions)
    relayout: bool = False
    # elementwise: XLA fuses it into its consumer, its result never reaching memory
    fusible: bool = False
    # reads its operands inside a fusion (elementwise ops and reductions): a fusible value
    # read by nothing else is never materialised
    fusion_reader: bool = False
    # apply pins its result at the sharding the plan computes it in before resharding it:
    # XLA's partitioner, left to shard a grouped conv's 1-wide output features itself,
    # emits invalid HLO or wrong values (jax 0.12; the property tests found it)
    write_at_view: bool = False
    # a matmul or a conv: its kernel is priced by its shape (a profile's matmul table), its
    # factors by role (``_records.Contraction``)
    contraction: bool = False
    # concatenate / split: the cut dim and the pieces along it (XLA moves whole pieces)
    shift: Callable[..., Shift] | None = None
    # any device can make the result locally at any sharding (an iota, a broadcast scalar):
    # resharding it is free, XLA just builds it at the sharding wanted; (op, values) -> bool
    local: Callable[..., bool] | None = None
    # result dims XLA's SPMD partitioner may not shard: a pad with interior padding is
    # partitioned wrongly when its result is sharded along the padded dim (wrong values or a
    # failed HLO verification, jax 0.10.2); op -> dims
    blocked_dims: Callable[..., set[int]] | None = None
    # a conv: per lhs spatial dim, the factor its FLOPs per device grow by when that dim is
    # sharded with a halo exchange (``_rules.conv_halo_ratios``)
    halo_ratios: Callable[..., dict[int, float]] | None = None
    # a conv with batch_group_count > 1 (a depthwise conv's weight gradient): XLA all-reduces
    # its partial results over the whole mesh (_patterns.whole_mesh_partials); params -> bool
    grouped: Callable[[dict], bool] | None = None
    # a collective the user wrote inside a shard_map region: its kind (a ``CollectiveKind``
    # name) and (params, operand shapes' bytes, result bytes) -> (mesh axes, bytes per device:
    # the larger of its buffers before and after), priced as it is, whatever the plan
    manual: tuple[str, Callable[..., tuple[tuple[str, ...], float]]] | None = None
    # its results are its operands' buffers, one for one (a shard_map region's boundary: a
    # device's shard outside is the body's array inside, and the body's result is the
    # device's shard of the region's): it allocates nothing
    aliases: bool = False
    # random bits: XLA:CPU runs threefry2x32 as a rolled loop whose two uint32 halves of the
    # result's shape are materialised (TPU and GPU unroll it into fusible elementwise ops);
    # the halves are combined and turned into a mask or floats inside each consumer's fusion
    # again, so they live until the last use of anything computed from the bits elementwise
    # alone, and what is computed so is never materialised (_fusion.cpu_random_bits)
    cpu_rolled_bits: bool = False
    # XLA:CPU's default scheduler starts an op as soon as its operands are ready: an op of
    # a random key's derivation (and a view or unstack of one) reads nothing that waits,
    # so the random bits made from the key are made at the step's start, or as soon as
    # the key is derived from something made later (_liveness.cpu_early_bits)
    cpu_early: bool = False
    # a kernel: the HBM bytes it says it reads and writes beyond its operands' and results'
    # once (a flash kernel reads K and V once per block of queries); params -> bytes, 0: none said
    hbm_bytes: Callable[[dict], float] | None = None
    # its FLOPs as XLA:CPU runs it where that differs from TPU and GPU (``ragged_dot``,
    # lowered densely there): what verify compares with on simulated devices
    cpu_flops: FlopsRule | None = None
    # device memory the op holds only while it runs, beyond its operands and results
    # (``_kernels.Workspace``: a kernel's own buffers, XLA:CPU's interpreted kernel or dense
    # rollout); (params, operand shapes, operand bytes, result bytes, XLA:CPU) -> Workspace
    workspace: Callable[[dict, Sequence[Shape], Sequence[float], Sequence[float], bool], Workspace] | None = None
    # a lookup in shards: "gather" (an embedding's rows looked up where they are held,
    # masked, the partial results summed) or "scatter" (updates applied where their rows are
    # held); XLA's partitioner moves a block of it onto the mesh's first axis when the op
    # leaves that axis out (_patterns.unused_first_axis)
    lookup: str = ""


DEFAULT = CostFacts()
cost_facts: dict[str, CostFacts] = {}


def facts_of(primitive: str) -> CostFacts:
    """The cost facts of a primitive (the default for one nothing is registered for)."""
    return cost_facts.get(primitive, DEFAULT)


def having(fact: str) -> dict[str, Any]:
    """Primitive -> its ``fact``, for the primitives where it is set (true, or a function):
    one dict lookup per op in the loops over a whole program (as fast as the name sets the
    registry replaced)."""
    return {n: v for n, f in cost_facts.items() if (v := getattr(f, fact))}


def define(names, **facts) -> None:
    """Set some facts of each of ``names``, keeping the others they have."""
    for n in names:
        cost_facts[n] = dataclasses.replace(cost_facts.get(n, DEFAULT), **facts)


# Ops that move no data of their own (views, loop boundaries).
FREE = PSEUDO_OPS | {"reshape", "squeeze", "expand_dims", "broadcast_in_dim", "convert_element_type",
                     "stop_gradient", "copy", "copy_p", "sharding_constraint", "optimization_barrier"}
define(FREE, free=True, relayout=True)
define(["shard_map_enter", "shard_map_exit"], aliases=True)
# a shard_map body's type casts (a device-invariant value declared varying over an axis):
# the same buffer, no data moved
define(["pvary", "pbroadcast"], free=True, relayout=True, view=True, aliases=True)
define(["random_bits", "threefry2x32"], cpu_rolled_bits=True)
define(["random_seed", "random_split", "random_fold_in", "random_wrap", "random_unwrap", "random_bits",
        "threefry2x32", "unstack"], cpu_early=True)
define(["transpose"], relayout=True)
# Ops that only view their operand (cast, reshape, transpose, slice).
define((FREE - PSEUDO_OPS) | {"transpose", "slice", "squeeze", "rev"}, view=True)
define((FREE - PSEUDO_OPS) | {"transpose", "slice", "squeeze", "rev"}, cpu_early=True)

# Elementwise primitives XLA fuses into their consumers, and the ops that read inside a
# fusion: those and XLA's reductions (every ``reduce_*`` primitive).
FUSIBLE = frozenset(name for name, rule in factor_rules.items() if rule is pointwise_rule) | {
    "broadcast_in_dim", "convert_element_type", "bitcast_convert_type", "reshape", "transpose", "squeeze",
    "select_n"}
define(FUSIBLE, fusible=True, fusion_reader=True)
define(["reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "reduce_xor",
        "reduce_precision", "reduce_window", "reduce_window_sum", "reduce_window_max", "reduce_window_min",
        "reduce_scatter", "reduce_scatter_start", "reduce_scatter_done"], fusion_reader=True)

define(PSEUDO_OPS | _MOVES, flops=no_flops)
define(_REDUCTIONS, flops=reduction_flops)
define(["dot_general"], flops=dot_flops, contraction=True)
define(["logistic"], flops=logistic_flops)
define(["conv_general_dilated"], flops=_conv_flops, halo_ratios=conv_halo_ratios, write_at_view=True, contraction=True,
       grouped=lambda params: params["batch_group_count"] > 1)

define(["concatenate"], shift=_concatenate_shift)
define(["split"], shift=_split_shift)
define(["iota"], local=lambda op, values: True)
define(["broadcast_in_dim"], local=_scalar_broadcast)
define(["pad"], blocked_dims=_interior_padded)
define(["gather"], lookup="gather")
define([n for n in factor_rules if n.startswith("scatter")], lookup="scatter")


# Collectives inside shard_map bodies: per-device code, so the bytes are the buffers' own.
def _axes(params) -> tuple[str, ...]:
    names = params.get("axis_name", params.get("axes", ()))
    names = names if isinstance(names, (tuple, list)) else (names,)
    return tuple(str(a) for a in names if isinstance(a, str))


def _larger(params, in_bytes: Sequence[float], out_bytes: Sequence[float]) -> tuple[tuple[str, ...], float]:
    return _axes(params), float(max(max(in_bytes[:1], default=0.0), max(out_bytes[:1], default=0.0)))


def _summed(params, in_bytes: Sequence[float], out_bytes: Sequence[float]) -> tuple[tuple[str, ...], float]:
    return _axes(params), float(sum(out_bytes))  # a psum of several operands is one tuple all-reduce


for _kind, _names, _bytes in (
        ("all-reduce", ("psum", "psum_invariant", "pmax", "pmin", "pxor"), _summed),
        ("all-gather", ("all_gather", "all_gather_invariant"), _larger),
        ("reduce-scatter", ("reduce_scatter", "psum_scatter", "pmax_scatter", "pmin_scatter"), _larger),
        ("all-to-all", ("all_to_all", "ragged_all_to_all"), _larger),
        ("collective-permute", ("ppermute",), _larger)):
    define(_names, manual=(_kind, _bytes), flops=no_flops)


# Kernels (``_kernels``): a Pallas kernel is one custom call to XLA, priced by its cost
# estimate or its body; a custom_partitioning op by the function it wraps. What each holds
# while it runs beyond its operands and results: its workspace (``_kernels.Workspace``).
define(["pallas_call"], flops=lambda params, ins, outs: pallas_flops(params, ins, outs, facts_of),
       hbm_bytes=pallas_hbm_bytes, workspace=pallas_op_workspace)
define(["custom_partitioning"], flops=lambda params, ins, outs: call_flops(params, ins, outs, facts_of),
       hbm_bytes=call_hbm_bytes,
       workspace=lambda params, ins, in_bytes, out_bytes, cpu: call_op_workspace(params, ins, in_bytes, out_bytes,
                                                                                  cpu, facts_of))
define(["ragged_dot_general"], flops=ragged_dot_flops, cpu_flops=ragged_dot_cpu_flops, workspace=ragged_dot_workspace)


def _rolled_bits_workspace(params, ins, in_bytes, out_bytes, cpu: bool) -> Workspace:
    """XLA:CPU's rolled threefry loop (``CostFacts.cpu_rolled_bits``): each round makes the
    next two uint32 halves from both of the state's, beside them (the state's own two are
    the bits' buffers: ``Liveness.mid_scale``)."""
    if not cpu:
        return NO_WORKSPACE
    if "bit_width" not in params:  # threefry2x32: its two results are the halves
        return Workspace(tuple((-1 - j, 1.0) for j in range(len(out_bytes))))
    size = int(params["bit_width"]) // 8
    return Workspace(((-1, 2 * max(4, size) / size),))


define(["random_bits", "threefry2x32"], workspace=_rolled_bits_workspace)


def op_workspace(op, values, cpu: bool) -> Workspace:
    """The workspace of ``op`` (``CostFacts.workspace``; none where its primitive has none)."""
    rule = facts_of(op.primitive).workspace
    if rule is None:
        return NO_WORKSPACE
    return rule(op.params, [values[i].shape for i in op.inputs], [float(values[i].nbytes) for i in op.inputs],
                [float(values[o].nbytes) for o in op.outputs], cpu)
