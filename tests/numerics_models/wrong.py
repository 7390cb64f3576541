"""Wrong sharded runs, to show that verify's numerics catch them: a shard in the wrong place
(``swapped``) and a data-parallel step that never reduces its gradients (``unreduced``)."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import PartitionSpec as P


def swapped(paths: list[str], leaves: list, path: str) -> list:
    """``leaves`` with the two halves of ``path``'s leading dim swapped."""
    out = list(leaves)
    i = paths.index(path)
    x = np.asarray(out[i])
    out[i] = np.concatenate([x[x.shape[0] // 2:], x[:x.shape[0] // 2]])
    return out


def unreduced(step, args, batch_args: int = 1, devices: int = 8) -> list:
    """The output leaves of a ``shard_map`` of ``step`` over ``devices`` that splits the last
    ``batch_args`` arguments along their leading dim and reduces nothing across the shards:
    device 0's result, the step on its own shard of the batch (a data-parallel program without
    its gradient all-reduce)."""
    mesh = jax.make_mesh((devices,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    specs = tuple(P() for _ in range(len(args) - batch_args)) + tuple(P("data") for _ in range(batch_args))
    run = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False))
    return jax.tree_util.tree_leaves(run(*args))
