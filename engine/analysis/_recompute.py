"""Recompute units: what rematerialising a layer stack, or re-gathering its weights, changes.

A training step traced with ``jax.grad`` is its forward pass followed by the backward pass
(JAX's partial evaluation puts every primal op first; the transposed ops carry ``transpose``
in their name stack, the one mark JAX's AD leaves on them). A forward value read again in the
backward pass is a *residual*: it stays alive from the forward to the backward, and at long
sequences the residuals of every layer are what does not fit.

A *recompute unit* is a layer stack of the forward pass: unrolled (``_stacks.layer_blocks``)
or a ``scan`` over the layers whose stacked residuals the backward pass's ``scan`` reads. One
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
  layer in the backward pass;
- ``offload``: as ``dots``, but the saved matmul outputs the backward pass reads go to host
  memory as the forward pass makes them and come back for the backward pass (as
  ``jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host")``, and
  MaxText's ``*_offloaded`` remat policies): device memory traded for the host link's time;
- ``full_offload``: as ``full``, but each layer's input goes to host memory as the forward
  pass makes it and comes back for the layer's recomputation (MaxText's
  ``decoder_layer_input: offload`` with every other tag recomputed).

Both remat kinds re-gather the layer's weights too (the recomputation reads them behind the
same barrier, as ``jax.checkpoint`` does). For each copy of the layer, ``CopyPlan`` gives
what apply re-emits (the ops, where, from which saved values) and what the cost model charges
(the ops run twice; the residuals die after the forward and a recomputed copy lives from the
recompute point to its last backward read).

Under ``scan`` a layer's weights are a slice of the stacked weights, gathered in every
iteration of each loop alike, so re-gather is no decision there: the kinds are ``dots``,
``full`` and their offloading forms, and ``LoopPlan`` says which stacked residuals the forward loop no longer outputs,
which values it stacks instead (the layer input, the saved matmul outputs), and which forward
body ops the backward loop's body runs again, per iteration, before its own.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from .._decisions import LOOP_RECOMPUTE_KINDS, RECOMPUTE_KINDS
from ..tracing._program import NO_PRODUCER, TOP_REGION, Program, ValueId
from ._stacks import Block, layer_blocks

KINDS = RECOMPUTE_KINDS
LOOP_KINDS = LOOP_RECOMPUTE_KINDS


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
    offloaded: tuple[ValueId, ...] = ()  # ``offload``: saved residuals kept in host memory until ``at``


@dataclasses.dataclass(frozen=True)
class LoopPlan:
    """A layer stack under ``scan`` under one remat kind: the forward loop stops stacking the
    residuals recomputed, stacks the values the recomputation reads instead, and the
    backward loop's body runs the forward body's ops again before its own, every iteration."""

    forward: int  # the forward loop's enter op
    backward: int  # the backward loop's enter op
    ops: tuple[int, ...]  # forward body ops the backward body binds again, in program order
    leaves: tuple[ValueId, ...]  # forward body values they read: loop consts, carries, xs slices, saved values
    stacked: tuple[ValueId, ...]  # leaves the forward loop stacks as new outputs (carries, saved values not stacked yet)
    dropped: tuple[int, ...]  # indices of the forward loop's stacked outputs (ys) it no longer makes
    feeds: tuple[tuple[int, ValueId], ...]  # (backward enter operand, forward body value): the recomputed slices
    reuse: tuple[tuple[ValueId, int], ...]  # (leaf, backward enter operand): a leaf already stacked and read
    # ``offload``: the stacked outputs (indices of the ys) and the new stacked leaves
    # (indices into ``stacked``) the forward loop stacks in host memory, and the backward
    # loop's operands that read one of them (each slice brought back as the loop reads it)
    host_ys: tuple[int, ...] = ()
    host_stacked: tuple[int, ...] = ()
    host_in: tuple[int, ...] = ()

    at = -1  # no point in the top-level program: apply acts at the two loops


@dataclasses.dataclass(frozen=True)
class Unit:
    """A forward layer stack whose layers can be recomputed."""

    id: int
    block: Block | None  # an unrolled stack's layers; None for a scan
    label: str
    boundary: int  # the first backward op
    until: int  # the last backward op
    copies: tuple[tuple[int, int], ...]  # op ranges [lo, hi) of the layers (a scan: its one body)
    where: str = ""  # the source line of the layer's first op
    loop: tuple[int, int] | None = None  # a scan: (forward, backward) loops' enter ops
    layers: int = 0  # layers covered (a scan's length)
    kinds: tuple[str, ...] = KINDS

    @property
    def description(self) -> str:
        """One line for reading: ``label: N layers (scan) from source line``."""
        how = " (scan)" if self.loop else ""
        return f"{self.label}: {self.layers} layers{how} from {self.where}"


def backward_span(program: Program) -> tuple[int, int] | None:
    """The first and last op of the backward pass: the top-level ops JAX's AD transposed."""
    ids = [op.id for op in program.ops if op.region == TOP_REGION and "transpose(" in op.scope]
    return (ids[0], ids[-1]) if ids else None


def units(program: Program, blocks: Sequence[Block] | None = None) -> list[Unit]:
    """The forward layer stacks of a differentiated step that apply can recompute: unrolled
    at top level, or a scan whose stacked residuals the backward scan reads; ahead of the
    backward pass, with residuals it reads (none: the step's own ``jax.checkpoint`` keeps
    only the layers' inputs already, modelled as it is)."""
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
        copies = tuple((blk.start + k * blk.period, blk.start + (k + 1) * blk.period) for k in range(blk.count))
        if not all(_recomputable(program, lo, hi) for lo, hi in copies):
            continue
        u = Unit(len(out), blk, "", b, until, copies, layers=blk.count)
        # nothing the backward reads, or recomputed already (the step's own jax.checkpoint)
        if not any(plan_copy(program, u, k, "full", readers).at >= 0 for k in range(len(copies))):
            continue
        out.append(dataclasses.replace(u, where=_where(program, blk.start)))
    for fwd, bwd in _scan_pairs(program, b, readers):
        u = Unit(len(out), None, "", b, until, ((fwd.enter, fwd.exit + 1),),
                 _where(program, fwd.enter), (fwd.enter, bwd.enter), program.ops[fwd.enter].params["length"],
                 LOOP_KINDS)
        if plan_loop(program, u, "full", readers).ops:
            out.append(u)
    out.sort(key=lambda u: u.copies[0][0])
    return [dataclasses.replace(u, id=i, label=f"stack{i}") for i, u in enumerate(out)]


def shard_map_spans(program: Program, lo: int, hi: int) -> dict[int, int] | None:
    """The ``shard_map`` regions among ops [lo, hi), enter op -> exit op (a region's body is
    traced inline, between the two); None where a region crosses the range's ends."""
    spans: dict[int, int] = {}
    open_: list[int] = []
    for op in program.ops[lo:hi]:
        if op.primitive == "shard_map_enter":
            open_.append(op.id)
        elif op.primitive == "shard_map_exit":
            if not open_:
                return None
            spans[open_.pop()] = op.id
    return None if open_ else spans


def _recomputable(program: Program, lo: int, hi: int) -> bool:
    """Ops [lo, hi) can be bound again in the backward pass: top-level ops and whole
    shard_map regions (bound as one op, whatever their bodies hold); no loop or branch."""
    spans = shard_map_spans(program, lo, hi)
    if spans is None:
        return False
    inside = np.zeros(hi - lo, dtype=bool)
    for enter, exit_ in spans.items():
        inside[enter - lo:exit_ - lo + 1] = True
    return all(inside[op.id - lo] or (op.region == TOP_REGION and not op.primitive.endswith(("_enter", "_exit")))
               for op in program.ops[lo:hi])


def _where(program: Program, op: int) -> str:
    first = program.ops[op]
    return first.source.rsplit("/", 1)[-1] if first.source else f"op {op}"


def _scan_pairs(program: Program, boundary: int, readers):
    """(forward, backward) scan regions: a top-level forward scan without nested loops whose
    stacked outputs a top-level backward scan reads."""
    regions = program.regions
    nested = {r.parent for r in regions}
    by_enter = {r.enter: r for r in regions if r.enter >= 0}
    for r in regions:
        if r.kind != "scan" or r.parent != TOP_REGION or r.enter < 0 or r.exit >= boundary or r.id in nested:
            continue
        x = program.ops[r.exit]
        nc = x.params["num_carry"]
        bwd = {by_enter.get(o) for v in x.outputs[nc:] for o in readers[v] if o >= boundary}
        bwd = [b for b in bwd if b is not None and b.kind == "scan" and b.parent == TOP_REGION]
        if len(bwd) == 1:
            yield r, bwd[0]


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
    dots: set[int] = set()
    if kind in ("dots", "offload"):
        dots = {ops[made[v]].outputs[0] for v in late if _saveable_dot(ops[made[v]])}
        saved |= dots
    recomputed = [v for v in late if v not in saved]
    offloaded = tuple(sorted(v for v in dots if v in late)) if kind == "offload" else ()
    if kind == "full_offload":  # the layer's input: what it reads that the forward made, no other layer reads
        others = [(a, b) for j, (a, b) in enumerate(u.copies) if j != k]
        offloaded = tuple(sorted({v for op in ops[lo:hi] for v in op.inputs
                                 if v not in made and program.values[v].producer != NO_PRODUCER
                                 and v not in program.constants
                                 and not any(a <= r < b for r in readers[v] for a, b in others)
                                 and any(r >= u.boundary for r in readers[v])}))
    if not recomputed and not offloaded:
        return CopyPlan(-1, (), (), (), (), ())
    if not recomputed:  # nothing recomputed: the offloaded values come back where first read
        at = min(r for v in offloaded for r in readers[v] if r >= u.boundary)
        return CopyPlan(at, (), (), (), (), (), u.until, offloaded)
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
    # a shard_map region runs again whole (apply binds it as one op)
    for enter, exit_ in (shard_map_spans(program, lo, hi) or {}).items():
        if any(enter <= o <= exit_ for o in need):
            need.update(range(enter, exit_ + 1))
    seq = tuple(sorted(need))
    produced = {v for o in seq for v in ops[o].outputs}
    leaves = tuple(sorted({v for o in seq for v in ops[o].inputs if v not in produced and v not in program.constants}))
    at = min(r for v in (*recomputed, *offloaded) for r in readers[v] if r >= u.boundary)
    return CopyPlan(at, seq, leaves, tuple(recomputed), weights, _anchors(program, at, u.boundary), u.until,
                    offloaded)


def _anchors(program: Program, at: int, boundary: int) -> tuple[ValueId, ...]:
    """Operands of op ``at`` made in the backward pass: the barrier waits for them, so XLA
    cannot start the recomputation (or the re-gather) before the backward pass reaches it."""
    vs = program.values
    return tuple(v for v in dict.fromkeys(program.ops[at].inputs)
                 if vs[v].producer != NO_PRODUCER and vs[v].producer >= boundary)


def plan_unit(program: Program, u: Unit, kind: str) -> tuple[CopyPlan | LoopPlan, ...]:
    readers = value_readers(program)
    if u.loop is not None:
        lp = plan_loop(program, u, kind, readers)
        return (lp,) if lp.ops or lp.host_ys else ()
    return tuple(plan_copy(program, u, k, kind, readers) for k in range(len(u.copies)))


def _saveable_dot(op) -> bool:
    """A matmul with no batch dimensions (with a weight): what ``dots`` saves."""
    return op.primitive == "dot_general" and not op.params["dimension_numbers"][1][0]


def plan_loop(program: Program, u: Unit, kind: str, readers=None) -> LoopPlan:
    """What recomputing scan unit ``u`` under ``kind`` changes in its two loops."""
    readers = value_readers(program) if readers is None else readers
    ops, values = program.ops, program.values
    if u.loop is None:
        raise ValueError(f"{u.description}: not a scan, so no loops to plan (plan_loop takes scan units)")
    f_enter, b_enter = u.loop
    enter, exit_ = ops[f_enter], ops[u.copies[0][1] - 1]
    nc = exit_.params["num_carry"]
    body = range(f_enter + 1, exit_.id)
    made = {v: o for o in body for v in ops[o].outputs}
    ys_body = exit_.inputs[:len(exit_.outputs)][nc:]  # the body value each stacked output stacks
    ys_out = exit_.outputs[nc:]
    bin_ = ops[b_enter].inputs
    # a stacked output the backward loop alone reads, of a value the body makes: recomputable
    only_b = [j for j, (bv, sv) in enumerate(zip(ys_body, ys_out))
              if bv in made and readers[sv] and all(r == b_enter for r in readers[sv])]
    saved = {bv for j, bv in enumerate(ys_body) if j not in only_b}
    dots: set[int] = set()
    if kind in ("dots", "offload"):
        dots = {v for v, o in made.items() if _saveable_dot(ops[o]) and ops[o].outputs[0] == v}
        saved |= dots
    dropped = tuple(j for j in only_b if ys_body[j] not in saved)
    # ``offload``: the matmul outputs the backward loop alone reads, stacked already, are
    # stacked in host memory
    host_ys = tuple(j for j in only_b if j not in dropped and ys_body[j] in dots) if kind == "offload" else ()
    if kind == "full_offload":  # every stacked residual kept (the layer inputs the recomputation reads)
        host_ys = tuple(j for j, sv in enumerate(ys_out) if j not in dropped and readers[sv]
                        and all(r == b_enter for r in readers[sv]))
    host_in = tuple(i for i, sv in enumerate(bin_) if sv in ys_out and ys_out.index(sv) in host_ys)
    if not dropped:
        return LoopPlan(f_enter, b_enter, (), (), (), (), (), (), host_ys, (), host_in)
    need: set[int] = set()
    stack = [made[ys_body[j]] for j in dropped]
    while stack:
        o = stack.pop()
        if o in need:
            continue
        need.add(o)
        stack += [made[v] for v in ops[o].inputs if v in made and v not in saved]
    seq = tuple(sorted(need))
    produced = {v for o in seq for v in ops[o].outputs}
    leaves = tuple(sorted({v for o in seq for v in ops[o].inputs if v not in produced and v not in program.constants}))
    # leaves the backward loop can read as they are: the loop's consts (outer values) and xs
    # slices (of the stacked operand), and values already stacked and read by it
    consts = {v for v in leaves if values[v].producer != f_enter and v not in made}
    xs = set(enter.outputs[nc:])
    kept = {bv: ys_out[j] for j, bv in enumerate(ys_body) if j not in dropped}
    reuse = tuple((v, bin_.index(kept[v])) for v in leaves if v in kept and kept[v] in bin_)
    stacked = tuple(v for v in leaves if v not in consts and v not in xs and v not in dict(reuse))
    feeds = tuple((i, ys_body[ys_out.index(sv)]) for i, sv in enumerate(bin_)
                  if sv in ys_out and ys_out.index(sv) in dropped)
    # and so are the matmul outputs stacked anew for the recomputation
    # (``full_offload``: the layer inputs stacked for the recomputation)
    host_stacked = tuple(k for k, v in enumerate(stacked) if v in dots) if kind == "offload" else \
        tuple(range(len(stacked))) if kind == "full_offload" else ()
    return LoopPlan(f_enter, b_enter, seq, leaves, stacked, dropped, feeds, reuse, host_ys, host_stacked, host_in)
