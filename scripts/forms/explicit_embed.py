"""A transformer training step in jax's explicit sharding mode with a token embedding: the
mesh's axes are ``AxisType.Explicit``, the arguments placed with ``NamedSharding``s (the
embedding table ``params/embed`` over its vocabulary on `model`, as Megatron's
vocabulary-parallel embedding is; ``make(embed=(None, None))`` places it whole), the tokens
looked up with ``params["embed"].at[tokens].get(out_sharding=...)``, each projection saying
its result's sharding (``jnp.einsum(..., out_sharding=P(...))``), the residual stream moved
back with ``jax.sharding.reshard`` after each block and the output projection tied to the
embedding. Two pre-norm blocks of causal attention (heads over `model`) and a GELU MLP
(Megatron over `model`); optax's Adam; the mesh data=4,model=2. Run the step as the user
does: ``with jax.set_mesh(mesh(args)): jax.jit(step)(*args)``.

    partex analyze scripts/forms/explicit_embed.py:make
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

MESH = "data=4,model=2"
SIZES = {"tiny": dict(batch=8, seq=16, d_model=32, heads=4, d_ff=64, vocab=128)}


def mesh(args=None):
    """The step's explicit mesh (that of its arguments where given)."""
    if args is not None:
        return jax.tree.leaves(args)[0].sharding.mesh
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


def rms_norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def make(layers: int = 2, size: str = "tiny", embed: tuple = ("model", None)):
    """(train_step, (params, opt_state, batch)): arguments placed on the explicit mesh, the
    embedding table as ``P(*embed)``; run the step under ``jax.set_mesh(mesh(args))``."""
    c = SIZES[size]
    m = mesh()
    d, f, h, v = c["d_model"], c["d_ff"], c["heads"], c["vocab"]
    hd = d // h
    optimizer = optax.adam(1e-3)

    def put(x, *spec):
        return jax.device_put(x, NamedSharding(m, P(*spec)))

    ks = iter(jax.random.split(jax.random.key(12), 6 * layers + 2))

    def normal(shape, fan_in):
        return jax.random.normal(next(ks), shape) / fan_in ** 0.5

    params = {"embed": put(normal((v, d), 1), *embed),
              "layers": [{"ln1": put(jnp.ones((d,)), None), "ln2": put(jnp.ones((d,)), None),
                          "wq": put(normal((d, h, hd), d), None, "model", None),
                          "wk": put(normal((d, h, hd), d), None, "model", None),
                          "wv": put(normal((d, h, hd), d), None, "model", None),
                          "wo": put(normal((h, hd, d), d), "model", None, None),
                          "w_in": put(normal((d, f), d), None, "model"),
                          "w_out": put(normal((f, d), f), "model", None)} for _ in range(layers)],
              "ln_f": put(jnp.ones((d,)), None)}
    tokens = jax.random.randint(next(ks), (c["batch"], c["seq"]), 0, v)
    batch = {"tokens": put(tokens, "data", None), "targets": put(jnp.roll(tokens, -1, axis=1), "data", None)}
    with jax.set_mesh(m):
        opt_state = jax.jit(optimizer.init)(params)

    def block(p, x):
        t = x.shape[1]
        y = rms_norm(x, p["ln1"])
        q = jnp.einsum("btd,dhk->bthk", y, p["wq"], out_sharding=P("data", None, "model", None))
        k = jnp.einsum("btd,dhk->bthk", y, p["wk"], out_sharding=P("data", None, "model", None))
        val = jnp.einsum("btd,dhk->bthk", y, p["wv"], out_sharding=P("data", None, "model", None))
        s = jnp.einsum("bqhk,bshk->bhqs", q, k) / hd ** 0.5
        s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e9)
        a = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(s, axis=-1), val)
        x = x + jnp.einsum("bqhk,hkd->bqd", a, p["wo"], out_sharding=P("data", None, None))
        u = jax.nn.gelu(jnp.einsum("btd,df->btf", rms_norm(x, p["ln2"]), p["w_in"],
                                   out_sharding=P("data", None, "model")))
        x = x + jnp.einsum("btf,fd->btd", u, p["w_out"], out_sharding=P("data", None, None))
        return jax.sharding.reshard(x, P("data", None, None))

    def loss_fn(params, batch):
        x = params["embed"].at[batch["tokens"]].get(out_sharding=P("data", None, None))
        for p in params["layers"]:
            x = block(p, x)
        logits = jnp.einsum("btd,vd->btv", rms_norm(x, params["ln_f"]), params["embed"],
                            out_sharding=P("data", None, None))
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step, (params, opt_state, batch)
