"""A tower of gated MLP blocks, each of its own widths (a network-search result, or an
EfficientNet-like stack written out block by block): no two layers share a role, so every
width is a decision group of its own (2 per block). At the default 110 blocks the step has
over 200 decision groups: the explorer's graph at that size (``tests/test_explorer.py``)::

    partex analyze scripts/tower.py:make
"""

import jax
import jax.numpy as jnp
import numpy as np

BLOCKS = 110
BATCH = 16


def widths(blocks: int = BLOCKS) -> list[tuple[int, int]]:
    """(hidden, output) of each block: distinct sizes, so no block folds into another."""
    return [(48 + 2 * i, 16 + 2 * i) for i in range(blocks)]


def make(blocks: int = BLOCKS):
    ws = widths(blocks)
    rng = np.random.default_rng(0)  # numpy: jax.random would compile once per distinct shape

    def normal(*shape, scale=1.0):
        return jnp.asarray(rng.standard_normal(shape, dtype=np.float32) * scale)

    d_in = 16
    params = []
    for hidden, out in ws:
        params.append({"gate": normal(d_in, hidden, scale=d_in ** -0.5),
                       "up": normal(d_in, hidden, scale=d_in ** -0.5),
                       "down": normal(hidden, out, scale=hidden ** -0.5)})
        d_in = out

    def loss(params, x, y):
        h = x
        for p in params:
            h = (jax.nn.silu(h @ p["gate"]) * (h @ p["up"])) @ p["down"]
        return jnp.mean((h - y) ** 2)

    def step(params, x, y):
        l, g = jax.value_and_grad(loss)(params, x, y)
        return jax.tree_util.tree_map(lambda p, g: p - 1e-3 * g, params, g), l

    x, y = normal(BATCH, 16), normal(BATCH, d_in)
    return step, (params, x, y)
