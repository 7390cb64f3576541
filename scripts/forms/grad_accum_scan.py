"""A training step with gradient accumulation: the batch arrives as ``[microbatches, ...]``
and a ``jax.lax.scan`` over the microbatches sums each one's loss and gradients (the carry),
before one optax Adam update with their mean, as large-batch training loops (MaxText's
``gradient_accumulation_steps``, optax's ``MultiSteps`` done in one step) write it. Two
residual MLP layers; the mesh data=4,model=2. ``compute_dtype`` casts the weights inside the
loss (mixed precision: the loop body makes each microbatch's copy from the parameters, which XLA
hoists out of the loop, as it does the copy's gathers).

    partex analyze scripts/forms/grad_accum_scan.py:make
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

MESH = "data=4,model=2"
SIZES = {"tiny": dict(microbatches=2, batch=8, seq=8, d_model=32, d_ff=64)}


def make(layers: int = 2, size: str = "tiny", compute_dtype=None):
    """(train_step, (params, opt_state, batch)); the batch's leaves are
    ``[microbatches, batch, seq, d_model]``; ``compute_dtype``: the dtype the layers compute
    in (None: the parameters' own)."""
    c = SIZES[size]
    d, f, n = c["d_model"], c["d_ff"], c["microbatches"]
    optimizer = optax.adam(1e-3)
    ks = jax.random.split(jax.random.key(7), 2 * layers + 2)
    params = {"layers": [{"w_in": jax.random.normal(ks[2 * i], (d, f)) / d ** 0.5, "b_in": jnp.zeros((f,)),
                          "w_out": jax.random.normal(ks[2 * i + 1], (f, d)) / f ** 0.5}
                         for i in range(layers)]}
    shape = (n, c["batch"], c["seq"], d)
    batch = {"x": jax.random.normal(ks[-2], shape), "y": jax.random.normal(ks[-1], shape)}
    opt_state = optimizer.init(params)

    def loss_fn(params, micro):
        h = micro["x"]
        for layer in params["layers"]:
            if compute_dtype is not None:
                layer = jax.tree.map(lambda w: w.astype(compute_dtype), layer)
            h = h + (jax.nn.gelu(h @ layer["w_in"] + layer["b_in"]) @ layer["w_out"]).astype(h.dtype)
        return jnp.mean((h - micro["y"]) ** 2)

    grad_fn = jax.value_and_grad(loss_fn)

    def train_step(params, opt_state, batch):
        def accumulate(carry, micro):
            loss, grads = carry
            micro_loss, micro_grads = grad_fn(params, micro)
            return (loss + micro_loss, jax.tree.map(jnp.add, grads, micro_grads)), None

        zeros = (jnp.zeros(()), jax.tree.map(jnp.zeros_like, params))
        (loss, grads), _ = jax.lax.scan(accumulate, zeros, batch)
        grads = jax.tree.map(lambda g: g / n, grads)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss / n

    return train_step, (params, opt_state, batch)
