"""Llama-style decoder: RMSNorm, rotary positions (RoPE), grouped-query attention, SwiGLU FFN,
layers stacked and run under `jax.lax.scan` (``scan=false``: held in a list and run one after
another, unrolled), untied LM head, token cross-entropy.

Parameters are keyed as in the Llama reference code (`wq`, `wk`, `wv`, `wo`, `w_gate`,
`w_up`, `w_down`, `attn_norm`, `ffn_norm`, `final_norm`, `lm_head`), not by role, so the
model checks that partex finds the tensor-parallel dims from the program's structure.
Grouped-query attention: `kv_heads` key/value heads, each shared by `heads // kv_heads`
query heads (the query heads are reshaped to [kv_heads, group] for the score einsum).

Two options mirror how MaxText trains (defaults keep the plain float32 model, unchanged):

- ``dtype``: ``"float32"`` (default) or ``"bfloat16"``. With ``"bfloat16"`` the parameters
  (and Adam's state) stay float32, as MaxText's ``weight_dtype: float32``, but every layer
  computes in bf16, as MaxText's ``dtype: bfloat16``: each weight is cast to bf16 where it is
  used, the residual stream between layers is bf16, and every matmul takes bf16 operands.
  RMSNorm's mean square, the attention softmax and the loss (logits cast up, log-softmax,
  mean) are computed in float32, as MaxText's RMSNorm, attention kernel and
  ``cast_logits_to_fp32`` do; the loss takes one-hot targets, as MaxText's
  ``cross_entropy_with_logits`` does (the gradient of the logits is then elementwise, not a
  scatter into a [batch, seq, vocab] block of zeros).
- ``remat``: rematerialisation of the scanned layer, with MaxText's ``remat_policy`` names:
  ``"none"`` (default: no ``jax.checkpoint``), ``"full"`` (``jax.checkpoint`` around the
  layer, nothing saved: everything recomputed in the backward pass), or a policy that saves
  (or offloads to pinned host memory) the layer's activations tagged with MaxText's
  ``checkpoint_name`` tags (``decoder_layer_input``, ``query_proj``, ``key_proj``,
  ``value_proj`` (q and k after RoPE, as in MaxText), ``context`` (attention output, before
  ``wo``), ``out_proj``, ``mlpwi_0`` (gate), ``mlpwi_1`` (up), ``mlpwo`` (down)) and
  recomputes the rest. The named policies are those of MaxText's ``decoders.py``
  (``get_remat_policy``): ``minimal`` saves every projection (q/k/v/out, gate/up/down) but
  not the attention context, ``minimal_with_context`` the same plus the context,
  ``save_dot_with_context_except_mlp``, ``save_dot_except_mlpwi``, ``save_dot_except_mlp``,
  ``save_qkv_proj``, ``save_out_proj``; ``qkv_proj_offloaded`` and ``minimal_offloaded``
  offload instead of saving. ``custom:NAME=device+NAME=offload+...`` is MaxText's
  ``remat_policy: custom`` (each listed tag saved on device or offloaded, the others
  recomputed; ``decoder_layer_input`` defaults to ``device`` and cannot be ``remat``, as in
  MaxText); the form uses ``+``, not commas, so that it survives the CLI's
  ``--config a=1,b=2`` splitting. MaxText wraps the scanned layer with
  ``prevent_cse=False``; so does this model.
- ``attention``: ``"dot"`` (default: einsums and a softmax, the [seq, seq] scores in memory)
  or ``"flash"``: JAX's Pallas flash-attention kernels (``_flash``: the scores stay in the
  kernel's blocks; partitioned over batch and heads by ``custom_partitioning``), as MaxText's
  ``attention: flash`` runs its splash kernel on TPU. The key/value heads are repeated to the
  query heads' count for the kernel. Off TPU the kernels run in Pallas' interpreter.

Presets ``maxtext-32b``, ``maxtext-22b``, ``llama2-70b`` (v5p), ``llama2-70b-v6e``,
``llama3.1-70b-v6e`` and ``llama3.1-8b-v6e`` mirror published MaxText runs (dims, global
batch = per-device batch x chips, sequence, bf16, remat policy); ``PUBLISHED_RUNS`` gives each
one's hardware, mesh and published MFU, and the comments by each preset say what is not
mirrored. The presets whose runs used MaxText's flash (splash) kernel set ``attention="flash"``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from . import _flash
from ._common import (DemoModelError, ModelDef, check_divides, normal, ones, randint, rmsnorm,
                      stack_spec, weight)


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
    dtype: str = "float32"  # "float32" or "bfloat16" (bf16 compute, float32 parameters)
    remat: str = "none"  # "none", "full", a MaxText remat_policy name, or "custom:..."
    attention: str = "dot"  # "dot" (einsums, scores in memory) or "flash" (Pallas kernels)
    # MaxText's: the parameters / Adam's state kept in host memory between steps
    parameter_memory_host_offload: bool = False
    optimizer_memory_host_offload: bool = False
    # the layers stacked and run under lax.scan (MaxText's scan_layers: true), or held in a
    # list and run one after another in Python (scan_layers: false; flax without nn.scan)
    scan: bool = True

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


# Llama-2-7B's dims (32 layers, d_model 4096, 32 heads, SwiGLU 11008, vocab 32000) with
# grouped-query attention over 8 key/value heads (as Llama-2-70B / Llama-3 use); batch 8 of
# 1024 tokens, as in docs/results.md's 7B measurement ("Full-size problems"). Retune here.
LLAMA_7B = LlamaConfig(layers=32, d_model=4096, heads=32, kv_heads=8, d_ff=11008, vocab=32000,
                       seq=1024, batch=8, lr=1e-4)

# ----------------------------------------------------------------- published MaxText runs
# Each preset mirrors one published MaxText run: dims, global batch (per-device batch x
# chips), sequence, bf16 compute over float32 weights, the run's remat_policy. lr is MaxText's
# default learning_rate (3e-5); it changes no shape, FLOP or byte. The meshes and the MFU
# are in PUBLISHED_RUNS below, the sources by each preset. The runs that used MaxText's
# splash (flash) Pallas kernel (`attention: flash`, or `autoselected`, which picks it for
# training on TPU) use JAX's Pallas flash-attention kernels here (`attention="flash"`): the
# [batch, heads, seq, seq] scores never reach memory. Not mirrored: splash skips fully
# masked causal blocks, JAX's flash kernels are counted at the full seq x seq work; the
# key/value heads are repeated for the kernel (splash reads grouped heads as they are). Also not mirrored:
# `use_iota_embed: true` (MaxText embeds by a one-hot matmul, here a gather), AdamW's weight
# decay (here Adam), RMSNorm epsilon 1e-5 (here 1e-6), the XLA/libtpu flags.

# MaxText README (Jan 2025, commit 9501baa) "32B | v5p-128 | 3.28e+02 | 67.76%" from
# MaxText/configs/v5p/32b.sh: global_parameter_scale=32 on base.yml's llama2-style default
# model (emb 2048x4, 16x4 heads, MHA, head_dim 128, SwiGLU mlp 7168x4, 16x2 layers, vocab
# 32000, untied), per_device_batch_size=6, max_target_length=2048, remat_policy=minimal,
# attention=flash, ici_fsdp=16 x ici_tensor=4 on 64 chips (v5p-128). In Jan 2025 MaxText's
# `minimal` was jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims; here it is the
# name-based policy MaxText uses now, which saves the same projections (q/k after RoPE here,
# before RoPE there: only elementwise work differs).
MAXTEXT_32B = LlamaConfig(layers=32, d_model=8192, heads=64, kv_heads=64, d_ff=28672,
                          vocab=32000, seq=2048, batch=6 * 64, lr=3e-5, dtype="bfloat16",
                          remat="minimal", attention="flash")
# MaxText README (Apr 2023, commit 281e04b) "22B | 1x v4-128 | 156 TFLOP/s | 56.7%" from
# MaxText/configs/1xv4-128.sh: scale=3 (emb 6144, 24 heads of head_dim 256, mlp 24576,
# 48 layers), vocab 32768, per_device_batch_size=16, max_target_length=1024, remat full,
# ici_fsdp=64 on 64 chips, plain dot-product attention (no flash in 2023). That 2023 model is
# NOT a Llama: a single ReLU matmul pair (wi 6144x24576, wo 24576x6144) instead of SwiGLU, a
# parallel block (attention and MLP read the same pre-norm), T5 relative position biases
# instead of RoPE, query/key layer norm, tied input/output embeddings. d_ff=16384 makes the
# SwiGLU's three matrices hold exactly the ReLU MLP's two (3*16384 = 2*24576): the same
# parameters and matmul FLOPs per layer. The untied lm_head adds 0.2B parameters that the
# published (tied) model has not. (Today's v4/22b.sh is another model, SwiGLU with head_dim
# 128, and has no published MFU of its own: the v4 README still shows the 2023 figures.)
MAXTEXT_22B = LlamaConfig(layers=48, d_model=6144, heads=24, kv_heads=24, d_ff=16384,
                          vocab=32768, seq=1024, batch=16 * 64, lr=3e-5, dtype="bfloat16",
                          remat="full")
# MaxText docs/reference/models/tiering.md (v5p Gold): "Llama 2 70B | 512 Chips, BF16,
# SL=4096 | 65.4% | 692 tokens/s/device", recipe benchmarks/maxtext_v5p_model_configs.py
# llama2_70b_v5p_128 (commit 92e59fd): model llama2-70b, per_device_batch_size=4,
# max_target_length=4096, remat_policy=save_dot_except_mlpwi, ici_fsdp=-1 (all 512 chips),
# attention autoselected (= flash on TPU).
LLAMA2_70B = LlamaConfig(layers=80, d_model=8192, heads=64, kv_heads=8, d_ff=28672, vocab=32000,
                         seq=4096, batch=4 * 512, lr=3e-5, dtype="bfloat16",
                         remat="save_dot_except_mlpwi", attention="flash")
# tpu-recipes training/trillium/Llama2-70B-MaxText (MaxText tag tpu-recipes-v0.1.2, model
# llama2-70b-4096-sc): v6e-256, max_target_length=4096, remat_policy=qkv_proj_offloaded,
# ici_fsdp_transpose=-1 (256), attention=flash; its log line "seconds: 9.052, TFLOP/s/device:
# 402.274, total_weights: 2097152" (= 43.8% MFU, tiering.md, Trillium Gold) is a run at
# per_device_batch_size=2 (2 x 256 x 4096 tokens), as the recipe said until May 2025; it says
# 3 since (commit 8239ba3) without a new log line. This preset mirrors the measured run: 2.
LLAMA2_70B_V6E = dataclasses.replace(LLAMA2_70B, batch=2 * 256, remat="qkv_proj_offloaded")
# tpu-recipes training/trillium/Llama3.1-70B-MaxText/v6e-256 (model llama3_1-70b-8192):
# per_device_batch_size=5, max_target_length=8192, remat custom (decoder_layer_input, q/k/v
# projections offloaded), ici_fsdp=-1 (256), attention=flash (block sizes 2048, fused bwd);
# 462.297 TFLOP/s/device = 50.33% MFU (tiering.md). Not mirrored: Llama 3.1's RoPE frequency
# scaling (rope_type llama3.1; only rope_theta 500000 is).
LLAMA31_70B_V6E = LlamaConfig(
    layers=80, d_model=8192, heads=64, kv_heads=8, d_ff=28672, vocab=128256, seq=8192,
    batch=5 * 256, rope_theta=500000.0, lr=3e-5, dtype="bfloat16", attention="flash",
    remat="custom:decoder_layer_input=offload+query_proj=offload+key_proj=offload"
          "+value_proj=offload")
# tpu-recipes training/trillium/Llama3.1-8B-MaxText/v6e-256 (model llama3_1-8b-8192):
# per_device_batch_size=4, max_target_length=8192, remat custom (decoder_layer_input,
# out_proj and q/k/v offloaded), ici_fsdp=-1 (256), attention=flash; 417.397 TFLOP/s/device
# = 45.46% MFU (tiering.md). RoPE scaling not mirrored, as above.
LLAMA31_8B_V6E = LlamaConfig(
    layers=32, d_model=4096, heads=32, kv_heads=8, d_ff=14336, vocab=128256, seq=8192,
    batch=4 * 256, rope_theta=500000.0, lr=3e-5, dtype="bfloat16", attention="flash",
    remat="custom:decoder_layer_input=offload+out_proj=offload+query_proj=offload"
          "+key_proj=offload+value_proj=offload")

# Llama 3.1 405B (Meta's model card and paper: 126 layers, d_model 16384, 128 heads over 8
# key/value heads, SwiGLU 53248, vocab 128256, RoPE theta 500000) at 8192 tokens and a global
# batch of 2048 sequences (16M tokens, the paper's batch at that context), bf16 over float32
# weights, full remat, flash attention. No published MaxText run of it: the mesh is left to
# partex (``partex search --devices``).
LLAMA31_405B = LlamaConfig(
    layers=126, d_model=16384, heads=128, kv_heads=8, d_ff=53248, vocab=128256, seq=8192,
    batch=2048, rope_theta=500000.0, lr=3e-5, dtype="bfloat16", remat="full", attention="flash")

PRESETS = {"tiny": LlamaConfig(), "full": LLAMA_7B, "7b": LLAMA_7B, "llama3.1-405b": LLAMA31_405B,
           "maxtext-32b": MAXTEXT_32B, "maxtext-22b": MAXTEXT_22B, "llama2-70b": LLAMA2_70B,
           "llama2-70b-v6e": LLAMA2_70B_V6E, "llama3.1-70b-v6e": LLAMA31_70B_V6E,
           "llama3.1-8b-v6e": LLAMA31_8B_V6E}

# The published run behind each MaxText preset: chip, chip count, MaxText's mesh (axes of
# size 1 left out), published MFU (as MaxText counts it: 6*N-style weight FLOPs plus
# attention FLOPs, not causal-halved for these runs; the 2023 22B run counted 6*N*tokens
# only) and TFLOP/s per chip where published.
PUBLISHED_RUNS = {
    "maxtext-32b": {"chip": "tpu-v5p", "chips": 64, "mesh": {"fsdp": 16, "tensor": 4},
                    "mfu": 0.6776, "tflops_per_chip": 328.0},
    "maxtext-22b": {"chip": "tpu-v4", "chips": 64, "mesh": {"fsdp": 64},
                    "mfu": 0.567, "tflops_per_chip": 156.0},
    "llama2-70b": {"chip": "tpu-v5p", "chips": 512, "mesh": {"fsdp": 512},
                   "mfu": 0.654, "tflops_per_chip": None},
    "llama2-70b-v6e": {"chip": "tpu-v6e", "chips": 256, "mesh": {"fsdp_transpose": 256},
                       "mfu": 0.438, "tflops_per_chip": 402.274},
    "llama3.1-70b-v6e": {"chip": "tpu-v6e", "chips": 256, "mesh": {"fsdp": 256},
                         "mfu": 0.5033, "tflops_per_chip": 462.297},
    "llama3.1-8b-v6e": {"chip": "tpu-v6e", "chips": 256, "mesh": {"fsdp": 256},
                        "mfu": 0.4546, "tflops_per_chip": 417.397},
}


# --------------------------------------------------------------------------- dtype, remat

DTYPES = {"float32": None, "bfloat16": jnp.bfloat16}  # None: compute as the float32 params are

# MaxText's checkpoint_name tags, in the order this layer produces them.
TAGS = ("decoder_layer_input", "query_proj", "key_proj", "value_proj", "context", "out_proj",
        "mlpwi_0", "mlpwi_1", "mlpwo")
_QKV = ("query_proj", "value_proj", "key_proj")
_MINIMAL = _QKV + ("out_proj", "mlpwi_0", "mlpwi_1", "mlpwo")
# remat_policy -> (names saved on device, names offloaded to pinned host), from MaxText's
# decoders.py get_remat_policy / minimal_policy (its kv_proj, qkv_proj and mlpwi tags are
# for fused projections this model does not have).
REMAT_POLICIES = {
    "minimal": (_MINIMAL, ()),
    "minimal_with_context": (_MINIMAL + ("context",), ()),
    "save_dot_with_context_except_mlp": (_QKV + ("context", "out_proj"), ()),
    "save_dot_except_mlpwi": (_QKV + ("out_proj", "mlpwo"), ()),
    "save_dot_except_mlp": (_QKV + ("out_proj",), ()),
    "save_qkv_proj": (_QKV, ()),
    "save_out_proj": (("out_proj",), ()),
    "qkv_proj_offloaded": ((), _QKV),
    "minimal_offloaded": ((), _MINIMAL),
}
REMAT_CHOICES = ("none", "full") + tuple(REMAT_POLICIES) + ("custom:NAME=device|offload+...",)


def _custom_remat(spec: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """'custom:decoder_layer_input=offload+query_proj=offload' -> (device names, offloaded)."""
    where = {"decoder_layer_input": "device"}  # MaxText's base.yml default; the rest: remat
    body = spec[len("custom:"):]
    for item in body.split("+") if body else ():
        name, sep, how = item.partition("=")
        name, how = name.strip(), how.strip()
        if not sep or name not in TAGS or how not in ("device", "offload", "remat"):
            raise DemoModelError(
                f"llama: bad custom remat entry {item!r} in {spec!r}; expected NAME=device, "
                f"NAME=offload or NAME=remat joined by '+', NAME one of {', '.join(TAGS)}")
        where[name] = how
    if where["decoder_layer_input"] == "remat":
        raise DemoModelError("llama: custom remat cannot rematerialise decoder_layer_input "
                             "(the scanned layer's input is always kept, as in MaxText)")
    return (tuple(n for n in TAGS if where.get(n) == "device"),
            tuple(n for n in TAGS if where.get(n) == "offload"))


def remat_names(remat: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The (saved, offloaded) tag names of a named-tag remat policy; None for none/full."""
    if remat in ("none", "full"):
        return None
    if remat.startswith("custom:"):
        return _custom_remat(remat)
    if remat in REMAT_POLICIES:
        return REMAT_POLICIES[remat]
    raise DemoModelError(f"llama: unknown remat {remat!r}; valid: {', '.join(REMAT_CHOICES)}")


def validate(c: LlamaConfig) -> None:
    check_divides("llama", "d_model must be divisible by heads", c.heads, c.d_model)
    check_divides("llama", "heads must be divisible by kv_heads", c.kv_heads, c.heads)
    check_divides("llama", "the head dim must be even (rotary pairs)", 2, c.head_dim)
    if c.dtype not in DTYPES:
        raise DemoModelError(f"llama: unknown dtype {c.dtype!r}; valid: {', '.join(DTYPES)}")
    if c.attention not in ATTENTIONS:
        raise DemoModelError(f"llama: unknown attention {c.attention!r}; valid: {', '.join(ATTENTIONS)}")
    if c.attention == "flash" and c.seq % 128:
        raise DemoModelError(f"llama: attention=flash needs seq a multiple of 128 (the kernels' blocks), got {c.seq}")
    remat_names(c.remat)


ATTENTIONS = ("dot", "flash")


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
        "layers": stack_spec(layer_spec(c), c.layers) if c.scan else [layer_spec(c) for _ in range(c.layers)],
        "final_norm": ones((c.d_model,), ("d_model",)),
        "lm_head": weight((c.d_model, c.vocab), ("d_model", "vocab")),
    }
    batch = {
        "tokens": randint((c.batch, c.seq), ("batch", "seq"), c.vocab),
        "targets": randint((c.batch, c.seq), ("batch", "seq"), c.vocab),
    }
    return params, batch


# --------------------------------------------------------------------------- math
#
# `cd` is the compute dtype: None for the float32 model (every helper then runs exactly the
# ops it always did), jnp.bfloat16 for dtype="bfloat16". `tag(x, name)` is checkpoint_name
# when the remat policy selects by name, else the identity (no eqn at all).


def _no_tag(x, name):
    return x


def _cast(x, cd):
    return x if cd is None else x.astype(cd)


def _norm(x, scale, cd):
    """RMSNorm; under bf16 as MaxText's: statistics in float32, output and scale in bf16."""
    if cd is None:
        return rmsnorm(x, scale)
    xf = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(xf), axis=-1, keepdims=True)
    return (xf * jax.lax.rsqrt(var + 1e-6)).astype(cd) * scale.astype(cd)


def rope(x: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding of x [batch, seq, heads, head_dim] (rotate-half form)."""
    t, hd = x.shape[1], x.shape[-1]
    freqs = 1.0 / theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)  # [hd/2]
    angles = jnp.arange(t, dtype=jnp.float32)[:, None] * freqs[None, :]      # [t, hd/2]
    cos, sin = jnp.cos(angles)[:, None, :], jnp.sin(angles)[:, None, :]     # [t, 1, hd/2]
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def attention(c: LlamaConfig, p, x, cd=None, tag=_no_tag):
    """x + GQA(rmsnorm(x)) with a causal mask."""
    b, t, _ = x.shape
    kv, g, hd = c.kv_heads, c.heads // c.kv_heads, c.head_dim
    h = _norm(x, p["attn_norm"], cd)
    # RoPE in float32 (its tables are float32), cast back to the compute dtype
    q = _cast(rope(jnp.einsum("btm,mhd->bthd", h, p["wq"]), c.rope_theta), cd)
    k = _cast(rope(jnp.einsum("bsm,mkd->bskd", h, p["wk"]), c.rope_theta), cd)
    v = jnp.einsum("bsm,mkd->bskd", h, p["wv"])
    q, k, v = tag(q, "query_proj"), tag(k, "key_proj"), tag(v, "value_proj")
    if c.attention == "flash":  # the kernel's layout: [batch, heads, seq, head_dim]
        k, v = (jnp.repeat(a, g, axis=2).transpose(0, 2, 1, 3) for a in (k, v))
        out = _flash.attention(q.transpose(0, 2, 1, 3), k, v, causal=True, sm_scale=1.0 / math.sqrt(hd))
        out = tag(out.transpose(0, 2, 1, 3), "context")
        return x + tag(jnp.einsum("bthd,hdm->btm", out, p["wo"]), "out_proj")
    q = q.reshape(b, t, kv, g, hd)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k) / math.sqrt(hd)
    causal = jax.lax.broadcasted_iota(jnp.int32, (t, t), 0) >= \
        jax.lax.broadcasted_iota(jnp.int32, (t, t), 1)
    if cd is None:
        scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
        probs = jax.nn.softmax(scores, axis=-1)
    else:  # softmax in float32, as the flash kernel's statistics are
        scores = scores.astype(jnp.float32)
        scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(cd)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(b, t, c.heads, hd)
    out = tag(out, "context")
    return x + tag(jnp.einsum("bthd,hdm->btm", out, p["wo"]), "out_proj")


def swiglu(p, x, cd=None, tag=_no_tag):
    h = _norm(x, p["ffn_norm"], cd)
    gate = tag(jnp.einsum("btm,mf->btf", h, p["w_gate"]), "mlpwi_0")
    up = tag(jnp.einsum("btm,mf->btf", h, p["w_up"]), "mlpwi_1")
    return x + tag(jnp.einsum("btf,fm->btm", jax.nn.silu(gate) * up, p["w_down"]), "mlpwo")


def _layer_fn(c: LlamaConfig):
    """The scan body (x, layer params) -> (x, None), wrapped as `c.remat` asks."""
    cd = DTYPES[c.dtype]
    names = remat_names(c.remat)
    tag = _no_tag if names is None else checkpoint_name

    def layer(x, p):
        if cd is not None:  # weights cast to the compute dtype where they are used
            p = jax.tree.map(lambda w: w.astype(cd), p)
        x = tag(x, "decoder_layer_input")
        return swiglu(p, attention(c, p, x, cd, tag), cd, tag), None

    if c.remat == "none":
        return layer
    if c.remat == "full":
        return jax.checkpoint(layer, prevent_cse=False)
    saved, offloaded = names
    if offloaded:
        policy = jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=list(saved), names_which_can_be_offloaded=list(offloaded),
            offload_src="device", offload_dst="pinned_host")
    else:
        policy = jax.checkpoint_policies.save_only_these_names(*saved)
    return jax.checkpoint(layer, policy=policy, prevent_cse=False)


def loss(c: LlamaConfig, params, batch):
    cd = DTYPES[c.dtype]
    x = jnp.take(_cast(params["embed"], cd), batch["tokens"], axis=0)  # [batch, seq, d_model]
    layer = _layer_fn(c)
    if c.scan:
        x, _ = jax.lax.scan(layer, x, params["layers"])
    else:
        for p in params["layers"]:
            x, _ = layer(x, p)
    x = _norm(x, params["final_norm"], cd)
    logits = jnp.einsum("btm,mv->btv", x, _cast(params["lm_head"], cd))
    if cd is not None:  # the loss in float32 (MaxText's cast_logits_to_fp32)
        logits = logits.astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    if cd is not None:  # MaxText's one-hot cross entropy
        picked = jnp.sum(jax.nn.one_hot(batch["targets"], c.vocab, dtype=logp.dtype) * logp, axis=-1)
    else:
        picked = jnp.take_along_axis(logp, batch["targets"][:, :, None], axis=-1)
    return -jnp.mean(picked)


LLAMA = ModelDef(
    name="llama",
    description="Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU, scan over layers (or unrolled)",
    config_cls=LlamaConfig,
    presets=PRESETS,
    spec=spec,
    loss=loss,
    validate=validate,
    host_state=lambda c: (c.parameter_memory_host_offload, c.optimizer_memory_host_offload),
)
