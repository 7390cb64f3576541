"""Gemma 3 from google-deepmind's ``gemma`` package (4.0.1), trained as a JAX user writes it.

The model is gemma's own ``gm.nn.Transformer`` (flax linen) built from a
``gm.nn.config.TransformerConfig``: grouped-query attention, qk-norm, post-attention and
post-FFW norms, alternating local (sliding-window) and global attention layers, tied
embeddings. ``size="full"`` is ``gm.nn.Gemma3_4B(text_only=True)`` -- gemma's own 4B config
(34 layers, embed 2560, 8 heads / 4 kv heads of 256, FFW 10240, vocab 262144, bfloat16
params; 3.88B without the vision encoder) -- at batch 8, seq 2048, as
``jax.ShapeDtypeStruct`` (nothing allocated). ``size="tiny"``: the same block options at embed
64, 4 heads / 2 kv heads of 16, FFW 128, vocab 256, sliding window 8, batch 8, seq 32, the
layers alternating local and global (so every depth has both kinds). ``make(dtype=...)``
changes the params' dtype (gemma's ``Transformer.dtype``, bfloat16 by default).

The step is the plain-JAX fine-tuning loop of gemma's docs without kauldron's trainer:
``model.apply({"params": params}, tokens=...)`` gives ``Output.logits``, next-token softmax
cross-entropy (optax, the mask as gemma's loss takes it), ``jax.value_and_grad`` and
``optax.adamw``; it returns
``(new_params, new_opt_state, loss)``. Params are the flax ``params`` dict as ``model.init``
gives it: ``embedder/input_embedding``, ``layer_0/attn/q_einsum/w``, ...,
``final_norm/scale``. gemma has no logical axis names, so none are passed.

No network: random init from the config classes, no tokenizer or checkpoint.

Two of gemma's imports reach tensorflow (kauldron's trainer), which is not installed: they
are bridged while gemma is imported and nothing else sees it (see ``_import_gemma``).

Commands::

    partex analyze scripts/libmodels/gemma.py:tiny
    partex bench scripts/libmodels/gemma.py:tiny --mesh data=4,model=2 --memory 1MiB --budget 10
    JAX_NUM_CPU_DEVICES=32 partex bench scripts/libmodels/gemma.py:full \\
        --mesh data=8,model=4 --hardware tpu-v4 --memory 32GiB --budget 60 --verify --json
"""

from __future__ import annotations

import sys
import types

import jax
import jax.numpy as jnp
import optax

_GM = None


def _import_gemma():
    """``from gemma import gm`` and the model modules, with tensorflow absent.

    Two of gemma's imports reach tensorflow, which is not installed (it is a dependency of
    kauldron's trainer and data pipeline, not of the model):

    * kauldron/typing/array_types.py does ``import tensorflow as tf`` only to name
      ``tf.Tensor`` in its array-type aliases (``TfArray``, ...): a placeholder module with a
      ``Tensor`` class stands in while gemma is imported;
    * gemma/gm/nn/_gemma.py (the Gemma3_4B config) imports ``gemma.gm.ckpts._paths`` (an enum
      of checkpoint URLs), whose package ``__init__`` loads the checkpoint policy that
      evaluates ``kd.train.TrainState`` -- kauldron's trainer, clu and tensorboard, all
      tensorflow: the real ``_paths`` module is loaded on its own for the import.

    Both placeholders leave ``sys.modules`` afterwards, so code that imports tensorflow or
    ``gemma.gm.ckpts`` later sees the real state. Nothing is downloaded."""
    global _GM
    if _GM is not None:
        return _GM
    import importlib.util
    import os

    import gemma

    added = {}
    try:
        import tensorflow  # noqa: F401  (a real tensorflow, if any, is used as is)
    except ImportError:
        added["tensorflow"] = types.ModuleType("tensorflow")
        added["tensorflow"].Tensor = type("Tensor", (), {})
    if "gemma.gm.ckpts" not in sys.modules:
        ckpts_dir = os.path.join(os.path.dirname(gemma.__file__), "gm", "ckpts")
        spec = importlib.util.spec_from_file_location("gemma.gm.ckpts._paths", os.path.join(ckpts_dir, "_paths.py"))
        paths = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(paths)
        ckpts = types.ModuleType("gemma.gm.ckpts")
        ckpts.__path__ = [ckpts_dir]
        ckpts._paths = paths
        added["gemma.gm.ckpts"], added["gemma.gm.ckpts._paths"] = ckpts, paths
    sys.modules.update(added)
    try:
        from gemma import gm
        from gemma.gm.nn import _config, _gemma, _modules, _transformer  # noqa: F401  (loaded while the placeholders are in)
    finally:
        for name, module in added.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]
    _GM = gm
    return gm


TINY = dict(num_embed=256, embed_dim=64, hidden_dim=128, num_heads=4, head_dim=16, num_kv_heads=2,
            sliding_window_size=8)
BATCH, SEQ = 8, 32
FULL_BATCH, FULL_SEQ = 8, 2048


def _model(layers: int, size: str, dtype=jnp.bfloat16):
    gm = _import_gemma()
    from gemma.gm.nn import _config, _gemma, _modules

    if size == "full":
        return gm.nn.Gemma3_4B(tokens="batch.input", text_only=True, dtype=dtype)
    if size != "tiny":
        raise ValueError(f"size must be 'tiny' or 'full', not {size!r}")
    full = _gemma.Gemma3_4B.config
    # Gemma 3's block options (qk-norm, post norms, gating layout, RoPE bases) at a tiny width;
    # local and global layers alternate so that both attention kinds are in every depth.
    pattern = (_modules.AttentionType.LOCAL_SLIDING, _modules.AttentionType.GLOBAL)
    config = _config.TransformerConfig(
        final_logit_softcap=None,
        use_post_attn_norm=full.use_post_attn_norm,
        use_post_ffw_norm=full.use_post_ffw_norm,
        use_qk_norm=full.use_qk_norm,
        attention_types=_config.make_attention_layers_types(pattern, num_layers=layers),
        query_pre_attn_norm=full.query_pre_attn_norm,
        attn_logits_soft_cap=None,
        transpose_gating_einsum=full.transpose_gating_einsum,
        local_base_frequency=full.local_base_frequency,
        global_base_frequency=full.global_base_frequency,
        global_scale_factor=full.global_scale_factor,
        vision_encoder=None,
        **TINY,
    )
    return gm.nn.Transformer(config=config, tokens="batch.input", dtype=dtype)


def _train_step(model, optimizer):
    def loss_fn(params, batch):
        out = model.apply({"params": params}, tokens=batch["input"])
        logits = out.logits.astype(jnp.float32)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["target"])
        return jnp.sum(loss * batch["mask"]) / jnp.sum(batch["mask"])

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, loss

    return train_step


def make(layers: int = 2, size: str = "tiny", dtype=jnp.bfloat16):
    """``(train_step, (params, opt_state, batch))`` of a Gemma 3 transformer; ``dtype`` is
    the params' (gemma's ``Transformer.dtype``, bfloat16 by default)."""
    model = _model(layers, size, jnp.dtype(dtype))
    optimizer = optax.adamw(learning_rate=1e-4, weight_decay=0.01)
    batch_size, seq = (FULL_BATCH, FULL_SEQ) if size == "full" else (BATCH, SEQ)
    vocab = model.config.num_embed

    def init(key):
        k_init, k_tok = jax.random.split(key)
        # token 0 is gemma's padding id (masked out of attention): draw from 1..vocab-1
        tokens = jax.random.randint(k_tok, (batch_size, seq + 1), 1, vocab, dtype=jnp.int32)
        params = model.init(k_init, tokens=tokens[:, :-1])["params"]
        batch = {"input": tokens[:, :-1], "target": tokens[:, 1:],
                 "mask": jnp.ones((batch_size, seq), jnp.float32)}
        return params, optimizer.init(params), batch

    key = jax.random.key(0)
    args = jax.eval_shape(init, key) if size == "full" else jax.jit(init)(key)
    return _train_step(model, optimizer), args


def tiny():
    return make(2, "tiny")


def tiny4():
    return make(4, "tiny")


def full():
    return make(size="full")
