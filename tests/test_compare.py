"""The explorer's Compare view without a browser: ``compare_plans`` on the tiny transformer's
baselines (data=4, model=2), checked against the plans' own decisions and reports, and the
view's selects, tables and memory bars as the plans come and go."""

from __future__ import annotations

import collections
import dataclasses

import panel as pn
import partex
import pytest

from partex.explorer._charts import MEMORY_PARTS, plan_rows
from partex.explorer._compare import FIGURES, CompareView, compare_plans
from partex.explorer._format import fmt_bytes, fmt_time
from partex.explorer._state import ExplorerState
from test_explorer_state import _settle


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    st = ExplorerState(sessions_dir=tmp_path_factory.mktemp("sessions"))
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None, "the model to load")
        yield st
    finally:
        st.close()


@pytest.fixture
def plans(state):
    """The state's baselines; a test that adds a search's best or an upload has it undone."""
    yield state.baselines
    state.best = None
    state.uploaded = None


def _decided(summary, an) -> dict[str, set[str]]:
    """What a plan decides, per group or layer stack label (from the engine's own labels)."""
    out = collections.defaultdict(set)
    for d in summary.decisions:
        subject, _, choice = an.decision_label(d).rpartition("->")
        out[subject].add(choice)
    return out


def test_compare_plans_reports_exactly_the_decisions_that_differ(state, plans):
    an = state.workspace.an
    dp, zero3 = plans["dp"], plans["zero3"]
    cmp = compare_plans(dp, zero3, an)
    da, db = _decided(dp, an), _decided(zero3, an)
    differ = {s for s in da.keys() | db.keys() if da.get(s) != db.get(s)}
    same = {s for s in da.keys() | db.keys() if da.get(s) == db.get(s)}
    assert differ and same  # zero3 adds to dp's batch->data
    rows = cmp["decisions"]
    assert (cmp["a"], cmp["b"]) == ("dp", "zero3")
    assert {r["label"] for r in rows if not r["same"]} == differ
    assert {r["label"] for r in rows if r["same"]} == same
    assert [r["same"] for r in rows] == sorted(r["same"] for r in rows)  # the differing first
    for r in rows:
        assert {d.slot for d in r["a"]} == da.get(r["label"], set())
        assert {d.slot for d in r["b"]} == db.get(r["label"], set())
        assert set(r["b_labels"]) == {f"{r['label']}→{d.slot}" for d in r["b"]}


def test_a_recompute_decision_is_labelled_by_its_layer_stack(state, plans):
    """A recompute decision's id is a layer stack's, not a group's (stack 0 is not group 0)."""
    an = state.workspace.an
    dp, remat = plans["dp"], plans["dp+remat"]
    (d,) = [d for d in remat.decisions if d not in dp.decisions]
    rows = [r for r in compare_plans(dp, remat, an)["decisions"] if not r["same"]]
    assert len(rows) == 1
    row = rows[0]
    assert isinstance(d, partex.Recompute)
    assert row["kind"] == "unit" and row["label"] == an.units[d.unit].label != an.groups[d.unit].label
    assert row["a"] == () and row["b"] == (d,) and row["b_labels"] == (an.decision_label(d, "→"),)


def test_compare_plans_deltas_are_b_minus_a_from_the_reports(state, plans):
    a, b = plans["dp"], plans["zero3"]
    ra, rb = a.report, b.report
    cmp = compare_plans(a, b, state.workspace.an)
    for key, get in FIGURES.items():
        assert cmp[key]["a"] == get(ra) and cmp[key]["b"] == get(rb)
        assert cmp[key]["delta"] == pytest.approx(get(rb) - get(ra))
        assert cmp[key]["ratio"] == pytest.approx(get(rb) / get(ra))
    assert cmp["step_time"]["delta"] > 0 and cmp["peak"]["delta"] < 0  # ZeRO-3's gathers buy memory
    for part in MEMORY_PARTS:
        assert cmp["memory"][part]["a"] == ra.memory.breakdown[part]
        assert cmp["memory"][part]["delta"] == pytest.approx(rb.memory.breakdown[part] - ra.memory.breakdown[part])
    assert cmp["fits"] == {"a": ra.fits, "b": rb.fits}
    colls = cmp["collectives"]
    assert len({(r["kind"], r["axes"]) for r in colls}) == len(colls)
    for side, r in (("a", ra), ("b", rb)):
        assert sum(row["bytes"][side] for row in colls) == pytest.approx(sum(c.bytes * c.count for c in r.collectives))
        assert sum(row["time"][side] for row in colls) == pytest.approx(sum(c.time for c in r.collectives))
    for row in colls:
        assert row["time"]["delta"] == pytest.approx(row["time"]["b"] - row["time"]["a"])
    assert {r["kind"] for r in colls} >= {"all-gather", "reduce-scatter"}  # ZeRO-3's gathers, not DP's
    changes = [abs(r["time"]["delta"]) for r in colls]
    assert changes == sorted(changes, reverse=True)


@pytest.mark.parametrize("name", ["dp", "zero3", "megatron+remat"])
def test_a_plan_compared_with_itself_changes_nothing(state, plans, name):
    p = plans[name]
    cmp = compare_plans(p, p, state.workspace.an)
    assert cmp["decisions"] and all(r["same"] for r in cmp["decisions"])
    for key in FIGURES:
        assert cmp[key]["delta"] == 0 and cmp[key]["ratio"] == 1
    assert all(cmp["memory"][k]["delta"] == 0 for k in MEMORY_PARTS)
    assert cmp["collectives"] and all(r["bytes"]["delta"] == 0 == r["time"]["delta"] for r in cmp["collectives"])


def test_the_view_waits_for_a_model_then_compares_two_baselines(tmp_path):
    st = ExplorerState(sessions_dir=tmp_path)
    try:
        view = CompareView(state=st)  # nothing is installed before the first poll
        assert view.a.options == [] and "No plans yet" in view.head.object
        _settle(st, lambda: st.phase == "ready" and st.runner is not None, "the model to load")
        names = [n for n, _ in plan_rows(st)]
        assert view.a.options == view.b.options == names and "search" not in names
        assert (view.a.value, view.b.value) == (next(iter(st.baselines)), "zero3")
        assert view.src.data["row"] == [view.a.value, "zero3"]
    finally:
        st.close()


def test_the_selects_follow_the_plans_as_they_come_and_go(state, plans):
    view = CompareView(state=state)
    assert view.a.options == list(plans)
    state.best = dataclasses.replace(plans["megatron"], name="search")
    assert view.a.options == ["search", *plans] and view.a.value == "search"  # A follows the search
    state.uploaded = dataclasses.replace(plans["dp"], name="uploaded")
    assert view.b.options == ["search", "uploaded", *plans] and view.b.value == "uploaded"
    view.a.value, view.b.value = "uploaded", "dp"  # the user's picks
    state.uploaded = None  # gone: A back to the search's plan, B kept
    assert "uploaded" not in view.a.options and (view.a.value, view.b.value) == ("search", "dp")
    state.best = None  # gone too: A on the first baseline
    assert (view.a.value, view.b.value) == (next(iter(plans)), "dp")
    assert view.src.data["row"] == [next(iter(plans)), "dp"]


def test_changing_b_changes_the_tables_and_the_bars(state, plans):
    an = state.workspace.an
    view = CompareView(state=state)
    view.a.value, view.b.value = "dp", "zero3"
    table = view.decisions.view.object
    dp, zero3 = plans["dp"], plans["zero3"]
    da, db = _decided(dp, an), _decided(zero3, an)
    for label in da.keys() | db.keys():
        assert (f"<td>{label}</td>" in table) == (da.get(label) != db.get(label)), label
    (kept,) = set(dp.decisions) & set(zero3.decisions)  # dp's batch->data
    assert f"1 decision the same: {an.decision_label(kept, '→')}</div>" in view.same.object
    colls = view.colls.view.object
    assert "all-gather" in colls and "reduce-scatter" in colls and "<th>zero3 time</th>" in colls
    pct = (zero3.report.step_time - dp.report.step_time) / dp.report.step_time * 100
    assert f"<span class='bad'>+{pct:.1f}%</span>" in view.head.object
    assert f"{fmt_time(dp.report.step_time)} → {fmt_time(zero3.report.step_time)}" in view.head.object
    data = view.src.data
    assert data["row"] == ["dp", "zero3"] and list(view.fig.y_range.factors) == ["zero3", "dp"]
    assert data["peak_txt"] == [fmt_bytes(dp.report.memory.peak), fmt_bytes(zero3.report.memory.peak)]
    for part in MEMORY_PARTS:  # each part's bars in one scale, as the reports give them
        assert data[part][0] * zero3.report.memory.breakdown[part] == pytest.approx(
            data[part][1] * dp.report.memory.breakdown[part])
    scale = dp.report.memory.peak / data["total"][0]  # bytes per unit of the axis
    assert view.budget.visible and view.budget.location == pytest.approx(state.config.hw.budget / scale)

    view.b.value = "dp+remat"
    table = view.decisions.view.object
    assert f"<td>{an.units[0].label}" in table and "<td>d_model</td>" not in table
    assert "all-gather" not in view.colls.view.object
    assert view.src.data["row"] == ["dp", "dp+remat"]
    view.swap.clicks += 1
    assert (view.a.value, view.b.value) == ("dp+remat", "dp") and view.src.data["row"] == ["dp+remat", "dp"]


def test_the_view_renders_with_named_bokeh_models(state, plans):
    view = CompareView(state=state)
    root = pn.panel(view).get_root()
    for key in ("partex-compare-a", "partex-compare-b", "partex-compare-head", "partex-compare-decisions",
                "partex-compare-collectives", "partex-compare-memory"):
        assert root.select_one({"name": key}) is not None, key
    model = root.select_one({"name": "partex-compare-b"})
    assert model.options == list(plans) and model.value == "zero3"
