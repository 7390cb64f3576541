"""A mixture-of-experts step whose expert matmuls are ``jax.lax.ragged_dot`` (tokens sorted by
expert, one group per expert, as MaxText's sparse MoE path and megablox do): top-1 routing,
tokens sorted by their expert, ``ragged_dot`` against the stacked expert weights, unsorted.
XLA:CPU lowers ``ragged_dot`` densely (each group's rows against every expert's weight, a
[groups, tokens, out] temporary); TPU and GPU run a grouped kernel. Two layers; optax's Adam;
data=4,model=2.

    partex analyze scripts/forms/ragged_dot_moe.py:make
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

MESH = "data=4,model=2"
SIZES = {"tiny": dict(tokens=128, d_model=32, experts=4, d_ff=64)}


def make(layers: int = 2, size: str = "tiny"):
    """(train_step, (params, opt_state, batch))."""
    c = SIZES[size]
    d, e, f, n = c["d_model"], c["experts"], c["d_ff"], c["tokens"]
    optimizer = optax.adam(1e-3)
    ks = iter(jax.random.split(jax.random.key(10), 3 * layers + 2))
    params = {"layers": [{"router": jax.random.normal(next(ks), (d, e)) / d ** 0.5,
                          "w_in": jax.random.normal(next(ks), (e, d, f)) / d ** 0.5,
                          "w_out": jax.random.normal(next(ks), (e, f, d)) / f ** 0.5}
                         for _ in range(layers)]}
    batch = {"x": jax.random.normal(next(ks), (n, d)), "y": jax.random.normal(next(ks), (n, d))}
    opt_state = optimizer.init(params)

    def moe(p, x):
        logits = x @ p["router"]
        expert = jnp.argmax(logits, axis=-1)
        gate = jnp.take_along_axis(jax.nn.softmax(logits, axis=-1), expert[:, None], axis=-1)
        order = jnp.argsort(expert)
        xs = x[order]
        sizes = jnp.bincount(expert, length=e).astype(jnp.int32)
        h = jax.nn.gelu(jax.lax.ragged_dot(xs, p["w_in"], sizes))
        ys = jax.lax.ragged_dot(h, p["w_out"], sizes)
        y = jnp.zeros_like(ys).at[order].set(ys)
        return x + gate * y

    def loss_fn(params, batch):
        x = batch["x"]
        for p in params["layers"]:
            x = moe(p, x)
        return jnp.mean((x - batch["y"]) ** 2)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step, (params, opt_state, batch)
