"""A training step with dropout whose randomness is a typed key (``jax.random.key``: dtype
``key<fry>``) carried in the train state, as flax's ``TrainState``-style loops and equinox code
hold it: each step splits the state's key into the next step's key and this step's dropout
key, and each layer folds its index into that key for its masks (``jax.random.bernoulli``).
Two residual MLP layers with dropout after the activation and on the residual branch;
optax's Adam; the mesh data=4,model=2.

    partex analyze scripts/forms/dropout_typed_keys.py:make
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

MESH = "data=4,model=2"
SIZES = {"tiny": dict(batch=16, seq=8, d_model=32, d_ff=64, rate=0.1)}


def dropout(key, x, rate):
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def make(layers: int = 2, size: str = "tiny"):
    """(train_step, (state, batch)): ``state`` holds params, optimizer state and the key."""
    c = SIZES[size]
    d, f, rate = c["d_model"], c["d_ff"], c["rate"]
    optimizer = optax.adam(1e-3)

    ks = jax.random.split(jax.random.key(5), 2 * layers + 2)
    params = {"layers": [{"w_in": jax.random.normal(ks[2 * i], (d, f)) / d ** 0.5, "b_in": jnp.zeros((f,)),
                          "w_out": jax.random.normal(ks[2 * i + 1], (f, d)) / f ** 0.5}
                         for i in range(layers)]}
    shape = (c["batch"], c["seq"], d)
    batch = {"x": jax.random.normal(ks[-2], shape), "y": jax.random.normal(ks[-1], shape)}
    state = {"params": params, "opt_state": optimizer.init(params), "key": jax.random.key(42)}

    def loss_fn(params, batch, key):
        h = batch["x"]
        for i, layer in enumerate(params["layers"]):
            k_act, k_res = jax.random.split(jax.random.fold_in(key, i))
            a = dropout(k_act, jax.nn.gelu(h @ layer["w_in"] + layer["b_in"]), rate)
            h = h + dropout(k_res, a @ layer["w_out"], rate)
        return jnp.mean((h - batch["y"]) ** 2)

    def train_step(state, batch):
        key, dropout_key = jax.random.split(state["key"])
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], batch, dropout_key)
        updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "opt_state": opt_state, "key": key}, loss

    return train_step, (state, batch)
