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
