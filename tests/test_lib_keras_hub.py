"""keras-hub's Llama and GPT-2 on Keras 3's JAX backend (scripts/libmodels/keras_hub.py)
through partex: the step is ``model.stateless_call`` + ``optimizer.stateless_apply`` as
Keras's JAX training-loop guide writes it, and its state is what Keras users hold there --
lists of arrays in Keras's variable order (``variables="paths"``: dicts keyed by Keras
variable path)."""

import jax
import numpy as np

import partex

import _libcheck as lc

MOD = lc.load("keras_hub")


class _Variant:
    """The module with other defaults for ``make`` (GPT-2, or the state keyed by path)."""

    def __init__(self, **defaults):
        self.defaults = defaults

    def make(self, layers: int = 2, size: str = "tiny"):
        return MOD.make(layers, size, **self.defaults)


GPT2 = _Variant(arch="gpt2")
BY_PATH = _Variant(variables="paths")


def test_keras_hub_llama_layers_are_one_stack_whatever_the_depth():
    lc.check_depth_independent(MOD)


def test_keras_hub_gpt2_layers_are_one_stack_whatever_the_depth():
    lc.check_depth_independent(GPT2)


def test_keras_hub_state_by_variable_path_layers_are_one_stack_whatever_the_depth():
    """Keyed by path, the params are ``transformer_layer_0/...`` subtrees, and AdamW's
    moments are leaves ``adam_w/transformer_layer_0_self_attention_query_kernel_momentum``."""
    lc.check_depth_independent(BY_PATH)


def test_keras_hub_llama_hand_plans_shard_batch_heads_ffn_and_state():
    plans = lc.check_hand_plans(MOD)
    s = lc.session(MOD.make())
    on_model = {label for label, axis in plans["megatron"].items() if axis == "model"}
    paths = MOD.variable_paths("llama", 2)
    # the Megatron pairs, found by structure: the query heads and the FFN hidden of each layer
    for name, dim in (("transformer_layer_0/self_attention/query/kernel", 1),
                      ("transformer_layer_1/feedforward_gate_dense/kernel", 1)):
        anchor = f"trainable_variables/{paths.index(name)}:{dim}"
        assert s.group(anchor).label in on_model, (name, anchor, plans["megatron"])


def test_keras_hub_gpt2_hand_plans():
    lc.check_hand_plans(GPT2)


def test_keras_hub_llama_search_fits_under_a_budget_that_forces_sharding():
    lc.check_search_fits(MOD)


def test_keras_hub_state_by_variable_path_gives_readable_labels():
    fn, args = BY_PATH.make()
    labels = {g.label for g in partex.analyze(fn, *args).analysis.decision_groups}
    # keras' bias-free Dense layers hold only ``kernel``: the layer names the dim
    assert {"self_attention/query[2]", "transformer_layer_*/feedforward_gate_dense[1]",
            "token_embedding/embeddings[1]"} <= labels, labels


def test_keras_hub_list_held_variables_are_labelled_by_the_layer_that_reads_them():
    """In a list, a variable's path is its position: the label comes from the Keras layer
    scope JAX traced its first reader in, layer index starred, as the by-path labels read."""
    fn, args = MOD.make()
    an = partex.analyze(fn, *args).analysis
    labels = {g.label for g in an.decision_groups}
    assert {"self_attention/query[2]", "transformer_layer_*/feedforward_intermediate_dense[1]"} <= labels, labels
    assert not any(label.startswith("trainable_variables/") and label.split("/")[1][0].isdigit()
                   for label in labels), labels


def test_keras_hub_optimizer_iteration_and_state_come_out_of_the_sharded_step():
    """Keras's AdamW state is a list whose first leaves are the int ``iteration`` and the
    learning rate; a zero3 plan runs the step and its updated state matches the unsharded one."""
    fn, args = MOD.make()
    assert args[2][0].dtype == np.int32 and args[2][0].shape == ()
    expected = jax.jit(fn)(*args)
    s = lc.session((fn, args))
    got = partex.apply_plan(s.plan(strategy="zero3"), fn)(*args)
    assert int(got[2][0]) == int(expected[2][0]) == 1
    np.testing.assert_allclose(got[3], expected[3], rtol=1e-5)
    # the first moments (0.1 * grad after one step) at the scale of the largest
    want_m, got_m = expected[2][2::2], got[2][2::2]
    floor = 1e-4 * max(float(np.abs(w).max()) for w in want_m)
    for g, w in zip(got_m, want_m):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=floor)
