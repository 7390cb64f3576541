"""A tiny vision transformer in flax linen, trained with optax Adam as linen users train it
(``flax.training.train_state.TrainState``).

Patches embedded by ``nn.Dense``, a class token, learned positions, pre-norm encoder blocks of
``nn.MultiHeadDotProductAttention`` (its query/key/value/out projections carry biases, linen's
default) and a GELU MLP, a linear head on the class token, softmax cross-entropy.

The key projection's bias has a gradient that is exactly zero (softmax ignores a shift along
the keys), so what the step computes for it is rounding noise, and Adam turns noise into whole
``lr``-sized steps: under a data-parallel plan the new key biases differ from the unsharded
step's by their own size, and so do the unsharded step's own when its inputs move by an ulp."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state


@dataclasses.dataclass(frozen=True)
class Config:
    image: int = 16
    patch: int = 4
    channels: int = 3
    d_model: int = 32
    heads: int = 4
    mlp: int = 64
    layers: int = 2
    classes: int = 10
    batch: int = 16


class Block(nn.Module):
    cfg: Config

    @nn.compact
    def __call__(self, x):
        cfg = self.cfg
        y = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=cfg.heads, qkv_features=cfg.d_model)(y, y)
        y = nn.LayerNorm()(x)
        return x + nn.Dense(cfg.d_model)(nn.gelu(nn.Dense(cfg.mlp)(y)))


class ViT(nn.Module):
    cfg: Config

    @nn.compact
    def __call__(self, images):
        cfg = self.cfg
        b, n = images.shape[0], cfg.image // cfg.patch
        patches = images.reshape(b, n, cfg.patch, n, cfg.patch, cfg.channels).transpose(0, 1, 3, 2, 4, 5)
        x = nn.Dense(cfg.d_model, name="embed")(patches.reshape(b, n * n, -1))
        cls = self.param("cls", nn.initializers.zeros, (1, 1, cfg.d_model))
        x = jnp.concatenate([jnp.broadcast_to(cls, (b, 1, cfg.d_model)), x], axis=1)
        x = x + self.param("pos", nn.initializers.normal(0.02), (1, n * n + 1, cfg.d_model))
        for i in range(cfg.layers):
            x = Block(cfg, name=f"block_{i}")(x)
        return nn.Dense(cfg.classes, name="head")(nn.LayerNorm()(x[:, 0]))


def train_step(state: train_state.TrainState, batch):
    def loss_fn(params):
        logits = state.apply_fn({"params": params}, batch["images"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def make(**config):
    """(train_step, (state, batch)) at a tiny config (``Config`` fields as keywords)."""
    cfg = Config(**config)
    model = ViT(cfg)
    k_init, k_img, k_lab = jax.random.split(jax.random.key(0), 3)
    images = jax.random.normal(k_img, (cfg.batch, cfg.image, cfg.image, cfg.channels))
    params = jax.jit(model.init)(k_init, images)["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-3))
    batch = {"images": images, "labels": jax.random.randint(k_lab, (cfg.batch,), 0, cfg.classes)}
    return train_step, (state, batch)


def tiny():
    return make()
