"""A training step with a partially manual ``jax.shard_map``: ``axis_names={"data"}`` makes the
region manual over `data` only, while `model` stays the partitioner's inside it. Each layer is
an MLP with cross-replica batch normalisation, as data-parallel code writes it: the region
holds its `data` shard of the batch, and the hidden activations' mean and variance over the
whole batch are ``jax.lax.pmean``-ed over `data`; the weights enter replicated over `data` and
their hidden dim is free for the plan to put on `model`. Two residual layers; optax's Adam;
the mesh data=4,model=2 with Auto axes.

    partex analyze scripts/forms/partial_manual.py:make
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import optax
from jax.sharding import AxisType, PartitionSpec as P

MESH = "data=4,model=2"
SIZES = {"tiny": dict(batch=16, seq=8, d_model=32, d_ff=64)}


def mesh():
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


def make(layers: int = 2, size: str = "tiny"):
    """(train_step, (params, opt_state, batch))."""
    c = SIZES[size]
    m = mesh()
    d, f = c["d_model"], c["d_ff"]
    optimizer = optax.adam(1e-3)

    @partial(jax.shard_map, mesh=m, in_specs=(P("data"), P(), P(), P(), P()), out_specs=P("data"),
             axis_names={"data"})
    def batch_norm_mlp(x, w_in, gamma, beta, w_out):
        h = jnp.einsum("btd,df->btf", x, w_in)
        mean = jax.lax.pmean(jnp.mean(h, axis=(0, 1)), "data")
        var = jax.lax.pmean(jnp.mean(jnp.square(h - mean), axis=(0, 1)), "data")
        h = (h - mean) * jax.lax.rsqrt(var + 1e-5) * gamma + beta
        return jnp.einsum("btf,fd->btd", jax.nn.relu(h), w_out)

    ks = jax.random.split(jax.random.key(3), 2 * layers + 2)
    params = {"layers": [{"w_in": jax.random.normal(ks[2 * i], (d, f)) / d ** 0.5,
                          "gamma": jnp.ones((f,)), "beta": jnp.zeros((f,)),
                          "w_out": jax.random.normal(ks[2 * i + 1], (f, d)) / f ** 0.5}
                         for i in range(layers)]}
    shape = (c["batch"], c["seq"], d)
    batch = {"x": jax.random.normal(ks[-2], shape), "y": jax.random.normal(ks[-1], shape)}
    opt_state = optimizer.init(params)

    def loss_fn(params, batch):
        h = batch["x"]
        for layer in params["layers"]:
            h = h + batch_norm_mlp(h, layer["w_in"], layer["gamma"], layer["beta"], layer["w_out"])
        return jnp.mean((h - batch["y"]) ** 2)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step, (params, opt_state, batch)
