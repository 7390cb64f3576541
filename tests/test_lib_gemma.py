"""google-deepmind's gemma (scripts/libmodels/gemma.py) through partex: gemma's own Gemma 3
``Transformer`` (GQA, qk-norm, local sliding-window and global layers, tied embeddings,
bfloat16 params as gemma makes them) with ``model.apply`` and ``optax.adamw``. Its params are
the flax dict ``model.init`` gives: ``layer_0``, ``layer_1``, ... siblings, no axis names."""

import jax.numpy as jnp

import partex

import _libcheck as lc

MOD = lc.load("gemma")


def test_gemma_layers_are_one_stack_whatever_the_depth():
    lc.check_depth_independent(MOD)


def test_gemma_hand_plans_shard_batch_heads_ffn_and_state():
    plans = lc.check_hand_plans(MOD)
    s = lc.session(MOD.make())
    on_model = {label for label, axis in plans["megatron"].items() if axis == "model"}
    # the Megatron pairs, found by structure: the FFN hidden and the attention heads
    for anchor in ("params/layer_0/mlp/gating_einsum:1", "params/layer_1/mlp/linear:0",
                   "params/layer_1/attn/attn_vec_einsum/w:0"):
        assert s.group(anchor).label in on_model, (anchor, plans["megatron"])


def test_gemma_local_and_global_layers_share_their_groups():
    """layer_0 is a sliding-window layer and layer_1 a global one (other RoPE base, other
    mask): the same params, so one decision covers both."""
    s = lc.session(MOD.make())
    for leaf, dim in (("attn/q_einsum/w", 0), ("attn/q_einsum/w", 2), ("attn/kv_einsum/w", 1),
                      ("mlp/gating_einsum", 1), ("attn/attn_vec_einsum/w", 2)):
        assert s.group(f"params/layer_0/{leaf}:{dim}") is s.group(f"params/layer_1/{leaf}:{dim}"), (leaf, dim)


def test_gemma_labels_are_gemmas_param_names():
    fn, args = MOD.make()
    labels = {g.label for g in partex.analyze(fn, *args).analysis.decision_groups}
    # an einsum module's only leaf ``w`` is a wrapper: the module names the dim
    assert {"mlp/gating_einsum[1]", "attn/attn_vec_einsum[0]", "embedder/input_embedding[0]"} <= labels, labels
    assert not any("layer_" in label for label in labels), labels


def test_gemma_search_fits_under_a_budget_that_forces_sharding():
    # in float32: verify's numerics tolerance (1e-4 of the output's scale) is below bf16's
    # rounding (~4e-3, which Adam's first step turns into whole-lr differences), so a correct
    # bf16 plan differs from the unsharded bf16 run by up to ~0.25 (even the replicated plan:
    # XLA:CPU fuses bf16 dots differently); the plan is the same at either dtype
    lc.check_search_fits(MOD, simulations=200, dtype=jnp.float32)
