"""The named-dimension graph: decision groups as nodes (sized by the bytes their tensors
hold, coloured by the mesh axis the current plan gives them), edges where two groups meet
in one tensor, conflicts in red; and the decision panel beside it (what a group is, where
it comes from, its conflicts, and the pin / forbid form). Node positions: ``_layout``.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import panel as pn
import param
from bokeh.models import ColumnDataSource, HoverTool, Range1d, TapTool
from bokeh.plotting import figure

from partex import RECOMPUTE_WHAT, GroupInfo, Recompute, Resolve, Shard

from ._engine import short_source
from ._format import esc, fmt_bytes
from ._layout import PX_H, PX_W, X_RANGE, Y_RANGE, GraphLayout, graph_layout, label_dy, node_size, sub_line
from ._widgets import bokeh_update, button, html, keyed, on_change, on_click, page_callback, select, tip_left

# A mesh axis's colour follows its name alone, the same on every mesh: the usual names have
# their own; any other takes one of the palette by a hash of its name (crc32, the same in
# every process).
AXIS_COLORS = {"data": "#2563eb", "model": "#ea580c", "fsdp": "#059669", "stage": "#9333ea", "expert": "#db2777",
               "seq": "#0891b2", "tensor": "#ca8a04", "pipeline": "#4f46e5", "replica": "#65a30d"}
OTHER_AXIS_COLORS = ("#2563eb", "#ea580c", "#059669", "#9333ea", "#db2777", "#0891b2", "#ca8a04", "#4f46e5",
                     "#65a30d", "#be185d")
UNSHARDED = "#cbd5e1"
CONFLICT = "#dc2626"
PIN_LINE = "#0f172a"
REMAT = "#9a3412"
NO_GROUP = "— choose a group —"  # the decision form's group when none is selected (its value: NONE)
NONE = -1  # a Select shows no option for a None value: the placeholder has a value of its own
SELECTED = "#f59e0b"  # the clicked (or found) node's outline  # the recompute chips' orange (explorer.css)


def axis_color(axis: str) -> str:
    """The colour of the mesh axis named ``axis``: its name's alone (``AXIS_COLORS``)."""
    return AXIS_COLORS.get(axis) or OTHER_AXIS_COLORS[zlib.crc32(axis.encode()) % len(OTHER_AXIS_COLORS)]


def axis_colors(axes) -> dict[str, str]:
    """Axis name -> colour, for the axes of a mesh."""
    return {a: axis_color(a) for a in axes}


def recomputed(state) -> dict[int, tuple[str, str]]:
    """Group id -> (layer stack, kind) where the current plan recomputes the stack the
    group's tensors are made in (the groups local to its layers)."""
    decisions = state.best.decisions if state.best is not None else state.pins
    ws = getattr(state, "workspace", None)
    if ws is None:
        return {}
    an = ws.an
    out = {}
    for d in decisions:
        if isinstance(d, Recompute):
            for g in an.unit_groups.get(d.unit, ()):
                out[g] = (an.units[d.unit].label, d.kind)
    return out


def assignment(state) -> dict[int, list[str]]:
    """Group id -> mesh axes in the current plan (the step's own fixed shardings, then the
    search's best, else the pins)."""
    decisions = state.best.decisions if state.best is not None else state.pins
    ws = getattr(state, "workspace", None)
    fixed = ws.session.cost_model.fixed.decisions if ws is not None else ()
    out: dict[int, list[str]] = {}
    for d in [*fixed, *decisions]:
        if isinstance(d, Shard):  # not a layer stack's recompute, not a conflict's resolution
            out.setdefault(d.group, []).append(d.axis)
    return out


def decision_text(an, decision, arrow: str = "→") -> str:
    """A decision as a view writes it: the group's title (``Analysis.titles``) and the axis;
    a recompute decision names its layer stack, a memory one its state set."""
    if not decision.ON_GROUP:
        return an.decision_label(decision, arrow)
    return f"{an.titles[decision.group]}{arrow}{decision.slot}"


def resolutions(state) -> dict[int, str]:
    """Group id -> the conflict resolution the current plan takes for it (none: the default)."""
    decisions = state.best.decisions if state.best is not None else state.pins
    return {d.group: d.resolution for d in decisions if isinstance(d, Resolve)}


class GraphView(pn.viewable.Viewer):
    """Bokeh graph of decision groups and of clusters of them (``_layout``): click a group
    to inspect (and pin) it, a cluster (a square) to open it; the search box finds a group
    by its label or a pytree path and opens the clusters around it."""

    state = param.Parameter()

    def __init__(self, **params):
        super().__init__(**params)
        self.layout: GraphLayout | None = None
        self._found: dict[str, int] = {}  # search option -> group
        self.node_src = ColumnDataSource(data=self._empty_nodes())
        self.edge_src = ColumnDataSource(data=dict(x0=[], y0=[], x1=[], y1=[], color=[], width=[], alpha=[]))
        self.fig = self._figure()
        self.legend = html(sizing_mode="stretch_width", margin=(0, 10))
        self.search = keyed(pn.widgets.AutocompleteInput)(
            "partex-graph-search", label="", placeholder="find a group: its label or a pytree path", options=[],
            case_sensitive=False, search_strategy="includes", min_characters=1, restrict=False,
            sizing_mode="stretch_width", margin=(0, 6))
        on_change(self.search, self.state.clock, "the graph's search box", self._on_search, ["value"])
        self.search_note = html(sizing_mode="stretch_width", margin=(0, 10), name="partex-graph-search-note")
        self.overview = button("partex-graph-overview", "Overview", width=100, margin=(0, 6),
                               description="Close the clusters opened since the model loaded")
        on_click(self.overview, self.state.clock, "the graph's Overview button", lambda: self._show(None))
        self._ringing = False  # set while the view sets the ring itself
        self.node_src.selected.on_change("indices", self._tapped)
        s = self.state
        on_change(s, s.clock, "the graph rebuilt", self._rebuild, ["graph"])
        on_change(s, s.clock, "the graph restyled", self._restyle, ["best", "pins", "forbidden"])
        on_change(s, s.clock, "the graph's selection", self._select_from_state, ["selected_group"])
        self._rebuild()
        self._panel = pn.Column(
            pn.Row(self.search, self.overview, sizing_mode="stretch_width"),
            self.search_note,
            pn.pane.Bokeh(self.fig, sizing_mode="stretch_both", min_height=PX_H, min_width=PX_W),
            self.legend, sizing_mode="stretch_both", name="graph-card",
        )

    def __panel__(self):
        return self._panel

    @staticmethod
    def _empty_nodes() -> dict:
        keys = ("key", "gid", "x", "y", "size", "ring", "marker", "label", "sub", "badge", "fill", "line",
                "line_width", "conflict", "tip", "label_dy", "sub_dy", "ring_alpha", "sub_rc", "badge_alpha")
        return {k: [] for k in keys}

    def _figure(self):
        p = figure(name="partex-graph", tools="", toolbar_location=None, sizing_mode="stretch_both",
                   min_width=PX_W, min_height=PX_H,
                   x_range=Range1d(start=X_RANGE[0], end=X_RANGE[1]),
                   y_range=Range1d(start=Y_RANGE[0], end=Y_RANGE[1]), min_border=0,
                   outline_line_color=None, background_fill_color=None, border_fill_color=None)
        p.xaxis.visible = p.yaxis.visible = False
        p.xgrid.visible = p.ygrid.visible = False
        p.segment("x0", "y0", "x1", "y1", source=self.edge_src, line_color="color", line_width="width",
                  line_alpha="alpha")
        # a click selects a node: the others dim a little; rings and labels stay as they are
        p.scatter("x", "y", source=self.node_src, size="ring", marker="marker", fill_color=None,
                  line_color=CONFLICT, line_width=2.5, line_dash="dashed", line_alpha="ring_alpha",
                  nonselection_line_alpha="ring_alpha")
        nodes = p.scatter("x", "y", source=self.node_src, size="size", marker="marker", fill_color="fill",
                          line_color="line", line_width="line_width", selection_fill_alpha=1.0,
                          selection_line_color=SELECTED,
                          # bokeh takes any selection_line_* visual; its stubs list colour and alpha only
                          selection_line_width=4,  # pyright: ignore[reportCallIssue]
                          nonselection_fill_alpha=0.6, nonselection_line_alpha=1.0)
        # the axes' initials on a dark backdrop of their own: legible on any fill, and on a node
        # smaller than its badge ("D+F+M" overflows a small group's circle onto the page)
        badge_bg: dict[str, Any] = dict(background_fill_color="#0f172a", background_fill_alpha="badge_alpha", padding=2,
                                        border_radius=3)
        p.text("x", "y", text="badge", source=self.node_src, text_align="center", text_baseline="middle",
               text_color="white", text_font_size="11px", text_font_style="bold", nonselection_text_alpha=1.0,
               **badge_bg)
        label_bg: dict[str, Any] = dict(background_fill_color="#ffffff", background_fill_alpha=0.8, padding=1,
                        nonselection_text_alpha=1.0)
        p.text("x", "y", text="label", source=self.node_src, y_offset="label_dy", text_align="center",
               text_baseline="top", text_font_size="13px", text_font_style="bold", text_color="#0f172a", **label_bg)
        # one colour per glyph (a recomputed layer's line in its own): see MemoryView's notes
        for column, colour in (("sub", "#475569"), ("sub_rc", REMAT)):
            p.text("x", "y", text=column, source=self.node_src, y_offset="sub_dy", text_align="center",
                   text_baseline="top", text_font_size="11px", text_color=colour, **label_bg)
        # the nodes' tooltips only: an edge's would open with its ends' (what two groups share
        # is in the decision panel)
        p.add_tools(HoverTool(renderers=[nodes], tooltips="@tip{safe}", attachment="right"), TapTool(renderers=[nodes]))
        return p

    # ------------------------------------------------------------------ data
    @bokeh_update
    def _rebuild(self, *_):
        self.layout = self.state.graph
        self.search_note.object = ""
        if self.layout is None:
            self.node_src.data = self._empty_nodes()
            self.node_src.selected.indices = []
            self.search.options = []
            return
        self._found = search_options(self.state.infos)
        self.search.options = list(self._found)
        self._restyle()
        self._select_from_state()  # the new drawing's nodes: the selection is found among them anew

    def _show(self, opened, reveal: bool = True) -> None:
        """Lay the graph out anew with ``opened`` clusters open (None: the first view); with
        ``reveal``, open the clusters around the selected group too."""
        ws, lay = self.state.workspace, self.layout
        if ws is None or lay is None:
            return
        first = self.state.graph  # the first view, laid out with the model: taken again, not redone
        self.layout = first if opened is None and first is not None else graph_layout(ws.an, self.state.infos,
                                                                                      lay.tree, opened)
        self._restyle()
        if reveal:
            self._select_from_state()

    def _reveal(self, g: int) -> None:
        """Open the clusters around group ``g`` where it is not drawn."""
        lay = self.layout
        if lay is not None and g not in lay.nodes and g in lay.tree.parent:
            self._show(lay.tree.open(lay.opened, lay.tree.parent[g]))

    @bokeh_update
    def _restyle(self, *_):
        s = self.state
        ws = s.workspace
        lay = self.layout
        if ws is None or lay is None or not lay.nodes:
            return
        an = ws.an
        tree = lay.tree
        colors = axis_colors(ws.config.mesh.axes)
        assigned = assignment(s)
        remat = recomputed(s)
        resolved = resolutions(s)
        pinned = {d.group for d in s.pins if isinstance(d, Shard)}
        forbidden: dict[int, list[str]] = {}
        for d in s.forbidden:
            if isinstance(d, Shard):
                forbidden.setdefault(d.group, []).append(d.axis)
        conflicted = {c.group for c in an.conflicts}
        most = max(tree.nbytes(n) for n in lay.nodes) or 1
        d = self._empty_nodes()
        for n in lay.nodes:
            members = tree.clusters[n].groups if isinstance(n, str) else (n,)
            size = node_size(tree.nbytes(n), most)
            x, y = lay.pos[n]
            axis_bytes: dict[str, int] = {}
            for g in members:
                for a in assigned.get(g, []):
                    axis_bytes[a] = axis_bytes.get(a, 0) + tree.group_bytes[g]
            mine = sorted(axis_bytes, key=lambda a: -axis_bytes[a])
            conflict = any(g in conflicted for g in members)
            is_pinned = any(g in pinned for g in members)
            d["key"].append(str(n))
            d["gid"].append(n if isinstance(n, int) else -1)
            d["x"].append(x)
            d["y"].append(y)
            d["size"].append(size)
            d["ring"].append(size + 12)
            d["marker"].append("square" if isinstance(n, str) else "circle")
            d["ring_alpha"].append(1.0 if conflict else 0.0)
            d["label"].append(lay.labels[n][0])
            rc = remat.get(n) if isinstance(n, int) else None
            sub = sub_line(tree, s.infos, n, rc[1] if rc else "")
            d["sub"].append("" if rc else sub)
            d["sub_rc"].append(sub if rc else "")
            d["badge"].append("+".join(a[:1].upper() for a in mine))
            d["badge_alpha"].append(0.72 if mine else 0.0)  # no backdrop where there is no badge
            d["fill"].append(colors[mine[0]] if mine else UNSHARDED)
            d["line"].append(PIN_LINE if is_pinned else "#ffffff")
            d["line_width"].append(3.5 if is_pinned else 1.5)
            d["conflict"].append(conflict)
            d["label_dy"].append(label_dy(size))
            d["sub_dy"].append(label_dy(size) + 16)
            if isinstance(n, str):
                d["tip"].append(_cluster_tooltip(tree.clusters[n], s.infos, assigned))
            else:
                d["tip"].append(_tooltip(s.infos[n], assigned.get(n, []), n in pinned, forbidden.get(n, []),
                                         n in conflicted, rc, resolved.get(n)))
        self.node_src.data = d
        self.edge_src.data = _edge_columns(lay, assigned)
        self._sync_selection()  # new rows: the selected row is found anew, never left at an old index
        self.legend.object = _legend(lay, colors, len(s.infos), bool(remat))

    # ------------------------------------------------------------------ selection
    def _tapped(self, attr, old, new):
        """A click on the graph (Bokeh's selection of a node), as one of the page's callbacks."""
        with page_callback(self.state.clock, "a click on the graph"):
            self._on_tap(attr, old, new)

    def _on_tap(self, attr, old, new):
        lay = self.layout
        if self._ringing or lay is None:
            return
        if not new:  # a click off every node: the card keeps its group, and the graph its ring
            self._sync_selection(echo=True)
            return
        data: dict[str, Any] = self.node_src.data  # the columns _rebuild wrote
        key, gid = data["key"][new[0]], data["gid"][new[0]]
        if gid >= 0:
            if self.state.selected_group != gid:
                self.state.selected_group = gid
        else:
            self._show(lay.tree.open(lay.opened, key), reveal=False)
            g = self.state.selected_group
            lay = self.layout  # laid out anew
            if g is not None and lay is not None and g not in lay.nodes:  # the click closed the selected group's cluster
                self.state.selected_group = None
        self._sync_selection(echo=True)

    def _on_search(self, event):
        text = (event.new or "").strip()
        if not text:
            return
        g = self._found.get(text)
        if g is None:  # typed, not picked: the largest group whose label or a path holds it
            hits = [g for opt, g in self._found.items() if text.lower() in opt.lower()]
            g = max(hits, key=lambda g: self.state.infos[g].bytes) if hits else None
        if g is None:
            self.search_note.object = f"<div class='field-msg'>No group's label or pytree path holds {esc(text)!s}.</div>"
            return
        self.search_note.object = ""
        self._reveal(g)
        if self.state.selected_group != g:
            self.state.selected_group = g
        else:
            self._select_from_state()

    @bokeh_update
    def _select_from_state(self, *_):
        """The state's selected group, drawn (its clusters opened) and ringed."""
        g = self.state.selected_group
        if g is not None:
            self._reveal(g)
        self._sync_selection()

    @bokeh_update
    def _sync_selection(self, echo: bool = False) -> None:
        """Ring the state's selected group, the row whose key is its id: the Decision card
        shows the same group, or, with none selected (or the group not drawn), no row is.

        With ``echo`` (a click's answer) the ring is sent to the page even where this side
        already holds it: a ring the server sent before the click was heard (a new layout, a
        new best restyling the graph) reaches the page after the page's own, and would
        otherwise stay there while the card shows the clicked group."""
        g = self.state.selected_group
        keys = list(self.node_src.data["key"])
        want = [keys.index(str(g))] if g is not None and str(g) in keys else []
        sel = self.node_src.selected
        self._ringing = True  # _on_tap hears only the page's clicks
        try:
            if list(sel.indices) != want:
                sel.indices = want
            elif echo:
                sel.trigger("indices", want, want)
        finally:
            self._ringing = False


def search_options(infos) -> dict[str, int]:
    """What the graph's search box offers: each group's title and its label (the name plan
    files give it), and each pytree path and dim that holds a group ("params/layers/0/w1
    dim 1 · ffn")."""
    out = {info.shown: g for g, info in infos.items()}
    for g, info in infos.items():
        out.setdefault(info.label, g)
    for g, info in infos.items():
        for path, _, dim in info.tensors:
            out.setdefault(f"{path} dim {dim} · {info.shown}", g)
    return out


def _cluster_tooltip(c, infos, assigned) -> str:
    names = ", ".join(esc(infos[g].shown) + (f" ({esc('+'.join(assigned[g]))})" if assigned.get(g) else "")
                      for g in c.groups[:12])
    more = f", … {len(c.groups) - 12} more" if len(c.groups) > 12 else ""
    return (f"<div style='font:12px sans-serif;max-width:340px'><b>{esc(c.label)}</b> · {len(c.groups)} groups · "
            f"{fmt_bytes(c.bytes)}<div style='margin-top:4px;color:#475569'>{names}{more}</div>"
            "<div style='margin-top:4px'>click to open</div></div>")


def _tooltip(info: GroupInfo, axes, pinned: bool, forbidden, conflicted: bool, remat=None, resolution=None) -> str:
    rows = "".join(f"<div class='t-row'>{esc(p)} {esc(tuple(s))} dim {d}</div>" for p, s, d in info.tensors[:5])
    more = f"<div class='t-row'>… {len(info.tensors) - 5} more</div>" if len(info.tensors) > 5 else ""
    state = ", ".join(axes) if axes else "unsharded"
    if pinned:
        state += " (pinned)"
    if forbidden:
        state += f"; forbidden on {', '.join(forbidden)}"
    warn = ""
    if conflicted:
        how = {None: "the first dim of each such tensor keeps the axis (the default)",
               "second": "the second dim keeps the axis (resolve:second)",
               "neither": "neither dim is sharded there (resolve:neither)"}.get(resolution, resolution)
        warn = (f"<div style='color:#dc2626'>conflict: one tensor has two of its dims in this group; "
                f"{esc(how)}</div>")
    if remat:
        what = RECOMPUTE_WHAT.get(remat[1], remat[1])
        warn += f"<div style='color:{REMAT}'>{esc(remat[0])} → recompute:{esc(remat[1])}: {esc(what)}</div>"
    return (f"<div style='font:12px sans-serif;max-width:340px'><b>{esc(info.shown)}</b> · size {info.size} · "
            f"{fmt_bytes(info.bytes)} · {info.layers} named dim(s)<br>plan: {esc(state)}{warn}"
            f"<div style='margin-top:4px;color:#475569'>{rows}{more}</div></div>")


class DecisionView(pn.viewable.Viewer):
    """The group clicked in the graph: its tensors, source lines and conflicts; and the form
    that pins it to a mesh axis, forbids it, or releases it."""

    state = param.Parameter()

    def __init__(self, **params):
        super().__init__(**params)
        s = self.state
        self.group = select("partex-pin-group", "Group", options={}, sizing_mode="stretch_width")
        self.axis = select("partex-pin-axis", "Mesh axis", options=[], sizing_mode="stretch_width")
        self.pin_btn = button("partex-pin", "Pin", color="primary", sizing_mode="stretch_width")
        self.forbid_btn = button("partex-forbid", "Forbid", color="warning", sizing_mode="stretch_width")
        self.unpin_btn = button("partex-unpin", "Release", color="default", sizing_mode="stretch_width",
                                description=tip_left("Unpin, or allow again, the group on the axis"))
        on_click(self.pin_btn, s.clock, "the Pin button", lambda: self._decide(s.pin))
        on_click(self.forbid_btn, s.clock, "the Forbid button", lambda: self._decide(s.forbid))
        on_click(self.unpin_btn, s.clock, "the Release button", lambda: self._decide(s.unpin))
        self._quiet = False  # set while the form is set from the state: its events are not the user's
        on_change(self.group, s.clock, "the Decision card's group", self._on_group, ["value"])
        self.detail = html(sizing_mode="stretch_width", css_classes=["detail-scroll"], min_height=200,
                           name="decision-detail")
        self.chips = html(sizing_mode="stretch_width", margin=(0, 10))
        on_change(s, s.clock, "the Decision card's choices", self._options, ["infos", "config"])
        on_change(s, s.clock, "the Decision card", self._render, ["selected_group", "best", "pins", "forbidden", "infos"])
        self._options()
        self._render()
        self._panel = pn.Column(
            pn.Row(self.group, self.axis, sizing_mode="stretch_width"),
            pn.Row(self.pin_btn, self.forbid_btn, self.unpin_btn, sizing_mode="stretch_width"),
            self.chips,
            pn.Column(self.detail, sizing_mode="stretch_both", scroll=True, min_height=200),
            sizing_mode="stretch_both",
        )

    def __panel__(self):
        return self._panel

    def _decide(self, fn):
        fn(None if self.group.value == NONE else self.group.value, self.axis.value)

    def _options(self, *_):
        s = self.state
        ws = s.workspace
        if ws is None:
            return
        # the selected group or none (the first option): the form never picks one itself
        self._set_group({NO_GROUP: NONE, **{info.shown: g for g, info in s.infos.items()}})
        axes = list(ws.config.mesh.axes)
        self.axis.options = axes
        if self.axis.value not in axes:
            self.axis.value = axes[-1] if axes else None

    def _set_group(self, options=None) -> None:
        """The form's group: the state's selected one (``NO_GROUP`` where there is none)."""
        s = self.state
        want = s.selected_group if s.selected_group in s.infos else NONE
        self._quiet = True
        try:
            if options is not None:
                self.group.options = options
            if self.group.value != want:
                self.group.value = want
        finally:
            self._quiet = False

    def _on_group(self, event):
        g = None if event.new in (None, NONE) else event.new
        if not self._quiet and self.state.selected_group != g:
            self.state.selected_group = g

    def _render(self, *_):
        s = self.state
        ws = s.workspace
        if ws is None or not s.infos:
            self.detail.object = "<div class='muted'>Loading the model…</div>"
            return
        an = ws.an
        label = lambda d: decision_text(an, d)  # noqa: E731

        def titled(name: str) -> str:  # a fixed decision's group, by its title
            group = an.group_by_label(name)
            return an.titles[group.id] if group is not None else name

        chips = "".join(
            f"<span class='chip user' title='{esc(f['kind'])} at {esc(f['source'])}'>yours: "
            f"{esc(titled(f['group']))}→{esc(f['axis'] or 'unsharded')}</span>" for f in ws.session.fixed)
        chips += "".join(f"<span class='chip pin'>pinned {esc(label(d))}</span>" for d in s.pins)
        chips += "".join(f"<span class='chip forbid'>forbidden {esc(label(d))}</span>" for d in s.forbidden)
        held = s.held
        chips += "".join(f"<span class='chip held' title='does not apply on this mesh; it comes back on a mesh "
                         f"where it does'>set aside: {how} {esc(label(d))}</span>"
                         for how, items in (("pin", held.pins), ("forbid", held.forbidden)) for d in items)
        self.chips.object = f"<div class='chips'>{chips or '<span class=muted>No pins: the search decides everything.</span>'}</div>"
        g = s.selected_group
        self._set_group()  # the form shows the group the card shows (none: its first option)
        if g is None or g not in s.infos:
            conflicts = "".join(_conflict_html(c) for info in s.infos.values() for c in info.conflicts)
            self.detail.object = (
                "<div class='muted'>Click a node in the graph (or choose a group above) to see its tensors, "
                "the source lines that make them and its conflicts.</div>" + conflicts)
            return
        info = s.infos[g]
        axes = assignment(s).get(g, [])
        cooccur = sorted(((n, b if a == g else a) for (a, b), n in an.cooccur.items() if g in (a, b)), reverse=True)
        rows = "".join(f"<tr><td class='mono'>{esc(p)}</td><td class='mono'>{esc(tuple(sh))}</td><td>{d}</td></tr>"
                       for p, sh, d in info.tensors[:24])
        more = f"<div class='muted'>… {len(info.tensors) - 24} more tensors</div>" if len(info.tensors) > 24 else ""
        lines: dict[str, int] = {}
        for x, n in info.sources:  # several columns of one line read as one line here
            lines[short_source(x)] = lines.get(short_source(x), 0) + n
        src = "".join(f"<li><span class='mono'>{esc(x)}</span> <span class='muted'>×{n}</span></li>"
                      for x, n in sorted(lines.items(), key=lambda kv: -kv[1]))
        co = ", ".join(f"{esc(an.titles[o])} <span class='muted'>{fmt_bytes(n)}</span>" for n, o in cooccur[:6])
        plan = ", ".join(esc(a) for a in axes) or "unsharded"
        self.detail.object = (
            f"<div class='detail'><h3>{esc(info.shown)}</h3>"
            + (f"<div class='muted small'>named <span class='mono'>{esc(info.label)}</span> in plan and session "
               "files and pins</div>" if info.label != info.shown else "")
            + f"<div class='kv'><span>size {info.size}</span><span>{info.layers} named dim(s)</span>"
            f"<span>{fmt_bytes(info.bytes)} touched</span><span>plan: <b>{plan}</b></span></div>"
            + "".join(_conflict_html(c) for c in info.conflicts)
            + (f"<h4>Input tensors (pytree path, shape, dim)</h4><table class='tbl'>{rows}</table>{more}"
               if rows else "<h4>Input tensors</h4><div class='muted'>None: no input of the step holds it; the "
               "step's own ops make its tensors (below).</div>")
            + (f"<h4>Made by</h4><ul class='src'>{src}</ul>" if src else "")
            + (f"<h4>Meets in one tensor with</h4><div>{co}</div>" if co else "")
            + "</div>")


def _conflict_html(c: dict) -> str:
    path = "".join(f"<li class='mono'>{esc(_short_op(p))}</li>" for p in c["path"])
    opts = "".join(f"<li>{esc(o)}</li>" for o in c["options"])
    return (f"<div class='conflict'><b>Conflict in {esc(c['group'])}</b>: {esc(c['value'])} "
            f"{esc(tuple(c['shape']))} has dims {c['dims'][0]} and {c['dims'][1]} both in {esc(c['named_dim'])} "
            f"({c['values']} tensors), made by {esc(c['producer'])} at "
            f"<span class='mono'>{esc(short_source(c['source']))}</span>."
            f"<div>Op path that joins them:</div><ol>{path}</ol><div>Resolutions:</div><ul>{opts}</ul></div>")


def _short_op(p: str) -> str:
    prim, _, src = p.partition(" @ ")
    return f"{prim} @ {short_source(src)}" if src else prim


def _edge_columns(lay, assigned: dict[int, list[str]]) -> dict[str, Any]:
    """The edges' columns: width and opacity by the bytes of the tensors joining the two
    nodes; red where two groups share a mesh axis (a tensor holding both gathers one;
    clusters: not said)."""
    e: dict[str, Any] = dict(x0=[], y0=[], x1=[], y1=[], color=[], width=[], alpha=[])
    emax = max((b for *_, b in lay.edges), default=1)
    for a, b, nb in lay.edges:
        shared = (isinstance(a, int) and isinstance(b, int)
                  and set(assigned.get(a, [])) & set(assigned.get(b, [])))
        (x0, y0), (x1, y1) = lay.pos[a], lay.pos[b]
        for key, coord in (("x0", x0), ("y0", y0), ("x1", x1), ("y1", y1)):
            e[key].append(coord)
        w = 1 + 5 * math.sqrt(nb / emax)
        e["width"].append(w + (1.5 if shared else 0))
        e["color"].append(CONFLICT if shared else "#94a3b8")
        e["alpha"].append(0.9 if shared else 0.25 + 0.45 * math.sqrt(nb / emax))
    return e


def _legend(lay, colors: dict[str, str], groups: int, remat: bool) -> str:
    """The legend under the graph: the axes' colours, the marks, and what the clusters hold."""
    tree = lay.tree
    colors_html = "".join(f'<span class="lg"><i style="background:{c}"></i>{esc(a)}</span>'
                          for a, c in colors.items())
    closed = [n for n in lay.nodes if isinstance(n, str)]
    inside = sum(len(tree.clusters[n].groups) for n in closed)
    clusters = (f'<span class="lg"><i class="sq"></i><b>{len(closed)} clusters hold {inside} of '
                f'{groups} groups: click one to open it</b></span>' if closed else
                f'<span class="lg muted">all {groups} groups drawn</span>')
    return (f'<div class="legend">{colors_html}<span class="lg"><i style="background:{UNSHARDED}"></i>unsharded</span>'
            f'<span class="lg"><i class="ring"></i>conflict</span>'
            f'<span class="lg"><i class="pin"></i>pinned</span>'
            f'<span class="lg"><i class="bar" style="background:{CONFLICT}"></i>both on one axis</span>'
            + (f'<span class="lg" style="color:{REMAT}">↻ its layers recomputed</span>' if remat else "")
            + clusters + '<span class="lg muted">size: bytes touched · click a node</span></div>')
