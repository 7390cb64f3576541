"""flax.nnx's decoder-only LM (scripts/libmodels/flax_nnx.py) through partex: nnx's own
modules, the layers in an ``nnx.List``, and the functional step NNX users jit
(``nnx.split`` -> ``train_step(state, opt_state, batch)`` that ``nnx.merge``s). No axis
names: everything is found from the program's structure."""

import jax
import numpy as np
from flax import nnx

import partex

import _libcheck as lc

MOD = lc.load("flax_nnx")


def test_flax_nnx_layers_are_one_stack_whatever_the_depth():
    lc.check_depth_independent(MOD)


def test_flax_nnx_hand_plans_shard_batch_megatron_pairs_and_state():
    plans = lc.check_hand_plans(MOD)
    s = lc.session(MOD.make())
    on_model = {label for label, axis in plans["megatron"].items() if axis == "model"}
    for anchor in ("state/layers/0/mlp/gate/kernel/value:1", "state/layers/1/attention/query/kernel/value:1",
                   "state/layers/0/attention/out/kernel/value:0"):
        assert s.group(anchor).label in on_model, (anchor, plans["megatron"])


def test_flax_nnx_search_fits_under_a_budget_that_forces_sharding():
    lc.check_search_fits(MOD, simulations=200)


def test_flax_nnx_roles_of_the_split_state_follow_the_step():
    fn, (state, opt_state, batch) = MOD.make()
    assert isinstance(state, nnx.State)
    res = partex.analyze(fn, state, opt_state, batch)
    roles, p = res.analysis.roles, res.program
    want = {"state": roles.parameters, "opt_state": roles.optimizer, "batch": roles.data}
    for vid, path in zip(p.inputs, p.input_paths):
        assert vid in want[path.split("/")[0]], path


def test_flax_nnx_labels_name_the_module_not_the_variable_field():
    """nnx keeps each array in a Variable, whose pytree child is ``value``: a label built
    from the leaf path should name the layer (``gate/kernel[1]``), not ``kernel/value[1]``,
    which every nnx parameter shares."""
    s = lc.session(MOD.make())
    mlp = s.group("state/layers/0/mlp/gate/kernel/value:1").label
    assert mlp.split("/")[0] in {"gate", "up", "down"}, mlp
    labels = [g.label for g in s.analysis.decision_groups]
    assert not any(label.startswith("kernel/value") for label in labels), labels


def test_flax_nnx_searched_plan_runs_the_step_with_unsharded_numerics():
    fn, args = MOD.make()
    expected = jax.jit(fn)(*args)
    plan = partex.search(fn, args, mesh=lc.MESH, memory=0.5 * lc.replicated_bytes(lc.session((fn, args))),
                         simulations=100)
    new_state, new_opt_state, loss = partex.apply_plan(plan, fn)(*args)
    np.testing.assert_allclose(loss, expected[2], rtol=1e-5)
    # the gradients, read from Adam's first moment after one step (mu = 0.1 * grad), at the
    # scale of the largest one (rounding noise on near-zero gradients is no false alarm)
    got_mu, want_mu = jax.tree.leaves(new_opt_state[0].mu), jax.tree.leaves(expected[1][0].mu)
    floor = 1e-4 * max(float(np.abs(w).max()) for w in want_mu)
    for got, want in zip(got_mu, want_mu):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=floor)
