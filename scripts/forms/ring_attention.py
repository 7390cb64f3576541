"""A transformer training step with ring attention (context parallelism): the sequence is sharded
over the `context` axis, and inside a ``jax.shard_map`` each device keeps its block of queries
while the key/value blocks travel round the ring with ``jax.lax.ppermute``, one hop per
iteration of a ``jax.lax.fori_loop``; causal softmax computed blockwise with a running max and
sum (the block's global positions from ``jax.lax.axis_index``). The region holds the batch over
`data` and the heads over `model` too. Two pre-norm layers (attention, then an MLP outside the
region), the input projected first (as a model embeds its tokens); optax's Adam; the mesh
data=2,context=2,model=2 with Auto axes.

    partex analyze scripts/forms/ring_attention.py:make
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import optax
from jax.sharding import AxisType, PartitionSpec as P

MESH = "data=2,context=2,model=2"
SIZES = {"tiny": dict(batch=8, seq=16, d_model=32, heads=4, d_ff=64)}
MASKED = -1e30


def mesh():
    return jax.make_mesh((2, 2, 2), ("data", "context", "model"), axis_types=(AxisType.Auto,) * 3)


def rms_norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def make(layers: int = 2, size: str = "tiny"):
    """(train_step, (params, opt_state, batch))."""
    c = SIZES[size]
    m = mesh()
    d, h, f = c["d_model"], c["heads"], c["d_ff"]
    dh = d // h
    n = m.shape["context"]
    optimizer = optax.adam(1e-3)
    qkv = P("data", "context", "model", None)  # [batch, seq, heads, head_dim]

    @partial(jax.shard_map, mesh=m, in_specs=(qkv, qkv, qkv), out_specs=qkv)
    def ring_attention(q, k, v):
        block = q.shape[1]
        me = jax.lax.axis_index("context")
        q_pos = me * block + jnp.arange(block)
        perm = [(j, (j + 1) % n) for j in range(n)]

        def hop(i, carry):
            k, v, row_max, row_sum, out = carry
            src = (me - i) % n  # whose block this device holds at hop i
            k_pos = src * block + jnp.arange(block)
            s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / dh ** 0.5
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], s, MASKED)
            new_max = jnp.maximum(row_max, s.max(-1))
            p = jnp.exp(s - new_max[..., None])
            scale = jnp.exp(row_max - new_max)
            row_sum = row_sum * scale + p.sum(-1)
            out = out * scale.transpose(0, 2, 1)[..., None] + jnp.einsum("bhqk,bkhd->bqhd", p, v)
            return jax.lax.ppermute(k, "context", perm), jax.lax.ppermute(v, "context", perm), new_max, row_sum, out

        per_row = jnp.zeros_like(q[..., 0]).transpose(0, 2, 1)  # [batch, heads, queries], varying like q
        init = (k, v, per_row + MASKED, per_row, jnp.zeros_like(q))
        _, _, _, row_sum, out = jax.lax.fori_loop(0, n, hop, init)
        return out / row_sum.transpose(0, 2, 1)[..., None]

    ks = jax.random.split(jax.random.key(4), 6 * layers + 3)
    params = {"embed": jax.random.normal(ks[-3], (d, d)) / d ** 0.5,
              "layers": [{"attn_norm": jnp.ones((d,)),
                          "wq": jax.random.normal(ks[6 * i], (d, h, dh)) / d ** 0.5,
                          "wk": jax.random.normal(ks[6 * i + 1], (d, h, dh)) / d ** 0.5,
                          "wv": jax.random.normal(ks[6 * i + 2], (d, h, dh)) / d ** 0.5,
                          "wo": jax.random.normal(ks[6 * i + 3], (h, dh, d)) / d ** 0.5,
                          "mlp_norm": jnp.ones((d,)),
                          "w_in": jax.random.normal(ks[6 * i + 4], (d, f)) / d ** 0.5,
                          "w_out": jax.random.normal(ks[6 * i + 5], (f, d)) / f ** 0.5}
                         for i in range(layers)]}
    shape = (c["batch"], c["seq"], d)
    batch = {"x": jax.random.normal(ks[-2], shape), "y": jax.random.normal(ks[-1], shape)}
    opt_state = optimizer.init(params)

    def loss_fn(params, batch):
        x = batch["x"] @ params["embed"]
        for layer in params["layers"]:
            a = rms_norm(x, layer["attn_norm"])
            q, k, v = (jnp.einsum("btd,dhk->bthk", a, layer[w]) for w in ("wq", "wk", "wv"))
            x = x + jnp.einsum("bthk,hkd->btd", ring_attention(q, k, v), layer["wo"])
            a = rms_norm(x, layer["mlp_norm"])
            x = x + jax.nn.gelu(a @ layer["w_in"]) @ layer["w_out"]
        return jnp.mean((x - batch["y"]) ** 2)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step, (params, opt_state, batch)
