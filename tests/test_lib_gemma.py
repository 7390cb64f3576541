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
    """In gemma's own bfloat16: verify compares the plan's numerics in float32 (the same ops
    at the same shardings), since bf16 rounding (~4e-3, which Adam's first step turns into
    whole-lr differences where a gradient is ~0) moves a correct plan's outputs by up to ~0.25
    of their scale, as far as a misplaced shard would."""
    out = lc.check_search_fits(MOD, simulations=200)
    assert out.numerics.computed_in == "float32 (the step's bfloat16 promoted)", out.numerics
    assert out.numerics.max_rel_err < 1e-5, out.numerics


def test_gemma_bfloat16_outputs_differ_by_rounding_alone_where_float32_does_not():
    """Why verify promotes: the same correct plan run natively in bf16 differs from the
    unsharded bf16 run far beyond the tolerance, while the float32 comparison agrees."""
    import jax
    import numpy as np

    from partex.plan._verify import compare_outputs

    fn, args = MOD.make()[:2]
    s = lc.session((fn, args))
    planned = partex.apply_plan(s.plan(strategy="megatron"), fn)
    want = jax.tree_util.tree_leaves(jax.jit(fn)(*args))
    got = jax.tree_util.tree_leaves(planned(*jax.tree_util.tree_map(jnp.copy, args)))  # it donates its args
    native = compare_outputs(list(s.program.output_paths), want, got)
    assert not native["ok"] and native["loss_rel_err"] < 1e-4, native
    assert s.verify(s.plan(strategy="megatron"), run=True, mark=False).numerics.ok
    assert np.dtype(jax.tree_util.tree_leaves(args[0])[0].dtype) == np.dtype(jnp.bfloat16)
