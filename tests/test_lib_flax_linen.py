"""flax.linen's decoder-only LM (scripts/libmodels/flax_linen.py) through partex: linen's
own modules, ``layers_0``, ``layers_1``, ... as linen names a list of submodules, logical
axis names from ``nn.get_partition_spec``, and a ``TrainState`` whose step is the Python
``0`` that ``TrainState.create`` gives."""

import warnings

import jax
import numpy as np

import partex

import _libcheck as lc

MOD = lc.load("flax_linen")


def test_flax_linen_layers_are_one_stack_whatever_the_depth():
    lc.check_depth_independent(MOD)


def test_flax_linen_hand_plans_shard_batch_megatron_pairs_and_state():
    plans = lc.check_hand_plans(MOD)
    # the Megatron pairs are found by structure: the MLP hidden and the attention heads
    s = lc.session(MOD.make())
    on_model = {label for label, axis in plans["megatron"].items() if axis == "model"}
    for anchor in ("state/params/layers_0/mlp/wi_0/kernel:1", "state/params/layers_1/attention/query/kernel:1",
                   "state/params/layers_0/attention/out/kernel:0"):
        assert s.group(anchor).label in on_model, (anchor, plans["megatron"])


def test_flax_linen_search_fits_under_a_budget_that_forces_sharding():
    lc.check_search_fits(MOD, simulations=200)


def test_flax_linen_logical_names_from_get_partition_spec_label_the_groups():
    """The axis names are what linen users have: ``nn.get_partition_spec`` of the abstract
    train state (``jax.sharding.PartitionSpec`` leaves), taken as they are, with no warning."""
    fn, args, names = MOD.make()
    assert isinstance(names[0].params["layers_0"]["mlp"]["wi_0"]["kernel"], jax.sharding.PartitionSpec)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        analysis = partex.analyze(fn, *args, axis_names=names).analysis
    labels = {g.label for g in analysis.decision_groups}
    assert {"batch", "length", "embed", "mlp", "heads", "vocab"} <= labels, labels


def test_flax_linen_python_int_step_traces_and_the_plan_runs_with_it():
    fn, (state, batch), names = MOD.make()
    assert type(state.step) is int  # TrainState.create's step, as users pass it
    s = lc.session((fn, (state, batch), names))
    assert "state/step" in s.program.input_paths
    expected_state, expected_loss = jax.jit(fn)(state, batch)
    new_state, loss = partex.apply_plan(s.plan(strategy="zero3"), fn)(state, batch)
    assert int(new_state.step) == int(expected_state.step) == 1
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    # the gradients, read from Adam's first moment after one step (mu = 0.1 * grad), at the
    # scale of the largest one; the params are not compared: Adam's first step is lr * g / |g|,
    # which rounding flips where g ~ 0
    new_mu, expected_mu = new_state.opt_state[0].mu, expected_state.opt_state[0].mu
    got_mu, want_mu = jax.tree.leaves(new_mu), jax.tree.leaves(expected_mu)
    floor = 1e-4 * max(float(np.abs(w).max()) for w in want_mu)
    for got, want in zip(got_mu, want_mu):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=floor)


def test_names_of_a_boxed_linen_state_are_a_prefix_of_the_args():
    """The flax partitioning guide's way: the step takes the *boxed* state
    (LogicallyPartitioned nodes) and nn.get_partition_spec gives one spec per box, a prefix of
    the args as jit's in_shardings allow; partex broadcasts it into the boxes, no warning."""
    import warnings

    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    class Mlp(nn.Module):
        @nn.compact
        def __call__(self, x):
            init = nn.initializers.lecun_normal()
            h = nn.Dense(64, kernel_init=nn.with_logical_partitioning(init, ("embed", "mlp")))(x)
            return nn.Dense(16, kernel_init=nn.with_logical_partitioning(init, ("mlp", "embed")))(jax.nn.relu(h))

    model, x = Mlp(), jnp.ones((8, 16))
    boxed = model.init(jax.random.key(0), x)

    def step(v, x):
        g = jax.grad(lambda v: jnp.mean(model.apply(v, x) ** 2))(v)
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, v, g)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        an = partex.analyze(step, boxed, x, axis_names=(nn.get_partition_spec(boxed), ("batch", None)))
    assert {"batch", "embed", "mlp"} <= {g.label for g in an.analysis.decision_groups}


def test_flax_rules_of_zero3_train_under_nn_logical_axis_rules_without_partex():
    """The plan exported as logical-axis rules: the model names its activations
    (nn.with_logical_constraint), so the rules must rank batch before embed (the weights'
    embed on data, the activations' embed whole while batch holds data); under the rules
    alone a flax step shards every named array as the plan does and computes the same."""
    import flax.linen as nn

    fn, args, names = MOD.make()
    s = lc.session((fn, args, names))
    plan = s.plan(strategy="zero3")
    r = partex.flax_rules(plan, fn, args, axis_names=names)
    rules, order = dict(r.rules), [n for n, _ in r.rules]
    assert rules["batch"] == rules["embed"] == ("data",) and rules["mlp"] == rules["heads"] == ("model",)
    assert order.index("batch") < order.index("embed")
    assert r.matched == 1.0 and not r.conflicts
    assert r.activations == 11  # the embedding's output, and q, k, v, MLP hidden, output of each layer
    # a flax training script with the rules and no partex: jit under the rules on the mesh
    mesh = plan.jax_mesh()
    state_specs = nn.logical_to_mesh_sharding(names[0], mesh, r.flax())
    batch_specs = {k: jax.sharding.NamedSharding(mesh, nn.logical_to_mesh_axes(v, r.flax()))
                   for k, v in names[1].items()}
    step = jax.jit(fn, in_shardings=(state_specs, batch_specs))
    with jax.set_mesh(mesh), nn.logical_axis_rules(r.flax()):
        state, loss = step(*args)
        text = step.lower(*args).as_text()
    assert "sharding_constraint" in text  # the model's own constraints are in force
    assert "sharding_constraint" not in jax.jit(fn).lower(*args).as_text()  # and only under the rules
    kernel = state.params["layers_0"]["mlp"]["wi_0"]["kernel"]
    assert kernel.sharding.spec == jax.sharding.PartitionSpec("data", "model")
    _, expected_loss = jax.jit(fn)(*args)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    # verify: XLA's figures of the rules alone beside the full plan, and their numerics
    out = partex.verify(plan, fn, args, axis_names=names, run=True, export="flax-rules")
    c = out.comparison
    assert c["export"]["numerics"]["ok"] and c["plan"]["numerics"]["ok"]
    # both sides calibrated on the same unsharded step's noise
    assert c["export"]["numerics"]["noise_runs"] == c["plan"]["numerics"]["noise_runs"] == 3
    assert c["export"]["collectives"]["all-gather"] > 0  # the weights gathered over data, as ZeRO-3 does
    assert "flax-rules alone" in partex.export_table(out)
