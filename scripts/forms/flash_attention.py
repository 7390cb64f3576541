"""A training step whose attention is JAX's Pallas flash-attention kernels (TPU kernels; off
TPU in Pallas' interpreter) under ``custom_partitioning`` over batch and heads, the llama
demo's ``attention="flash"`` (``demo_models/_flash.py``): the kernels keep the [seq, seq]
scores in their blocks, partex prices the forward kernel by its cost estimate and the two
backward kernels by their bodies, and reads the op's ``sharding_rule``. Two layers
(attention then an MLP, residual); optax's Adam; data=4,model=2.

    partex analyze scripts/forms/flash_attention.py:make
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from partex.demo_models import _flash

MESH = "data=4,model=2"
SIZES = {"tiny": dict(batch=8, seq=128, d_model=64, heads=4, d_ff=128)}


def make(layers: int = 2, size: str = "tiny"):
    """(train_step, (params, opt_state, batch))."""
    c = SIZES[size]
    d, h, f = c["d_model"], c["heads"], c["d_ff"]
    hd = d // h
    optimizer = optax.adam(1e-3)
    ks = iter(jax.random.split(jax.random.key(9), 6 * layers + 2))
    params = {"layers": [{"wq": jax.random.normal(next(ks), (d, h, hd)) / d ** 0.5,
                          "wk": jax.random.normal(next(ks), (d, h, hd)) / d ** 0.5,
                          "wv": jax.random.normal(next(ks), (d, h, hd)) / d ** 0.5,
                          "wo": jax.random.normal(next(ks), (h, hd, d)) / d ** 0.5,
                          "w_in": jax.random.normal(next(ks), (d, f)) / d ** 0.5,
                          "w_out": jax.random.normal(next(ks), (f, d)) / f ** 0.5}
                         for _ in range(layers)]}
    shape = (c["batch"], c["seq"], d)
    batch = {"x": jax.random.normal(next(ks), shape), "y": jax.random.normal(next(ks), shape)}
    opt_state = optimizer.init(params)

    def loss_fn(params, batch):
        x = batch["x"]
        for p in params["layers"]:
            q, k, v = (jnp.einsum("btm,mhd->bhtd", x, p[w]) for w in ("wq", "wk", "wv"))
            a = _flash.attention(q, k, v, causal=True, sm_scale=hd ** -0.5)
            x = x + jnp.einsum("bhtd,hdm->btm", a, p["wo"])
            x = x + jax.nn.gelu(x @ p["w_in"]) @ p["w_out"]
        return jnp.mean((x - batch["y"]) ** 2)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step, (params, opt_state, batch)
