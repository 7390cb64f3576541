"""Roles from structure (engine/analysis/_roles.py): parameters, optimizer state and data found from
what the step returns, the hand strategies built on them, and nothing decided from a name."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

from partex import LoadedModel, PartexError, Shard, analyze_loaded, analyze_model, load_model
from partex import demo_models
from partex.cost import CostModel
from partex.planner._ilp import solve_ilp
from partex._mesh import MeshSpec, get_hardware
from partex.plan._planned import default_donate
from partex.tracing._program import trace
from partex.analysis._roles import mirror_map
from partex.planner._pins import Pins
from partex.planner._search import Search, search_inputs
from partex.planner._strategies import baseline_names, strategy_decisions

from _rename import Renamed

MESH = MeshSpec.parse("data=4,model=2")
DEMOS = list(demo_models.MODELS)
ROLE_OF_ARG = {"params": "parameters", "opt_state": "optimizer", "batch": "data"}


@functools.lru_cache(maxsize=None)
def _analysed(name: str):
    return analyze_model(name)


@functools.lru_cache(maxsize=None)
def _renamed(name: str):
    renamed = Renamed(load_model(name))
    return renamed, analyze_loaded(renamed.model)


def _role(roles, vid: int) -> str:
    for role in ("parameters", "optimizer", "data"):
        if vid in getattr(roles, role):
            return role
    raise AssertionError(f"input %{vid} has no role")


@pytest.mark.parametrize("name", DEMOS)
def test_roles_of_demo_inputs_follow_the_step_structure(name):
    res = _analysed(name)
    p, roles = res.program, res.analysis.roles
    # ground truth: the demos' train_step(params, opt_state, batch) layout
    for vid, path in zip(p.inputs, p.input_paths):
        assert _role(roles, vid) == ROLE_OF_ARG[path.split("/")[0]], path
    # each updated leaf mirrors the input it replaces: out/0/... <- params/..., out/1/... <- opt_state/...
    in_path, out_path = dict(zip(p.inputs, p.input_paths)), dict(zip(p.outputs, p.output_paths))
    arg = {"0": "params", "1": "opt_state"}
    for o, i in roles.mirror.items():
        _, k, *rest = out_path[o].split("/")
        assert in_path[i] == "/".join([arg[k], *rest]), (out_path[o], in_path[i])
    assert len(roles.mirror) == len(roles.parameters) + len(roles.optimizer)
    assert p.outputs[-1] not in roles.mirror  # the loss
    assert default_donate(p) == (0, 1)


def test_an_output_of_the_same_shape_that_ignores_an_input_does_not_make_it_state():
    def fresh(w, x):  # returns zeros shaped like w: w is not updated, so not state
        return jnp.zeros_like(w), jnp.sum(x @ w)

    def sgd(w, x):
        loss, g = jax.value_and_grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
        return w - 0.1 * g, loss

    w, x = jnp.ones((4, 4)), jnp.ones((2, 4))
    p_fresh, p_sgd = trace(fresh, (w, x)), trace(sgd, (w, x))
    assert mirror_map(p_fresh) == {}
    assert default_donate(p_fresh) == ()
    assert mirror_map(p_sgd) == {p_sgd.outputs[0]: p_sgd.inputs[0]}
    assert default_donate(p_sgd) == (0,)


def test_a_model_without_experts_has_no_expert_baseline():
    an = _analysed("transformer").analysis
    assert "expert" not in baseline_names(an)
    with pytest.raises(PartexError, match="expert dimension"):
        strategy_decisions("expert", an, MESH)
    assert "expert" in baseline_names(_analysed("moe").analysis)


# --------------------------------------------------------------------------- renaming


def _input_specs(res, cm, decisions, original_path=lambda p: p) -> dict[str, tuple]:
    specs = cm.value_specs(decisions)
    p = res.program
    return {original_path(path): tuple(map(tuple, specs[v])) for v, path in zip(p.inputs, p.input_paths)}


def _figures(report) -> tuple:
    return report.step_time, report.memory.peak, report.fits, dict(report.memory.breakdown)


@pytest.mark.parametrize("name", DEMOS)
def test_renamed_model_gets_the_same_bench_table(name):
    """Every key renamed to k000.., no axis names, arguments arg0..: the same hand plans
    (PartitionSpec per input leaf), baseline figures and MCTS plan."""
    res = _analysed(name)
    renamed, ren = _renamed(name)
    assert not any(k in path for path in ren.program.input_paths for k in ("params", "mu", "w1", "batch"))
    hw0 = get_hardware("tpu-v4")
    peak0 = CostModel(res.analysis, MESH, hw0, donate=default_donate(res.program)).evaluate([]).memory.peak
    # a budget that replicated and dp miss: the searches must shard
    hw = hw0.replace(memory_budget=0.25 * peak0)
    assert default_donate(ren.program) == default_donate(res.program)
    cm = CostModel(res.analysis, MESH, hw, donate=default_donate(res.program))
    cm_r = CostModel(ren.analysis, MESH, hw, donate=default_donate(ren.program))

    names = baseline_names(res.analysis)
    assert baseline_names(ren.analysis) == names
    for s in names:
        dec, dec_r = strategy_decisions(s, res.analysis, MESH), strategy_decisions(s, ren.analysis, MESH)
        assert _input_specs(ren, cm_r, dec_r, renamed.original_path) == _input_specs(res, cm, dec), s
        assert _figures(cm_r.evaluate(dec_r, detail=True)) == _figures(cm.evaluate(dec, detail=True)), s

    # a fixed number of simulations, not seconds: the same seed gives the same plan whatever
    # the machine's load
    search, search_r = Search(*search_inputs(res, MESH, hw), seed=0), Search(*search_inputs(ren, MESH, hw), seed=0)
    search.step(25, Pins())
    search_r.step(25, Pins())
    best, best_r = search.best(), search_r.best()
    assert best.decisions  # not the replicated plan: the budget forces sharding
    assert _figures(best_r.report) == _figures(best.report)
    assert _input_specs(ren, cm_r, best_r.decisions, renamed.original_path) == \
        _input_specs(res, cm, best.decisions)


@pytest.mark.parametrize("name", ["mlp"])
def test_renamed_model_gets_the_same_ilp_plan(name):
    """The ILP on the renamed model: the same plan. A small model, whose MILPs solve to
    optimality in a second: the time limit is a safety net far above that, so the outcome
    does not depend on how busy the machine is."""
    res = _analysed(name)
    renamed, ren = _renamed(name)
    hw0 = get_hardware("tpu-v4")
    peak0 = CostModel(res.analysis, MESH, hw0, donate=default_donate(res.program)).evaluate([]).memory.peak
    hw = hw0.replace(memory_budget=0.25 * peak0)
    cm = CostModel(res.analysis, MESH, hw, donate=default_donate(res.program))
    cm_r = CostModel(ren.analysis, MESH, hw, donate=default_donate(ren.program))
    ilp, ilp_r = (solve_ilp(c, time_limit=900, relinearise=1) for c in (cm, cm_r))
    assert ilp.status == ilp_r.status == "optimal"
    assert _figures(ilp_r.report) == _figures(ilp.report)
    assert _input_specs(ren, cm_r, ilp_r.decisions, renamed.original_path) == \
        _input_specs(res, cm, ilp.decisions)


# --------------------------------------------------------------------------- llama


def _anchor_group(res, path: str, dim: int) -> int:
    p = res.program
    return res.analysis.group_of(p.inputs[p.input_paths.index(path)], dim)


def test_megatron_finds_llama_heads_and_ffn_without_axis_names():
    m = load_model("llama")
    res = analyze_loaded(LoadedModel("llama-unnamed", m.fn, m.args, None, m.preset, m.config))
    an = res.analysis
    # no logical names at all: labels are made from paths and dims, never "heads" / "ffn"
    assert not any(g.label.split("#")[0] in ("heads", "ffn", "d_model", "vocab") for g in an.groups)
    heads = _anchor_group(res, "params/layers/wq", 2)  # stacked [layers, d_model, heads, head_dim]
    hidden = _anchor_group(res, "params/layers/w_gate", 2)  # [layers, d_model, hidden]
    assert heads != hidden
    assert _anchor_group(res, "params/layers/wo", 1) == heads  # the pair's second matmul
    assert _anchor_group(res, "params/layers/w_down", 1) == hidden
    assert _anchor_group(res, "params/layers/wk", 2) == heads  # grouped-query: kv heads follow
    megatron = strategy_decisions("megatron", an, MESH)
    assert Shard(heads, "model") in megatron and Shard(hidden, "model") in megatron
    assert Shard(_anchor_group(res, "batch/tokens", 0), "data") in megatron
    d_model = _anchor_group(res, "params/layers/wq", 1)
    assert all(d.group != d_model for d in megatron)  # normed: not tensor-parallel

    cm = CostModel(an, MESH, get_hardware("tpu-v4"), donate=default_donate(res.program))
    rep, meg = cm.evaluate([]), cm.evaluate(megatron)
    assert meg.step_time != rep.step_time
    assert meg.memory.peak < rep.memory.peak
    specs = cm.value_specs(megatron)
    wq = res.program.inputs[res.program.input_paths.index("params/layers/wq")]
    assert tuple(map(tuple, specs[wq])) == ((), (), ("model",), ())


def test_gradient_metrics_and_a_scale_einsum_leave_the_roles_alone():
    """A step that also returns the global norms of its gradients and params (MaxText's
    metrics, optax's clipping) still has its forward pass and Megatron pair; a norm's scale
    written as ``einsum("bd,d->bd")`` (a dot_general that contracts nothing) is no expert."""
    import optax

    tx = optax.adamw(1e-3)

    def step(params, opt, x, y):
        def loss(p):
            h = jax.nn.relu(jnp.einsum("bd,d->bd", x, p["scale"]) @ p["w1"])
            return jnp.mean((h @ p["w2"] - y) ** 2)
        l, g = jax.value_and_grad(loss)(params)
        u, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, u), opt, l, optax.global_norm(g), optax.global_norm(params)

    params = {"w1": jnp.ones((64, 256)), "w2": jnp.ones((256, 32)), "scale": jnp.ones((64,))}
    an = analyze_loaded(LoadedModel("gn", step, (params, tx.init(params), jnp.ones((32, 64)), jnp.ones((32, 32)))))
    roles = an.analysis.roles
    labels = lambda gs: [an.analysis.groups[g].label for g in gs]  # noqa: E731
    assert labels(roles.pair_groups) == ["params/w1[1]"]
    assert roles.expert_groups == ()
    assert "expert" not in baseline_names(an.analysis)
