"""The explorer's graph view without a browser: a click on a node is answered with the ring
the server holds, so the page's ring and the Decision card stay on one group whatever the
server sent before it heard the click."""

from __future__ import annotations

import pytest
from bokeh.document import Document
from bokeh.document.events import ModelChangedEvent

from partex.explorer._graph import GraphView
from partex.explorer._state import ExplorerState
from test_explorer_state import _settle


@pytest.fixture(scope="module")
def view(tmp_path_factory):
    st = ExplorerState(sessions_dir=tmp_path_factory.mktemp("sessions"))
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None, "the model to load")
        gv = GraphView(state=st)
        doc = Document()
        doc.add_root(gv.fig)
        yield gv, doc
    finally:
        st.close()


def _rings_sent(doc, act) -> list[list[int]]:
    """The selections the server sends the page while ``act`` runs (the page's own change,
    made with the setter "page", is never sent back to it)."""
    sent: list[list[int]] = []

    def heard(event):
        if isinstance(event, ModelChangedEvent) and event.attr == "indices" and event.setter != "page":
            sent.append(list(event.new))

    doc.on_change(heard)
    try:
        act()
    finally:
        doc.remove_on_change(heard)
    return sent


def _click(gv, row: int | None) -> None:
    """The page's tap: its selection changes, and the server hears of it."""
    gv.node_src.selected.set_from_json("indices", [] if row is None else [row], setter="page")


def test_a_click_on_a_group_is_answered_with_its_ring(view):
    gv, doc = view
    st = gv.state
    data = gv.node_src.data
    rows = [i for i, gid in enumerate(data["gid"]) if gid >= 0]
    assert len(rows) >= 2
    first, second = rows[:2]
    # the page clicks a group: the state selects it and the page is told its ring
    assert _rings_sent(doc, lambda: _click(gv, first)) == [[first]]
    assert st.selected_group == data["gid"][first]
    # the server rings another group (the card's form chose it) while the page's click on
    # the first is on its way: the click, heard last, wins, and its ring is sent after
    st.selected_group = data["gid"][second]
    assert list(gv.node_src.selected.indices) == [second]
    assert _rings_sent(doc, lambda: _click(gv, first)) == [[first]]
    assert st.selected_group == data["gid"][first]
    # a click off every node keeps the card's group, and the graph rings it again
    assert _rings_sent(doc, lambda: _click(gv, None)) == [[first]]
    assert st.selected_group == data["gid"][first]


def test_a_badge_has_a_backdrop_of_its_own_and_an_empty_one_none(view):
    """The axes' initials on a node sit on a dark backdrop (legible on a pale fill and past
    a small node's edge); a node with no axis has no backdrop drawn."""
    gv, _ = view
    st = gv.state
    st.step_size = 30
    st.step()
    _settle(st, lambda: st.best is not None and not st.running, "a plan")
    data = gv.node_src.data
    shown = [(b, a) for b, a in zip(data["badge"], data["badge_alpha"])]
    assert any(b for b, _ in shown) and all((a > 0.5) == bool(b) for b, a in shown), shown
    badge = next(r.glyph for r in gv.fig.renderers if getattr(r.glyph, "text", None) == "badge")
    assert badge.text_color == "white" and badge.background_fill_color == "#0f172a"


def test_overview_takes_the_first_view_again_without_laying_it_out(view, monkeypatch):
    """Overview closes the clusters opened since the model loaded: the page's first layout
    is drawn again as it was (a large model's layout takes long to redo on the page's loop)."""
    import partex.explorer._graph as graph

    gv, _ = view
    st = gv.state
    laid: list = []
    real = graph.graph_layout
    monkeypatch.setattr(graph, "graph_layout", lambda *a, **k: laid.append(a) or real(*a, **k))
    before = st.clock.timings["callbacks"]
    gv.overview.clicks += 1
    assert gv.layout is st.graph and not laid
    assert st.clock.timings["callbacks"] == before + 1  # one timed callback on the page's clock


def test_the_warm_start_label_sits_on_a_box_of_its_own(view):
    """The search chart's "warm start" label is drawn over the step line it starts: on a white
    box, in a dark colour, at the chart's own label size, so the line never crosses the words."""
    from partex.explorer._charts import SearchView

    gv, _ = view
    chart = SearchView(state=gv.state)
    glyph = next(r.glyph for r in chart.hist_fig.renderers if r.name == "partex-history-start")
    assert glyph.background_fill_color == "#ffffff" and glyph.background_fill_alpha > 0.8
    assert glyph.text_font_size == "12px" and glyph.text_color == "#1e293b"
