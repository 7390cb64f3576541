"""equinox's GPT (scripts/libmodels/equinox_gpt.py) through partex: equinox's own modules
vmapped over the batch, ``eqx.partition(model, eqx.is_array)`` params, an
``eqx.filter_value_and_grad`` step with optax.adamw; the blocks as a Python list, and
stacked under ``jax.lax.scan`` (``make(..., scan=True)``)."""

import functools
import types

import jax
import numpy as np

import partex

import _libcheck as lc

MOD = lc.load("equinox_gpt")
SCAN = types.SimpleNamespace(make=functools.partial(MOD.make, scan=True))


def test_equinox_blocks_list_is_one_stack_whatever_the_depth():
    lc.check_depth_independent(MOD)


def test_equinox_scanned_blocks_give_the_list_decision_space():
    (scan_groups,) = set(lc.check_depth_independent(SCAN))
    assert scan_groups == lc.decision_groups(MOD.make())
    fn, args = MOD.make(scan=True)
    assert any(op.primitive == "scan_enter" for op in partex.analyze(fn, *args).program.ops)


def test_equinox_hand_plans_shard_batch_megatron_pairs_and_state():
    plans = lc.check_hand_plans(MOD)
    s = lc.session(MOD.make())
    on_model = {label for label, axis in plans["megatron"].items() if axis == "model"}
    # eqx.nn.Linear's weight is (out, in): the MLP hidden is fc's dim 0 and proj's dim 1
    for anchor in ("params/blocks/0/fc/weight:0", "params/blocks/1/proj/weight:1",
                   "params/blocks/0/attention/query_proj/weight:0"):
        assert s.group(anchor).label in on_model, (anchor, plans["megatron"])


def test_equinox_scan_hand_plans_shard_batch_megatron_pairs_and_state():
    plans = lc.check_hand_plans(SCAN)
    s = lc.session(SCAN.make())
    on_model = {label for label, axis in plans["megatron"].items() if axis == "model"}
    # stacked blocks: dim 0 is the layer, so the MLP hidden is fc's dim 1
    for anchor in ("params/blocks/fc/weight:1", "params/blocks/attention/query_proj/weight:1"):
        assert s.group(anchor).label in on_model, (anchor, plans["megatron"])


def test_equinox_search_fits_under_a_budget_that_forces_sharding():
    lc.check_search_fits(MOD, simulations=200)


def test_equinox_scan_search_fits_under_a_budget_that_forces_sharding():
    lc.check_search_fits(SCAN, simulations=200)


def test_equinox_roles_of_partitioned_params_follow_the_step():
    for mod in (MOD, SCAN):
        fn, args = mod.make()
        res = partex.analyze(fn, *args)
        roles, p = res.analysis.roles, res.program
        want = {"params": roles.parameters, "opt_state": roles.optimizer, "batch": roles.data}
        for vid, path in zip(p.inputs, p.input_paths):
            assert vid in want[path.split("/")[0]], path


def test_equinox_zero3_plan_runs_the_step_with_unsharded_numerics():
    fn, args = MOD.make(scan=True)
    expected = jax.jit(fn)(*args)
    plan = lc.session((fn, args)).plan(strategy="zero3")
    new_params, new_opt_state, loss = partex.apply_plan(plan, fn)(*args)
    np.testing.assert_allclose(loss, expected[2], rtol=1e-5)
    # the gradients, read from Adam's first moment after one step (mu = 0.1 * grad), at the
    # scale of the largest one: the key bias has a zero gradient (softmax ignores a shift), so
    # its mu is rounding noise
    got_mu, want_mu = jax.tree.leaves(new_opt_state[0].mu), jax.tree.leaves(expected[1][0].mu)
    floor = 1e-4 * max(float(np.abs(w).max()) for w in want_mu)
    for got, want in zip(got_mu, want_mu):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=floor)
