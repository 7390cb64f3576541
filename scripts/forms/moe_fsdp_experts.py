"""A mixture-of-experts training step written as one ``jax.shard_map`` over data=4,expert=2,
with expert parallelism over `expert` and the expert weights sharded FSDP-style over `data`
as well: the region receives each device's tokens (the batch over `data` and `expert`), the
router's weights whole, and its experts' weights (``[E, d, f]`` as ``P("expert", "data")``),
gathers those weights over `data` with ``jax.lax.all_gather`` where it uses them, routes each
token to its top-2 experts (softmax gating, the router applied inside the region), packs the
tokens into per-expert slots up to a capacity, sends each expert its slots with
``jax.lax.all_to_all``, runs the local experts' FFN, sends the results back with a second
``all_to_all`` and combines them with the gate weights. Two pre-norm residual MoE layers; the
input projected first (as a model embeds its tokens); optax's Adam; Auto axes (a
shard_map-only step). ``make(dtype=jnp.bfloat16)`` computes in bfloat16 as mixed-precision
training does (the float32 parameters and batch cast at the top of the loss).

    partex analyze scripts/forms/moe_fsdp_experts.py:make
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


def make(layers: int = 2, size: str = "tiny", dtype=jnp.float32):
    """(train_step, (params, opt_state, batch)); ``dtype``: what the loss computes in."""
    c = SIZES[size]
    m = mesh()
    d, f, n_exp, k = c["d_model"], c["d_ff"], c["experts"], c["top_k"]
    tokens = c["batch"] * c["seq"] // m.size  # per device
    cap = int(c["capacity_factor"] * tokens * k / n_exp)  # slots per expert per device
    optimizer = optax.adam(1e-3)
    tokens_spec, experts_spec = P(("data", "expert")), P("expert", "data")

    @partial(jax.shard_map, mesh=m, in_specs=(tokens_spec, P(), experts_spec, experts_spec),
             out_specs=tokens_spec, check_vma=False)
    def moe(x, router, w_in, w_out):
        b, t, _ = x.shape
        x = x.reshape(b * t, d)
        w_in = jax.lax.all_gather(w_in, "data", axis=1, tiled=True)  # [E / n_ep, d, f]
        w_out = jax.lax.all_gather(w_out, "data", axis=1, tiled=True)  # [E / n_ep, f, d]
        gates, experts = jax.lax.top_k(jax.nn.softmax(x @ router, axis=-1), k)  # [tokens, k]
        gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
        onehot = jax.nn.one_hot(experts, n_exp, dtype=x.dtype)  # [tokens, k, E]
        # each (token, choice)'s slot in its expert: choices ranked by k, then by token
        position = jnp.cumsum(onehot.transpose(1, 0, 2).reshape(-1, n_exp), axis=0).reshape(k, b * t, n_exp)
        position = position.transpose(1, 0, 2) * onehot
        kept = onehot * (position <= cap)
        slot = jax.nn.one_hot(jnp.sum(position, axis=-1).astype(jnp.int32) - 1, cap, dtype=x.dtype)
        dispatch = jnp.einsum("tke,tkc->tec", kept, slot)
        combine = jnp.einsum("tke,tkc,tk->tec", kept, slot, gates)
        xe = jnp.einsum("tec,td->ecd", dispatch, x)  # [E, cap, d]
        # each expert's slots to the device holding it: [E / n_ep, n_ep * cap, d]
        xe = jax.lax.all_to_all(xe, "expert", split_axis=0, concat_axis=1, tiled=True)
        h = jax.nn.gelu(jnp.einsum("ecd,edf->ecf", xe, w_in))
        ye = jnp.einsum("ecf,efd->ecd", h, w_out)
        ye = jax.lax.all_to_all(ye, "expert", split_axis=1, concat_axis=0, tiled=True)  # back: [E, cap, d]
        return jnp.einsum("tec,ecd->td", combine, ye).reshape(b, t, d)

    ks = jax.random.split(jax.random.key(13), 3 * layers + 3)
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
        params, batch = jax.tree.map(lambda a: a.astype(dtype), (params, batch))
        h = batch["x"] @ params["embed"]
        for layer in params["layers"]:
            h = h + moe(rms_norm(h, layer["norm"]), layer["router"], layer["w_in"], layer["w_out"])
        return jnp.mean((h - batch["y"]).astype(jnp.float32) ** 2)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step, (params, opt_state, batch)
