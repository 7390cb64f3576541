"""The Alpa-style ILP baseline (engine/planner/_ilp.py) against the hand plans on the cost model."""

from __future__ import annotations


import pytest

from partex import Shard, analyze_model
from partex.cost import CostModel
from partex.planner._ilp import ILPResult, group_strategies, solve_ilp
from partex._mesh import GiB, MeshSpec, get_hardware
from partex.planner._strategies import strategy_decisions

HAND = ("dp", "megatron", "zero3")


@pytest.fixture(scope="module")
def tiny():
    res = analyze_model("transformer", "tiny")
    return res.analysis, MeshSpec.parse("data=4,model=2")


@pytest.fixture(scope="module")
def t32():
    # full-size shapes (ShapeDtypeStructs), two layers: quick to analyse and score
    res = analyze_model("transformer", "t32", ["layers=2"])
    return res.analysis, MeshSpec.parse("data=8,model=4")


def _cm(an, mesh, budget=None):
    return CostModel(an, mesh, get_hardware("tpu-v4", memory_budget=budget), donate=[0, 1])


def _best_hand(cm, an, mesh):
    times = [r.step_time for r in (cm.evaluate(strategy_decisions(s, an, mesh)) for s in HAND) if r.fits]
    return min(times) if times else None


def _check_result(out: ILPResult, cm, an):
    assert out.status == "optimal", out.message
    assert out.report is not None and out.report.fits
    assert out.variables > 0 and out.constraints > 0 and out.solves >= 1
    # the report is the true cost model's evaluation of the decisions
    again = cm.evaluate(list(out.decisions))
    assert again.step_time == pytest.approx(out.report.step_time)
    assert again.memory.peak == pytest.approx(out.report.memory.peak)
    # shardings (not recompute or host memory): decidable groups, biggest groups first, each
    # group's axes together
    decidable = {g.id: g for g in an.decision_groups}
    order = [d.group for d in out.decisions if isinstance(d, Shard)]
    assert all(g in decidable for g in order)
    firsts = list(dict.fromkeys(order))
    assert order == [g for g in firsts for _ in range(order.count(g))]
    assert [decidable[g].bytes for g in firsts] == sorted((decidable[g].bytes for g in firsts), reverse=True)
    for g in firsts:
        axes = [d.axis for d in out.decisions if isinstance(d, Shard) and d.group == g]
        assert len(axes) == len(set(axes)) <= 2


def test_group_strategies_skip_what_does_not_divide():
    sizes = {"data": 4, "model": 2}
    assert group_strategies(8, ("data", "model"), sizes) == [
        (), ("data",), ("model",), ("data", "model"), ("model", "data")]
    assert group_strategies(6, ("data", "model"), sizes) == [(), ("model",)]
    assert group_strategies(7, ("data", "model"), sizes) == [()]
    assert group_strategies(8, ("x",), {"x": 8}) == [(), ("x",)]


def test_tiny_default_budget_not_worse_than_replicated_or_hand_plans(tiny):
    an, mesh = tiny
    cm = _cm(an, mesh)
    out = solve_ilp(cm, time_limit=900)
    _check_result(out, cm, an)
    replicated = cm.evaluate([])
    assert out.report.step_time <= replicated.step_time * (1 + 1e-9)
    assert out.report.step_time <= _best_hand(cm, an, mesh) * 1.5


def test_tiny_tight_budget_fits_and_competes_with_hand_plans(tiny):
    an, mesh = tiny
    cm = _cm(an, mesh)
    budget = 0.25 * cm.evaluate([]).memory.peak  # replicated and dp do not fit, megatron does
    assert not cm.evaluate(strategy_decisions("dp", an, mesh)).memory.peak <= budget
    out = solve_ilp(cm, time_limit=900, budget=budget)
    assert out.report is not None
    assert out.report.budget == budget and out.report.memory.peak <= budget
    cm_b = _cm(an, mesh, budget)
    _check_result(out, cm_b, an)
    best = _best_hand(cm_b, an, mesh)
    assert best is not None
    assert out.report.step_time <= best * 1.5


@pytest.mark.parametrize("budget_gib", [None, 8.0])
def test_t32_fits_and_competes_with_hand_plans(t32, budget_gib):
    an, mesh = t32
    cm = _cm(an, mesh, None if budget_gib is None else budget_gib * GiB)
    replicated = cm.evaluate([])
    assert not replicated.fits  # ~115 GiB per device
    if budget_gib is not None:
        assert not cm.evaluate(strategy_decisions("dp", an, mesh)).fits
    out = solve_ilp(cm, time_limit=900)
    _check_result(out, cm, an)
    assert out.report.step_time <= replicated.step_time
    best = _best_hand(cm, an, mesh)
    assert out.report.step_time <= best * 1.25, (out.report.step_time, best)


def test_unachievable_budget_is_infeasible(tiny):
    an, mesh = tiny
    cm = _cm(an, mesh)
    budget = 0.01 * cm.evaluate([]).memory.peak
    out = solve_ilp(cm, time_limit=900, budget=budget)
    assert out.status == "infeasible"
    assert out.report is None and out.decisions == ()
    assert "memory budget" in out.message


def test_time_limit_is_honoured(tiny):
    an, mesh = tiny
    cm = _cm(an, mesh)
    budget = 0.4 * cm.evaluate([]).memory.peak  # replicated does not fit: a real search
    out = solve_ilp(cm, time_limit=1e-4, budget=budget)
    # the status says the limit stopped it (how long that took is the machine's business)
    assert out.status == "time_limit"
    assert out.report is None or out.report.memory.peak <= budget
