"""A two-layer MLP step whose user constrains the hidden activation Megatron-style (batch over
``data``, hidden over ``model``) and calls its output layer through a ``jax.jit`` with
``in_shardings``. ``make()`` builds it on an abstract mesh of the plan's shape, so it traces on
any number of devices. partex keeps the user's shardings as fixed decisions (their own pins)::

    partex analyze scripts/constrained_mlp.py:make
    partex search scripts/constrained_mlp.py:make --mesh data=4,model=2 --budget 5 --out plan.json
"""

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P


def make_step(mesh):
    """(step, example args) with the user's shardings over ``mesh`` (axes data, model)."""
    hidden = NamedSharding(mesh, P("data", "model"))
    head = jax.jit(lambda h, w2: h @ w2, in_shardings=(hidden, NamedSharding(mesh, P("model", None))))

    def loss(params, x, y):
        h = jax.nn.relu(x @ params["w1"])
        h = jax.lax.with_sharding_constraint(h, hidden)  # CONSTRAINT_LINE
        return jnp.mean((head(h, params["w2"]) - y) ** 2)

    def step(params, x, y):
        l, g = jax.value_and_grad(loss)(params, x, y)
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, g), l

    k = jax.random.split(jax.random.key(0), 4)
    params = {"w1": jax.random.normal(k[0], (64, 256)) / 8, "w2": jax.random.normal(k[1], (256, 32)) / 16}
    return step, (params, jax.random.normal(k[2], (32, 64)), jax.random.normal(k[3], (32, 32)))


def make():
    return make_step(AbstractMesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2))
