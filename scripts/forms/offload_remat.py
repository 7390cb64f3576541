"""A training step whose layers are checkpointed with a policy that offloads a named residual
to pinned host memory (``save_and_offload_only_these_names(..., offload_dst="pinned_host")``,
as MaxText's ``*_offloaded`` and ``custom`` remat policies do) and recomputes the rest. On
TPU and GPU the residual lives in host memory between the passes (partex: host memory and
two host transfers per layer); XLA:CPU ignores memory spaces, so on simulated devices it stays
in device memory (verify compares on that footing). Four residual MLP layers; optax's Adam;
data=4,model=2.

    partex analyze scripts/forms/offload_remat.py:make
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax.ad_checkpoint import checkpoint_name

MESH = "data=4,model=2"
SIZES = {"tiny": dict(batch=16, seq=16, d_model=32, d_ff=128)}
POLICY = jax.checkpoint_policies.save_and_offload_only_these_names(
    names_which_can_be_saved=[], names_which_can_be_offloaded=["hidden"],
    offload_src="device", offload_dst="pinned_host")


def make(layers: int = 4, size: str = "tiny"):
    """(train_step, (params, opt_state, batch))."""
    c = SIZES[size]
    d, f = c["d_model"], c["d_ff"]
    optimizer = optax.adam(1e-3)
    ks = jax.random.split(jax.random.key(11), 2 * layers + 2)
    params = {"layers": [{"w_in": jax.random.normal(ks[2 * i], (d, f)) / d ** 0.5,
                          "w_out": jax.random.normal(ks[2 * i + 1], (f, d)) / f ** 0.5}
                         for i in range(layers)]}
    shape = (c["batch"], c["seq"], d)
    batch = {"x": jax.random.normal(ks[-2], shape), "y": jax.random.normal(ks[-1], shape)}
    opt_state = optimizer.init(params)

    def layer(p, h):
        a = checkpoint_name(jax.nn.gelu(h @ p["w_in"]), "hidden")
        return h + jnp.tanh(a) @ p["w_out"]

    block = jax.checkpoint(layer, policy=POLICY)

    def loss_fn(params, batch):
        h = batch["x"]
        for p in params["layers"]:
            h = block(p, h)
        return jnp.mean((h - batch["y"]) ** 2)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step, (params, opt_state, batch)
