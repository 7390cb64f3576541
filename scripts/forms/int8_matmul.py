"""A training step whose matmuls run in int8, as AQT-style quantised training writes them:
both operands quantised per tensor (scale = max |x| / 127, rounded and clipped to int8), an
int8 x int8 -> int32 ``jax.lax.dot_general(..., preferred_element_type=jnp.int32)``, the int32
result rescaled to float32; the gradients are the straight-through estimator's (a
``jax.custom_vjp`` whose backward pass is the float matmul's). Two residual MLP layers, both
matmuls of each quantised; optax's Adam; the mesh data=4,model=2.

    partex analyze scripts/forms/int8_matmul.py:make
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

MESH = "data=4,model=2"
SIZES = {"tiny": dict(batch=16, seq=8, d_model=32, d_ff=64)}


def quantize(x):
    """x as int8 and its per-tensor scale: x ≈ q * scale."""
    scale = jnp.maximum(jnp.max(jnp.abs(x)), 1e-8) / 127.0
    return jnp.clip(jnp.round(x / scale), -127, 127).astype(jnp.int8), scale


@jax.custom_vjp
def int8_dot(x, w):
    """x [..., k] @ w [k, n] with both operands in int8 and an int32 accumulator."""
    xq, xs = quantize(x)
    wq, ws = quantize(w)
    acc = jax.lax.dot_general(xq, wq, (((x.ndim - 1,), (0,)), ((), ())), preferred_element_type=jnp.int32)
    return acc.astype(jnp.float32) * (xs * ws)


def _int8_dot_fwd(x, w):
    return int8_dot(x, w), (x, w)


def _int8_dot_bwd(residuals, g):
    """Straight-through: the rounding's derivative taken as 1, so the float matmul's gradients."""
    x, w = residuals
    return jnp.einsum("...n,kn->...k", g, w), jnp.einsum("...k,...n->kn", x, g)


int8_dot.defvjp(_int8_dot_fwd, _int8_dot_bwd)


def make(layers: int = 2, size: str = "tiny"):
    """(train_step, (params, opt_state, batch))."""
    c = SIZES[size]
    d, f = c["d_model"], c["d_ff"]
    optimizer = optax.adam(1e-3)
    ks = jax.random.split(jax.random.key(6), 2 * layers + 2)
    params = {"layers": [{"w_in": jax.random.normal(ks[2 * i], (d, f)) / d ** 0.5,
                          "w_out": jax.random.normal(ks[2 * i + 1], (f, d)) / f ** 0.5}
                         for i in range(layers)]}
    shape = (c["batch"], c["seq"], d)
    batch = {"x": jax.random.normal(ks[-2], shape), "y": jax.random.normal(ks[-1], shape)}
    opt_state = optimizer.init(params)

    def loss_fn(params, batch):
        h = batch["x"]
        for layer in params["layers"]:
            h = h + int8_dot(jax.nn.gelu(int8_dot(h, layer["w_in"])), layer["w_out"])
        return jnp.mean((h - batch["y"]) ** 2)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step, (params, opt_state, batch)
