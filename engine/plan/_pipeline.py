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
- GPipe's schedule, fill and drain: ``M + S - 1`` ticks; at tick ``t`` stage ``s`` runs its
  layers (an inner ``scan``) on microbatch ``t - s``, then every stage hands its activation
  to the next (one rotation of the stage dim by one: XLA's collective-permute on the stage
  axis). Ticks where a stage has no microbatch (the bubble) compute on what it holds and
  their results are dropped. A ``reverse`` loop (the backward pass) runs the stages from the
  last to the first.

A result of the body with the batch dim (a residual) is written per microbatch where the
stage made it; one that sums over the batch (a weight's gradient) is summed over the
microbatches; one that does not depend on the batch is kept as any microbatch made it. The loop's final carry is the last stage's, per microbatch. Which operands and
results have a batch dim, and that the body is a sum over the batch where a result has none,
is the caller's to know (the analysis decides which stacks may be pipelined).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec

from ..analysis._pipeline import SUM, PipelineStack

Batch = int | None  # a leaf's batch dim, or None


def _split(x, dim: int, m: int):
    """``x`` with its dim ``dim`` (size B) as ``[B/m, m]``: microbatch k is index k of the new dim ``dim+1``."""
    b = x.shape[dim]
    return x.reshape(*x.shape[:dim], b // m, m, *x.shape[dim + 1:])


def _merge(x, dim: int):
    return x.reshape(*x.shape[:dim], x.shape[dim] * x.shape[dim + 1], *x.shape[dim + 2:])


def _pick(x, dim: int, k):
    """Microbatch ``k`` of a split leaf (``k`` traced; ``dim``: the leaf's batch dim)."""
    return lax.dynamic_index_in_dim(x, k, dim + 1, keepdims=False)


def pipelined_scan(body: Callable, consts: Sequence, carry: Sequence, xs: Sequence, *, length: int,
                   reverse: bool, stages: int, microbatches: int, axis: str,
                   const_batch: Sequence[Batch], carry_batch: Sequence[Batch], xs_batch: Sequence[Batch],
                   ys_batch: Sequence[Batch | str], xs_skewed: Sequence[bool] | None = None,
                   constrain: Callable | None = None) -> tuple[list, list]:
    """``lax.scan(lambda c, x: body(consts, c, x), carry, xs, length=length, reverse=reverse)``
    as a GPipe pipeline of ``stages`` stages over mesh axis ``axis`` and ``microbatches``
    microbatches (module docstring). ``*_batch``: each leaf's batch dim (per layer: a stacked
    leaf's dim in one layer's slice), None where it has none; every carry has one; a result
    without one that sums over the batch is ``SUM``. ``xs_skewed``: the stacked operands
    already in the stages' skewed order (a forward pipeline's stacked results: below).
    ``constrain(x, spec)``: how a value is placed (default: ``with_sharding_constraint`` under
    the context mesh); the stage dim of every per-stage value is placed on ``axis``.
    Returns (final carry, stacked ys) as lists.

    Every index a tick takes is one scalar for all stages (a dynamic slice XLA keeps local,
    where a per-stage index would be a gather it partitions by gathering the operand): the
    per-row operands and results of stage ``s`` are held *skewed*, its slot ``j`` holding
    microbatch ``(j - s) mod M``. At tick ``t`` every stage reads and writes slot ``t mod M``
    (a ``reverse`` loop, whose microbatches go in the other order: ``(M+S-2-t) mod M``), which
    is each stage's own microbatch in both directions. A forward loop's per-row results (its
    residuals) come back skewed, as the backward loop reads them; any other per-row stacked
    operand is skewed on the way in. The consts (a mask, positions: small, whole on every
    stage) are indexed by each stage's microbatch."""
    S, M, L = stages, microbatches, length
    if L % S:
        raise ValueError(f"{L} layers do not split into {S} stages")
    cb = [b for b in carry_batch if b is not None]
    if len(cb) != len(carry_batch):
        raise ValueError("every carry of a pipelined loop needs a batch dim")
    lps = L // S
    skewed = list(xs_skewed) if xs_skewed is not None else [False] * len(xs)
    place = constrain if constrain is not None else lax.with_sharding_constraint

    def on_stage(x):  # the leading (stage) dim over the stage axis, the rest left to the partitioner
        return place(x, PartitionSpec(axis, *([PartitionSpec.UNCONSTRAINED] * (x.ndim - 1))))

    def skew(per_stage, dim):
        """[S, ...] per-stage copies, microbatch dim ``dim`` of each (after the stage dim)
        rolled by its stage: slot j of stage s holds microbatch (j - s) mod M."""
        return on_stage(jnp.stack([jnp.roll(per_stage[s], s, axis=dim) for s in range(S)]))

    consts = [c if b is None else _split(c, b, M) for c, b in zip(consts, const_batch)]

    def by_stage(x, b, done):  # [L, ...] -> [S, L/S, ...], the batch (if any) split in place and skewed
        x = x if b is None else _split(x, b + 1, M)
        x = on_stage(x.reshape(S, lps, *x.shape[1:]))
        return x if b is None or done else skew(x, b + 2)

    xs_st = [by_stage(x, b, k) for x, b, k in zip(xs, xs_batch, skewed)]
    carry_in = [_split(c, b, M) for c, b in zip(carry, cb)]
    stage_id = jnp.arange(S)
    # a stage's place in the pipeline, the stage a microbatch enters at and leaves from
    pos = S - 1 - stage_id if reverse else stage_id
    first, last = (S - 1, 0) if reverse else (0, S - 1)
    shift = -1 if reverse else 1

    def micro(u):  # the microbatch the first stage takes at tick u (the last stage at u + S - 1)
        return M - 1 - u if reverse else u

    def stage(cs, c, x_stage, m):
        """One stage's layers, in order, on its microbatch ``m`` (the consts, small and whole
        on every stage, indexed by ``m`` itself; the stacked operands come sliced)."""
        cs = [c_ if b is None else _pick(c_, b, m) for c_, b in zip(cs, const_batch)]
        return lax.scan(lambda c_, x_: body(cs, c_, x_), c, x_stage, length=lps, reverse=reverse)

    run = jax.vmap(stage, in_axes=(None, 0, 0, 0), spmd_axis_name=axis)

    def sliced(j):  # every stage's slot j of the stacked operands ([S, L/S, ...] each: a dynamic slice)
        return [x_ if b is None else _pick(x_, b + 2, j) for x_, b in zip(xs_st, xs_batch)]

    def _per_stage(v, y):  # a per-stage flag broadcast against a per-stage value
        return v.reshape(S, *[1] * (y.ndim - 1))

    # one tick's results, to learn the shapes of the buffers
    act0 = [on_stage(jnp.broadcast_to(_pick(c, b, 0)[None], (S, *_pick(c, b, 0).shape)))
            for c, b in zip(carry_in, cb)]
    _, ys_shape = jax.eval_shape(run, consts, act0, sliced(0), jnp.zeros((S,), jnp.int32))
    ys_buf = [on_stage(jnp.zeros((*y.shape[:3 + b], M, *y.shape[3 + b:]) if isinstance(b, int) else y.shape,
                                 y.dtype)) for y, b in zip(ys_shape, ys_batch)]
    out_buf = [on_stage(jnp.zeros((S, *c.shape), c.dtype)) for c in carry_in]

    def put(buf, dim: int, k, y, valid):
        """``buf`` ([S, ...]) with slot ``k`` (a scalar) of its dim ``dim + 1`` (the microbatch
        dim of each stage's ``[..., dim]`` rows) set to ``y`` on the stages ``valid`` says."""
        old = lax.dynamic_index_in_dim(buf, k, dim + 2, keepdims=False)
        return lax.dynamic_update_index_in_dim(buf, jnp.where(_per_stage(valid, y), y, old), k, dim + 2)

    def tick(state, t):
        act, ys_b, out_b = state
        m = micro(t - pos)  # each stage's microbatch
        valid = (m >= 0) & (m < M)
        j = (M + S - 2 - t) % M if reverse else t % M  # every stage's slot
        enter = jnp.clip(micro(t), 0, M - 1)
        act = [jnp.where(_per_stage(stage_id == first, a), _pick(c, b, enter)[None].astype(a.dtype), a)
               for a, c, b in zip(act, carry_in, cb)]
        new, ys = run(consts, act, sliced(j), jnp.clip(m, 0, M - 1))
        new = [on_stage(a) for a in new]
        ys_b = [put(buf, b + 1, j, y, valid) if isinstance(b, int) else
                buf + jnp.where(_per_stage(valid, y), y, jnp.zeros_like(y)) if b == SUM else
                jnp.where(_per_stage(valid, y), y, buf)
                for buf, y, b in zip(ys_b, ys, ys_batch)]
        leave = jnp.clip(micro(t - (S - 1)), 0, M - 1)
        done = valid & (stage_id == last)
        out_b = [put(buf, b, leave, y, done) for buf, y, b in zip(out_b, new, cb)]
        act = [on_stage(jnp.roll(a, shift, axis=0)) for a in new]  # to the next stage
        return (act, [on_stage(y) for y in ys_b], [on_stage(o) for o in out_b]), None

    (_, ys_b, out_b), _ = lax.scan(tick, (act0, ys_buf, out_buf), jnp.arange(M + S - 1))
    carry_out = [_merge(o[last], b) for o, b in zip(out_b, cb)]
    ys = [_merge(y, b + 2) if isinstance(b, int) else y for y, b in zip(ys_b, ys_batch)]
    ys = [y.reshape(L, *y.shape[2:]) for y in ys]
    return carry_out, ys


def unskew(y, b: int, stages: int, microbatches: int):
    """A pipelined loop's stacked per-row result (``[L, ...]``, its rows at per-layer dim
    ``b`` in the stages' skewed order) in the loop's own row order."""
    S, M = stages, microbatches
    x = _split(y, b + 1, M)
    x = x.reshape(S, x.shape[0] // S, *x.shape[1:])
    x = jnp.stack([jnp.roll(x[s], -s, axis=b + 2) for s in range(S)])
    return _merge(x.reshape(y.shape[0], *x.shape[2:]), b + 1)


@dataclasses.dataclass(frozen=True)
class PipelineRun:
    """How apply runs a layer stack's two loops: ``stages`` stages over mesh axis ``axis``,
    ``microbatches`` microbatches, GPipe's schedule."""

    stack: PipelineStack
    axis: str
    stages: int
    microbatches: int
