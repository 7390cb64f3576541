"""The page's views render the state whole when made: a card (or a sidebar control) made
after the model loaded and the search found plans shows what one made when the page opened,
and kept up to date by the state's changes since, shows. (A page may then make its parts in
any order, at any time, from the state alone.)"""

from __future__ import annotations

import re

from bokeh.core.json_encoder import serialize_json
from bokeh.document import Document

from partex.explorer._charts import MemoryView, SearchView
from partex.explorer._compare import CompareView
from partex.explorer._controls import FileControls, MeshControls, ModelControls, SearchControls
from partex.explorer._graph import DecisionView, GraphView
from partex.explorer._meshes import MeshesView
from partex.explorer._share import LinkControls
from partex.explorer._state import ExplorerState
from partex.explorer._tables import BaselinesView, PlanView, VerifyView

from test_explorer_state import wait_for

VIEWS = [SearchControls, ModelControls, MeshControls, GraphView, DecisionView, SearchView, MemoryView, BaselinesView,
         MeshesView, CompareView, PlanView, VerifyView, FileControls, LinkControls]


def drawn(view) -> str:
    """The JSON the browser gets for ``view``: its Bokeh models in a document of their own,
    their ids numbered in the order they appear, Panel's names for them and the ids of the
    Python objects in its tags left out (they differ between two makings)."""
    doc = Document()
    doc.add_root(view.__panel__().get_root(doc))
    text = serialize_json(doc.to_json())
    ids: dict[str, str] = {}
    text = re.sub(r'"(p\d+)"', lambda m: '"' + ids.setdefault(m.group(1), f"#{len(ids)}") + '"', text)
    text = re.sub(r'"([A-Z][A-Za-z]*)\d{5}"', r'"\1#"', text)  # Panel's own names: its class, a counter
    return re.sub(r"\b\d{12,}\b", "#", text)  # Python objects' ids in Panel's tags


def test_a_card_drawn_late_shows_what_the_card_drawn_first_shows(tmp_path):
    """Each card's view (and the sidebar's controls) made before the model loaded (kept up to date by the state's changes
    since) and one made after it loaded and the search found plans: the browser gets the same
    models from both."""
    st = ExplorerState(sessions_dir=tmp_path)
    try:
        early = [view(state=st) for view in VIEWS]
        wait_for(lambda: (st.poll(), st.phase == "ready" and st.runner is not None and not st.busy)[1],
                 timeout=120, what="the model to load")
        st.step()
        wait_for(lambda: (st.poll(), st.best is not None and not st.running)[1], timeout=120,
                 what="a step of the search")
        late = [view(state=st) for view in VIEWS]
        for view, a, b in zip(VIEWS, early, late):
            assert drawn(a) == drawn(b), f"{view.__name__} drawn late differs from the one drawn first"
    finally:
        st.close()
