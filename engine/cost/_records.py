"""The records the cost package shares: what its building modules make and its pricing modules read.

Built once per (analysis, mesh, hardware) and immutable: ``Tables`` (``_tables``), with its
``Liveness`` (the live ranges: ``_liveness``) and its ``Pattern``s (``_compile``;
``PatternKey`` names what makes two ops one pattern, ``Contraction`` a matmul's factors by
role). Made while pricing a plan, each memoised by the façade: ``Need`` and ``Coll`` (a
collective before and after its seconds are known: ``_reshard``), ``Transient`` and
``PatternCost`` (one execution of a pattern: ``_patterns``), ``Aggregate`` (the patterns of
one group mask: ``_aggregate``), ``Edit`` (what recompute decisions change:
``_recompute``) and ``Moved`` (what state kept in host memory changes: ``_memory``).

Plain data on neither side: imports no module that builds or prices, only the program,
analysis, mesh and hardware types, ``_facts``' ``Shift``, ``_kinds`` and ``_shardings``'
type aliases.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from .._mesh import Hardware, MeshSpec
from ..analysis._types import Analysis
from ..tracing._program import Program
from ._facts import Shift
from ._kinds import CollectiveKind
from ._shardings import Sig, Spec

# the link a host transfer runs over, as the overlap schedule names links (not a mesh axis)
HOST_LINK = "<host>"


# ----------------------------------------------------------------------------- the tables

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
    # and read inside one fusion, see _fusion.fused_values; on TPU and GPU the buffers it
    # is computed from instead, _fusion.kernel_reads); per result: written to memory
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


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Tables:
    """One analysed program on one mesh and hardware, as the cost model reads it."""

    analysis: Analysis
    program: Program
    mesh: MeshSpec
    hw: Hardware
    lowering: str  # "tpu" | "cpu" (CostModel's docstring)
    axes: tuple[str, ...]  # the mesh axes, in order
    axis_size: dict[str, int]
    axis_bw: dict[str, float]  # bytes/s of each axis's links
    axis_lat: dict[str, float]  # seconds per hop
    nbytes: np.ndarray  # per value: its bytes, unsharded
    sigs: list[Sig]  # the distinct value signatures
    vsig: np.ndarray  # per value: its signature
    sig_mask: list[int]  # per signature: its groups, as a bitmask
    sig_masks: list[tuple[int, list[int]]]  # (mask, the signatures with it)
    patterns: tuple[Pattern, ...]
    op_pattern: np.ndarray  # per op: its pattern
    pat_mask: list[int]  # per pattern: the groups of its factors and signatures, as a bitmask
    mask_groups: list[tuple[int, list[int]]]  # (mask, the patterns with it)
    total_flops: float  # per step, unsharded
    fused: np.ndarray  # per value: XLA fuses it away (_fusion.fused_values)
    live: Liveness
    combined_until: np.ndarray | None  # lowering "cpu": _fusion.cpu_combined
    # The step's own jax.checkpoint: its backward (the recomputation and its transpose)
    # reads the weights through an optimisation barrier (prevent_cse), so a weight the
    # plan gathers is gathered again there, as under a re-gather decision: weight ->
    # the backward pass's ops
    user_late: dict[int, tuple[int, int]]
    # group ids from len(analysis.groups) on: a group as partially manual shard_map regions
    # see it, (the group, the axes they are manual over) each (``region_groups``)
    views: tuple[tuple[int, frozenset[str]], ...] = ()
    # a recompute variant's (``variant_tables``): per value, fused away as XLA fuses the
    # program under those decisions (``fused`` stays the program's: the liveness's); None
    # for the program as written
    variant_fused: np.ndarray | None = None
    # each pattern's key -> its index (``compile_patterns``); a variant's: per pattern, the
    # index of the program's pattern of the same key (it costs the same), or -1
    pattern_keys: dict = dataclasses.field(default_factory=dict)
    same_pattern: np.ndarray | None = None
    reads: list | None = None  # per op, its kernel's reads (``_fusion.kernel_reads``; None: XLA:CPU)
    # the ops that hold device memory while they run (``_facts.op_workspace``), one entry per
    # part, as seven arrays: the op, the operand (or -1 - j: result j) the part is sized by,
    # its bytes per byte of that operand as the op holds it, bytes whatever the plan,
    # whether the part is made before the op runs (``Workspace.early``), whether it is a
    # loop's copy of the operand (``Workspace.copies``), and the key of a part other ops
    # compute alike (``Workspace.common``; -1: none)
    workspace: tuple[np.ndarray, ...] = ()


# ----------------------------------------------------------------------------- per plan

class Need(NamedTuple):
    """A collective one execution of a pattern needs."""

    kind: CollectiveKind
    axes: tuple[str, ...]
    bytes: float  # per device: the larger of the buffer before/after
    cause: int  # the group responsible (NO_DIM: none)
    # for an operand's reshard: the operand, the sharding the op reads it in and the bytes
    # of that resharded buffer per device (what CSE and the overlap schedule key on)
    operand: int = -1
    view: Spec | None = None
    view_bytes: float = 0.0


class Coll(NamedTuple):
    """A collective of a pattern, with its seconds per execution."""

    kind: CollectiveKind
    axes: tuple[str, ...]
    bytes: float
    time: float
    cause: int
    operand: int = -1  # -1: a result's (a reduction, a reshard after the op) or a halo
    view: Spec | None = None
    view_bytes: float = 0.0

    def reshard_key(self) -> tuple:
        """What makes two operand reshards the same collective (the CSE cache key)."""
        return (self.kind, self.axes, self.bytes, self.operand, self.view)


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


@dataclasses.dataclass(slots=True, eq=False)
class Aggregate:
    """Costs of a set of patterns that depend on the same groups, under some decisions;
    per step (each pattern's one execution times its executions)."""

    compute: float  # seconds
    comm: float  # seconds, before CSE
    resharded: list  # [(pattern, collectives)] of the patterns that reshard an operand
    transients: list  # [(op, until op, bytes)]: buffers beside the values
    colls: list  # [(pattern, collectives)] of the patterns with any collective
    per: np.ndarray  # per pattern: one execution's compute seconds
    # per pattern of ``resharded``: (pattern, its operand reshards' Coll.reshard_key()s):
    # what the plan's CSE depends on (CostModel._common_reshards' memo key)
    reshard_keys: tuple
    # the overlap schedule's view of the collectives (_overlap.schedule_of): built on the
    # first overlapped evaluation that uses this aggregate, then kept with it
    schedule: tuple | None = None


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Edit:
    """What a set of recompute decisions changes in the program the cost model scores."""

    rc: tuple[tuple[int, str], ...]  # the recompute decisions, as sorted (unit, kind)
    extra: list  # [(pattern mask, [(pattern, shared operand indices, executions)])]
    mid_end: np.ndarray  # the intermediates' lifetimes, residuals shortened
    clone_v: np.ndarray  # recomputed values (their local size) ...
    clone_a: np.ndarray  # ... live from the recompute point ...
    clone_b: np.ndarray  # ... to their last backward read
    clone_n: np.ndarray  # copies of each (a value a forward loop stacks: its length)
    late: dict[int, tuple[int, int]]  # weight -> the backward pass's ops: reads there reshard anew
    # the recomputations' temporaries: (row, value) pairs, a row a set of values live at
    # once; a recomputation's rows from tmp_seg on; the largest row of each, live at its
    # recompute point (tmp_at)
    tmp_row: np.ndarray
    tmp_v: np.ndarray
    tmp_seg: np.ndarray
    tmp_at: np.ndarray
    # ``offload``: the values kept in host memory (their local size, times host_n: a
    # stack's layers), each copied there in the forward pass and back for the backward
    host_v: np.ndarray
    host_n: np.ndarray
    host_unit: tuple[int, ...]  # per host value, its unit
    # the values a backward loop's recomputation reads through its optimisation barrier
    # (apply's: the saved values, their slices of the forward loop's stacks), and how often:
    # XLA copies each slice out of its stack into a buffer of its own, every trip
    barrier_v: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    barrier_n: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    # the ops with a workspace (``Tables.workspace``) the recomputation runs again, and where
    work_op: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    work_at: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))


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
