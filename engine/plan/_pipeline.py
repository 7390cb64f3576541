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
                   constrain: Callable | None = None, repeats: int = 1) -> tuple[list, list]:
    """``lax.scan(lambda c, x: body(consts, c, x), carry, xs, length=length, reverse=reverse)``
    as a pipeline of ``stages`` stages over mesh axis ``axis`` and ``microbatches``
    microbatches (module docstring). ``*_batch``: each leaf's batch dim (per layer: a stacked
    leaf's dim in one layer's slice), None where it has none; every carry has one; a result
    without one that sums over the batch is ``SUM``. ``xs_skewed``: the stacked operands
    already in the stages' skewed order (a forward pipeline's stacked results: below).
    ``constrain(x, spec)``: how a value is placed (default: ``with_sharding_constraint`` under
    the context mesh); the stage dim of every per-stage value is placed on ``axis``.
    Returns (final carry, stacked ys) as lists.

    ``repeats`` R > 1: the circular schedule (MaxText's ``num_pipeline_repeats``): the layers
    split into R*S blocks, stage ``s`` holding blocks ``s, S+s, 2S+s, ...`` (the stacked
    operands' layer dim regrouped so on entry: an all-to-all over the stage axis, and back
    for the results); every microbatch passes the stages R times, the last stage's output
    held on the first stage until that microbatch's next round (M >= S: it is back before it
    is needed). R*M + S - 1 ticks: a bubble of (S-1)/(R*M+S-1).

    Every index a tick takes is one scalar for all stages (a dynamic slice XLA keeps local,
    where a per-stage index would be a gather it partitions by gathering the operand): the
    per-row operands and results of stage ``s`` are held *skewed*, its slot ``u`` holding
    iteration ``(u - s) mod RM`` (iteration ``r*M + m``: microbatch ``m`` in round ``r``). At
    tick ``t`` every stage reads and writes slot ``t mod RM`` (a ``reverse`` loop, whose
    iterations go in the other order: ``(RM+S-2-t) mod RM``), which is each stage's own
    iteration in both directions. A forward loop's per-row results (its residuals) come back
    skewed, as the backward loop reads them (with R > 1 in the stages' own layout,
    ``[S, L/(RS), ..., B/M, RM, ...]``: ``unskew`` puts them in the loop's order); any other
    per-row stacked operand is skewed on the way in. The rounds of the stages differ by at
    most one at a tick: a per-layer operand is read, and a per-layer result written, at the
    two rounds a tick may hold (each one scalar slice), each stage taking its own. The consts
    (a mask, positions: small, whole on every stage) are indexed by each stage's
    microbatch."""
    S, M, L, R = stages, microbatches, length, repeats
    if L % (S * R):
        raise ValueError(f"{L} layers do not split into {S} stages" + (f" of {R} rounds" if R > 1 else ""))
    if R > 1 and M < S:
        raise ValueError(f"a circular pipeline needs at least as many microbatches as stages ({M} < {S})")
    cb = [b for b in carry_batch if b is not None]
    if len(cb) != len(carry_batch):
        raise ValueError("every carry of a pipelined loop needs a batch dim")
    lps = L // (S * R)
    N = R * M  # iterations a stage runs
    skewed = list(xs_skewed) if xs_skewed is not None else [False] * len(xs)
    place = constrain if constrain is not None else lax.with_sharding_constraint

    def on_stage(x):  # the leading (stage) dim over the stage axis, the rest left to the partitioner
        return place(x, PartitionSpec(axis, *([PartitionSpec.UNCONSTRAINED] * (x.ndim - 1))))

    def skew(per_stage, dim):
        """[S, ...] per-stage copies, iteration dim ``dim`` of each (after the stage dim)
        rolled by its stage: slot u of stage s holds iteration (u - s) mod RM."""
        return on_stage(jnp.stack([jnp.roll(per_stage[s], s, axis=dim) for s in range(S)]))

    consts = [c if b is None else _split(c, b, M) for c, b in zip(consts, const_batch)]

    def by_stage(x, b, done):
        """[L, ...] -> [S, L/S, ...] (R > 1: [S, R, L/(RS), ...]; a per-row leaf:
        [S, L/(RS), ..., B/M, RM, ...]), skewed unless ``done``."""
        if b is not None and done and R > 1:  # a forward loop's residual: in the stages' layout already
            return on_stage(x)
        x = x if b is None else _split(x, b + 1, M)
        if R == 1:
            x = on_stage(x.reshape(S, lps, *x.shape[1:]))
        elif b is None:
            x = on_stage(jnp.swapaxes(x.reshape(R, S, lps, *x.shape[1:]), 0, 1))
        else:  # the rounds beside the microbatches: slot r*M + m
            x = jnp.moveaxis(x.reshape(R, S, lps, *x.shape[1:]), 0, b + 3)
            x = on_stage(_merge(x, b + 3))
        return x if b is None or done else skew(x, b + 2)

    xs_st = [by_stage(x, b, k) for x, b, k in zip(xs, xs_batch, skewed)]
    carry_in = [_split(c, b, M) for c, b in zip(carry, cb)]
    stage_id = jnp.arange(S)
    # a stage's place in the pipeline, the stage a microbatch enters at and leaves from
    pos = S - 1 - stage_id if reverse else stage_id
    first, last = (S - 1, 0) if reverse else (0, S - 1)
    shift = -1 if reverse else 1

    def micro(u):  # the microbatch of a round's iteration u (the first stage's at tick u)
        return M - 1 - u if reverse else u

    def round_of(q):  # the layer blocks' round of iteration block q (a reverse loop runs them backwards)
        return jnp.clip(R - 1 - q if reverse else q, 0, R - 1)

    def stage(cs, c, x_stage, m):
        """One stage's layers, in order, on its microbatch ``m`` (the consts, small and whole
        on every stage, indexed by ``m`` itself; the stacked operands come sliced)."""
        cs = [c_ if b is None else _pick(c_, b, m) for c_, b in zip(cs, const_batch)]
        return lax.scan(lambda c_, x_: body(cs, c_, x_), c, x_stage, length=lps, reverse=reverse)

    run = jax.vmap(stage, in_axes=(None, 0, 0, 0), spmd_axis_name=axis)

    def _per_stage(v, y):  # a per-stage flag broadcast against a per-stage value
        return v.reshape(S, *[1] * (y.ndim - 1))

    def rounds(t, i):
        """The two rounds' blocks a tick may hold (scalars) and which each stage is in."""
        q = t // M
        return (q, q - 1), (i // M == q)

    def sliced(t, j, i):  # every stage's stacked operands at tick t: slot j, its round's layers
        (q0, q1), at0 = rounds(t, i)
        out = []
        for x_, b in zip(xs_st, xs_batch):
            if b is not None:
                out.append(_pick(x_, b + 2, j))
            elif R == 1:
                out.append(x_)
            else:
                a0, a1 = (lax.dynamic_index_in_dim(x_, round_of(q), 1, keepdims=False) for q in (q0, q1))
                out.append(jnp.where(_per_stage(at0, a0), a0, a1))
        return out

    # one tick's results, to learn the shapes of the buffers
    act0 = [on_stage(jnp.broadcast_to(_pick(c, b, 0)[None], (S, *_pick(c, b, 0).shape)))
            for c, b in zip(carry_in, cb)]
    zero = jnp.zeros((), jnp.int32)
    _, ys_shape = jax.eval_shape(lambda: run(consts, act0, sliced(zero, zero, jnp.zeros((S,), jnp.int32)),
                                             jnp.zeros((S,), jnp.int32)))
    ys_buf = [on_stage(jnp.zeros((*y.shape[:3 + b], N, *y.shape[3 + b:]) if isinstance(b, int) else
                                 y.shape if R == 1 else (S, R, *y.shape[1:]), y.dtype))
              for y, b in zip(ys_shape, ys_batch)]
    out_buf = [on_stage(jnp.zeros((S, *c.shape), c.dtype)) for c in carry_in]
    back_buf = out_buf if R > 1 else []  # the last stage's output, on the first stage till its next round

    def put(buf, dim: int, k, y, valid):
        """``buf`` ([S, ...]) with slot ``k`` (a scalar) of its dim ``dim + 1`` (the microbatch
        dim of each stage's ``[..., dim]`` rows) set to ``y`` on the stages ``valid`` says."""
        old = lax.dynamic_index_in_dim(buf, k, dim + 2, keepdims=False)
        return lax.dynamic_update_index_in_dim(buf, jnp.where(_per_stage(valid, y), y, old), k, dim + 2)

    def per_layer(buf, y, valid, summed, t, i):
        """A per-layer result's buffer with this tick's ``y`` added (``summed``) or kept, on
        the stages ``valid`` says, at each stage's round."""
        if R == 1:
            return buf + jnp.where(_per_stage(valid, y), y, jnp.zeros_like(y)) if summed else \
                jnp.where(_per_stage(valid, y), y, buf)
        (q0, q1), at0 = rounds(t, i)
        for q, here in ((q0, at0), (q1, ~at0)):
            k = round_of(q)
            old = lax.dynamic_index_in_dim(buf, k, 1, keepdims=False)
            mask = _per_stage(valid & here, y)
            buf = lax.dynamic_update_index_in_dim(
                buf, old + jnp.where(mask, y, jnp.zeros_like(y)) if summed else jnp.where(mask, y, old), k, 1)
        return buf

    def tick(state, t):
        act, ys_b, out_b, back_b = state
        i = t - pos  # each stage's iteration
        valid = (i >= 0) & (i < N)
        m = jnp.clip(micro(i % M), 0, M - 1)  # each stage's microbatch
        j = (N + S - 2 - t) % N if reverse else t % N  # every stage's slot
        enter = jnp.clip(micro(t), 0, M - 1)
        is_first = stage_id == first
        act = [jnp.where(_per_stage(is_first & (t < M), a), _pick(c, b, enter)[None].astype(a.dtype),
                         jnp.where(_per_stage(is_first, a), _pick(bb, b + 1, t % M).astype(a.dtype), a)
                         if R > 1 else a)
               for a, c, b, bb in zip(act, carry_in, cb, back_b or act)]
        new, ys = run(consts, act, sliced(t, j, i), m)
        new = [on_stage(a) for a in new]
        ys_b = [put(buf, b + 1, j, y, valid) if isinstance(b, int) else per_layer(buf, y, valid, b == SUM, t, i)
                for buf, y, b in zip(ys_b, ys, ys_batch)]
        # the last stage's iteration; its microbatch leaves after its last round
        out_i = t - (S - 1)
        leave = jnp.clip(micro(out_i - (R - 1) * M), 0, M - 1)
        done = valid & (stage_id == last) & (i // M == R - 1)
        out_b = [put(buf, b, leave, y, done) for buf, y, b in zip(out_b, new, cb)]
        act = [on_stage(jnp.roll(a, shift, axis=0)) for a in new]  # to the next stage
        if R > 1:  # the first stage now holds the last stage's output: kept for its next round
            again = is_first & (out_i >= 0) & (out_i + M < N)
            back_b = [on_stage(put(buf, b, out_i % M, a, again)) for buf, a, b in zip(back_b, act, cb)]
        return (act, [on_stage(y) for y in ys_b], [on_stage(o) for o in out_b], back_b), None

    (_, ys_b, out_b, _), _ = lax.scan(tick, (act0, ys_buf, out_buf, back_buf), jnp.arange(N + S - 1))
    carry_out = [_merge(o[last], b) for o, b in zip(out_b, cb)]
    ys = []
    for y, b in zip(ys_b, ys_batch):
        if isinstance(b, int):
            ys.append(_merge(y, b + 2).reshape(L, *y.shape[2:b + 2], -1, *y.shape[b + 4:]) if R == 1
                      else y)  # R > 1: the stages' layout, as the backward loop reads it
        else:
            ys.append(y.reshape(L, *y.shape[2:]) if R == 1 else jnp.swapaxes(y, 0, 1).reshape(L, *y.shape[3:]))
    return carry_out, ys


def unskew(y, b: int, stages: int, microbatches: int, repeats: int = 1):
    """A pipelined loop's stacked per-row result (``[L, ...]``, its rows at per-layer dim
    ``b`` in the stages' skewed order; with ``repeats`` > 1 in the stages' layout
    ``[S, L/(RS), ..., B/M, RM, ...]``) in the loop's own layer and row order."""
    S, M, R = stages, microbatches, repeats
    if R > 1:
        x = jnp.stack([jnp.roll(y[s], -s, axis=b + 2) for s in range(S)])  # [S, k, ..., B/M, RM, ...]
        x = x.reshape(*x.shape[:b + 3], R, M, *x.shape[b + 4:])  # [S, k, ..., B/M, R, M, ...]
        x = jnp.moveaxis(x, b + 3, 0)  # [R, S, k, ..., B/M, M, ...]
        x = x.reshape(-1, *x.shape[3:])
        return _merge(x, b + 1)
    x = _split(y, b + 1, M)
    x = x.reshape(S, x.shape[0] // S, *x.shape[1:])
    x = jnp.stack([jnp.roll(x[s], -s, axis=b + 2) for s in range(S)])
    return _merge(x.reshape(y.shape[0], *x.shape[2:]), b + 1)


@dataclasses.dataclass(frozen=True)
class PipelineRun:
    """How apply runs a layer stack's two loops: ``stages`` stages over mesh axis ``axis``,
    ``microbatches`` microbatches, GPipe's schedule (``repeats`` > 1: the circular one)."""

    stack: PipelineStack
    axis: str
    stages: int
    microbatches: int
    repeats: int = 1
