"""The explorer's views as a user tours them (headless Chromium, 1440x900, the server and
helpers of tests/test_explorer.py): the graph's titles and its selection kept in step with
the Decision card, the search chart's axis and titles, the headline's comparison in words,
the verify tables that list every row and every unmatched collective, and the Meshes card
(the mesh searched with the plan, a row picked to continue on). Each view's
screenshot lands in tests/screenshots/views_*.png.

A few checks of the views' pure helpers run without a browser."""

from __future__ import annotations

import re

import pytest

from partex.explorer._format import fmt_time, fmt_versus, nice_ticks
from partex.explorer._layout import short
from partex.explorer._tables import Table, unmatched_rows

from test_explorer import (  # noqa: F401  (fixtures: pytest finds them by name here)
    SHOTS, _graph_nodes, _load, analyze_on, choose, chromium, click, console_summary, no_browser_errors, pin,
    run_until, select_group, server, set_model_value, state, tab, verify_in_page, wait_until,
)

PRIMITIVES = ("reshape", "broadcast_in_dim", "rev", "iota", "concatenate", "transpose", "dot_general")


# --------------------------------------------------------------------------- helpers, no browser

@pytest.mark.parametrize("time, other, want", [
    (1.0, 9.7, "9.7× faster than the best baseline (zero3)"),
    (1.3, 1.0, "1.30× slower than the best baseline (zero3)"),
    (1.0, 1.001, "as fast as the best baseline (zero3)"),
    (1.0, 250.0, "250× faster than the best baseline (zero3)"),
])
def test_a_step_time_is_compared_in_words(time, other, want):
    assert fmt_versus(time, other, "zero3") == want


@pytest.mark.parametrize("lo, hi", [(0.1775, 0.1795), (0.17801, 0.17803), (0, 12.3), (150, 950), (2e-6, 3e-6)])
def test_ticks_are_written_apart_over_any_range(lo, hi):
    ticks, decimals = nice_ticks(lo, hi)
    labels = [f"{t:.{decimals}f}" for t in ticks]
    assert len(ticks) >= 2 and len(set(labels)) == len(labels), labels
    assert all(lo - 1e-12 <= t <= hi + 1e-12 for t in ticks)


def test_a_long_table_keeps_every_row_behind_a_details_element():
    t = Table("t", [("a", "a"), ("b", "b")], height=100, max_rows=3)
    t.update([(i, f"row{i}") for i in range(10)])
    text = t.view.object
    shown, folded = text.split("<details", 1)
    assert all(f"row{i}<" in shown for i in range(3)) and "row3<" not in shown
    assert "7 more rows: show them</summary>" in folded
    assert all(f"row{i}<" in folded for i in range(3, 10))


def test_unmatched_rows_list_both_sides():
    xla = [{"kind": "all-reduce", "bytes": 256.0, "where": "<neg>", "op_name": "jit(f)/neg", "hlo": "wrapped_negate",
            "matched": False}]
    pred = [{"kind": "all-gather", "bytes": 128.0, "where": "/x/m.py:3:1 (f)", "param": None, "cause": "d_model",
             "decision": "d_model->data"}]
    rows = unmatched_rows(xla, pred)
    assert [r[0] for r in rows] == ["XLA only", "predicted only"]
    assert rows[1][3] == "m.py:3:1 (f)" and "d_model->data" in rows[1][4]


# --------------------------------------------------------------------------- page helpers

def _selection(page) -> dict:
    """The graph's ringed nodes, the decision form's group and the card's heading."""
    return page.evaluate("""() => {
        const doc = Bokeh.documents[0];
        const r = doc.get_model_by_name('partex-graph').renderers.find(r => r.data_source.data.key !== undefined);
        const d = r.data_source.data;
        const ring = Array.from(r.data_source.selected.indices).map(i => ({key: d.key[i], label: d.label[i],
                                                                          cluster: d.gid[i] < 0}));
        const form = doc.get_model_by_name('partex-pin-group');
        const opt = form.options.find(o => (Array.isArray(o) ? o[0] : o) === String(form.value));
        const card = doc.get_model_by_name('decision-detail').text;
        const h3 = card.match(/<h3>(.*?)<\\/h3>/);
        return {ring: ring, form: String(form.value), form_label: Array.isArray(opt) ? opt[1] : opt,
                card: h3 ? h3[1] : null} }""")


def _unescape(text: str) -> str:
    return text.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">").replace("&#x27;", "'")


def _in_step(page):
    """The selection the graph rings is the group the Decision card and its form show (or
    none anywhere); the selection, or None while they differ."""
    sel = _selection(page)
    selected = state(page).get("selected")
    if selected is None:
        ok = sel["ring"] == [] and sel["card"] is None and sel["form"] == "-1" and sel["form_label"].startswith("—")
    else:
        ok = (len(sel["ring"]) == 1 and not sel["ring"][0]["cluster"] and sel["ring"][0]["key"] == sel["form"]
              and sel["card"] is not None and _unescape(sel["card"]) == sel["form_label"]
              and sel["ring"][0]["label"] == short(sel["form_label"]))
    return sel if ok else None


def _tap(page, index: int) -> None:
    """A click on the graph's node at ``index`` (as a tap selects it)."""
    page.evaluate("""(i) => { const r = Bokeh.documents[0].get_model_by_name('partex-graph').renderers
        .find(r => r.data_source.data.key !== undefined); r.data_source.selected.indices = [i] }""", index)


def _card(page, title: str):
    card = page.locator(".card-title", has_text=title).first
    card.evaluate("e => e.scrollIntoView({block: 'start'})")
    page.mouse.move(0, 0)
    return card


def _chart(page) -> dict:
    """The search chart's points (ms) and the label of the point it starts from."""
    return page.evaluate("""() => {
        const f = Bokeh.documents[0].get_model_by_name('partex-history');
        const pts = f.renderers.find(r => r.data_source.data.ms !== undefined && r.data_source.data.secs !== undefined);
        const start = f.renderers.find(r => r.data_source.data.text !== undefined);
        return {ms: Array.from(pts.data_source.data.ms), sim: Array.from(pts.data_source.data.sim),
                start: Array.from(start.data_source.data.text)} }""")


def _headline(page) -> str:
    """The headline's best step time, as written."""
    kpis = page.evaluate("Bokeh.documents[0].get_model_by_name('kpis').text")
    m = re.search(r"Best step time</div><div class='k-value'>([^<]*)<", kpis)
    assert m, kpis
    return _unescape(m.group(1))


def _pinned_first(s: dict, group: str, axis: str) -> bool:
    """Whether the search's best plan in the state ``s`` starts with the pin ``group->axis``."""
    first = s["best"]["decisions"][0] if s["best"] and s["best"]["decisions"] else {}
    return (first.get("group"), first.get("axis"), first.get("pinned")) == (group, axis, True)


def _shows_one_best(page, ready=lambda s: True) -> dict:
    """The state once the headline, the chart's last point and the search's best agree (the
    page renders them from one snapshot), and ``ready(state)``."""
    def agree():
        s = state(page)
        if s["best"] is None or not ready(s):
            return None
        chart = _chart(page)
        ok = (_headline(page) == fmt_time(s["best"]["step_time"]) and chart["ms"]
              and abs(chart["ms"][-1] - s["best"]["step_time"] * 1e3) <= 1e-9 * chart["ms"][-1])
        return s if ok else None
    return wait_until(agree, what="the headline and the chart to show the search's best")


# --------------------------------------------------------------------------- the tests

def test_graph_titles_come_from_the_model_and_the_selection_stays_with_the_card(tab):
    """Pick ffn in the transformer, switch to the U-Net, click a group, click a cluster,
    switch back: at every step the ring in the graph and the Decision card show one group
    (or neither shows any). The U-Net's nodes are titled by its functions (group_norm,
    upsample), never by primitives, and no cluster calls anything a vocabulary."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    select_group(tab, "ffn")
    wait_until(lambda: _in_step(tab), what="ffn ringed and in the card")
    _load(tab, "unet")
    wait_until(lambda: _in_step(tab), what="the graph and the card in step after the switch")
    nodes = _graph_nodes(tab)
    assert not any(n["label"].split("[")[0] in PRIMITIVES for n in nodes), nodes
    assert "vocabulary" not in [n["label"] for n in nodes]
    # open the activations: the functions that make them name them
    acts = next(i for i, n in enumerate(nodes) if n["cluster"] and n["label"] == "activations")
    _tap(tab, acts)
    wait_until(lambda: any(n["label"].startswith("made in group_norm") for n in _graph_nodes(tab)),
               what="the activations' clusters")
    nodes = _graph_nodes(tab)
    norm = next(i for i, n in enumerate(nodes) if n["label"].startswith("made in group_norm"))
    _tap(tab, norm)
    wait_until(lambda: "group_norm[4]" in [n["label"] for n in _graph_nodes(tab)], what="group_norm[4] drawn")
    nodes = _graph_nodes(tab)
    labels = [n["label"] for n in nodes]
    assert not any(label.split("[")[0] in PRIMITIVES for label in labels), labels
    _tap(tab, labels.index("group_norm[4]"))
    sel = wait_until(lambda: (lambda s: s and s["form_label"] == "group_norm[4]" and s)(_in_step(tab)),
                     what="group_norm[4] ringed and in the card")
    wait_until(lambda: "reshape[4]" in tab.evaluate("Bokeh.documents[0].get_model_by_name('decision-detail').text"),
               what="the group's file name in the card")
    assert state(tab)["selected"] == "reshape[4]"  # the decision's name in plan and session files
    _card(tab, "Named dimensions")
    tab.screenshot(path=SHOTS / "views_graph_unet_titles.png")
    # a click on another cluster: the group stays ringed if drawn, else neither shows it
    nodes = _graph_nodes(tab)
    other = next(i for i, n in enumerate(nodes) if n["cluster"])
    _tap(tab, other)
    wait_until(lambda: nodes[other]["key"] not in [n["key"] for n in _graph_nodes(tab)], what="the cluster to open")
    wait_until(lambda: _in_step(tab), what="the graph and the card in step after a cluster opened")
    _load(tab, "transformer")
    wait_until(lambda: _in_step(tab), what="the graph and the card in step after switching back")
    select_group(tab, "heads")
    sel = wait_until(lambda: (lambda s: s and s["form_label"] == "heads" and s)(_in_step(tab)), what="heads")
    assert sel["ring"][0]["label"] == "heads"
    _card(tab, "Named dimensions")
    tab.screenshot(path=SHOTS / "views_selection_in_step.png")


def test_search_chart_ticks_differ_titles_fit_and_the_headline_says_faster_or_slower(tab):
    s = run_until(tab, lambda s: s["best"] is not None and s["simulations"] >= 200 and s["history"] >= 2,
                  what="a search with some history")
    wait_until(lambda: not state(tab)["running"], what="the search to pause")
    axis = tab.evaluate("""() => {
        const f = Bokeh.documents[0].get_model_by_name('partex-history');
        const y = f.left[0];
        return {ticks: Array.from(y.ticker.ticks || []), format: y.formatter.format, title: f.title ? f.title.text : '',
                start: f.y_range.start, end: f.y_range.end} }""")
    decimals = len(axis["format"].split(".")[1]) if "." in axis["format"] else 0
    labels = [f"{t:.{decimals}f}" for t in axis["ticks"]]
    assert len(labels) >= 2 and len(set(labels)) == len(labels), (axis, labels)
    assert all(axis["start"] - 1e-12 <= t <= axis["end"] + 1e-12 for t in axis["ticks"]), axis
    assert not axis["title"], axis  # the titles are HTML above the charts, and wrap
    for title in ("Best predicted step time", "Root actions"):
        box = tab.locator(".chart-title", has_text=title).first
        assert box.is_visible()
        assert box.evaluate("e => e.scrollWidth <= e.clientWidth + 1 && e.scrollHeight <= e.clientHeight + 1"), title
    # the headline: faster or slower, in words, against the named best baseline
    kpis = _unescape(tab.evaluate("Bokeh.documents[0].get_model_by_name('kpis').text"))
    m = re.search(r"([\d.]+)× (faster|slower) than the best baseline \((\w+)\)|as fast as the best baseline \((\w+)\)",
                  kpis)
    assert m, kpis
    s = state(tab)
    best, base = s["best"]["step_time"], s["baselines"][m.group(3) or m.group(4)]
    if m.group(2):
        assert (m.group(2) == "faster") == (base > best), (kpis, best, base)
        ratio = base / best if base > best else best / base
        assert abs(float(m.group(1)) - ratio) <= 0.051 * ratio, (m.group(0), ratio)
    assert "the best baseline" in kpis and "× the best baseline" not in kpis
    sub = tab.locator(".kpi", has_text="Best step time").locator(".k-sub")
    assert sub.evaluate("e => e.scrollWidth <= e.clientWidth + 1"), "the comparison is cut"
    assert m.group(0) in _unescape(sub.inner_text())
    tab.locator(".kpis").first.evaluate("e => e.scrollIntoView({block: 'start'})")
    tab.mouse.move(0, 0)
    tab.screenshot(path=SHOTS / "views_kpi.png")
    _card(tab, "Search")
    tab.screenshot(path=SHOTS / "views_search_chart.png")


def test_verify_lists_every_collective_and_what_each_side_lacks(tab):
    """zero3 on the tiny transformer: the headline counts the collectives one side has and the
    other lacks; the table under it lists each of them, the largest in view and the rest
    behind "show them", which opens in the page."""
    verify_in_page(tab, "zero3")
    head = tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-explain-head').text")
    m = re.search(r"(\d+) predicted ones? not in XLA's program", head)
    x = re.search(r"(\d+) of XLA's that no prediction explains", head)
    assert m and "listed under the table" in head, head
    listed = int(m.group(1)) + (int(x.group(1)) if x else 0)
    table = tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-explain-unmatched').text")
    assert table.count("predicted only") + table.count("XLA only") == listed, table
    assert table.count("predicted only") == int(m.group(1))
    unmatched = tab.locator(".grid", has_text="predicted only")
    _card(tab, "Predicted vs XLA")
    tab.locator(".grid-wrap", has_text="found in").first.evaluate("e => e.scrollIntoView({block: 'center'})")
    if listed > 5:  # more than the table shows: behind a details element that opens
        more = tab.locator("summary", has_text="more row")
        wait_until(lambda: more.count() > 0, what="the 'show them' line")
        hidden = tab.locator("details.more-rows .grid tr", has_text="only")
        assert not hidden.first.is_visible()
        more.first.click()
        wait_until(lambda: hidden.first.is_visible(), what="the folded rows to open")
    rows = tab.locator(".grid tr", has_text=re.compile("predicted only|XLA only"))
    wait_until(lambda: sum(rows.nth(i).is_visible() for i in range(rows.count())) == listed,
               what="every unmatched collective in view")
    assert unmatched.count() >= 1
    tab.mouse.move(0, 0)
    tab.screenshot(path=SHOTS / "views_verify_unmatched.png")


def test_the_meshes_card_searches_the_meshes_and_continues_on_the_one_picked(tab):
    """The Meshes card on 8 devices as 2 slices of 4 (6.25 GB/s between them): every mesh
    tried has the data axis across the slices at that bandwidth, the table lists them best
    first with the chosen one marked, and Use this mesh puts the picked row's mesh (links
    included) in the sidebar's form and restarts the search there. A topology that does not
    hold the devices is marked at its field and starts nothing."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    card = _card(tab, "Meshes")
    topo = tab.locator("input[placeholder='one slice; or 4x64@6.25']")
    topo.fill("3x4")
    topo.press("Enter")
    click(tab, "Search meshes")
    wait_until(lambda: "holds 12 devices, not the 8" in str(state(tab)["field_error"].get("topology")),
               what="the topology's mark")
    assert "meshes" not in state(tab)["busy"] and not state(tab)["meshes"]["rows"]
    note = tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-field-error-meshes').text")
    assert "holds 12 devices" in note, note
    tab.screenshot(path=SHOTS / "views_meshes_bad_topology.png")

    topo.fill("2x4@6.25")
    topo.press("Enter")
    tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-mesh-seconds').value = 4")
    click(tab, "Search meshes")
    s = wait_until(lambda: (lambda s: s["meshes"]["status"].startswith(("6 meshes", "4 meshes", "3 meshes"))
                            and "meshes" not in s["busy"] and s)(state(tab)), what="the mesh search to end")
    assert not s["field_error"], s["field_error"]
    rows = s["meshes"]["rows"]
    assert len(rows) >= 3
    for r in rows:
        axes = dict(a.split("=") for a in r["mesh"].split(","))
        assert int(axes["data"]) % 2 == 0, r  # one axis across the two slices
        assert r["form"].startswith(f"data={axes['data']}@6.25"), r
    steps = [r["step"] for r in rows if r["step"] is not None]
    assert steps and steps == sorted(steps), rows
    assert s["meshes"]["status"].split("the best is ")[1].startswith(rows[0]["mesh"] + " at ")
    table = tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-meshes').text")
    assert table.count("<tr>") == len(rows) + 1 and "chosen</span>" in table
    assert table.index(rows[0]["mesh"]) < table.index(rows[-1]["mesh"])
    card.evaluate("e => e.scrollIntoView({block: 'start'})")
    tab.mouse.move(0, 0)
    tab.screenshot(path=SHOTS / "views_meshes.png")

    # the page on three axes: the mesh with the most axes that has a plan
    pick = max((r for r in rows if r["step"] is not None), key=lambda r: r["mesh"].count(","))
    assert pick["mesh"].count(",") >= 2, rows
    set_model_value(tab, "partex-mesh-pick", pick["form"])
    wait_until(lambda: tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-mesh-pick').value") == pick["form"],
               what="the pick")
    click(tab, "Use this mesh")
    s = wait_until(lambda: (lambda s: s["phase"] == "ready" and s["config"]["mesh"] == pick["mesh"]
                            and "load" not in s["busy"] and s)(state(tab)), what="the picked mesh to load")
    assert tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-mesh').value") == pick["form"]
    assert len(s["meshes"]["rows"]) == len(rows)  # the table stays: another row can be picked
    table = tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-meshes').text")
    assert "on the page</span>" in table
    s = run_until(tab, lambda s: s["simulations"] >= 20 and s["best"] is not None, what="the search on the picked mesh")
    axes = {d["axis"] for d in s["best"]["decisions"] if ":" not in d["axis"]}  # less recompute, memory
    assert axes and axes <= set(dict(a.split("=") for a in pick["mesh"].split(","))), s["best"]
    card.evaluate("e => e.scrollIntoView({block: 'start'})")
    tab.mouse.move(0, 0)
    tab.screenshot(path=SHOTS / "views_meshes_picked.png")
    _card(tab, "Named dimensions")
    tab.screenshot(path=SHOTS / "views_meshes_picked_graph.png")

    # anytime: while the search runs the card says the best so far, when it was found and what
    # is still open; Stop keeps the rows and that best
    card = _card(tab, "Meshes")
    tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-mesh-seconds').value = 120")
    click(tab, "Search meshes")
    s = wait_until(lambda: (lambda s: "meshes" in s["busy"] and "best so far" in s["meshes"]["status"]
                            and "open" in s["meshes"]["status"] and s)(state(tab)), what="the incumbent streamed")
    assert " s in: best so far " in s["meshes"]["status"] and "found after" in s["meshes"]["status"], s["meshes"]
    card.evaluate("e => e.scrollIntoView({block: 'start'})")
    tab.mouse.move(0, 0)
    tab.screenshot(path=SHOTS / "views_meshes_streaming.png")
    click(tab, "Stop")
    s = wait_until(lambda: (lambda s: "meshes" not in s["busy"] and s)(state(tab)), what="the search to stop")
    assert s["meshes"]["rows"] and s["meshes"]["status"].startswith("stopped: best so far"), s["meshes"]["status"]


def test_a_pipeline_in_the_sidebar_and_among_the_meshes(tab):
    """The scanned transformer with its stack pipelined over a stage axis: the Pipeline field
    takes stack0:stage:4 and the sidebar says the stages, microbatches, schedule, bubble and
    what each stage's devices hold; on 2 slices the Meshes card lists pipelined candidates
    with their pipeline and bubble, and Use this mesh puts the mesh and the pipeline in the
    forms."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    analyze_on(tab, "transformer-scan", "tpu-v4", "16MiB", "layers=4")
    assert "may be pipelined: stack0 (4 layers, batch 8)" in tab.evaluate(
        "Bokeh.documents[0].get_model_by_name('partex-pipeline-info').text")
    mesh = tab.locator("input[placeholder='data=4,model=2']")
    mesh.fill("stage=2,data=2,model=2")
    mesh.press("Enter")
    box = tab.locator("input[placeholder='none; e.g. stack0:stage:8']")
    box.fill("stack0:stage:4")
    box.press("Enter")
    wait_until(lambda: (lambda s: s["phase"] == "ready" and s["config"]["pipeline"] == "stack0:stage:4"
                        and "load" not in s["busy"])(state(tab)), what="the pipelined step")
    run_until(tab, lambda s: s["best"] is not None and s["simulations"] >= 10, what="a plan of the pipelined step")
    info = tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-pipeline-info').text")
    assert "2 stages, 4 microbatches, gpipe, bubble 20%" in info and "devices hold" in info, info
    tab.locator(".side-title", has_text="Mesh & hardware").first.evaluate("e => e.scrollIntoView({block: 'start'})")
    tab.mouse.move(0, 0)
    tab.screenshot(path=SHOTS / "views_pipeline_sidebar.png")

    card = _card(tab, "Meshes")
    # the default: a stage per slice where there are several slices
    assert tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-mesh-pipelines').value") == "over the slices"
    topo = tab.locator("input[placeholder='one slice; or 4x64@6.25']")
    topo.fill("2x4@25")
    topo.press("Enter")
    tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-mesh-seconds').value = 60")  # converges sooner
    click(tab, "Search meshes")
    s = wait_until(lambda: (lambda s: s["meshes"]["rows"] and "meshes" not in s["busy"] and s)(state(tab)),
                   what="the mesh search to end")
    piped = [r for r in s["meshes"]["rows"] if r["pipeline"]]
    assert piped and all(r["form"].startswith("stage=2@25") and r["bubble"] for r in piped), s["meshes"]["rows"]
    table = tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-meshes').text")
    assert f"pipeline {piped[0]['pipeline']}, bubble" in table
    card.evaluate("e => e.scrollIntoView({block: 'start'})")
    tab.mouse.move(0, 0)
    tab.screenshot(path=SHOTS / "views_meshes_pipelines.png")
    pick = [r for r in piped if r["step"] is not None][-1]  # the pick lists the rows with a plan
    _use_mesh_row(tab, pick)
    assert tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-pipeline').value") == pick["pipeline"]


def _use_mesh_row(page, row: dict) -> None:
    """Pick a row of the Meshes card (its mesh, and its pipeline where it has one) and press
    Use this mesh; wait for the page to load it."""
    key = row["form"] + (f" | {row['pipeline']}" if row["pipeline"] else "")
    set_model_value(page, "partex-mesh-pick", key)
    wait_until(lambda: page.evaluate("Bokeh.documents[0].get_model_by_name('partex-mesh-pick').value") == key,
               what="the pick")
    click(page, "Use this mesh")
    wait_until(lambda: (lambda s: s["phase"] == "ready" and s["config"]["mesh"] == row["mesh"]
                        and s["config"]["pipeline"] == row["pipeline"] and "load" not in s["busy"])(state(page)),
               what="the picked mesh to load")


def test_a_pin_starts_the_search_from_the_best_plan_that_keeps_it_and_the_chart_agrees(tab):  # noqa: F811
    """The default model and mesh: a short search, Pause, pin batch->data on the Decision
    card, Run again. The search goes on from the best plan known that keeps the pin: at once
    at or under dp (batch->data alone, which keeps it) and never above it after; its best
    never rises while it runs; the headline, the chart's last point and the Baselines' search
    row say one step time."""
    s = run_until(tab, lambda s: s["simulations"] >= 76 and s["best"] is not None, what="a short search")
    wait_until(lambda: not state(tab)["running"], what="the search to pause")
    pin(tab, "batch", "data")
    s = _shows_one_best(tab, lambda s: _pinned_first(s, "batch", "data"))
    dp = s["baselines"]["dp"]
    assert s["best"]["step_time"] <= dp * (1 + 1e-12), (s["best"], dp)
    seen = [s["best"]["step_time"]]

    def searched(st):
        if st["best"] is not None:
            seen.append(st["best"]["step_time"])
        return st["simulations"] >= s["simulations"] + 300

    run_until(tab, searched, what="the pinned search to run")
    wait_until(lambda: not state(tab)["running"], what="the search to pause")
    s = _shows_one_best(tab)
    seen.append(s["best"]["step_time"])
    assert all(b <= a * (1 + 1e-12) for a, b in zip(seen, seen[1:])), seen
    assert s["best"]["step_time"] <= dp * (1 + 1e-12)
    kpis = _unescape(tab.evaluate("Bokeh.documents[0].get_model_by_name('kpis').text"))
    assert "slower than the best baseline" not in kpis, kpis
    table = _unescape(tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-baselines').text"))
    row = table[table.index("search"):table.index("replicated")]
    assert fmt_time(s["best"]["step_time"]) in row, row
    tab.locator(".kpis").first.evaluate("e => e.scrollIntoView({block: 'end'})")  # the message too
    tab.mouse.move(0, 0)
    tab.screenshot(path=SHOTS / "views_pin_kpi.png")
    _card(tab, "Search")
    tab.screenshot(path=SHOTS / "views_pin_chart.png")


def test_use_this_mesh_brings_the_plan_the_mesh_search_found_there(tab):  # noqa: F811
    """The scanned transformer at 3 MiB, its meshes searched on 2 slices of 4 (pipelined
    candidates too): a row whose searched plan beats its hand plans, a pipelined one where the
    search reached one, is picked and used. The page's new search on that mesh starts from that
    plan: at 0 simulations the headline and the chart say the row's step time, and the search
    never reads worse from there."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    analyze_on(tab, "transformer-scan", "tpu-v4", "3MiB", "layers=4")
    card = _card(tab, "Meshes")
    topo = tab.locator("input[placeholder='one slice; or 4x64@6.25']")
    topo.fill("2x4@25")
    topo.press("Enter")
    tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-mesh-seconds').value = 60")  # it returns once converged
    click(tab, "Search meshes")
    s = wait_until(lambda: (lambda s: s["meshes"]["rows"] and "meshes" not in s["busy"] and s)(state(tab)),
                   what="the mesh search to end")
    here = s["config"]["mesh"]
    better = [r for r in s["meshes"]["rows"] if r["step"] is not None and r["hand"] is not None
              and r["step"] < r["hand"] * (1 - 1e-9) and (r["mesh"], r["pipeline"]) != (here, None)]
    assert better, s["meshes"]["rows"]
    row = next((r for r in better if r["pipeline"]), better[0])
    _use_mesh_row(tab, row)
    s = _shows_one_best(tab)
    assert s["simulations"] == 0
    assert s["best"]["step_time"] == pytest.approx(row["step"], rel=1e-9), (s["best"], row)
    assert _chart(tab)["start"] == ["warm start"]
    card.evaluate("e => e.scrollIntoView({block: 'start'})")
    tab.mouse.move(0, 0)
    tab.screenshot(path=SHOTS / "views_meshes_used_plan.png")
    tab.locator(".kpis").first.evaluate("e => e.scrollIntoView({block: 'end'})")  # the message too
    tab.screenshot(path=SHOTS / "views_meshes_used_plan_kpi.png")
    s = run_until(tab, lambda s: s["simulations"] >= 20, what="the search on the picked mesh")
    assert s["best"]["step_time"] <= row["step"] * (1 + 1e-12)


def test_a_large_model_says_what_its_first_simulation_does_and_shows_the_warm_start(tab):  # noqa: F811
    """Llama 7B on the default mesh: its first simulation (a rollout, then a local search from
    the warm start's best hand plan) takes seconds. Run says so and names the plan it starts
    from; the headline and the chart show that plan as the best so far (the chart's point
    labelled "warm start"); the Search tile says the first is under way; a Pause before it
    ends says the first ends first, and once it has, the count and the better plan it found."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    choose(tab, "partex-model", "llama")
    wait_until(lambda: "7b" in tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-preset').options"),
               what="the llama presets")
    choose(tab, "partex-preset", "7b")
    click(tab, "Analyze")
    s = wait_until(lambda: (lambda s: s["phase"] == "ready" and s["model"]["preset"] == "7b" and "load" not in s["busy"]
                            and s["best"] is not None and s)(state(tab)), timeout=600, what="llama 7b and its warm start")
    warm = s["best"]["step_time"]
    name = min((t, n) for n, t in s["baselines"].items() if t == pytest.approx(warm, rel=1e-9))[1]
    assert s["simulations"] == 0 and _headline(tab) == fmt_time(warm)
    assert _chart(tab)["start"] == ["warm start"]
    click(tab, "▶ Run")
    s = wait_until(lambda: (lambda s: s["running"] and s)(state(tab)), what="the search to run")
    said = (f"a rollout, then a local search from the best plan so far, the warm start's {name} at {fmt_time(warm)} "
            f"(the best of its {len(s['baselines'])} hand plans)")
    assert "; the first simulation: " + said in s["message"], s["message"]
    kpis = tab.evaluate("Bokeh.documents[0].get_model_by_name('kpis').text")
    assert "the first under way: a local search from the best plan so far" in kpis, kpis
    tab.locator(".kpis").first.evaluate("e => e.scrollIntoView({block: 'end'})")  # the message too
    tab.mouse.move(0, 0)
    tab.screenshot(path=SHOTS / "views_first_simulation.png")
    click(tab, "❚❚ Pause")
    s = wait_until(lambda: (lambda s: not s["running"] and s)(state(tab)), what="the pause")
    assert s["message"].startswith(f"paused after 0 simulations; the first, under way, ends first: {said}; Run goes on"), \
        s["message"]
    tab.screenshot(path=SHOTS / "views_first_simulation_pausing.png")
    _card(tab, "Search")
    tab.screenshot(path=SHOTS / "views_first_simulation_chart.png")
    s = wait_until(lambda: (lambda s: s["simulations"] >= 1 and s["message"].startswith(
        f"paused after {s['simulations']:,} simulations; Run goes on") and s)(state(tab)), timeout=600,
        what="the first simulation to end")
    assert s["best"]["step_time"] <= warm
    _shows_one_best(tab)
    tab.screenshot(path=SHOTS / "views_first_simulation_done.png")
