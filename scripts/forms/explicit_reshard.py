"""A training step in jax's explicit sharding mode: the mesh's axes are ``AxisType.Explicit``
(the default of ``jax.make_mesh``), the arguments are placed with ``NamedSharding``s, each
matmul says its result's sharding (``jnp.einsum(..., out_sharding=P(...))``) and the residual
stream is moved back with ``jax.sharding.reshard``; optax's Adam.

Two residual MLP layers (Megatron over `model`: ``w_in`` column-, ``w_out`` row-sharded), the
batch over `data`, on the mesh data=4,model=2. The step uses bare ``P(...)``s, so it is traced
and run under the mesh as the user runs it: ``with jax.set_mesh(mesh): jax.jit(step)(*args)``
(``mesh(args)`` gives it). partex traces it under the arguments' mesh itself.

    partex analyze scripts/forms/explicit_reshard.py:make
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

MESH = "data=4,model=2"
SIZES = {"tiny": dict(batch=16, seq=8, d_model=32, d_ff=64)}


def mesh(args=None):
    """The step's explicit mesh (that of its arguments where given)."""
    if args is not None:
        return jax.tree.leaves(args)[0].sharding.mesh
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


def make(layers: int = 2, size: str = "tiny"):
    """(train_step, (params, opt_state, batch)): arguments placed on the explicit mesh;
    run the step under ``jax.set_mesh(mesh(args))``."""
    c = SIZES[size]
    m = mesh()
    optimizer = optax.adam(1e-3)

    def put(x, *spec):
        return jax.device_put(x, NamedSharding(m, P(*spec)))

    ks = jax.random.split(jax.random.key(0), 2 * layers + 2)
    d, f = c["d_model"], c["d_ff"]
    params = {"layers": [{"w_in": put(jax.random.normal(ks[2 * i], (d, f)) / d ** 0.5, None, "model"),
                          "w_out": put(jax.random.normal(ks[2 * i + 1], (f, d)) / f ** 0.5, "model", None)}
                         for i in range(layers)]}
    shape = (c["batch"], c["seq"], d)
    batch = {"x": put(jax.random.normal(ks[-2], shape), "data", None, None),
             "y": put(jax.random.normal(ks[-1], shape), "data", None, None)}
    with jax.set_mesh(m):
        opt_state = jax.jit(optimizer.init)(params)

    def loss_fn(params, batch):
        h = batch["x"]
        for layer in params["layers"]:
            a = jnp.einsum("btd,df->btf", h, layer["w_in"], out_sharding=P("data", None, "model"))
            a = jax.nn.gelu(a)
            y = jnp.einsum("btf,fd->btd", a, layer["w_out"], out_sharding=P("data", None, None))
            h = jax.sharding.reshard(h + y, P("data", None, None))
        return jnp.mean((h - batch["y"]) ** 2)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step, (params, opt_state, batch)
