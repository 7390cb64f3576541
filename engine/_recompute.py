"""Recompute units: what rematerialising a layer stack, or re-gathering its weights, changes.

A training step traced with ``jax.grad`` is its forward pass followed by the backward pass
(JAX's partial evaluation puts every primal op first; the transposed ops carry ``transpose``
in their name stack, the one mark JAX's AD leaves on them). A forward value read again in the
backward pass is a *residual*: it stays alive from the forward to the backward, and at long
sequences the residuals of every layer are what does not fit.

A *recompute unit* is a layer stack of the forward pass (``_stacks.layer_blocks``); one
decision covers every layer of it, as a sharding decision covers every layer of a group.
The kinds, as ``jax.checkpoint`` and its policies give them:

- ``save``: today's program, every residual kept (no decision);
- ``regather``: residuals kept, but the weights each layer reads are taken again in the
  backward pass behind an optimisation barrier, so that a weight gathered over a data axis
  (ZeRO-3 / FSDP) is gathered again there instead of XLA keeping the forward's gathered copy
  alive in between;
- ``dots``: save the outputs of the layer's matmuls with weights (dots without batch
  dimensions, as ``jax.checkpoint_policies.dots_with_no_batch_dims_saveable``) and recompute
  the rest (elementwise ops, attention's scores and probabilities) in the backward pass;
- ``full``: save only what the layer reads (its input and weights) and recompute the whole
  layer in the backward pass.

Both remat kinds re-gather the layer's weights too (the recomputation reads them behind the
same barrier, as ``jax.checkpoint`` does). For each copy of the layer, ``RecomputePlan`` gives
what apply re-emits (the ops, where, from which saved values) and what the cost model charges
(the ops run twice; the residuals die after the forward and a recomputed copy lives from the
recompute point to its last backward read).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from ._program import NO_PRODUCER, TOP_REGION, Program, ValueId
from ._stacks import Block, layer_blocks

KINDS = ("regather", "dots", "full")  # "save" is no decision
PREFIX = "recompute:"  # the pseudo mesh axis a recompute decision carries: (unit, "recompute:full")


def kind_of(axis: str) -> str | None:
    """The recompute kind a decision's axis names, or None for a mesh axis."""
    return axis[len(PREFIX):] if axis.startswith(PREFIX) else None


def is_recompute(decision) -> bool:
    return decision[1].startswith(PREFIX)


@dataclasses.dataclass(frozen=True)
class CopyPlan:
    """One layer of a unit under one kind."""

    at: int  # the op before which apply re-emits (the first backward read), -1: nothing to do
    ops: tuple[int, ...]  # forward ops re-emitted there, in program order
    leaves: tuple[ValueId, ...]  # saved values they read (through the barrier)
    recomputed: tuple[ValueId, ...]  # residuals the backward reads from the recomputation
    weights: tuple[ValueId, ...]  # program inputs the layer reads: re-taken after the barrier
    anchors: tuple[ValueId, ...]  # backward values the barrier waits for (no early hoisting)
    until: int = -1  # the backward pass's last op: later reads (the optimizer's) keep the weights as they were


@dataclasses.dataclass(frozen=True)
class Unit:
    """A forward layer stack whose layers can be recomputed."""

    id: int
    block: Block
    label: str
    boundary: int  # the first backward op
    until: int  # the last backward op
    copies: tuple[tuple[int, int], ...]  # op ranges [lo, hi) of the layers
    where: str = ""  # the source line of the layer's first op

    @property
    def description(self) -> str:
        return f"{self.label}: {len(self.copies)} layers from {self.where}"


def backward_span(program: Program) -> tuple[int, int] | None:
    """The first and last op of the backward pass: the top-level ops JAX's AD transposed."""
    ids = [op.id for op in program.ops if op.region == TOP_REGION and "transpose(" in op.scope]
    return (ids[0], ids[-1]) if ids else None


def units(program: Program, blocks: Sequence[Block] | None = None) -> list[Unit]:
    """The forward layer stacks of a differentiated step that apply can recompute: top-level
    (not under a loop), ahead of the backward pass, with residuals read by it."""
    span = backward_span(program)
    if span is None:
        return []
    b, until = span
    blocks = layer_blocks(program) if blocks is None else blocks
    readers = value_readers(program)
    out = []
    for blk in blocks:
        if blk.start + blk.extent > b:
            continue
        ops = program.ops[blk.start:blk.start + blk.period * blk.count]
        if any(op.region != TOP_REGION or op.primitive.endswith(("_enter", "_exit")) for op in ops):
            continue
        copies = tuple((blk.start + k * blk.period, blk.start + (k + 1) * blk.period) for k in range(blk.count))
        u = Unit(len(out), blk, "", b, until, copies)
        if not any(_residuals(program, u, lo, hi, readers) for lo, hi in copies):
            continue
        first = program.ops[blk.start]
        where = first.source.rsplit("/", 1)[-1] if first.source else f"op {blk.start}"
        out.append(dataclasses.replace(u, label=f"stack{len(out)}", where=where))
    return out


def value_readers(program: Program) -> list[list[int]]:
    """Per value, the top-level ops that read it (a read inside a loop or branch body counts
    at the body's enter op, where apply's interpreter reads it)."""
    enter_of = {r.id: (r.enter, r.parent) for r in program.regions if r.enter >= 0}
    readers: list[list[int]] = [[] for _ in program.values]
    for op in program.ops:
        at, r = op.id, op.region
        while r != TOP_REGION and r in enter_of:
            at, r = enter_of[r]
        for v in set(op.inputs):
            readers[v].append(at)
    return readers


def _residuals(program: Program, u: Unit, lo: int, hi: int, readers) -> list[ValueId]:
    """Values made in layer [lo, hi) that the backward pass reads."""
    return [v for op in program.ops[lo:hi] for v in op.outputs if any(r >= u.boundary for r in readers[v])]


def plan_copy(program: Program, u: Unit, k: int, kind: str, readers=None) -> CopyPlan:
    """What recomputing layer ``k`` of unit ``u`` under ``kind`` re-emits and where."""
    readers = value_readers(program) if readers is None else readers
    lo, hi = u.copies[k]
    ops = program.ops
    made = {v: op.id for op in ops[lo:hi] for v in op.outputs}
    weights = tuple(sorted({v for op in ops[lo:hi] for v in op.inputs
                            if v not in made and program.values[v].producer == NO_PRODUCER
                            and v not in program.constants}))
    late = _residuals(program, u, lo, hi, readers)
    if kind == "regather":
        reads = [r for w in weights for r in readers[w] if r >= u.boundary]
        if not reads:
            return CopyPlan(-1, (), (), (), (), ())
        at = min(reads)
        return CopyPlan(at, (), (), (), weights, _anchors(program, at, u.boundary), u.until)
    # saved: what the forward goes on to read after the layer (the next layer's input, the
    # loss's), and under ``dots`` the matmuls with weights
    saved = {v for v in made if any(hi <= r < u.boundary for r in readers[v])}
    if kind == "dots":
        saved |= {ops[made[v]].outputs[0] for v in late
                  if ops[made[v]].primitive == "dot_general" and not ops[made[v]].params["dimension_numbers"][1][0]}
    recomputed = [v for v in late if v not in saved]
    if not recomputed:
        return CopyPlan(-1, (), (), (), (), ())
    # the backward slice of the recomputed values within the layer, down to saved values
    need: set[int] = set()
    stack = [made[v] for v in recomputed]
    while stack:
        o = stack.pop()
        if o in need:
            continue
        need.add(o)
        for v in ops[o].inputs:
            if v in made and v not in saved:
                stack.append(made[v])
    seq = tuple(sorted(need))
    produced = {v for o in seq for v in ops[o].outputs}
    leaves = tuple(sorted({v for o in seq for v in ops[o].inputs if v not in produced and v not in program.constants}))
    at = min(r for v in recomputed for r in readers[v] if r >= u.boundary)
    return CopyPlan(at, seq, leaves, tuple(recomputed), weights, _anchors(program, at, u.boundary), u.until)


def _anchors(program: Program, at: int, boundary: int) -> tuple[ValueId, ...]:
    """Operands of op ``at`` made in the backward pass: the barrier waits for them, so XLA
    cannot start the recomputation (or the re-gather) before the backward pass reaches it."""
    vs = program.values
    return tuple(v for v in dict.fromkeys(program.ops[at].inputs)
                 if vs[v].producer != NO_PRODUCER and vs[v].producer >= boundary)


def plan_unit(program: Program, u: Unit, kind: str) -> tuple[CopyPlan, ...]:
    readers = value_readers(program)
    return tuple(plan_copy(program, u, k, kind, readers) for k in range(len(u.copies)))
