"""Layer stacks that may run as a pipeline, and what each loop's operands hold of the batch.

Pipelining a layer stack (``plan._pipelined_scan.pipelined_scan``) splits the batch into
microbatches that go through the layers at different times, on different stages. That
computes what the step computes only if the stack's loops treat the rows of the batch
independently, and a loop result without the batch (a weight's gradient) is a *sum* over the
rows, which the microbatches' partial sums add up to. The checks here are structural, on the
factor rules of the loop body's ops and the batch's named dimension:

- every carry of both loops (the forward's activation, the backward's cotangent) holds the
  batch, and the backward loop is the forward's transpose (``Unit.loop``);
- an op that reads the batch keeps it as a pass-through factor (elementwise, a matmul's batch
  or free dim), or sums over it (a matmul contracting it, ``reduce_sum``): never a sort,
  cumsum, gather, concatenate or halo along it, nor a ``max``-reduction;
- no op makes a batch dim from operands without one but a broadcast (an ``iota`` or random
  bits along the batch would differ per microbatch);
- a sum over the batch reaches the loop's results only through ops linear in it (adds of
  such sums, converts, reshapes, transposes, scaling by a value without the batch) and
  nothing else reads it: it may not flow back into the rows (batch-norm statistics) or into
  a carry.

Each loop operand's and result's batch dim is recorded for apply (``LoopBatch``).
"""

from __future__ import annotations

import dataclasses

from ..tracing._program import Program
from ._recompute import Unit, _scan_pairs, _where, backward_span, value_readers
from ._rules import FactorKind

Batch = int | None
SUM = "sum"  # a loop result without the batch that sums over its rows (a weight's gradient)
# a ``resize`` entry of a ``custom_partitioning`` op: not a param but the batch dim of each of
# its operands, then results (apply binds it again at a microbatch's rows: ``plan._micro``)
ROWS = "rows"
# ops linear in an operand that holds a sum over the batch (the others' operands are free of it)
_LINEAR = {"convert_element_type", "reshape", "transpose", "neg", "copy", "copy_p", "squeeze", "expand_dims",
           "broadcast_in_dim", "reduce_sum", "slice", "add", "add_any", "sub", "mul", "div", "dot_general",
           "reduce_precision"}
_ADDS = {"add", "add_any", "sub"}  # linear only where every operand is such a sum
_SCALES = {"mul", "dot_general"}  # linear where exactly one operand is such a sum
_MAKES_BATCH = {"broadcast_in_dim"}  # may give a value a batch dim its operands lack


@dataclasses.dataclass(frozen=True)
class LoopBatch:
    """One loop's operands' and results' batch dims (per layer for stacked ones: the dim in
    one layer's slice), None where a leaf has none, in the order of the scan's operands
    (carries, xs) and results (ys; the carries' are the carries'); the consts by value. A
    result without the batch is ``SUM`` where it sums over the batch's rows (None: it does
    not depend on them, the same for every microbatch)."""

    enter: int
    consts: dict[int, int]  # the consts with the batch: value -> its dim (the others have none)
    carry: tuple[Batch, ...]
    xs: tuple[Batch, ...]
    ys: tuple[Batch | str, ...]
    # body ops whose params size a batch dim (a broadcast's shape, a reshape's sizes): the
    # param and its entries that a microbatch divides
    resize: dict[int, tuple[tuple[str, tuple[int, ...]], ...]] = dataclasses.field(default_factory=dict)
    # per stacked operand: already in the stages' skewed row order (``pipelined_scan``): the
    # forward loop's per-row results that the backward loop reads
    skewed: tuple[bool, ...] = ()


@dataclasses.dataclass(frozen=True)
class PipelineStack:
    """A scan layer stack that may be pipelined: its layers, batch size and loops."""

    unit: int
    layers: int
    batch: int  # the batch's size (the microbatches divide it)
    group: int  # the batch's decision group
    forward: LoopBatch
    backward: LoopBatch


def pipeline_units(an) -> tuple[Unit, ...]:
    """The scan layer stacks a pipeline may name: the recompute units under ``scan`` and the
    scans whose layers the step's own ``jax.checkpoint`` rematerialises already (no
    recompute decision left: ``kinds`` empty), labelled after the units."""
    units = list(an.units)
    program: Program = an.program
    span = backward_span(program)
    if span is None:
        return tuple(u for u in units if u.loop is not None)
    have = {u.loop for u in units if u.loop is not None}
    b, until = span
    for fwd, bwd in _scan_pairs(program, b, value_readers(program)):
        if (fwd.enter, bwd.enter) in have:
            continue
        k = len(units)
        units.append(Unit(k, None, f"stack{k}", b, until, ((fwd.enter, fwd.exit + 1),), _where(program, fwd.enter),
                          (fwd.enter, bwd.enter), program.ops[fwd.enter].params["length"], ()))
    return tuple(u for u in units if u.loop is not None)


def pipeline_stacks(an, units: tuple[Unit, ...], batch_groups: tuple[int, ...]) -> dict[int, PipelineStack | str]:
    """Per scan unit, a ``PipelineStack``, or why it cannot be pipelined (one line)."""
    out: dict[int, PipelineStack | str] = {}
    for u in units:
        if u.loop is None:
            continue
        out[u.id] = _stack(an, u, batch_groups)
    return out


def _stack(an, u: Unit, batch_groups) -> PipelineStack | str:
    program: Program = an.program
    assert u.loop is not None
    f_enter, b_enter = u.loop
    for g in batch_groups:
        loops = []
        for enter in (f_enter, b_enter):
            lb = _loop_batch(an, enter, g)
            if isinstance(lb, str):
                loops.append(lb)
                break
            loops.append(lb)
        if all(isinstance(x, LoopBatch) for x in loops):
            fwd, bwd = loops
            assert isinstance(fwd, LoopBatch) and isinstance(bwd, LoopBatch) and fwd.carry[0] is not None
            why = _rows_stay(program, fwd, bwd)
            if isinstance(why, str):
                return why
            op = program.ops[f_enter]
            carry = program.values[op.outputs[0]]
            return PipelineStack(u.id, u.layers, carry.shape[fwd.carry[0]], g, fwd,
                                 dataclasses.replace(bwd, skewed=why))
        reason = next(x for x in loops if isinstance(x, str))
        if g == batch_groups[-1]:
            return reason
    return "the step has no batch dimension"


def _rows_stay(program: Program, fwd: LoopBatch, bwd: LoopBatch) -> tuple[bool, ...] | str:
    """Which of the backward loop's stacked operands are the forward loop's per-row results
    (held in the stages' skewed row order between the loops), or why the rows would be seen
    out of order: such a result read elsewhere, or a per-row result of the backward loop."""
    f_exit = program.ops[next(r.exit for r in program.regions if r.enter == fwd.enter)]
    ncarry = len(fwd.carry)
    per_row = {v for v, b in zip(f_exit.outputs[ncarry:], fwd.ys) if isinstance(b, int)}
    b_op = program.ops[bwd.enter]
    for op in program.ops:
        if op.id != bwd.enter and per_row.intersection(op.inputs):
            return (f"{program.ops[fwd.enter].source}: a per-row result of the layer loop is read by "
                    f"{op.primitive} at {op.source}, not only by the backward loop")
    if any(isinstance(b, int) for b in bwd.ys):
        return f"{b_op.source}: the backward loop stacks a per-row result"
    nb = len(bwd.carry)
    return tuple(v in per_row for v in b_op.inputs[nb:])


def _dim_in(an, vid: int, g: int) -> Batch:
    dims = [d for d in range(len(an.program.values[vid].shape)) if an.group_of(vid, d) == g]
    return dims[0] if len(dims) == 1 else None


def _loop_batch(an, enter: int, g: int) -> LoopBatch | str:
    program: Program = an.program
    op = program.ops[enter]
    region = next(r for r in program.regions if r.enter == enter)
    ncarry = int(op.params["num_carry"])
    exit_ = program.ops[region.exit]
    # the scan's consts are the outer values, read in the body as they are: the body ops'
    # inputs that are made outside it (and are not its enter op's outputs)
    body = range(enter + 1, region.exit)
    inner = {v for o in body for v in program.ops[o].outputs} | set(op.outputs)
    consts = list(dict.fromkeys(v for o in body for v in program.ops[o].inputs if v not in inner))
    carry = [_dim_in(an, v, g) for v in op.outputs[:ncarry]]
    where = f"{program.ops[enter].source}"
    if any(b is None for b in carry) or not carry:
        return f"{where}: a carry of the layer loop does not hold the batch"
    xs = tuple(_dim_in(an, v, g) for v in op.outputs[ncarry:])
    sums: set[int] = set()
    why = _separable(an, program, body, g, set(exit_.inputs[:ncarry]), sums)
    if why:
        return f"{where}: {why}"
    resize = {}
    for o in body:
        r = _resized(an, program.ops[o], g)
        if isinstance(r, str):
            return f"{where}: {r}"
        if r:
            resize[o] = r
    ys = tuple(SUM if v in sums else _dim_in(an, v, g) for v in exit_.inputs[ncarry:len(exit_.inputs) - ncarry])
    const_dims = {v: d for v in consts if (d := _dim_in(an, v, g)) is not None}
    return LoopBatch(enter, const_dims, tuple(carry), xs, ys, resize)


def _separable(an, program: Program, body, g: int, carries: set[int], sums: set[int]) -> str:
    """Why the body does not treat the batch's rows independently (module docstring), or
    ''; ``sums`` gets the values that hold a sum over the batch."""

    def has(v: int) -> bool:
        return any(an.group_of(v, d) == g for d in range(len(program.values[v].shape)))

    for o in body:
        op = program.ops[o]
        ins_b = [has(v) for v in op.inputs]
        outs_b = [has(v) for v in op.outputs]
        summed = [v for v in op.inputs if v in sums]
        if summed:
            if op.primitive not in _LINEAR or any(outs_b):
                return f"{op.primitive} at {op.source} reads a sum over the batch"
            if op.primitive in _ADDS and len(summed) != len(op.inputs):
                return f"{op.primitive} at {op.source} adds a sum over the batch to a value without it"
            if op.primitive in _SCALES and (len(summed) != 1 or any(ins_b)):
                return f"{op.primitive} at {op.source} multiplies a sum over the batch by another"
            sums.update(op.outputs)
            continue
        if not any(ins_b):
            if any(outs_b) and op.primitive not in _MAKES_BATCH and not op.primitive.endswith(("_enter", "_exit")):
                return f"{op.primitive} at {op.source} makes a batch dim (it would differ per microbatch)"
            continue
        reduced = False
        for f in an.factors[o]:
            on_batch = any(an.group_of(op.inputs[i], d) == g for i, d in f.operands if i < len(op.inputs)) or \
                any(an.group_of(op.outputs[i], d) == g for i, d in f.results)
            if not on_batch:
                continue
            if f.kind == FactorKind.PASS:
                continue
            if f.kind == FactorKind.REDUCTION and f.reduce == "sum" and not f.results:
                reduced = True
                continue
            return f"{op.primitive} at {op.source} does not treat the batch's rows independently"
        if reduced and not any(outs_b):
            sums.update(op.outputs)
    if sums & carries:
        return "a sum over the batch is carried from layer to layer"
    return ""


def _resized(an, op, g: int) -> tuple[tuple[str, tuple[int, ...]], ...] | str:
    """The params of ``op`` that size a batch dim, as ``LoopBatch.resize`` keeps them, or why
    a microbatch cannot run it."""
    def dims(vids, names=None):
        return tuple(d for v in vids for d in range(len(an.program.values[v].shape)) if an.group_of(v, d) == g)

    name, p = op.primitive, op.params
    if name == "custom_partitioning":  # bound again at the rows a stage runs (``plan._micro``)
        per = [dims((v,)) for v in (*op.inputs, *op.outputs)]
        if any(len(d) != 1 for d in per):
            return f"custom_partitioning at {op.source}: not every operand and result holds the batch once"
        return ((ROWS, tuple(d[0] for d in per)),)
    if name in ("broadcast_in_dim", "reshape"):
        out = dims(op.outputs[:1])
        return ((("shape" if name == "broadcast_in_dim" else "new_sizes"), out),) if out else ()
    ins = dims(op.inputs[:1]) if op.inputs else ()
    if not ins:
        return ()
    shape = an.program.values[op.inputs[0]].shape
    if name == "slice":
        strides = p.get("strides") or (1,) * len(shape)
        if any(p["start_indices"][d] != 0 or p["limit_indices"][d] != shape[d] or strides[d] != 1 for d in ins):
            return f"slice at {op.source} cuts the batch"
        return (("limit_indices", ins),)
    if name == "dynamic_slice":
        if any(p["slice_sizes"][d] != shape[d] for d in ins):
            return f"dynamic_slice at {op.source} cuts the batch"
        return (("slice_sizes", ins),)
    if name == "split" and p["axis"] in ins:
        return f"split at {op.source} cuts the batch"
    if name in ("gather", "scatter", "scatter-add", "scatter_add", "pallas_call", "shard_map",
                "iota", "rng_bit_generator", "while", "cond"):
        return f"{name} at {op.source} reads the batch (not run per microbatch yet)"
    return ()
