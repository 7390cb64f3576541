"""An explicit-sharding-mode training step with a ``jax.sharding.auto_axes`` region inside:
the residual MLP of ``explicit_reshard.py`` (Explicit axes data=4,model=2, arguments placed
with ``NamedSharding``s, ``out_sharding=`` on the matmuls), its input projected first (as a
model embeds its tokens), with a pre-norm whose RMS norm runs
in an ``auto_axes`` region, where the partitioner, not the types, places the values (how
explicit-mode code calls a function written for Auto mode); optax's Adam. Run it as the user does: ``with jax.set_mesh(mesh(args)): jax.jit(step)(*args)``.

    partex analyze scripts/forms/explicit_auto_axes.py:make
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

MESH = "data=4,model=2"
SIZES = {"tiny": dict(batch=16, seq=8, d_model=32, d_ff=64)}


def mesh(args=None):
    """The step's explicit mesh (that of its arguments where given)."""
    if args is not None:
        return jax.tree.leaves(args)[0].sharding.mesh
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


def _rms_norm(x, scale):
    """Auto-mode code: an RMS norm over d_model."""
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def make(layers: int = 2, size: str = "tiny"):
    """(train_step, (params, opt_state, batch)): arguments placed on the explicit mesh;
    run the step under ``jax.set_mesh(mesh(args))``."""
    c = SIZES[size]
    m = mesh()
    optimizer = optax.adam(1e-3)

    def put(x, *spec):
        return jax.device_put(x, NamedSharding(m, P(*spec)))

    ks = jax.random.split(jax.random.key(1), 2 * layers + 3)
    d, f = c["d_model"], c["d_ff"]
    params = {"embed": put(jax.random.normal(ks[-3], (d, d)) / d ** 0.5, None, None),
              "layers": [{"w_in": put(jax.random.normal(ks[2 * i], (d, f)) / d ** 0.5, None, "model"),
                          "norm": put(jnp.ones((d,)), None),
                          "w_out": put(jax.random.normal(ks[2 * i + 1], (f, d)) / f ** 0.5, "model", None)}
                         for i in range(layers)]}
    shape = (c["batch"], c["seq"], d)
    batch = {"x": put(jax.random.normal(ks[-2], shape), "data", None, None),
             "y": put(jax.random.normal(ks[-1], shape), "data", None, None)}
    with jax.set_mesh(m):
        opt_state = jax.jit(optimizer.init)(params)

    rms_norm = jax.sharding.auto_axes(_rms_norm, out_sharding=P("data", None, None))

    def loss_fn(params, batch):
        h = jnp.einsum("btd,de->bte", batch["x"], params["embed"], out_sharding=P("data", None, None))
        for layer in params["layers"]:
            x = rms_norm(h, layer["norm"])
            a = jnp.einsum("btd,df->btf", x, layer["w_in"], out_sharding=P("data", None, "model"))
            y = jnp.einsum("btf,fd->btd", jax.nn.gelu(a), layer["w_out"], out_sharding=P("data", None, None))
            h = h + y
        return jnp.mean((h - batch["y"]) ** 2)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step, (params, opt_state, batch)
