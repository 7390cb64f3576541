"""MaxText's llama2 decoder and MaxText's own ``train_step`` (scripts/libmodels/maxtext_llama.py)
through partex: MaxText's pyconfig, mesh, NNX model, AdamW and TrainStateNNX, and the
activation constraints MaxText places with its logical axis rules, which partex models as
the user's own pins. MaxText's mesh is built with the plan's axes (data=4, model=2)."""

import jax
import numpy as np
import pytest

import maxtext  # noqa: F401  (installed by `make test`)
import partex

import _libcheck as lc

MOD = lc.load("maxtext_llama")

# flax / MaxText deprecations (nnx.State, sharding_names), hundreds per model build
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _constraints(jaxpr):
    """Every sharding_constraint eqn of a jaxpr, sub-jaxprs (scan, remat, jit) included."""
    out = []
    for e in jaxpr.eqns:
        if e.primitive.name == "sharding_constraint":
            out.append(e)
        for p in e.params.values():
            for q in p if isinstance(p, (tuple, list)) else (p,):
                sub = getattr(q, "jaxpr", q)
                if hasattr(sub, "eqns"):
                    out += _constraints(sub)
    return out


def test_maxtext_scanned_layers_give_the_same_groups_at_any_depth():
    lc.check_depth_independent(MOD)


def test_maxtext_hand_plans_shard_batch_megatron_pairs_and_state():
    lc.check_hand_plans(MOD)


def test_maxtext_search_fits_under_a_budget_that_forces_sharding():
    lc.check_search_fits(MOD, simulations=200)


def test_maxtext_activation_constraints_are_the_users_pins_on_the_plans_mesh():
    """MaxText constrains 44 activations (its logical names -> its mesh): batch on data, the
    embed / heads / mlp dims of activations on its tensor axis (here named model). partex
    reads all of them and fixes their groups: the batch on data, embed, heads, mlp on model."""
    made = MOD.make()
    fn, args, names = made
    eqns = _constraints(jax.make_jaxpr(fn)(*args).jaxpr)
    assert len(eqns) == 44
    meshes = {tuple((a, n) for a, n in e.params["sharding"].mesh.shape.items() if n > 1) for e in eqns}
    assert meshes == {(("data", 4), ("model", 2))}
    specs = {tuple(e.params["sharding"].spec) for e in eqns}
    assert specs == {("data", None), ("data", None, "model"), ("data", None, "model", None)}

    res = partex.analyze(fn, *args, axis_names=names)
    assert res.analysis.summary()["user_shardings"] == 44
    s = lc.session(made)
    fixed = {f["group"]: f["axis"] for f in s.fixed}
    assert fixed["activation_embed_and_logits_batch"] == "data"
    assert {fixed[g] for g in ("embed", "kv_heads", "mlp")} == {"model"}
    # the labels are MaxText's logical axis names
    labels = {g.label for g in s.groups}
    assert {"embed", "mlp", "kv_heads", "vocab", "activation_embed_and_logits_batch"} <= labels


def test_maxtext_stock_mesh_axes_are_one_clear_error_on_a_data_model_mesh():
    """With MaxText's own axis names the constraints shard over ``tensor``, which a
    data=4,model=2 plan lacks: one PartexError naming it, not a crash at compile time."""
    with pytest.raises(partex.PartexError, match="mesh axis tensor=2 .* no axis 'tensor'"):
        lc.session(MOD.make(stock_axes=True))


def test_maxtext_dp_shards_the_batch_when_an_rng_follows_it():
    """MaxText's train loop calls ``p_train_step(state, batch, *rng)``: with the rng last,
    dp still shards the batch (found by role, not by position)."""
    fn, (state, data), names = MOD.make()

    def step(state, data, rng):
        del rng  # MaxText's NNX train_step takes dropout_rng and ignores it
        return fn(state, data)

    s = partex.Session(step, (state, data, jax.random.PRNGKey(0)), mesh=lc.MESH, axis_names=names + (None,))
    batch = s.group("data/inputs:0").id
    assert partex.Shard(batch, "data") in s.strategy("dp")


def test_maxtext_zero3_plan_runs_maxtexts_step_with_unsharded_numerics():
    """The plan applied with MaxText's own constraints rebound on its mesh (compile and run
    on 8 devices) gives the unsharded step's loss and AdamW moments."""
    fn, args, _ = MOD.make()
    expected = jax.jit(fn)(*MOD.make()[1])
    s = lc.session(MOD.make())
    new_state, metrics = s.plan(strategy="zero3").apply(fn)(*args)
    np.testing.assert_allclose(metrics["scalar"]["learning/loss"], expected[1]["scalar"]["learning/loss"], rtol=1e-5)
    got = jax.tree.leaves(new_state["optimizer"]["opt_state"][0]["mu"])
    want = jax.tree.leaves(expected[0]["optimizer"]["opt_state"][0]["mu"])
    floor = 1e-4 * max(float(np.abs(w).max()) for w in want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=floor)
