"""A layer loop run as a pipeline: its layers split into stages over a mesh axis, its batch
into microbatches that flow from stage to stage, in plain SPMD JAX.

``pipelined_scan`` computes what ``jax.lax.scan(body, carry, xs)`` computes over a layer
stack, for a body that treats the rows of its batch independently (a layer's forward or
backward pass), as a pipeline:

- the ``L`` layers' slices of every stacked operand (``[L, ...]``: the layers' weights, the
  forward pass's residuals) are split ``[S, L/S, ...]``, the stage dim sharded over the stage
  axis: stage ``s`` holds layers ``s*L/S .. (s+1)*L/S - 1`` (a plain block sharding of the
  layer dim, so weights and residuals stay where they are between steps and loops);
- the batch (every operand's and result's batch dim, ``None`` for those without one) is split
  into ``M`` microbatches, microbatch ``m`` the rows ``m, m+M, m+2M, ...`` (strided: a batch
  sharded over a data axis keeps each microbatch spread over all of it);
- the ticks follow a ``Schedule``, GPipe's fill and drain or the circular one: at tick ``t``
  stage ``s`` runs its layers (an inner ``scan``) on its iteration ``t - s``, then every stage
  hands its activation to the next (one rotation of the stage dim by one: XLA's
  collective-permute on the stage axis). Ticks where a stage has no microbatch (the bubble)
  compute on what it holds and their results are dropped. A ``reverse`` loop (the backward
  pass) runs the stages from the last to the first.

A result of the body with the batch dim (a residual) is written per microbatch where the
stage made it; one that sums over the batch (a weight's gradient) is summed over the
microbatches; one that does not depend on the batch is kept as any microbatch made it. The
loop's final carry is the last stage's, per microbatch. Which operands and results have a
batch dim, and that the body is a sum over the batch where a result has none, is the caller's
to know (the analysis decides which stacks may be pipelined).

Every index a tick takes is one scalar for all stages (a dynamic slice XLA keeps local, where
a per-stage index would be a gather it partitions by gathering the operand): the per-row
operands and results of stage ``s`` are held *skewed*, its slot ``u`` holding iteration
``(u - s) mod RM`` (``Schedule.slot``), so that the one slot all stages take at a tick is each
stage's own iteration, in both directions. A forward loop's per-row results (its residuals)
come back skewed, as the backward loop reads them (``unskew`` puts them in the loop's order);
any other per-row stacked operand is skewed on the way in.

The tick is one (``_Loop``); what differs between the schedules -- where a stage's layers
sit, how a tick reads and writes the per-layer values, the last stage's output kept for the
next round -- is a subclass per schedule kind (``_LOOPS``).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec

from ..analysis._pipeline_stacks import SUM, PipelineStack

Batch = int | None  # a leaf's batch dim, or None
# the two rounds' blocks a tick may hold (scalars), and which of them each stage is in ([S])
Rounds = tuple[tuple[Any, Any], Any]


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The ticks of a pipeline of ``stages`` S stages and ``microbatches`` M microbatches that
    pass the stages ``repeats`` R times: R = 1 is GPipe's fill and drain; R > 1 the circular
    schedule (MaxText's ``num_pipeline_repeats``: the layers in R*S blocks, stage ``s``
    holding blocks ``s, S+s, 2S+s, ...``), which divides the bubble by about R.

    A stage runs ``slots`` = R*M iterations, iteration ``r*M + m`` being microbatch ``m`` in
    round ``r``, one a tick from the tick of its place in the pipeline (``position``) on: the
    loop takes ``ticks`` = R*M + S - 1 ticks, S - 1 of them idle on every stage (``bubble``).
    The tick arithmetic takes Python ints and traced integer arrays alike."""

    stages: int
    microbatches: int
    repeats: int = 1

    @property
    def kind(self) -> str:
        """``"gpipe"`` (one round) or ``"circular"``: ``Pipeline.schedule``'s names."""
        return "circular" if self.repeats > 1 else "gpipe"

    @property
    def slots(self) -> int:
        """The iterations a stage runs, and so the slots of its per-row buffers."""
        return self.repeats * self.microbatches

    @property
    def ticks(self) -> int:
        """The tick loop's trips: a stage's iterations, the last stage starting S - 1 ticks
        after the first."""
        return self.slots + self.stages - 1

    @property
    def bubble(self) -> float:
        """The share of the ticks a stage idles: (S-1) / (RM+S-1)."""
        return (self.stages - 1) / self.ticks

    def block(self, layers: int) -> int:
        """The layers of one block (a stage's share of one round: L/(RS)). ValueError where
        ``layers`` do not split into the blocks, or where a circular schedule has fewer
        microbatches than stages (a microbatch would not be back on the first stage before
        its next round)."""
        S, M, R = self.stages, self.microbatches, self.repeats
        if layers % (S * R):
            raise ValueError(f"{layers} layers do not split into {S} stages" + (f" of {R} rounds" if R > 1 else ""))
        if R > 1 and M < S:
            raise ValueError(f"a circular pipeline needs at least as many microbatches as stages ({M} < {S})")
        return layers // (S * R)

    def position(self, stage, reverse: bool):
        """Stage ``stage``'s place in the pipeline, the tick of its first iteration (a
        ``reverse`` loop runs the stages from the last)."""
        return self.stages - 1 - stage if reverse else stage

    def slot(self, t, reverse: bool):
        """The slot of the per-row buffers every stage takes at tick ``t``: stage ``s``'s slot
        ``u`` holds iteration ``(u - s) mod RM`` of the loop's order, which a ``reverse``
        loop runs from the last."""
        N = self.slots
        return (N + self.stages - 2 - t) % N if reverse else t % N

    def microbatch(self, u, reverse: bool):
        """The microbatch of a round's iteration ``u`` (the first stage's at tick ``u``; a
        ``reverse`` loop takes them from the last); unclipped: ticks outside the round give
        indices outside ``0 .. M-1``."""
        M = self.microbatches
        return M - 1 - u if reverse else u

    def round(self, i):
        """The round of iteration ``i``."""
        return i // self.microbatches


def _split(x, dim: int, m: int):
    """``x`` with its dim ``dim`` (size B) as ``[B/m, m]``: microbatch k is index k of the new dim ``dim+1``."""
    b = x.shape[dim]
    return x.reshape(*x.shape[:dim], b // m, m, *x.shape[dim + 1:])


def _merge(x, dim: int):
    return x.reshape(*x.shape[:dim], x.shape[dim] * x.shape[dim + 1], *x.shape[dim + 2:])


def _pick(x, dim: int, k):
    """Microbatch ``k`` of a split leaf (``k`` traced; ``dim``: the leaf's batch dim)."""
    return lax.dynamic_index_in_dim(x, k, dim + 1, keepdims=False)


def _per_stage(v, y):
    """A per-stage flag (``[S]``) broadcast against a per-stage value ``y`` (``[S, ...]``)."""
    return v.reshape(v.shape[0], *[1] * (y.ndim - 1))


def _put(buf, dim: int, k, y, valid):
    """``buf`` ([S, ...]) with slot ``k`` (a scalar) of its dim ``dim + 1`` (the microbatch
    dim of each stage's ``[..., dim]`` rows) set to ``y`` on the stages ``valid`` says."""
    old = lax.dynamic_index_in_dim(buf, k, dim + 2, keepdims=False)
    return lax.dynamic_update_index_in_dim(buf, jnp.where(_per_stage(valid, y), y, old), k, dim + 2)


def pipelined_scan(body: Callable, consts: Sequence, carry: Sequence, xs: Sequence, *, length: int,
                   reverse: bool, stages: int, microbatches: int, axis: str,
                   const_batch: Sequence[Batch], carry_batch: Sequence[Batch], xs_batch: Sequence[Batch],
                   ys_batch: Sequence[Batch | str], xs_skewed: Sequence[bool] | None = None,
                   constrain: Callable | None = None, repeats: int = 1) -> tuple[list, list]:
    """``lax.scan(lambda c, x: body(consts, c, x), carry, xs, length=length, reverse=reverse)``
    as a pipeline of ``stages`` stages over mesh axis ``axis`` and ``microbatches``
    microbatches, passing the stages ``repeats`` times (``Schedule``; module docstring).
    ``*_batch``: each leaf's batch dim (per layer: a stacked leaf's dim in one layer's slice),
    None where it has none; every carry has one; a result without one that sums over the
    batch is ``SUM``. ``xs_skewed``: the stacked operands already in the stages' skewed order
    (a forward pipeline's stacked results). ``constrain(x, spec)``: how a value is placed
    (default: ``with_sharding_constraint`` under the context mesh); the stage dim of every
    per-stage value is placed on ``axis``.

    Returns (final carry, stacked ys) as lists; a per-row result in the stages' skewed order
    (with ``repeats`` > 1 in the stages' layout, ``[S, L/(RS), ..., B/M, RM, ...]``), as the
    backward loop reads it (``unskew``: the loop's order). ValueError where the layers do not
    split into the stages' blocks, a circular schedule has fewer microbatches than stages, or
    a carry has no batch dim."""
    schedule = Schedule(stages, microbatches, repeats)
    loop = _LOOPS[schedule.kind](
        body, schedule, length=length, reverse=reverse, axis=axis,
        place=constrain if constrain is not None else lax.with_sharding_constraint,
        const_batch=const_batch, carry_batch=carry_batch, xs_batch=xs_batch, ys_batch=ys_batch,
        consts=consts, carry=carry, xs=xs, xs_skewed=list(xs_skewed) if xs_skewed is not None else [False] * len(xs))
    return loop.scan()


def unskew(y, b: int, stages: int, microbatches: int, repeats: int = 1):
    """A pipelined loop's stacked per-row result (``[L, ...]``, its rows at per-layer dim
    ``b`` in the stages' skewed order; with ``repeats`` > 1 in the stages' layout
    ``[S, L/(RS), ..., B/M, RM, ...]``) in the loop's own layer and row order."""
    schedule = Schedule(stages, microbatches, repeats)
    return _LOOPS[schedule.kind].unskew(y, b, schedule)


class _Loop(abc.ABC):
    """One pipelined loop as it is traced: its operands laid out over the stages, and the
    tick loop every schedule shares. Where the schedules differ, the hooks below say what
    the subclass of a schedule kind does."""

    def __init__(self, body: Callable, schedule: Schedule, *, length: int, reverse: bool, axis: str,
                 place: Callable, const_batch: Sequence[Batch], carry_batch: Sequence[Batch],
                 xs_batch: Sequence[Batch], ys_batch: Sequence[Batch | str], consts: Sequence, carry: Sequence,
                 xs: Sequence, xs_skewed: Sequence[bool]):
        self.body, self.schedule, self.length, self.reverse = body, schedule, length, reverse
        self.axis, self.place = axis, place
        self.lps = schedule.block(length)  # the layers of one block
        cb = [b for b in carry_batch if b is not None]
        if len(cb) != len(carry_batch):
            raise ValueError("every carry of a pipelined loop needs a batch dim")
        self.const_batch, self.carry_batch, self.xs_batch, self.ys_batch = const_batch, cb, xs_batch, ys_batch
        S, M = schedule.stages, schedule.microbatches
        self.consts = [c if b is None else _split(c, b, M) for c, b in zip(consts, const_batch)]
        self.xs = [self.stacked(x, b, k) for x, b, k in zip(xs, xs_batch, xs_skewed)]
        self.carry = [_split(c, b, M) for c, b in zip(carry, cb)]
        self.stage_id = jnp.arange(S)
        self.pos = schedule.position(self.stage_id, reverse)
        # the stage a microbatch enters at and leaves from, and the way the activations rotate
        self.first, self.last = (S - 1, 0) if reverse else (0, S - 1)
        self.shift = -1 if reverse else 1
        self.run_stages = jax.vmap(self.stage, in_axes=(None, 0, 0, 0), spmd_axis_name=axis)

    # -- the hooks of a schedule kind

    @abc.abstractmethod
    def stacked(self, x, b: Batch, done: bool) -> Any:
        """A stacked operand ``[L, ...]`` (``b``: its per-layer batch dim) laid out over the
        stages, its stage dim placed on the stage axis; a per-row one skewed unless ``done``
        says it is already (a forward loop's residual)."""

    @abc.abstractmethod
    def layer_operand(self, x, rounds: Rounds) -> Any:
        """Every stage's layers of a per-layer stacked operand (no batch) at a tick."""

    @abc.abstractmethod
    def layer_buffer(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of the buffer of a per-layer result whose one tick has ``shape``."""

    @abc.abstractmethod
    def per_layer(self, buf, y, valid, summed: bool, t, i) -> Any:
        """A per-layer result's buffer with this tick's ``y`` added (``summed``) or kept, on
        the stages ``valid`` says (``t``: the tick, ``i``: each stage's iteration)."""

    @abc.abstractmethod
    def held(self, out_buf: list) -> list:
        """The buffers of the last stage's outputs kept on the first stage for their next
        round, at the start (empty where there is one round)."""

    @abc.abstractmethod
    def resumed(self, a, held, b: int, is_first, t) -> Any:
        """A carry's activation ``a`` at tick ``t`` before its new microbatch enters: the
        first stage's taken from ``held`` where a microbatch starts its next round."""

    @abc.abstractmethod
    def hold(self, held: list, act: list, is_first, out_i) -> list:
        """``held`` once the activations have moved on: the first stage now holds the last
        stage's output of its iteration ``out_i``."""

    @abc.abstractmethod
    def row_result(self, y, b: int) -> Any:
        """A per-row result's buffer as the loop returns it (``b``: its per-layer batch dim)."""

    @abc.abstractmethod
    def layer_result(self, y) -> Any:
        """A per-layer result's buffer as the loop returns it, ``[L, ...]``."""

    @staticmethod
    @abc.abstractmethod
    def unskew(y, b: int, schedule: Schedule) -> Any:
        """``unskew`` on this schedule."""

    # -- the tick loop

    def on_stage(self, x):
        """``x`` with its leading (stage) dim over the stage axis, the rest left to the partitioner."""
        return self.place(x, PartitionSpec(self.axis, *([PartitionSpec.UNCONSTRAINED] * (x.ndim - 1))))

    def skew(self, per_stage, dim: int):
        """[S, ...] per-stage copies, iteration dim ``dim`` of each (after the stage dim)
        rolled by its stage: slot u of stage s holds iteration (u - s) mod RM."""
        return self.on_stage(jnp.stack([jnp.roll(per_stage[s], s, axis=dim) for s in range(self.schedule.stages)]))

    def stage(self, cs, c, x_stage, m):
        """One stage's layers, in order, on its microbatch ``m`` (the consts, small and whole
        on every stage, indexed by ``m`` itself; the stacked operands come sliced)."""
        cs = [c_ if b is None else _pick(c_, b, m) for c_, b in zip(cs, self.const_batch)]
        return lax.scan(lambda c_, x_: self.body(cs, c_, x_), c, x_stage, length=self.lps, reverse=self.reverse)

    def rounds(self, t, i) -> Rounds:
        """The two rounds' blocks tick ``t`` may hold and which each stage (at its iteration
        ``i``) is in: the stages' rounds differ by at most one at a tick."""
        q = self.schedule.round(t)
        return (q, q - 1), (self.schedule.round(i) == q)

    def sliced(self, t, j, i) -> list:
        """Every stage's stacked operands at tick ``t``: slot ``j``, its round's layers."""
        rounds = self.rounds(t, i)
        return [_pick(x, b + 2, j) if b is not None else self.layer_operand(x, rounds)
                for x, b in zip(self.xs, self.xs_batch)]

    def buffers(self) -> tuple[list, list, list, list]:
        """The tick loop's first state: the activations, the results' buffers (one tick's
        results give their shapes), the final carries' and the held outputs'."""
        S, N = self.schedule.stages, self.schedule.slots
        act0 = [self.on_stage(jnp.broadcast_to(_pick(c, b, 0)[None], (S, *_pick(c, b, 0).shape)))
                for c, b in zip(self.carry, self.carry_batch)]
        zero = jnp.zeros((), jnp.int32)
        _, ys_shape = jax.eval_shape(lambda: self.run_stages(
            self.consts, act0, self.sliced(zero, zero, jnp.zeros((S,), jnp.int32)), jnp.zeros((S,), jnp.int32)))
        ys_buf = [self.on_stage(jnp.zeros((*y.shape[:3 + b], N, *y.shape[3 + b:]) if isinstance(b, int) else
                                          self.layer_buffer(y.shape), y.dtype))
                  for y, b in zip(ys_shape, self.ys_batch)]
        out_buf = [self.on_stage(jnp.zeros((S, *c.shape), c.dtype)) for c in self.carry]
        return act0, ys_buf, out_buf, self.held(out_buf)

    def tick(self, state, t):
        """Tick ``t``: every stage runs its layers on its iteration's microbatch, writes its
        results at its slot, and hands its activation to the next stage."""
        act, ys_b, out_b, held = state
        sch, reverse = self.schedule, self.reverse
        S, M, R, N = sch.stages, sch.microbatches, sch.repeats, sch.slots
        i = t - self.pos  # each stage's iteration
        valid = (i >= 0) & (i < N)
        m = jnp.clip(sch.microbatch(i % M, reverse), 0, M - 1)  # each stage's microbatch
        j = sch.slot(t, reverse)  # every stage's slot
        enter = jnp.clip(sch.microbatch(t, reverse), 0, M - 1)  # the microbatch entering the first stage
        is_first = self.stage_id == self.first
        act = [jnp.where(_per_stage(is_first & (t < M), a), _pick(c, b, enter)[None].astype(a.dtype),
                         self.resumed(a, h, b, is_first, t))
               for a, c, b, h in zip(act, self.carry, self.carry_batch, held or act)]
        new, ys = self.run_stages(self.consts, act, self.sliced(t, j, i), m)
        new = [self.on_stage(a) for a in new]
        ys_b = [_put(buf, b + 1, j, y, valid) if isinstance(b, int) else self.per_layer(buf, y, valid, b == SUM, t, i)
                for buf, y, b in zip(ys_b, ys, self.ys_batch)]
        # the last stage's iteration; its microbatch leaves after its last round
        out_i = t - (S - 1)
        leave = jnp.clip(sch.microbatch(out_i - (R - 1) * M, reverse), 0, M - 1)
        done = valid & (self.stage_id == self.last) & (sch.round(i) == R - 1)
        out_b = [_put(buf, b, leave, y, done) for buf, y, b in zip(out_b, new, self.carry_batch)]
        act = [self.on_stage(jnp.roll(a, self.shift, axis=0)) for a in new]  # to the next stage
        held = self.hold(held, act, is_first, out_i)
        return (act, [self.on_stage(y) for y in ys_b], [self.on_stage(o) for o in out_b], held), None

    def scan(self) -> tuple[list, list]:
        """The loop's final carry and stacked results (``pipelined_scan``)."""
        (_, ys_b, out_b, _), _ = lax.scan(self.tick, self.buffers(), jnp.arange(self.schedule.ticks))
        carry_out = [_merge(o[self.last], b) for o, b in zip(out_b, self.carry_batch)]
        ys = [self.row_result(y, b) if isinstance(b, int) else self.layer_result(y)
              for y, b in zip(ys_b, self.ys_batch)]
        return carry_out, ys


class _GPipe(_Loop):
    """GPipe's fill and drain: stage ``s`` holds one block of layers (``[S, L/S, ...]``) and
    runs every microbatch once."""

    def stacked(self, x, b, done):
        x = x if b is None else _split(x, b + 1, self.schedule.microbatches)
        x = self.on_stage(x.reshape(self.schedule.stages, self.lps, *x.shape[1:]))
        return x if b is None or done else self.skew(x, b + 2)

    def layer_operand(self, x, rounds):
        return x

    def layer_buffer(self, shape):
        return shape

    def per_layer(self, buf, y, valid, summed, t, i):
        return buf + jnp.where(_per_stage(valid, y), y, jnp.zeros_like(y)) if summed else \
            jnp.where(_per_stage(valid, y), y, buf)

    def held(self, out_buf):
        return []

    def resumed(self, a, held, b, is_first, t):
        return a

    def hold(self, held, act, is_first, out_i):
        return held

    def row_result(self, y, b):
        return _merge(y, b + 2).reshape(self.length, *y.shape[2:b + 2], -1, *y.shape[b + 4:])

    def layer_result(self, y):
        return y.reshape(self.length, *y.shape[2:])

    @staticmethod
    def unskew(y, b, schedule):
        S, M = schedule.stages, schedule.microbatches
        x = _split(y, b + 1, M)
        x = x.reshape(S, x.shape[0] // S, *x.shape[1:])
        x = jnp.stack([jnp.roll(x[s], -s, axis=b + 2) for s in range(S)])
        return _merge(x.reshape(y.shape[0], *x.shape[2:]), b + 1)


class _Circular(_Loop):
    """The circular schedule: stage ``s`` holds blocks ``s, S+s, 2S+s, ...`` of the layers
    (``[S, R, L/(RS), ...]``; a per-row operand ``[S, L/(RS), ..., B/M, RM, ...]``, its
    rounds beside its microbatches, slot ``r*M + m``): the stacked operands' layer dim is
    regrouped so on entry (an all-to-all over the stage axis) and back for the results. Every
    microbatch passes the stages R times, the last stage's output held on the first stage
    until that microbatch's next round (M >= S: it is back before it is needed). A per-layer
    operand is read, and a per-layer result written, at the two rounds a tick may hold (each
    one scalar slice), each stage taking its own."""

    def stacked(self, x, b, done):
        S, M, R = self.schedule.stages, self.schedule.microbatches, self.schedule.repeats
        if b is not None and done:  # a forward loop's residual: in the stages' layout already
            return self.on_stage(x)
        x = x if b is None else _split(x, b + 1, M)
        if b is None:
            return self.on_stage(jnp.swapaxes(x.reshape(R, S, self.lps, *x.shape[1:]), 0, 1))
        x = jnp.moveaxis(x.reshape(R, S, self.lps, *x.shape[1:]), 0, b + 3)  # the rounds beside the microbatches
        return self.skew(self.on_stage(_merge(x, b + 3)), b + 2)

    def block_round(self, q):
        """The layer blocks' round that iteration round ``q`` runs (a reverse loop runs them
        backwards), clipped to the rounds there are."""
        R = self.schedule.repeats
        return jnp.clip(R - 1 - q if self.reverse else q, 0, R - 1)

    def layer_operand(self, x, rounds):
        (q0, q1), at0 = rounds
        a0, a1 = (lax.dynamic_index_in_dim(x, self.block_round(q), 1, keepdims=False) for q in (q0, q1))
        return jnp.where(_per_stage(at0, a0), a0, a1)

    def layer_buffer(self, shape):
        return (self.schedule.stages, self.schedule.repeats, *shape[1:])

    def per_layer(self, buf, y, valid, summed, t, i):
        (q0, q1), at0 = self.rounds(t, i)
        for q, here in ((q0, at0), (q1, ~at0)):
            k = self.block_round(q)
            old = lax.dynamic_index_in_dim(buf, k, 1, keepdims=False)
            mask = _per_stage(valid & here, y)
            buf = lax.dynamic_update_index_in_dim(
                buf, old + jnp.where(mask, y, jnp.zeros_like(y)) if summed else jnp.where(mask, y, old), k, 1)
        return buf

    def held(self, out_buf):
        return out_buf

    def resumed(self, a, held, b, is_first, t):
        M = self.schedule.microbatches
        return jnp.where(_per_stage(is_first, a), _pick(held, b + 1, t % M).astype(a.dtype), a)

    def hold(self, held, act, is_first, out_i):
        M, N = self.schedule.microbatches, self.schedule.slots
        again = is_first & (out_i >= 0) & (out_i + M < N)
        return [self.on_stage(_put(buf, b, out_i % M, a, again)) for buf, a, b in zip(held, act, self.carry_batch)]

    def row_result(self, y, b):
        return y  # the stages' layout, as the backward loop reads it

    def layer_result(self, y):
        return jnp.swapaxes(y, 0, 1).reshape(self.length, *y.shape[3:])

    @staticmethod
    def unskew(y, b, schedule):
        S, M, R = schedule.stages, schedule.microbatches, schedule.repeats
        x = jnp.stack([jnp.roll(y[s], -s, axis=b + 2) for s in range(S)])  # [S, k, ..., B/M, RM, ...]
        x = x.reshape(*x.shape[:b + 3], R, M, *x.shape[b + 4:])  # [S, k, ..., B/M, R, M, ...]
        x = jnp.moveaxis(x, b + 3, 0)  # [R, S, k, ..., B/M, M, ...]
        x = x.reshape(-1, *x.shape[3:])
        return _merge(x, b + 1)


# the tick loop of each schedule kind (``Schedule.kind``)
_LOOPS: dict[str, type[_Loop]] = {"gpipe": _GPipe, "circular": _Circular}


@dataclasses.dataclass(frozen=True)
class PipelineRun:
    """How apply runs a layer stack's two loops: ``stages`` stages over mesh axis ``axis``,
    ``microbatches`` microbatches, GPipe's schedule (``repeats`` > 1: the circular one)."""

    stack: PipelineStack
    axis: str
    stages: int
    microbatches: int
    repeats: int = 1
