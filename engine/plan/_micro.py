"""A ``custom_partitioning`` op of a pipeline stage, bound for the rows the stage runs.

A pipelined stage runs its layers on one microbatch, and every stage at once (``jax.vmap``
over the stage dim, ``_pipelined_scan.pipelined_scan``). An op whose params size the batch is
re-bound with the microbatch's sizes (``analysis._pipeline_stacks``'s ``resize``), but a
``custom_partitioning`` op carries its function traced at the whole batch (``call``: a
kernel's grid follows the batch) and has no batching rule. ``bind_rows`` binds it again at
the rows it is given, every stage's merged into its batch dim (stage-major: the merged dim
keeps the stage axis's sharding outermost, each stage's rows where they are):

- the function is traced again at those shapes from what the op's own ``partition`` callback
  returns on a mesh of one device with every operand replicated -- the lowering it gives
  for a shard that holds the whole operand, which is the op itself (``custom_partitioning``'s
  contract: ``partition`` returns the function each device runs on its shard);
- under the stages' vmap (``jax.custom_batching.custom_vmap``), the vmapped dim is moved next
  to each operand's batch dim and merged into it, the op bound on the merged rows, and its
  results split back.

The partitioner still partitions the op with its callbacks at the new shapes (the rule is the
same, its batch factor now the stage's rows and the microbatch's). Every operand and result
must hold the batch (the analysis checks it: ``batch`` gives each one's dim).
"""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from jax.custom_batching import custom_vmap
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .._errors import PartexError
from ..tracing._jax import ShapedArray, custom_partitioning_p


def _retraced(params: dict, in_shapes: Sequence[tuple], out_shapes: Sequence[tuple], where: str):
    """The op's function traced at ``in_shapes`` (results ``out_shapes``), from its
    ``partition`` callback on one device (module docstring)."""
    call = params["call"]
    mesh = Mesh(np.array(jax.devices()[:1]), ("_whole",))
    whole = NamedSharding(mesh, PartitionSpec())

    def structs(shapes, avals):
        return [jax.ShapeDtypeStruct(tuple(s), a.dtype, sharding=whole) for s, a in zip(shapes, avals)]

    args = params["in_tree"].unflatten(structs(in_shapes, call.in_avals))
    result = params["out_tree"].unflatten(structs(out_shapes, call.out_avals))
    try:
        _, lower_fn, _, _ = params["partition"](*params["static_args"], mesh, args, result)
        traced = jax.make_jaxpr(lower_fn, axis_env=list(mesh.shape.items()))(*args)
    except Exception as e:  # the user's callback, at shapes it was not written for
        raise PartexError(f"{where}: its custom_partitioning cannot run a pipeline stage's microbatch: its partition "
                          f"callback, asked for {[tuple(s) for s in in_shapes]}, raised {type(e).__name__}: {e}") from e
    got = [tuple(a.shape) for a in traced.out_avals if isinstance(a, ShapedArray)]
    if got != [tuple(s) for s in out_shapes] or traced.consts:
        raise PartexError(f"{where}: its custom_partitioning's function, traced for a microbatch, gives {got}, not "
                          f"{[tuple(s) for s in out_shapes]}: it cannot run in a pipeline stage")
    return traced


def bind_rows(params: dict, args: Sequence, batch: Sequence[int], where: str) -> list:
    """The ``custom_partitioning`` op of ``params`` bound on ``args`` (module docstring);
    ``batch``: the batch dim of each operand, then of each result."""
    call = params["call"]
    n_in = len(call.in_avals)
    b_in, b_out = tuple(batch[:n_in]), tuple(batch[n_in:])

    def at(*xs):
        rows = xs[0].shape[b_in[0]]
        was = call.in_avals[0].shape[b_in[0]]
        outs = [tuple(rows if d == b else n for d, n in enumerate(a.shape)) for a, b in zip(call.out_avals, b_out)]
        if rows == was:
            new = call
        else:
            new = _retraced(params, [x.shape for x in xs], outs, where)
        return custom_partitioning_p.bind(*xs, **{**params, "call": new})

    op = custom_vmap(at)

    @op.def_vmap
    def merged(axis_size, in_batched, *xs):
        flat = []
        for x, on, b in zip(xs, in_batched, b_in):
            if not on:
                x = jax.numpy.broadcast_to(x, (axis_size, *x.shape))
            x = jax.numpy.moveaxis(x, 0, b)  # [..., S, rows, ...]
            flat.append(x.reshape(*x.shape[:b], x.shape[b] * x.shape[b + 1], *x.shape[b + 2:]))
        outs = at(*flat)  # (the stages' vmap is the only one: no other batching to hand on)
        split = []
        for y, b in zip(outs, b_out):
            y = y.reshape(*y.shape[:b], axis_size, y.shape[b] // axis_size, *y.shape[b + 1:])
            split.append(jax.numpy.moveaxis(y, b, 0))
        return split, [True] * len(split)

    return list(op(*args))
