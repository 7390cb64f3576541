"""Two-layer MLP regression: the teaching example (Megatron-style sharding is the answer)."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ._common import ModelDef, mse, normal, weight, zeros


@dataclass(frozen=True)
class MLPConfig:
    d_in: int = 64
    hidden: int = 256
    d_out: int = 32
    batch: int = 64
    lr: float = 1e-2


PRESETS = {
    "tiny": MLPConfig(),
    "full": MLPConfig(d_in=8192, hidden=32768, d_out=8192, batch=4096, lr=1e-4),
}


def spec(c: MLPConfig):
    params = {
        "w1": weight((c.d_in, c.hidden), ("features", "hidden")),
        "b1": zeros((c.hidden,), ("hidden",)),
        "w2": weight((c.hidden, c.d_out), ("hidden", "out_features")),
        "b2": zeros((c.d_out,), ("out_features",)),
    }
    batch = {
        "x": normal((c.batch, c.d_in), ("batch", "features")),
        "y": normal((c.batch, c.d_out), ("batch", "out_features")),
    }
    return params, batch


def loss(c: MLPConfig, params, batch):
    h = jax.nn.gelu(jnp.dot(batch["x"], params["w1"]) + params["b1"])
    return mse(jnp.dot(h, params["w2"]) + params["b2"], batch["y"])


MLP = ModelDef(
    name="mlp",
    description="two-layer MLP regression (teaching example)",
    config_cls=MLPConfig,
    presets=PRESETS,
    spec=spec,
    loss=loss,
)
