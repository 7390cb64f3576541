"""Mixture-of-experts decoder: attention + Switch (top-1) MoE FFN in every layer.

GShard-style dispatch: tokens are grouped per sequence (group = batch element), each
token goes to its argmax expert if that expert still has room (position-in-expert by
cumsum < capacity), and dispatch/combine tensors [batch, seq, experts, capacity] move
tokens to and from an explicit expert dimension with einsums, so `experts` is a real
tensor dim that expert parallelism can shard.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ._common import ModelDef, check_divides, ones, rmsnorm, weight
from ._transformer import (attention_spec, causal_attention, embed_spec, embed_tokens,
                           lm_loss, token_batch_spec)


@dataclass(frozen=True)
class MoEConfig:
    layers: int = 2
    d_model: int = 64
    heads: int = 4
    d_ff: int = 128
    experts: int = 8
    vocab: int = 128
    seq: int = 32
    batch: int = 8
    capacity_factor: float = 1.25
    aux_loss_coef: float = 0.01
    lr: float = 3e-3

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def capacity(self) -> int:
        """Slots per expert per group (sequence)."""
        return max(1, math.ceil(self.capacity_factor * self.seq / self.experts))


# Retune here.
PRESETS = {
    "tiny": MoEConfig(),
    "full": MoEConfig(layers=8, d_model=4096, heads=32, d_ff=8192, experts=32, vocab=32000,
                      seq=512, batch=64, lr=1e-4),
}


def validate(c: MoEConfig) -> None:
    check_divides("moe", "d_model must be divisible by heads", c.heads, c.d_model)


def layer_spec(c: MoEConfig) -> dict:
    e, d, f = c.experts, c.d_model, c.d_ff
    return {
        **attention_spec(c),
        "ln2": ones((d,), ("d_model",)),
        "router": weight((d, e), ("d_model", "experts")),
        "w1": weight((e, d, f), ("experts", "d_model", "ffn"), fan_in=d),
        "w2": weight((e, f, d), ("experts", "ffn", "d_model"), fan_in=f),
    }


def spec(c: MoEConfig):
    return {**embed_spec(c), "layers": [layer_spec(c) for _ in range(c.layers)]}, \
        token_batch_spec(c)


def moe_ffn(c: MoEConfig, p, x):
    """x + Switch-MoE(rmsnorm(x)); returns (y, load-balancing aux loss)."""
    h = rmsnorm(x, p["ln2"])                                        # [b, t, d]
    logits = jnp.einsum("btd,de->bte", h, p["router"])
    probs = jax.nn.softmax(logits, axis=-1)
    expert = jnp.argmax(logits, axis=-1)                            # [b, t]
    mask = jax.nn.one_hot(expert, c.experts, dtype=jnp.float32)     # [b, t, e]
    # 0-based position of each token in its expert's queue (per sequence).
    position = jnp.sum(jnp.cumsum(mask, axis=1) * mask, axis=-1) - 1.0  # [b, t]
    kept = mask * (position < c.capacity)[:, :, None]
    slot = jax.nn.one_hot(position.astype(jnp.int32), c.capacity, dtype=jnp.float32)
    dispatch = kept[:, :, :, None] * slot[:, :, None, :]            # [b, t, e, c]
    gate = jnp.sum(probs * mask, axis=-1)                            # [b, t]
    combine = dispatch * gate[:, :, None, None]
    expert_in = jnp.einsum("btec,btd->ebcd", dispatch, h)
    hidden = jax.nn.gelu(jnp.einsum("ebcd,edf->ebcf", expert_in, p["w1"]))
    expert_out = jnp.einsum("ebcf,efd->ebcd", hidden, p["w2"])
    y = jnp.einsum("btec,ebcd->btd", combine, expert_out)
    # Switch load-balancing loss: E * sum_e (fraction routed to e) * (mean prob of e).
    aux = c.experts * jnp.sum(jnp.mean(mask, axis=(0, 1)) * jnp.mean(probs, axis=(0, 1)))
    return x + y, aux


def loss(c: MoEConfig, params, batch):
    x = embed_tokens(params, batch["tokens"])
    aux_total = 0.0
    for p in params["layers"]:
        x = causal_attention(p, x)
        x, aux = moe_ffn(c, p, x)
        aux_total = aux_total + aux
    return lm_loss(params, x, batch["targets"]) + c.aux_loss_coef * aux_total


MOE = ModelDef(
    name="moe",
    description="mixture-of-experts decoder (Switch top-1 routing, GShard dispatch/combine)",
    config_cls=MoEConfig,
    presets=PRESETS,
    spec=spec,
    loss=loss,
    validate=validate,
)
