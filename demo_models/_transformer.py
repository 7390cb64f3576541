"""GPT-style decoder: unrolled layers ("transformer") and scan over layers ("transformer-scan").

Pre-RMSNorm, causal multi-head self-attention written with einsums (scores carry two
sequence dims, 'bhts'), GELU MLP, learned positions, untied unembedding, token
cross-entropy.  The attention / embedding / loss helpers are shared with the MoE model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ._common import (ModelDef, check_divides, ones, randint, rmsnorm, stack_spec, weight,
                      zeros, normal)


@dataclass(frozen=True)
class TransformerConfig:
    layers: int = 2
    d_model: int = 64
    heads: int = 4
    d_ff: int = 256
    vocab: int = 128
    seq: int = 32
    batch: int = 8
    lr: float = 3e-3
    remat: bool = False  # the user's own jax.checkpoint around every layer

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


# The benchmark sizes (PartIR/TOAST T32 and T48).  Retune here.
T32 = TransformerConfig(layers=32, d_model=4096, heads=32, d_ff=16384, vocab=32000,
                        seq=512, batch=48, lr=1e-4)
T48 = TransformerConfig(layers=48, d_model=8192, heads=64, d_ff=32768, vocab=32000,
                        seq=128, batch=64, lr=1e-4)
PRESETS = {"tiny": TransformerConfig(), "full": T32, "t32": T32, "t48": T48}


def validate(name: str, c) -> None:
    check_divides(name, "d_model must be divisible by heads", c.heads, c.d_model)


# --------------------------------------------------------------------------- specs


def attention_spec(c) -> dict:
    d, h, k = c.d_model, c.heads, c.head_dim
    return {
        "ln1": ones((d,), ("d_model",)),
        "wq": weight((d, h, k), ("d_model", "heads", "head_dim")),
        "wk": weight((d, h, k), ("d_model", "heads", "head_dim")),
        "wv": weight((d, h, k), ("d_model", "heads", "head_dim")),
        "wo": weight((h, k, d), ("heads", "head_dim", "d_model"), fan_in=d),
    }


def layer_spec(c) -> dict:
    return {
        **attention_spec(c),
        "ln2": ones((c.d_model,), ("d_model",)),
        "w1": weight((c.d_model, c.d_ff), ("d_model", "ffn")),
        "b1": zeros((c.d_ff,), ("ffn",)),
        "w2": weight((c.d_ff, c.d_model), ("ffn", "d_model")),
        "b2": zeros((c.d_model,), ("d_model",)),
    }


def embed_spec(c) -> dict:
    return {
        "embed": normal((c.vocab, c.d_model), ("vocab", "d_model"), 1.0),
        "pos": normal((c.seq, c.d_model), ("seq", "d_model"), 0.02),
        "ln_f": ones((c.d_model,), ("d_model",)),
        "unembed": weight((c.d_model, c.vocab), ("d_model", "vocab")),
    }


def token_batch_spec(c) -> dict:
    return {
        "tokens": randint((c.batch, c.seq), ("batch", "seq"), c.vocab),
        "targets": randint((c.batch, c.seq), ("batch", "seq"), c.vocab),
    }


def spec_unrolled(c):
    return {**embed_spec(c), "layers": [layer_spec(c) for _ in range(c.layers)]}, \
        token_batch_spec(c)


def spec_scan(c):
    return {**embed_spec(c), "layers": stack_spec(layer_spec(c), c.layers)}, \
        token_batch_spec(c)


# --------------------------------------------------------------------------- math


def embed_tokens(params, tokens):
    x = jnp.take(params["embed"], tokens, axis=0)  # gather: [batch, seq, d_model]
    return x + params["pos"][None, :, :]


def causal_attention(p, x):
    """x + softmax(q k^T / sqrt(d)) v with a causal mask, on pre-normed x."""
    h = rmsnorm(x, p["ln1"])
    q = jnp.einsum("btm,mhd->bthd", h, p["wq"])
    k = jnp.einsum("bsm,mhd->bshd", h, p["wk"])
    v = jnp.einsum("bsm,mhd->bshd", h, p["wv"])
    scores = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(q.shape[-1])
    t = x.shape[1]
    causal = jax.lax.broadcasted_iota(jnp.int32, (t, t), 0) >= \
        jax.lax.broadcasted_iota(jnp.int32, (t, t), 1)
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhts,bshd->bthd", probs, v)
    return x + jnp.einsum("bthd,hdm->btm", out, p["wo"])


def mlp_block(p, x):
    h = rmsnorm(x, p["ln2"])
    h = jax.nn.gelu(jnp.einsum("btm,mf->btf", h, p["w1"]) + p["b1"])
    return x + jnp.einsum("btf,fm->btm", h, p["w2"]) + p["b2"]


def decoder_layer(p, x):
    return mlp_block(p, causal_attention(p, x))


def lm_loss(params, x, targets):
    """Final norm, unembed, mean token cross-entropy."""
    x = rmsnorm(x, params["ln_f"])
    logits = jnp.einsum("btm,mv->btv", x, params["unembed"])
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, targets[:, :, None], axis=-1)
    return -jnp.mean(picked)


def _layer(c):
    """The layer as the step calls it: under the user's own ``jax.checkpoint`` with
    ``remat=True`` (every layer recomputed from its input, as MaxText's ``remat_policy: full``)."""
    return jax.checkpoint(decoder_layer) if c.remat else decoder_layer


def loss_unrolled(c, params, batch):
    x = embed_tokens(params, batch["tokens"])
    layer = _layer(c)
    for p in params["layers"]:
        x = layer(p, x)
    return lm_loss(params, x, batch["targets"])


def loss_scan(c, params, batch):
    x = embed_tokens(params, batch["tokens"])
    layer = _layer(c)
    x, _ = jax.lax.scan(lambda x, p: (layer(p, x), None), x, params["layers"])
    return lm_loss(params, x, batch["targets"])


TRANSFORMER = ModelDef(
    name="transformer",
    description="GPT-style decoder, unrolled layers (T32/T48 benchmark sizes)",
    config_cls=TransformerConfig,
    presets=PRESETS,
    spec=spec_unrolled,
    loss=loss_unrolled,
    validate=lambda c: validate("transformer", c),
)

TRANSFORMER_SCAN = ModelDef(
    name="transformer-scan",
    description="GPT-style decoder, lax.scan over stacked layers (T32/T48 benchmark sizes)",
    config_cls=TransformerConfig,
    presets=PRESETS,
    spec=spec_scan,
    loss=loss_scan,
    validate=lambda c: validate("transformer-scan", c),
)
