"""The named-dimension graph: decision groups as nodes (sized by the bytes their tensors
hold, coloured by the mesh axis the current plan gives them), edges where two groups meet
in one tensor, conflicts in red; and the decision panel beside it (what a group is, where
it comes from, its conflicts, and the pin / forbid form). Node positions: ``_layout``.
"""

from __future__ import annotations

import math

import panel as pn
import param
from bokeh.models import (
    ColumnDataSource, HoverTool, Range1d, TapTool,
)
from bokeh.plotting import figure

from partex import GroupInfo, is_recompute, is_resolution

from ._engine import short_source
from ._format import esc, fmt_bytes
from ._widgets import bokeh_update, button, html, select

AXIS_COLORS = ["#2563eb", "#ea580c", "#059669", "#9333ea", "#db2777", "#0891b2"]
UNSHARDED = "#cbd5e1"
CONFLICT = "#dc2626"
PIN_LINE = "#0f172a"
REMAT = "#9a3412"  # the recompute chips' orange (explorer.css)


def axis_colors(axes) -> dict[str, str]:
    return {a: AXIS_COLORS[i % len(AXIS_COLORS)] for i, a in enumerate(axes)}


def recomputed(state) -> dict[int, tuple[str, str]]:
    """Group id -> (layer stack, kind) where the current plan recomputes the stack the
    group's tensors are made in (the groups local to its layers)."""
    decisions = state.best.decisions if state.best is not None else state.pins
    ws = getattr(state, "workspace", None)
    if ws is None:
        return {}
    an = ws.an
    out = {}
    for u, a in decisions:
        if is_recompute((u, a)):
            for g in an.unit_groups().get(u, ()):
                out[g] = (an.units[u].label, a.split(":", 1)[1])
    return out


def assignment(state) -> dict[int, list[str]]:
    """Group id -> mesh axes in the current plan (the step's own fixed shardings, then the
    search's best, else the pins)."""
    decisions = state.best.decisions if state.best is not None else state.pins
    ws = getattr(state, "workspace", None)
    fixed = ws.session.cost_model.fixed.decisions if ws is not None else ()
    out: dict[int, list[str]] = {}
    for g, a in [*fixed, *decisions]:
        if ":" not in a:  # a mesh axis (not a layer stack's recompute, not a conflict's resolution)
            out.setdefault(g, []).append(a)
    return out


def resolutions(state) -> dict[int, str]:
    """Group id -> the conflict resolution the current plan takes for it (none: the default)."""
    decisions = state.best.decisions if state.best is not None else state.pins
    return {g: a.split(":", 1)[1] for g, a in decisions if is_resolution((g, a))}


class GraphView(pn.viewable.Viewer):
    """Bokeh graph of decision groups; click a node to inspect (and pin) it."""

    state = param.Parameter()

    def __init__(self, **params):
        super().__init__(**params)
        self._nodes: tuple[int, ...] = ()
        self._pos: dict = {}
        self._edges: tuple = ()
        self._hidden = 0
        self.node_src = ColumnDataSource(data=self._empty_nodes())
        self.edge_src = ColumnDataSource(data=dict(x0=[], y0=[], x1=[], y1=[], color=[], width=[], alpha=[],
                                                   pair=[], bytes=[], note=[]))
        self.fig = self._figure()
        self.legend = html(sizing_mode="stretch_width", margin=(0, 10))
        self.node_src.selected.on_change("indices", self._on_tap)
        s = self.state
        s.param.watch(self._rebuild, ["graph"])
        s.param.watch(self._restyle, ["best", "pins", "forbidden"])
        s.param.watch(self._select_from_state, ["selected_group"])
        self._rebuild()
        self._panel = pn.Column(
            pn.pane.Bokeh(self.fig, sizing_mode="stretch_both", min_height=380),
            self.legend, sizing_mode="stretch_both", name="graph-card",
        )

    def __panel__(self):
        return self._panel

    @staticmethod
    def _empty_nodes() -> dict:
        keys = ("gid", "x", "y", "size", "ring", "label", "sub", "badge", "fill", "line", "line_width",
                "conflict", "tip", "label_dy", "sub_dy", "ring_alpha", "sub_rc")
        return {k: [] for k in keys}

    def _figure(self):
        p = figure(name="partex-graph", tools="", toolbar_location=None, sizing_mode="stretch_both",
                   x_range=Range1d(-1.7, 1.7), y_range=Range1d(-1.34, 1.16), min_border=4,
                   outline_line_color=None, background_fill_color=None, border_fill_color=None)
        p.xaxis.visible = p.yaxis.visible = False
        p.xgrid.visible = p.ygrid.visible = False
        edges = p.segment("x0", "y0", "x1", "y1", source=self.edge_src, line_color="color",
                          line_width="width", line_alpha="alpha")
        # a click selects a node: the others dim a little; rings and labels stay as they are
        p.scatter("x", "y", source=self.node_src, size="ring", fill_color=None, line_color=CONFLICT,
                  line_width=2.5, line_dash="dashed", line_alpha="ring_alpha", nonselection_line_alpha="ring_alpha")
        nodes = p.scatter("x", "y", source=self.node_src, size="size", fill_color="fill", line_color="line",
                          line_width="line_width", selection_fill_alpha=1.0, nonselection_fill_alpha=0.6,
                          nonselection_line_alpha=1.0)
        p.text("x", "y", text="badge", source=self.node_src, text_align="center", text_baseline="middle",
               text_color="white", text_font_size="11px", text_font_style="bold", nonselection_text_alpha=1.0)
        label_bg = dict(background_fill_color="#ffffff", background_fill_alpha=0.8, padding=1,
                        nonselection_text_alpha=1.0)
        p.text("x", "y", text="label", source=self.node_src, y_offset="label_dy", text_align="center",
               text_baseline="top", text_font_size="13px", text_font_style="bold", text_color="#0f172a", **label_bg)
        # one colour per glyph (a recomputed layer's line in its own): see MemoryView's notes
        for column, colour in (("sub", "#475569"), ("sub_rc", REMAT)):
            p.text("x", "y", text=column, source=self.node_src, y_offset="sub_dy", text_align="center",
                   text_baseline="top", text_font_size="11px", text_color=colour, **label_bg)
        p.add_tools(HoverTool(renderers=[nodes], tooltips="@tip{safe}", attachment="right"),
                    HoverTool(renderers=[edges], tooltips="@pair: @note", line_policy="interp"),
                    TapTool(renderers=[nodes]))
        return p

    # ------------------------------------------------------------------ data
    @bokeh_update
    def _rebuild(self, *_):
        g = self.state.graph
        if g is None:
            self.node_src.data = self._empty_nodes()
            return
        self._nodes, self._pos, self._edges, self._hidden = g.nodes, g.pos, g.edges, g.hidden
        self._restyle()

    @bokeh_update
    def _restyle(self, *_):
        s = self.state
        ws = s.workspace
        if ws is None or not self._nodes:
            return
        an = ws.an
        axes = ws.config.mesh.axes
        colors = axis_colors(axes)
        assigned = assignment(s)
        remat = recomputed(s)
        resolved = resolutions(s)
        pinned = {g for g, a in s.pins if ":" not in a}
        forbidden = {}
        for g, a in (d for d in s.forbidden if ":" not in d[1]):
            forbidden.setdefault(g, []).append(a)
        conflicted = {c.group for c in an.conflicts}
        bmax = max(an.groups[g].bytes for g in self._nodes) or 1
        d = self._empty_nodes()
        for g in self._nodes:
            grp = an.groups[g]
            info = s.infos[g]
            x, y = self._pos[g]
            size = 20 + 34 * math.sqrt(grp.bytes / bmax)
            mine = assigned.get(g, [])
            d["gid"].append(g)
            d["x"].append(x)
            d["y"].append(y)
            d["size"].append(size)
            d["ring"].append(size + 12)
            d["ring_alpha"].append(1.0 if g in conflicted else 0.0)
            d["label"].append(_short(grp.label))
            layers = f" · ×{info.layers}" if info.layers > 1 else ""
            rc = remat.get(g)
            sub = f"{grp.size}{layers} · {fmt_bytes(grp.bytes)}" + (f" · ↻ {rc[1]}" if rc else "")
            d["sub"].append("" if rc else sub)
            d["sub_rc"].append(sub if rc else "")
            d["badge"].append("+".join(a[:1].upper() for a in mine))
            d["fill"].append(colors[mine[0]] if mine else UNSHARDED)
            d["line"].append(PIN_LINE if g in pinned else "#ffffff")
            d["line_width"].append(3.5 if g in pinned else 1.5)
            d["conflict"].append(g in conflicted)
            dy = size / 2 + (10 if g in conflicted else 4)  # below the node (and its ring)
            d["label_dy"].append(dy)
            d["sub_dy"].append(dy + 16)
            d["tip"].append(_tooltip(info, mine, g in pinned, forbidden.get(g, []), g in conflicted, rc,
                                     resolved.get(g)))
        self.node_src.data = d
        e = dict(x0=[], y0=[], x1=[], y1=[], color=[], width=[], alpha=[], pair=[], bytes=[], note=[])
        emax = max((n for *_, n in self._edges), default=1)
        for a, b, n in self._edges:
            shared = sorted(set(assigned.get(a, [])) & set(assigned.get(b, [])))
            (x0, y0), (x1, y1) = self._pos[a], self._pos[b]
            e["x0"].append(x0); e["y0"].append(y0); e["x1"].append(x1); e["y1"].append(y1)
            w = 1 + 5 * math.sqrt(n / emax)
            e["width"].append(w + (1.5 if shared else 0))
            e["color"].append(CONFLICT if shared else "#94a3b8")
            e["alpha"].append(0.9 if shared else 0.25 + 0.45 * math.sqrt(n / emax))
            e["pair"].append(f"{an.groups[a].label} × {an.groups[b].label}")
            e["bytes"].append(n)
            note = f"{fmt_bytes(n)} of tensors hold both"
            if shared:
                note += (f"; both on {', '.join(shared)}: such a tensor can shard only one of them on it, "
                         "the other is gathered (an all-gather where an op needs it)")
            e["note"].append(note)
        self.edge_src.data = e
        colors_html = "".join(f'<span class="lg"><i style="background:{c}"></i>{esc(a)}</span>'
                              for a, c in colors.items())
        hidden = self._hidden
        more = f'<span class="lg muted">{hidden} smaller groups not drawn</span>' if hidden > 0 else ""
        self.legend.object = (
            f'<div class="legend">{colors_html}<span class="lg"><i style="background:{UNSHARDED}"></i>unsharded</span>'
            f'<span class="lg"><i class="ring"></i>conflict</span>'
            f'<span class="lg"><i class="pin"></i>pinned</span>'
            f'<span class="lg"><i class="bar" style="background:{CONFLICT}"></i>both on one axis</span>'
            + (f'<span class="lg" style="color:{REMAT}">↻ its layers recomputed</span>' if remat else "")
            + f'{more}'
            f'<span class="lg muted">size: bytes touched · click a node</span></div>')

    # ------------------------------------------------------------------ selection
    def _on_tap(self, attr, old, new):
        if new:
            gid = self.node_src.data["gid"][new[0]]
            if self.state.selected_group != gid:
                self.state.selected_group = gid

    @bokeh_update
    def _select_from_state(self, event):
        g = event.new
        gids = self.node_src.data["gid"]
        want = [gids.index(g)] if g in gids else []
        if list(self.node_src.selected.indices) != want:
            self.node_src.selected.indices = want


def _short(label: str, n: int = 18) -> str:
    return label if len(label) <= n else label[: n - 1] + "…"


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
        what = {"full": "every layer recomputed from its input", "dots": "matmul outputs saved, the rest recomputed",
                "regather": "weights gathered again"}.get(remat[1], remat[1])
        warn += (f"<div style='color:{REMAT}'>{esc(remat[0])} → recompute:{esc(remat[1])}: {esc(what)} "
                 "in the backward pass</div>")
    return (f"<div style='font:12px sans-serif;max-width:340px'><b>{esc(info.label)}</b> · size {info.size} · "
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
        self.pin_btn = button("partex-pin", "Pin", button_type="primary", sizing_mode="stretch_width")
        self.forbid_btn = button("partex-forbid", "Forbid", button_type="warning", sizing_mode="stretch_width")
        self.unpin_btn = button("partex-unpin", "Release", button_type="default", sizing_mode="stretch_width",
                                description="Unpin, or allow again, the group on the axis")
        self.pin_btn.on_click(lambda e: self._decide(s.pin))
        self.forbid_btn.on_click(lambda e: self._decide(s.forbid))
        self.unpin_btn.on_click(lambda e: self._decide(s.unpin))
        self.group.param.watch(self._on_group, ["value"])
        self.detail = html(sizing_mode="stretch_width", css_classes=["detail-scroll"], min_height=200,
                           name="decision-detail")
        self.chips = html(sizing_mode="stretch_width", margin=(0, 10))
        s.param.watch(self._options, ["infos", "config"])
        s.param.watch(self._render, ["selected_group", "best", "pins", "forbidden", "infos"])
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
        with self.state.timed():
            fn(self.group.value, self.axis.value)

    def _options(self, *_):
        s = self.state
        ws = s.workspace
        if ws is None:
            return
        an = ws.an
        self.group.options = {an.groups[g].label: g for g in s.infos}
        axes = list(ws.config.mesh.axes)
        self.axis.options = axes
        if self.axis.value not in axes:
            self.axis.value = axes[-1] if axes else None
        if s.selected_group in s.infos:
            self.group.value = s.selected_group

    def _on_group(self, event):
        if event.new is not None and self.state.selected_group != event.new:
            self.state.selected_group = event.new

    def _render(self, *_):
        s = self.state
        ws = s.workspace
        if ws is None or not s.infos:
            self.detail.object = "<div class='muted'>Loading the model…</div>"
            return
        an = ws.an
        label = lambda d: an.decision_label(d, "→")  # noqa: E731
        chips = "".join(
            f"<span class='chip user' title='{esc(f['kind'])} at {esc(f['source'])}'>yours: "
            f"{esc(f['group'])}→{esc(f['axis'] or 'unsharded')}</span>" for f in ws.session.fixed)
        chips += "".join(f"<span class='chip pin'>pinned {esc(label(d))}</span>" for d in s.pins)
        chips += "".join(f"<span class='chip forbid'>forbidden {esc(label(d))}</span>" for d in s.forbidden)
        held_pins, held_forbidden = s.held
        chips += "".join(f"<span class='chip held' title='does not apply on this mesh; it comes back on a mesh "
                         f"where it does'>set aside: {how} {esc(label(d))}</span>"
                         for how, items in (("pin", held_pins), ("forbid", held_forbidden)) for d in items)
        self.chips.object = f"<div class='chips'>{chips or '<span class=muted>No pins: the search decides everything.</span>'}</div>"
        g = s.selected_group
        if g is None or g not in s.infos:
            conflicts = "".join(_conflict_html(c) for info in s.infos.values() for c in info.conflicts)
            self.detail.object = (
                "<div class='muted'>Click a node in the graph (or choose a group above) to see its tensors, "
                "the source lines that make them and its conflicts.</div>" + conflicts)
            return
        if self.group.value != g:
            self.group.value = g
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
        co = ", ".join(f"{esc(an.groups[o].label)} <span class='muted'>{fmt_bytes(n)}</span>" for n, o in cooccur[:6])
        plan = ", ".join(esc(a) for a in axes) or "unsharded"
        self.detail.object = (
            f"<div class='detail'><h3>{esc(info.label)}</h3>"
            f"<div class='kv'><span>size {info.size}</span><span>{info.layers} named dim(s)</span>"
            f"<span>{fmt_bytes(info.bytes)} touched</span><span>plan: <b>{plan}</b></span></div>"
            + "".join(_conflict_html(c) for c in info.conflicts)
            + f"<h4>Input tensors (pytree path, shape, dim)</h4><table class='tbl'>{rows}</table>{more}"
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
