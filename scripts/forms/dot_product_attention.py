"""A training step whose attention is ``jax.nn.dot_product_attention`` (causal, grouped-query:
2 key/value heads for 4 query heads), as flax and keras-hub call it. Off GPU it runs JAX's
XLA implementation (einsums, the [seq, seq] scores in memory), which is what XLA compiles
on CPU and TPU; on a GPU with cuDNN, ``implementation="cudnn"`` is a custom-partitioned
fused kernel. Two layers (attention then an MLP, residual); optax's Adam; data=4,model=2.

    partex analyze scripts/forms/dot_product_attention.py:make
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

MESH = "data=4,model=2"
SIZES = {"tiny": dict(batch=8, seq=64, d_model=32, heads=4, kv_heads=2, d_ff=64)}


def make(layers: int = 2, size: str = "tiny"):
    """(train_step, (params, opt_state, batch))."""
    c = SIZES[size]
    d, h, kv, f = c["d_model"], c["heads"], c["kv_heads"], c["d_ff"]
    hd = d // h
    optimizer = optax.adam(1e-3)
    ks = iter(jax.random.split(jax.random.key(8), 6 * layers + 2))
    params = {"layers": [{"wq": jax.random.normal(next(ks), (d, h, hd)) / d ** 0.5,
                          "wk": jax.random.normal(next(ks), (d, kv, hd)) / d ** 0.5,
                          "wv": jax.random.normal(next(ks), (d, kv, hd)) / d ** 0.5,
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
            q = jnp.einsum("btm,mhd->bthd", x, p["wq"])
            k = jnp.einsum("btm,mkd->btkd", x, p["wk"])
            v = jnp.einsum("btm,mkd->btkd", x, p["wv"])
            a = jax.nn.dot_product_attention(q, k, v, is_causal=True)
            x = x + jnp.einsum("bthd,hdm->btm", a, p["wo"])
            x = x + jax.nn.gelu(x @ p["w_in"]) @ p["w_out"]
        return jnp.mean((x - batch["y"]) ** 2)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step, (params, opt_state, batch)
