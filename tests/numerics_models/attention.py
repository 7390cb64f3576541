"""Attention with a key bias, trained with Adam.

The bias's gradient is exactly zero (softmax ignores a shift along the keys), so what a step
computes for it is rounding noise (~1e-9 in float32), and Adam, dividing a gradient by its own
RMS, turns that noise into whole ``lr``-sized steps in directions the rounding picks: the new
bias (zero, as libraries initialise biases) and its Adam moments are noise. ``dtype=jnp.bfloat16`` runs the whole step in bfloat16
(parameters, activations, Adam's moments)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from partex.demo_models._common import adam_init, adam_update


def make(dtype=jnp.float32, batch: int = 16, seq: int = 32, d_model: int = 64):
    def loss_fn(p, b):
        x = b["x"]
        q, k, v = x @ p["wq"], x @ p["wk"] + p["bk"], x @ p["wv"]
        h = jax.nn.softmax(jnp.einsum("btd,bsd->bts", q, k) / 4.0, axis=-1) @ v
        return jnp.mean(jnp.square((jnp.tanh(h @ p["wo"]) - b["y"]).astype(jnp.float32)))

    def step(params, opt, b):
        loss, g = jax.value_and_grad(loss_fn)(params, b)
        new, opt = adam_update(params, g, opt, 1e-3)
        return jax.tree.map(lambda n, p: n.astype(p.dtype), new, params), opt, loss

    ks = jax.random.split(jax.random.key(0), 6)
    params = {n: (jax.random.normal(ks[i], (d_model, d_model)) / 8).astype(dtype)
              for i, n in enumerate(["wq", "wk", "wv", "wo"])}
    params["bk"] = jnp.zeros((d_model,), dtype)  # as libraries initialise biases
    b = {"x": jax.random.normal(ks[4], (batch, seq, d_model)).astype(dtype),
         "y": jax.random.normal(ks[5], (batch, seq, d_model)).astype(dtype)}
    return step, (params, adam_init(params), b)


def float32():
    return make()


def bfloat16():
    return make(jnp.bfloat16)
