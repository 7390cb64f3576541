"""A training step whose first matmul of each MLP layer is a Pallas kernel (``pallas_call``,
run in interpret mode off TPU/GPU): a blocked matmul over a (rows, columns) grid, written
bare, as a kernel is before anyone wraps it. XLA's partitioner cannot see inside a kernel:
it gathers the kernel's operands and runs it whole on every device, and partex's plans say
so (``partex analyze`` lists the kernel as opaque). The kernel gives XLA a
``pl.CostEstimate`` (``ESTIMATE``; ``pallas_matmul_no_estimate`` leaves it out, and partex
counts the kernel body's FLOPs once per grid step). Gradients: a custom VJP with plain
matmuls. Two residual MLP layers; optax's Adam; the mesh data=4,model=2.

    partex analyze scripts/forms/pallas_matmul.py:make
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from jax.experimental import pallas as pl

MESH = "data=4,model=2"
SIZES = {"tiny": dict(batch=16, seq=8, d_model=32, d_ff=64)}
ESTIMATE = True
BLOCK = 32


def _kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)


def pallas_matmul(x, w, estimate: bool = True):
    """x [m, k] @ w [k, n] by a Pallas kernel over BLOCK x BLOCK output tiles."""
    m, k = x.shape
    n = w.shape[1]
    bm, bn = min(BLOCK, m), min(BLOCK, n)
    cost = pl.CostEstimate(flops=2 * m * n * k, transcendentals=0,
                           bytes_accessed=4 * (m * k * (n // bn) + k * n * (m // bm) + m * n)) if estimate else None
    return pl.pallas_call(
        _kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32), grid=(m // bm, n // bn),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)), pl.BlockSpec((k, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)), cost_estimate=cost,
        interpret=jax.default_backend() not in ("tpu", "gpu"))(x, w)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def matmul(x, w, estimate):
    return pallas_matmul(x, w, estimate)


def _fwd(x, w, estimate):
    return pallas_matmul(x, w, estimate), (x, w)


def _bwd(estimate, res, g):
    x, w = res
    return g @ w.T, x.T @ g


matmul.defvjp(_fwd, _bwd)


def make(layers: int = 2, size: str = "tiny", estimate: bool | None = None):
    """(train_step, (params, opt_state, batch))."""
    estimate = ESTIMATE if estimate is None else estimate
    c = SIZES[size]
    d, f = c["d_model"], c["d_ff"]
    optimizer = optax.adam(1e-3)
    ks = jax.random.split(jax.random.key(7), 2 * layers + 2)
    params = {"layers": [{"w_in": jax.random.normal(ks[2 * i], (d, f)) / d ** 0.5,
                          "w_out": jax.random.normal(ks[2 * i + 1], (f, d)) / f ** 0.5}
                         for i in range(layers)]}
    shape = (c["batch"] * c["seq"], d)
    batch = {"x": jax.random.normal(ks[-2], shape), "y": jax.random.normal(ks[-1], shape)}
    opt_state = optimizer.init(params)

    def loss_fn(params, batch):
        h = batch["x"]
        for layer in params["layers"]:
            h = h + jax.nn.gelu(matmul(h, layer["w_in"], estimate)) @ layer["w_out"]
        return jnp.mean((h - batch["y"]) ** 2)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step, (params, opt_state, batch)
