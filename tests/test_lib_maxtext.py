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
    new_state, metrics = partex.apply_plan(s.plan(strategy="zero3"), fn)(*args)
    np.testing.assert_allclose(metrics["scalar"]["learning/loss"], expected[1]["scalar"]["learning/loss"], rtol=1e-5)
    got = jax.tree.leaves(new_state["optimizer"]["opt_state"][0]["mu"])
    want = jax.tree.leaves(expected[0]["optimizer"]["opt_state"][0]["mu"])
    floor = 1e-4 * max(float(np.abs(w).max()) for w in want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=floor)


# --------------------------------------------------------------------------- MaxText's MoE

MOE = lc.load("maxtext_moe")


def test_maxtext_moe_scanned_layers_give_the_same_groups_at_any_depth():
    lc.check_depth_independent(MOE)


def test_maxtext_moe_hand_plans_shard_batch_megatron_pairs_and_state():
    lc.check_hand_plans(MOE)


def test_maxtext_moe_search_fits_under_a_budget_that_forces_sharding():
    lc.check_search_fits(MOE, simulations=200)


def test_maxtext_moe_dense_dispatch_keeps_maxtexts_expert_constraints():
    """MaxText's dense MoE path (capacity-factor dispatch and combine einsums) constrains its
    expert activations with its logical names: the experts' MLP and embedding dims on its
    tensor axis (here model), the batch on data; the expert dim is left to the plan."""
    made = MOE.make()
    fn, args, _ = made
    assert len(_constraints(jax.make_jaxpr(fn)(*args).jaxpr)) == 69
    s = lc.session(made)
    fixed = {f["group"]: f["axis"] for f in s.fixed}
    assert fixed == {"activation_embed_and_logits_batch": "data", "embed_moe": "model", "kv_heads": "model",
                     "mlp_moe": "model"}
    experts = s.group("state/model/decoder/layers/MoeBlock_0/wi_0/value:0")
    assert (experts.label, experts.size) == ("exp", 4)
    assert partex.Shard(experts.id, "data") in s.decisions([("exp", "data")])


class _Sparse:
    """maxtext_moe on MaxText's sparse path, as a library model module."""

    @staticmethod
    def make(layers=None, size="tiny"):
        return MOE.make(layers, size, path="sparse")


def test_maxtext_sparse_moe_layers_give_the_same_groups_at_any_depth():
    lc.check_depth_independent(_Sparse)


def test_maxtext_sparse_moe_shard_map_regions_fix_the_tokens_on_maxtexts_mesh():
    """MaxText's sparse MoE (``sparse_matmul``): one shard_map region per MoE layer and pass
    (routing, ragged_dot over the local experts, the combine), its in/out specs the step's own
    shardings: the tokens on data and on MaxText's fsdp axis (here model)."""
    made = _Sparse.make()
    fn, args, names = made
    res = partex.analyze(fn, *args, axis_names=names)
    prims = [op.primitive for op in res.program.ops]
    assert prims.count("shard_map_enter") == prims.count("shard_map_exit") == 4
    assert prims.count("ragged_dot_general") == 12
    kinds = {us.kind for us in res.analysis.user_shardings}
    assert {"shard_map in_specs", "shard_map out_specs", "with_sharding_constraint"} <= kinds
    s = lc.session(made, mesh="step")  # MaxText's mesh, with its axes of size 1
    assert {a: n for a, n in zip(s.mesh.axes, s.mesh.sizes) if n > 1} == {"data": 4, "model": 2}
    assert {f["axis"] for f in s.fixed if f["kind"] == "shard_map out_specs"} == {"data", "model"}


def test_maxtext_sparse_moe_zero3_plan_runs_with_unsharded_numerics_and_xlas_collectives():
    """ZeRO-3 over data around MaxText's shard_map regions (zero3's decisions on the data axis:
    the batch, the MoE weights' and the embeddings' largest free dims) compiles and runs on
    MaxText's mesh with the unsharded step's numerics; the weight gathers and gradient
    reductions partex predicts (the regions' psums among them) are XLA's."""
    s = lc.session(_Sparse.make(), mesh="step")
    plan = s.plan([d for d in s.strategy("zero3") if d.axis == "data"])
    out = s.verify(plan, run=True, mark=False)
    assert out.numerics.ok, out.numerics
    for kind in ("all-gather", "all-reduce"):
        c = out.collectives[kind]
        assert c.xla_bytes > 0 and 0.9 <= c.ratio <= 1.1, (kind, c)


@pytest.mark.xfail(strict=True, reason="the attention's kv heads on model inside MaxText's scanned, "
                   "checkpointed layers: XLA all-reduces 79 KiB more of the projections' gradients "
                   "than the cost model predicts (0.91 with the kv heads alone, 0.84 with zero3's "
                   "whole tensor-parallel part)")
def test_maxtext_sparse_moe_kv_heads_on_model_all_reduce_is_xlas():
    s = lc.session(_Sparse.make(), mesh="step")
    zero3 = s.strategy("zero3")
    kv = [d for d in zero3 if d.axis == "model" and s.label(d).startswith("kv_heads")]
    assert kv, [s.label(d) for d in zero3]
    out = s.verify(s.plan([d for d in zero3 if d.axis == "data"] + kv), mark=False)
    c = out.collectives["all-reduce"]
    assert 0.9 <= c.ratio <= 1.1 and abs(c.predicted_bytes - c.xla_bytes) < 16384, c


def test_maxtext_expert_parallel_moe_prices_its_ragged_all_to_alls_and_xla_cpu_cannot_compile_them():
    """With MaxText's expert axis the sparse MoE dispatches tokens between devices with
    ``ragged_all_to_all`` in its shard_map: the experts are fixed on that axis and partex
    prices the dispatch as all-to-alls at their source lines; XLA:CPU has no ragged
    all-to-all, which verify says in one line."""
    made = MOE.make(path="sparse_ep")
    s = lc.session(made, mesh="step")
    assert {a: n for a, n in zip(s.mesh.axes, s.mesh.sizes) if n > 1} == {"data": 4, "expert": 2}
    fixed = {(f["group"], f["axis"]) for f in s.fixed}
    assert ("exp", "expert") in fixed
    report = s.evaluate(s.strategy("dp"))
    dispatch = [c for c in report.collectives if c.kind.value == "all-to-all" and c.bytes > 0]
    assert {c.source.split(" ")[-1] for c in dispatch} == {"(RoutedMoE.sparse_matmul.<locals>.ra2a_and_route)",
                                                          "(RoutedMoE.sparse_matmul.<locals>.unsort_output_and_ra2a)"}
    assert all(c.axes == ("expert",) for c in dispatch)
    with pytest.raises(partex.PartexError, match="cannot compile this step .*ragged-all-to-all"):
        s.verify(s.plan(strategy="dp"), mark=False)


# --------------------------------------------------------------------------- explicit mode

EXPLICIT = lc.load("maxtext_explicit")


def test_maxtext_explicit_scanned_layers_give_the_same_groups_at_any_depth():
    lc.check_depth_independent(EXPLICIT)


def test_maxtext_explicit_search_fits_under_a_budget_that_forces_sharding():
    lc.check_search_fits(EXPLICIT, simulations=200)


def test_maxtext_explicit_typed_shardings_are_the_users_pins():
    """``shard_mode: explicit``: MaxText's mesh has Explicit axes, its train state and batch
    carry their shardings in their types and its activations are resharded. partex reads them
    as the step's own: the weights' Megatron dims, the vocabulary and the embedding on model,
    the batch on data; dp and megatron shard the batch on data."""
    made = EXPLICIT.make()
    fn, args, names = made
    mesh = EXPLICIT.mesh()
    assert set(mesh.axis_types) == {jax.sharding.AxisType.Explicit}
    assert {a: n for a, n in mesh.shape.items() if n > 1} == {"data": 4, "model": 2}
    res = partex.analyze(fn, *args, axis_names=names)
    assert {"explicit input", "reshard"} <= {us.kind for us in res.analysis.user_shardings}
    s = lc.session(made)
    fixed = {f["group"]: (f["axis"], f["kind"]) for f in s.fixed}
    for group in ("mlp", "kv_heads", "vocab"):
        assert fixed[group] == ("model", "explicit input"), fixed
    assert fixed["activation_embed_and_logits_batch"] == ("data", "explicit input")
    # the embedding lookup's typed result (``.at[ids].get(out_sharding=...)``): JAX up to
    # 0.12.0 traces it as a reshard after the gather, 0.12.1 as the gather's own out_sharding
    (embed,) = [f for f in s.fixed if f["group"] == "embed"]
    assert (embed["axis"], embed["kind"]) in {("model", "reshard"), ("model", "out_sharding")}, embed
    assert "(Embed.__call__)" in embed["source"], embed
    for strategy in ("dp", "megatron"):
        assert lc.sharded_groups(s, strategy)["activation_embed_and_logits_batch"] == "data"
    assert s.evaluate(s.strategy("dp")).memory.peak < lc.replicated_bytes(s)


def test_maxtext_explicit_plan_runs_maxtexts_step_with_its_numerics():
    """A plan applied to the explicit-mode step, called with the typed state and batch as
    MaxText holds them, gives the loss and AdamW moments of MaxText's own jit under its mesh."""
    fn, args, _ = EXPLICIT.make()
    with jax.set_mesh(EXPLICIT.mesh()):
        expected = jax.jit(fn)(*EXPLICIT.make()[1])
    s = lc.session(EXPLICIT.make())
    new_state, metrics = partex.apply_plan(s.plan(strategy="megatron"), fn)(*args)
    np.testing.assert_allclose(metrics["scalar"]["learning/loss"], expected[1]["scalar"]["learning/loss"], rtol=1e-5)
    got = jax.tree.leaves(new_state["optimizer"]["opt_state"][0]["mu"])
    want = jax.tree.leaves(expected[0]["optimizer"]["opt_state"][0]["mu"])
    floor = 1e-4 * max(float(np.abs(w).max()) for w in want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=floor)
