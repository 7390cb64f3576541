"""Llama-style decoder: RMSNorm, rotary positions (RoPE), grouped-query attention, SwiGLU FFN,
layers stacked and run under `jax.lax.scan`, untied LM head, token cross-entropy.

Parameters are keyed as in the Llama reference code (`wq`, `wk`, `wv`, `wo`, `w_gate`,
`w_up`, `w_down`, `attn_norm`, `ffn_norm`, `final_norm`, `lm_head`), not by role, so the
model checks that partex finds the tensor-parallel dims from the program's structure.
Grouped-query attention: `kv_heads` key/value heads, each shared by `heads // kv_heads`
query heads (the query heads are reshaped to [kv_heads, group] for the score einsum).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ._common import ModelDef, check_divides, normal, ones, randint, rmsnorm, stack_spec, weight


@dataclass(frozen=True)
class LlamaConfig:
    layers: int = 2
    d_model: int = 64
    heads: int = 4
    kv_heads: int = 2
    d_ff: int = 128
    vocab: int = 128
    seq: int = 32
    batch: int = 8
    rope_theta: float = 10000.0
    lr: float = 3e-3

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


# Llama-2-7B's dims (32 layers, d_model 4096, 32 heads, SwiGLU 11008, vocab 32000) with
# grouped-query attention over 8 key/value heads (as Llama-2-70B / Llama-3 use); batch 8 of
# 1024 tokens, as in DESIGN.md's 7B measurement. Retune here.
LLAMA_7B = LlamaConfig(layers=32, d_model=4096, heads=32, kv_heads=8, d_ff=11008, vocab=32000,
                       seq=1024, batch=8, lr=1e-4)
PRESETS = {"tiny": LlamaConfig(), "full": LLAMA_7B, "7b": LLAMA_7B}


def validate(c: LlamaConfig) -> None:
    check_divides("llama", "d_model must be divisible by heads", c.heads, c.d_model)
    check_divides("llama", "heads must be divisible by kv_heads", c.kv_heads, c.heads)
    check_divides("llama", "the head dim must be even (rotary pairs)", 2, c.head_dim)


# --------------------------------------------------------------------------- specs


def layer_spec(c: LlamaConfig) -> dict:
    d, h, kv, k, f = c.d_model, c.heads, c.kv_heads, c.head_dim, c.d_ff
    return {
        "attn_norm": ones((d,), ("d_model",)),
        "wq": weight((d, h, k), ("d_model", "heads", "head_dim")),
        "wk": weight((d, kv, k), ("d_model", "kv_heads", "head_dim")),
        "wv": weight((d, kv, k), ("d_model", "kv_heads", "head_dim")),
        "wo": weight((h, k, d), ("heads", "head_dim", "d_model"), fan_in=d),
        "ffn_norm": ones((d,), ("d_model",)),
        "w_gate": weight((d, f), ("d_model", "ffn")),
        "w_up": weight((d, f), ("d_model", "ffn")),
        "w_down": weight((f, d), ("ffn", "d_model")),
    }


def spec(c: LlamaConfig):
    params = {
        "embed": normal((c.vocab, c.d_model), ("vocab", "d_model"), 1.0),
        "layers": stack_spec(layer_spec(c), c.layers),
        "final_norm": ones((c.d_model,), ("d_model",)),
        "lm_head": weight((c.d_model, c.vocab), ("d_model", "vocab")),
    }
    batch = {
        "tokens": randint((c.batch, c.seq), ("batch", "seq"), c.vocab),
        "targets": randint((c.batch, c.seq), ("batch", "seq"), c.vocab),
    }
    return params, batch


# --------------------------------------------------------------------------- math


def rope(x: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding of x [batch, seq, heads, head_dim] (rotate-half form)."""
    t, hd = x.shape[1], x.shape[-1]
    freqs = 1.0 / theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)  # [hd/2]
    angles = jnp.arange(t, dtype=jnp.float32)[:, None] * freqs[None, :]      # [t, hd/2]
    cos, sin = jnp.cos(angles)[:, None, :], jnp.sin(angles)[:, None, :]     # [t, 1, hd/2]
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def attention(c: LlamaConfig, p, x):
    """x + GQA(rmsnorm(x)) with a causal mask."""
    b, t, _ = x.shape
    kv, g, hd = c.kv_heads, c.heads // c.kv_heads, c.head_dim
    h = rmsnorm(x, p["attn_norm"])
    q = rope(jnp.einsum("btm,mhd->bthd", h, p["wq"]), c.rope_theta)
    k = rope(jnp.einsum("bsm,mkd->bskd", h, p["wk"]), c.rope_theta)
    v = jnp.einsum("bsm,mkd->bskd", h, p["wv"])
    q = q.reshape(b, t, kv, g, hd)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k) / math.sqrt(hd)
    causal = jax.lax.broadcasted_iota(jnp.int32, (t, t), 0) >= \
        jax.lax.broadcasted_iota(jnp.int32, (t, t), 1)
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(b, t, c.heads, hd)
    return x + jnp.einsum("bthd,hdm->btm", out, p["wo"])


def swiglu(p, x):
    h = rmsnorm(x, p["ffn_norm"])
    gate = jnp.einsum("btm,mf->btf", h, p["w_gate"])
    up = jnp.einsum("btm,mf->btf", h, p["w_up"])
    return x + jnp.einsum("btf,fm->btm", jax.nn.silu(gate) * up, p["w_down"])


def loss(c: LlamaConfig, params, batch):
    x = jnp.take(params["embed"], batch["tokens"], axis=0)  # [batch, seq, d_model]
    x, _ = jax.lax.scan(lambda x, p: (swiglu(p, attention(c, p, x)), None), x, params["layers"])
    x = rmsnorm(x, params["final_norm"])
    logits = jnp.einsum("btm,mv->btv", x, params["lm_head"])
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, batch["targets"][:, :, None], axis=-1)
    return -jnp.mean(picked)


LLAMA = ModelDef(
    name="llama",
    description="Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU, scan over layers",
    config_cls=LlamaConfig,
    presets=PRESETS,
    spec=spec,
    loss=loss,
    validate=validate,
)
