"""Residual MLP blocks whose matmuls run quantised, trained with straight-through gradients
and Adam.

Each matmul quantises both operands with one scale per tensor (``max |x| / 127``) to int8,
multiplies them with ``dot_general`` int8 x int8 -> int32 and rescales; the backward pass
sees the float matmul (the straight-through estimator:
``x @ w + stop_gradient(quantised(x, w) - x @ w)``). ``fmt="fp8"`` quantises to
``float8_e4m3fn`` instead (scale ``max |x| / 448``, the product accumulated in float32).

Rounding at the quantiser flips wherever a value sits within an ulp of a rounding boundary:
a run that sums in another order (a norm's or a matmul's sum split across devices) moves the
outputs as much as one whose inputs differ in the last bits. At ``blocks=3, seed=1`` a correct
plan that splits those sums (hidden on ``model``, d_model and the batch on ``data``) differs
from the unsharded step by 1.1e-4 of a weight's scale on XLA:CPU, over a fixed 1e-4."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from partex.demo_models._common import adam_init, adam_update

D_MODEL, HIDDEN, BLOCKS, BATCH = 128, 256, 2, 64
_FORMATS = {"int8": (jnp.int8, 127.0, jnp.int32), "fp8": (jnp.float8_e4m3fn, 448.0, jnp.float32)}
_DOT = (((1,), (0,)), ((), ()))


def quantise(x, fmt: str):
    """(x quantised, its scale): one scale for the whole tensor."""
    dtype, top, _ = _FORMATS[fmt]
    scale = jnp.max(jnp.abs(x)) / top
    q = x / scale
    if fmt == "int8":
        q = jnp.clip(jnp.round(q), -top, top)
    return q.astype(dtype), scale


def qmatmul(x, w, fmt: str):
    """x @ w computed on quantised operands; straight-through gradients."""
    qx, sx = quantise(x, fmt)
    qw, sw = quantise(w, fmt)
    acc = _FORMATS[fmt][2]
    y = jax.lax.dot_general(qx, qw, _DOT, preferred_element_type=acc).astype(jnp.float32) * (sx * sw)
    exact = x @ w
    return exact + jax.lax.stop_gradient(y - exact)


def _norm(x):
    x = x - jnp.mean(x, axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def make(fmt: str = "int8", batch: int = BATCH, d_model: int = D_MODEL, hidden: int = HIDDEN, blocks: int = BLOCKS,
         seed: int = 0):
    """(step, (params, adam state, batch)): residual blocks ``h + W2 gelu(W1 norm(h))`` with
    both matmuls quantised, a mean-squared-error loss and Adam."""

    def loss_fn(p, b):
        h = b["x"]
        for layer in p["blocks"]:
            u = jax.nn.gelu(qmatmul(_norm(h), layer["w1"], fmt) + layer["b1"])
            h = h + qmatmul(u, layer["w2"], fmt)
        return jnp.mean((h - b["y"]) ** 2)

    def step(params, opt, b):
        loss, g = jax.value_and_grad(loss_fn)(params, b)
        params, opt = adam_update(params, g, opt, 1e-3)
        return params, opt, loss

    ks = iter(jax.random.split(jax.random.key(seed), 2 + 2 * blocks))
    params = {"blocks": [{"w1": jax.random.normal(next(ks), (d_model, hidden)) / d_model ** 0.5,
                          "b1": jnp.zeros((hidden,)),
                          "w2": jax.random.normal(next(ks), (hidden, d_model)) / hidden ** 0.5}
                         for _ in range(blocks)]}
    b = {"x": jax.random.normal(next(ks), (batch, d_model)), "y": jax.random.normal(next(ks), (batch, d_model))}
    return step, (params, adam_init(params), b)


def int8():
    return make("int8")


def fp8():
    return make("fp8")
