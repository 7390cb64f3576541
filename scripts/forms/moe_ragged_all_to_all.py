"""The mixture-of-experts step of ``moe_all_to_all.py`` with a dropless dispatch through
``jax.lax.ragged_all_to_all``, as MaxText's ``RoutedMoE`` (``layers/moe.py``, sparse matmul
with expert parallelism) writes it: inside a ``jax.shard_map`` over the `expert` axis each
device sorts its tokens' top-2 assignments by expert, learns every peer's counts with an
``all_gather``, sends each peer the run of assignments to its experts with
``ragged_all_to_all`` (offsets and sizes as MaxText's ``get_all_to_all_params``), sorts what it
received by local expert (``local_permute``), multiplies with ``jax.lax.ragged_dot`` against
its experts' weights (``[E, d, f]`` sharded over `expert`), sends the results back with a
second ``ragged_all_to_all`` and combines them with the gate weights. No token is dropped. Two
pre-norm residual MoE layers; the input projected first (as a model embeds its tokens); optax's
Adam; the mesh data=4,expert=2 with Auto axes.

    partex analyze scripts/forms/moe_ragged_all_to_all.py:make
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import optax
from jax.sharding import AxisType, PartitionSpec as P

MESH = "data=4,expert=2"
SIZES = {"tiny": dict(batch=16, seq=8, d_model=32, d_ff=64, experts=4, top_k=2)}


def mesh():
    return jax.make_mesh((4, 2), ("data", "expert"), axis_types=(AxisType.Auto,) * 2)


def rms_norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def _exclusive_cumsum(x, axis=0):
    return jnp.cumsum(x, axis=axis) - x


def make(layers: int = 2, size: str = "tiny"):
    """(train_step, (params, opt_state, batch))."""
    c = SIZES[size]
    m = mesh()
    d, f, n_exp, k = c["d_model"], c["d_ff"], c["experts"], c["top_k"]
    n_ep = m.shape["expert"]
    local = n_exp // n_ep  # experts per device
    assignments = c["batch"] * c["seq"] // m.size * k  # per device
    buffer = n_ep * assignments  # the most any device can receive: every peer's every assignment
    optimizer = optax.adam(1e-3)

    @partial(jax.shard_map, mesh=m, in_specs=(P(("data", "expert")), P(("data", "expert")), P("expert"), P("expert")),
             out_specs=P(("data", "expert")), check_vma=False)
    def moe(x, logits, w_in, w_out):
        b, t, _ = x.shape
        x, logits = x.reshape(b * t, d), logits.reshape(b * t, n_exp)
        gates, experts = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), k)  # [tokens, k]
        gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
        # permute: the assignments sorted by expert
        flat = experts.reshape(-1)
        order = jnp.argsort(flat)
        sorted_x = jnp.take(x, order // k, axis=0)  # [assignments, d]
        group_sizes = jnp.bincount(flat, length=n_exp)  # [E]
        send = group_sizes.reshape(n_ep, local).sum(-1)  # to each expert shard
        me = jax.lax.axis_index("expert")
        sizes = jax.lax.all_gather(send, "expert")  # [sender, receiver]
        received = jax.lax.ragged_all_to_all(
            sorted_x, jnp.zeros((buffer, d), x.dtype), _exclusive_cumsum(send), send,
            _exclusive_cumsum(sizes, axis=0)[me], sizes[:, me], axis_name="expert")
        # local_permute: what arrived (per sender, by expert) sorted by local expert
        counts = jax.lax.all_gather(group_sizes, "expert")  # [sender, E]
        local_counts = jax.lax.dynamic_slice_in_dim(counts, me * local, local, axis=1)  # [sender, local]
        ids = jnp.repeat(jnp.tile(jnp.arange(local), n_ep), local_counts.reshape(-1), total_repeat_length=buffer)
        ids = jnp.where(jnp.arange(buffer) < local_counts.sum(), ids, local)  # padding last
        local_order = jnp.argsort(ids)
        h = jnp.take(received, local_order, axis=0)
        group = local_counts.sum(0)
        h = jax.nn.gelu(jax.lax.ragged_dot(h, w_in, group))
        y = jax.lax.ragged_dot(h, w_out, group)
        y = jnp.zeros_like(y).at[local_order].set(y)  # back in arrival order
        # unpermute: each sender's results back to it
        recv = sizes[:, me]
        back = jax.lax.ragged_all_to_all(
            y, jnp.zeros((assignments, d), x.dtype), _exclusive_cumsum(recv), recv,
            _exclusive_cumsum(sizes, axis=1)[:, me], send, axis_name="expert")
        out = jnp.zeros_like(back).at[order].set(back).reshape(b * t, k, d)
        return jnp.einsum("tkd,tk->td", out, gates).reshape(b, t, d)

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
