"""A mixture-of-experts training step whose token dispatch is an ``all_to_all`` inside a
``jax.shard_map`` over the `expert` axis, as GShard and MaxText's expert parallelism write it:
the router's logits are computed outside the region (as MaxText's ``RoutedMoE`` does), the
region receives each device's tokens (the batch over `data` and `expert`), the router logits
and its experts' weights (``[E, d, f]`` sharded over `expert`), picks each token's top-2
experts, packs the tokens into per-expert slots up to a capacity, sends each expert its slots
with ``jax.lax.all_to_all``, runs the local experts' FFN, sends the results back with a second
``all_to_all`` and combines them with the gate weights. Two pre-norm residual MoE layers; the
input projected first (as a model embeds its tokens); optax's Adam; the mesh data=4,expert=2
with Auto axes (a shard_map-only step).

    partex analyze scripts/forms/moe_all_to_all.py:make
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import optax
from jax.sharding import AxisType, PartitionSpec as P

MESH = "data=4,expert=2"
SIZES = {"tiny": dict(batch=16, seq=8, d_model=32, d_ff=64, experts=4, top_k=2, capacity_factor=2.0)}


def mesh():
    return jax.make_mesh((4, 2), ("data", "expert"), axis_types=(AxisType.Auto,) * 2)


def rms_norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def make(layers: int = 2, size: str = "tiny"):
    """(train_step, (params, opt_state, batch))."""
    c = SIZES[size]
    m = mesh()
    d, f, n_exp, k = c["d_model"], c["d_ff"], c["experts"], c["top_k"]
    tokens = c["batch"] * c["seq"] // m.size  # per device
    cap = int(c["capacity_factor"] * tokens * k / n_exp)  # slots per expert per device
    optimizer = optax.adam(1e-3)

    @partial(jax.shard_map, mesh=m, in_specs=(P(("data", "expert")), P(("data", "expert")), P("expert"), P("expert")),
             out_specs=P(("data", "expert")), check_vma=False)
    def moe(x, logits, w_in, w_out):
        b, t, _ = x.shape
        x, logits = x.reshape(b * t, d), logits.reshape(b * t, n_exp)
        gates, experts = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), k)  # [tokens, k]
        gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
        onehot = jax.nn.one_hot(experts, n_exp)  # [tokens, k, E]
        # each (token, choice)'s slot in its expert: choices ranked by k, then by token
        position = jnp.cumsum(onehot.transpose(1, 0, 2).reshape(-1, n_exp), axis=0).reshape(k, b * t, n_exp)
        position = position.transpose(1, 0, 2) * onehot
        kept = onehot * (position <= cap)
        slot = jax.nn.one_hot(jnp.sum(position, axis=-1).astype(jnp.int32) - 1, cap)  # [tokens, k, cap]
        dispatch = jnp.einsum("tke,tkc->tec", kept, slot)
        combine = jnp.einsum("tke,tkc,tk->tec", kept, slot, gates)
        xe = jnp.einsum("tec,td->ecd", dispatch, x)  # [E, cap, d]
        # each expert's slots to the device holding it: [E / n_ep, n_ep * cap, d]
        xe = jax.lax.all_to_all(xe, "expert", split_axis=0, concat_axis=1, tiled=True)
        h = jax.nn.gelu(jnp.einsum("ecd,edf->ecf", xe, w_in))
        ye = jnp.einsum("ecf,efd->ecd", h, w_out)
        ye = jax.lax.all_to_all(ye, "expert", split_axis=1, concat_axis=0, tiled=True)  # back: [E, cap, d]
        return jnp.einsum("tec,ecd->td", combine, ye).reshape(b, t, d)

    ks = jax.random.split(jax.random.key(2), 3 * layers + 3)
    params = {"embed": jax.random.normal(ks[-3], (d, d)) / d ** 0.5,
              "layers": [{"norm": jnp.ones((d,)),
                          "router": jax.random.normal(ks[3 * i], (d, n_exp)) / d ** 0.5,
                          "w_in": jax.random.normal(ks[3 * i + 1], (n_exp, d, f)) / d ** 0.5,
                          "w_out": jax.random.normal(ks[3 * i + 2], (n_exp, f, d)) / f ** 0.5}
                         for i in range(layers)]}
    shape = (c["batch"], c["seq"], d)
    batch = {"x": jax.random.normal(ks[-2], shape), "y": jax.random.normal(ks[-1], shape)}
    opt_state = optimizer.init(params)

    def loss_fn(params, batch):
        h = batch["x"] @ params["embed"]
        for layer in params["layers"]:
            x = rms_norm(h, layer["norm"])
            h = h + moe(x, x @ layer["router"], layer["w_in"], layer["w_out"])
        return jnp.mean((h - batch["y"]) ** 2)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step, (params, opt_state, batch)
