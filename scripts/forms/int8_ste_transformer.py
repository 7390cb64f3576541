"""A decoder-only transformer training step whose projections run in int8, as quantisation-aware
training writes them: each activation quantised per token and each weight per output channel
(scales from ``jnp.max(jnp.abs(.), axis=...)``, rounded and clipped to int8), an int8 x int8
-> int32 ``jax.lax.dot_general(..., preferred_element_type=jnp.int32)`` rescaled to float32,
and the gradients of the float matmul by the straight-through estimator written with
``jax.lax.stop_gradient`` (``y + stop_gradient(int8(x, w) - y)``). A token embedding (tied to
the output projection), two pre-norm blocks of causal attention (one fused q/k/v weight) and
a GELU MLP; optax's Adam; the mesh data=2,model=4 (tensor parallelism over four devices).

    partex analyze scripts/forms/int8_ste_transformer.py:make
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

MESH = "data=2,model=4"
SIZES = {"tiny": dict(batch=8, seq=16, d_model=32, heads=4, d_ff=64, vocab=64)}


def quantize(x, axis):
    """x as int8 and its scale along ``axis`` (kept): x ≈ q * scale."""
    scale = jnp.maximum(jnp.max(jnp.abs(x), axis=axis, keepdims=True), 1e-8) / 127.0
    return jnp.clip(jnp.round(x / scale), -127, 127).astype(jnp.int8), scale


def int8_matmul(x, w):
    """x [..., k] @ w [k, n] in int8: x per token, w per output channel, an int32 accumulator."""
    xq, xs = quantize(x, -1)
    wq, ws = quantize(w, 0)
    acc = jax.lax.dot_general(xq, wq, (((x.ndim - 1,), (0,)), ((), ())), preferred_element_type=jnp.int32)
    return acc.astype(jnp.float32) * xs * ws


def qdot(x, w):
    """The int8 product forward, the float product's gradients backward (straight-through)."""
    y = x @ w
    return y + jax.lax.stop_gradient(int8_matmul(x, w) - y)


def rms_norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def make(layers: int = 2, size: str = "tiny"):
    """(train_step, (params, opt_state, batch))."""
    c = SIZES[size]
    d, f, h, v = c["d_model"], c["d_ff"], c["heads"], c["vocab"]
    hd = d // h
    optimizer = optax.adam(1e-3)
    ks = iter(jax.random.split(jax.random.key(11), 4 * layers + 2))

    def normal(shape, fan_in):
        return jax.random.normal(next(ks), shape) / fan_in ** 0.5

    params = {"embed": normal((v, d), 1),
              "layers": [{"ln1": jnp.ones((d,)), "ln2": jnp.ones((d,)),
                          "wqkv": normal((d, 3 * d), d), "wo": normal((d, d), d),
                          "w_in": normal((d, f), d), "w_out": normal((f, d), f)} for _ in range(layers)],
              "ln_f": jnp.ones((d,))}
    tokens = jax.random.randint(next(ks), (c["batch"], c["seq"]), 0, v)
    batch = {"tokens": tokens, "targets": jnp.roll(tokens, -1, axis=1)}
    opt_state = optimizer.init(params)

    def block(p, x):
        b, t, _ = x.shape
        qkv = qdot(rms_norm(x, p["ln1"]), p["wqkv"]).reshape(b, t, 3, h, hd)
        q, k, val = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / hd ** 0.5
        s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e9)
        a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), val).reshape(b, t, d)
        x = x + qdot(a, p["wo"])
        return x + qdot(jax.nn.gelu(qdot(rms_norm(x, p["ln2"]), p["w_in"])), p["w_out"])

    def loss_fn(params, batch):
        x = params["embed"][batch["tokens"]]
        for p in params["layers"]:
            x = block(p, x)
        logits = rms_norm(x, params["ln_f"]) @ params["embed"].T
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step, (params, opt_state, batch)
