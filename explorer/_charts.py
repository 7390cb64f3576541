"""Charts: the headline figures, per-device memory bars against the budget, and the
search's statistics (best step time over simulations, visits and value per root action)."""

from __future__ import annotations

import math
from typing import Any

import panel as pn
import param
from bokeh.models import (
    ColumnDataSource, FactorRange, FixedTicker, HoverTool, LinearColorMapper, NumeralTickFormatter, Range1d, Span,
    Title,
)
from bokeh.plotting import figure

from ._format import esc, fmt_bytes, fmt_pct, fmt_time, fmt_versus, nice_ticks
from ._engine import plan_rows
from ._widgets import bokeh_update, html, on_change

MEMORY_PARTS = ("parameters", "optimizer", "activations", "temporaries")
MEMORY_COLORS = ("#3b82f6", "#8b5cf6", "#14b8a6", "#f59e0b")
OVER = "#dc2626"
_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))


def _unit(n: float) -> tuple[str, float]:
    for name, size in _UNITS:
        if n >= size:
            return name, size
    return "B", 1


def _fig(**kw):
    p = figure(toolbar_location=None, tools="", sizing_mode="stretch_width", min_border_left=8,
               outline_line_color=None, background_fill_color=None, border_fill_color=None, **kw)
    p.axis.axis_line_color = "#cbd5e1"
    p.axis.major_tick_line_color = "#cbd5e1"
    p.axis.minor_tick_line_color = None
    p.axis.major_label_text_color = "#334155"
    p.axis.major_label_text_font_size = "12px"
    p.axis.axis_label_text_font_size = "12px"
    p.axis.axis_label_text_font_style = "normal"
    p.axis.axis_label_text_color = "#475569"
    p.grid.grid_line_color = "#e2e8f0"
    if isinstance(p.title, Title):  # figure() makes one (its type allows a str or None too)
        p.title.text_font_size = "13px"
        p.title.text_color = "#0f172a"
    return p


class KpiView(pn.viewable.Viewer):
    """The headline: best predicted step time, MFU, memory against the budget, progress."""

    state = param.Parameter()

    def __init__(self, **params):
        super().__init__(**params)
        self._pane = html(sizing_mode="stretch_width", margin=(0, 0, 6, 0), name="kpis")
        on_change(self.state, self.state.clock, "the headline", self._render,
                  ["best", "stats", "running", "search_queue", "baselines", "phase", "workspace"])
        self._render()

    # an Html viewer: Panel renders what __panel__ returns through pn.panel(), which unwraps viewers
    def __panel__(self):  # pyright: ignore[reportIncompatibleMethodOverride]
        return self._pane

    @bokeh_update
    def _render(self, *_):
        s = self.state
        best = s.best
        ws = s.workspace
        stats = s.stats
        sims = stats.simulations
        rate = stats.sims_per_s
        if best is not None:
            r = best.report
            fitting = [(b.report.step_time, name) for name, b in s.baselines.items() if b.report.fits]
            vs = fmt_versus(r.step_time, *min(fitting)) if fitting else "no baseline fits the budget"
            step = (fmt_time(r.step_time), vs)
            mfu = (fmt_pct(r.mfu), "of peak (predicted)")
            mem = (fmt_bytes(r.memory.peak), f"of {fmt_bytes(r.budget)} per device")
            mem_cls = "" if r.fits else " bad"
            if ws is not None and not ws.config.hw.overlap:
                comm = (fmt_time(r.comm_time), f"{ws.config.hw.name}: no overlap")
            else:
                comm = (fmt_time(r.exposed_time), f"{fmt_time(r.hidden_time)} more hidden")
        else:
            step = ("—", "no plan that fits yet")
            mfu = ("—", "of peak (predicted)")
            budget = fmt_bytes(ws.config.hw.budget) if ws else "—"
            mem = ("—", f"of {budget} per device")
            mem_cls = ""
            comm = ("—", "the step waits for it")
        queued = bool(s.search_queue)  # Run, or a Step, waiting for one of the server's search slots
        state_txt = {"loading": "loading", "failed": "no model"}.get(
            s.phase, "queued" if queued else "running" if s.running else "paused")
        # on a large model the first simulation (its local search) takes seconds: say what it does
        sims_sub = (s.search_queue.removeprefix("queued: ") if queued else
                    "the first under way: a local search from the best plan so far" if s.running and sims == 0
                    else f"simulations · {rate:,.0f}/s")
        badge = f"<span class='badge {state_txt}'>{state_txt}</span>"
        model = esc(ws.choice.title) if ws else "—"
        where = esc(f"{ws.config.mesh.text()} · {ws.config.hw.name}") if ws else ""
        self._pane.object = (
            "<div class='kpis six'>"
            f"<div class='kpi wide'><div class='k-label'>Model</div><div class='k-value small'>{model}</div>"
            f"<div class='k-sub'>{where}</div></div>"
            f"<div class='kpi'><div class='k-label'>Best step time</div><div class='k-value'>{step[0]}</div>"
            # the comparison wraps: cut, "9.7× faster than the b…" loses what it is compared with
            f"<div class='k-sub' style='white-space:normal;overflow:visible' title='{esc(step[1])}'>"
            f"{esc(step[1])}</div></div>"
            f"<div class='kpi'><div class='k-label'>MFU</div><div class='k-value'>{mfu[0]}</div>"
            f"<div class='k-sub'>{esc(mfu[1])}</div></div>"
            "<div class='kpi' title='communication the step waits for; the rest runs under compute, as XLA "
            "overlaps collectives on TPU and GPU (the hardware preset says whether)'>"
            f"<div class='k-label'>Comm. exposed</div><div class='k-value'>{comm[0]}</div>"
            f"<div class='k-sub'>{esc(comm[1])}</div></div>"
            f"<div class='kpi{mem_cls}'><div class='k-label'>Peak memory</div><div class='k-value'>{mem[0]}</div>"
            f"<div class='k-sub'>{esc(mem[1])}</div></div>"
            f"<div class='kpi'><div class='k-label'>Search {badge}</div><div class='k-value'>{sims:,}</div>"
            f"<div class='k-sub' style='white-space:normal;overflow:visible'>{esc(sims_sub)}</div></div>"
            "</div>")


def memory_columns() -> dict:
    """The empty columns of a memory_figure's source."""
    return {k: [] for k in (*MEMORY_PARTS, *(f"{k}_txt" for k in MEMORY_PARTS), "row", "total", "outline",
                            "note", "note_over", "peak_txt", "host_txt")}


def host_text(memory) -> str:
    """A plan's host memory beside its device bar (offloaded values are not on the device):
    '' when it holds none."""
    return f"  + {fmt_bytes(memory.host)} on the host" if memory.host else ""


def memory_figure(name: str, src: ColumnDataSource, height: int, bar: float) -> tuple:
    """Per-device memory as stacked bars, one row per plan (``memory_columns``), each with
    its peak written after it (in red when over) and an outline when over the budget; and
    the budget's dashed line (a Span, placed by the caller). Returns (figure, span)."""
    p = _fig(name=name, y_range=FactorRange(), x_range=Range1d(start=0, end=1), height=height,
             x_axis_label="per-device memory")
    bars = p.hbar_stack(list(MEMORY_PARTS), y="row", height=bar, color=list(MEMORY_COLORS), source=src,
                        legend_label=list(MEMORY_PARTS), line_color="white", line_width=0.5)
    p.hbar(y="row", left=0, right="total", height=bar, source=src, fill_color=None, line_color="outline",
           line_width=2.5)
    # two text glyphs of one colour each, not one with a colour per row: Bokeh 3.8's text
    # renders a per-row colour array before it re-lays out its labels, so a source that
    # shrinks reads past the colours' end (RangeError from a DataView, once per redraw)
    # The labels are drawn over the budget's line (the overlay level, above annotations),
    # each on a white box: a label the line crosses stays legible, the line showing above and
    # below it; the bars stay under the line
    # (a dict: bokeh's stubs for text() list no background visuals, which it takes)
    box: dict[str, Any] = dict(background_fill_color="#ffffff", background_fill_alpha=0.92, padding=2)
    for column, colour in (("note", "#334155"), ("note_over", OVER)):
        p.text(x="total", y="row", text=column, source=src, x_offset=6, text_baseline="middle",
               text_font_size="12px", text_color=colour, level="overlay", **box)
    budget = Span(location=0, dimension="height", line_color=OVER, line_dash="dashed", line_width=2)
    p.add_layout(budget)
    p.add_tools(HoverTool(renderers=[*bars], tooltips=[("plan", "@row"), *((k, f"@{k}_txt") for k in MEMORY_PARTS),
                                                    ("device peak", "@peak_txt"), ("host", "@host_txt")]))
    p.legend.orientation = "horizontal"
    p.legend.location = "top_left"
    p.legend.label_text_font_size = "11px"
    p.legend.background_fill_alpha = 0.85
    p.legend.border_line_color = None
    p.add_layout(p.legend[0], "above")
    p.ygrid.visible = False
    return p, budget


class MemoryView(pn.viewable.Viewer):
    """Stacked per-device memory of the best plan, an uploaded plan and the baselines, with
    the budget line; a bar over the budget is outlined and labelled in red."""

    state = param.Parameter()

    def __init__(self, **params):
        super().__init__(**params)
        self.src = ColumnDataSource(data=self._empty())
        self.fig, self.budget = memory_figure("partex-memory", self.src, height=300, bar=0.62)
        p = self.fig
        self.caption = html(sizing_mode="stretch_width", margin=(0, 10))
        on_change(self.state, self.state.clock, "the memory bars", self._render, ["best", "baselines", "uploaded", "config"])
        self._render()
        self._panel = pn.Column(pn.pane.Bokeh(p, sizing_mode="stretch_width"), self.caption,
                                sizing_mode="stretch_width")

    def __panel__(self):
        return self._panel

    @staticmethod
    def _empty() -> dict:
        return memory_columns()

    @bokeh_update
    def _render(self, *_):
        s = self.state
        rows = plan_rows(s)
        if not rows or s.config is None:
            self.src.data = self._empty()
            return
        budget = s.config.hw.budget
        peak_max = max([r.report.memory.peak for _, r in rows] + [budget if budget < 1e15 else 0])
        unit, scale = _unit(peak_max)
        d = self._empty()
        for name, r in rows:
            m = r.report.memory
            parts = [float(m.breakdown.get(k, 0.0)) for k in MEMORY_PARTS]
            for k, v in zip(MEMORY_PARTS, parts):
                d[k].append(v / scale)
            host_over = m.host > s.config.hw.host_memory_bytes
            fits = m.peak <= budget and not host_over
            d["row"].append(name)
            d["total"].append(m.peak / scale)
            d["outline"].append(None if fits else OVER)
            saved = f"  ({fmt_bytes(r.saving_all.memory.peak)} without {r.saving_what})" if r.recomputes else ""
            note = (fmt_bytes(m.peak) + host_text(m) + saved
                    + ("  over the host's memory" if host_over else "" if m.peak <= budget else "  over budget"))
            d["note"].append(note if fits else "")
            d["note_over"].append("" if fits else note)
            for k, v in zip(MEMORY_PARTS, parts):
                d[f"{k}_txt"].append(fmt_bytes(v))
            d["peak_txt"].append(fmt_bytes(m.peak))
            d["host_txt"].append(fmt_bytes(m.host))
        rows_rev = list(reversed(d["row"]))
        self.fig.y_range.factors = rows_rev
        self.src.data = d
        self.budget.location = budget / scale
        self.budget.visible = budget / scale <= peak_max / scale * 1.6
        self.fig.x_range.end = max(peak_max, budget if self.budget.visible else 0) / scale * 1.5
        self.fig.x_range.start = 0
        self.fig.xaxis.axis_label = f"per-device memory ({unit})"
        self.fig.height = 110 + 34 * len(rows)
        over = [n for n, r in rows if r.report.memory.peak > budget]
        host_over = [n for n, r in rows if r.report.memory.host > s.config.hw.host_memory_bytes]
        saved = [f"{esc(n)}: {fmt_bytes(r.saving_all.memory.peak - r.report.memory.peak)} for "
                 f"{fmt_time(r.report.step_time - r.saving_all.step_time)} more step time"
                 for n, r in rows if r.recomputes]
        self.caption.object = (
            f"<div class='caption'>Dashed red line: the budget, {fmt_bytes(budget)} per device. "
            + (f"<span class='bad'>Over budget: {esc(', '.join(over))}.</span>" if over
               else "" if host_over else "Every plan fits.")
            + (f" <span class='bad'>Over the host memory ({fmt_bytes(s.config.hw.host_memory_bytes)} per device): "
               f"{esc(', '.join(host_over))}.</span>" if host_over else "")
            + (f" What recompute and host memory save against the same sharding keeping every residual and its "
               f"state on the device: {'; '.join(saved)}."
               if saved else "")
            + (" Bars are device memory; values offloaded to host memory are written after them, apart."
               if any(r.report.memory.host for _, r in rows) else "")
            + "</div>")


class SearchView(pn.viewable.Viewer):
    """The search's statistics: best predicted step time against simulations, visits and
    mean value per root action, and the tree's size."""

    state = param.Parameter()

    def __init__(self, **params):
        super().__init__(**params)
        self.hist = ColumnDataSource(data=dict(sim=[], ms=[], secs=[]))
        self.acts = ColumnDataSource(data=dict(action=[], visits=[], value=[], value_txt=[]))
        # ranges set by _render: an automatic range over no data yet makes Bokeh warn
        # ("could not set initial ranges") on every page that opens before a search
        # titles in HTML above the charts: they wrap where a chart is narrow, where a Bokeh
        # title runs past the frame's edge and is cut
        h = _fig(name="partex-history", height=226, x_axis_label="simulations", y_axis_label="ms",
                 x_range=Range1d(start=0, end=1), y_range=Range1d(start=0, end=1))
        h.step("sim", "ms", source=self.hist, mode="after", line_width=2.5, color="#2563eb")
        h.scatter("sim", "ms", source=self.hist, size=7, color="#2563eb")
        # the plan the search starts from, scored before its first simulation (the warm start's
        # hand plans, a plan carried from elsewhere): named where it is the best so far
        self.start = ColumnDataSource(data=dict(sim=[], ms=[], text=[]))
        # on a white box over the line it starts (a label the step line crosses stays legible)
        label_box: dict[str, Any] = dict(background_fill_color="#ffffff", background_fill_alpha=0.92, padding=2)
        h.text("sim", "ms", text="text", source=self.start, x_offset=10, y_offset=4, text_baseline="top",
               text_font_size="12px", text_color="#1e293b", level="overlay", name="partex-history-start", **label_box)
        self.hover = HoverTool(tooltips=self._tips(3))
        h.add_tools(self.hover)
        # ticks chosen here for the range shown, written with as many decimals as tell them
        # apart (a fixed format repeats labels over a narrow range: 0.179, 0.179, 0.178)
        self.y_ticker, self.y_format = FixedTicker(ticks=[0, 0.5, 1]), NumeralTickFormatter(format="0.0")
        h.yaxis.ticker, h.yaxis.formatter = self.y_ticker, self.y_format
        self.hist_fig = h
        self.acts_range = FactorRange()
        a = _fig(name="partex-root-actions", height=226, y_range=self.acts_range, x_axis_label="visits",
                 x_range=Range1d(start=0, end=1))
        self.cmap = LinearColorMapper(palette=_BLUES, low=0, high=1)
        a.hbar(y="action", right="visits", height=0.7, source=self.acts,
               fill_color={"field": "value", "transform": self.cmap}, line_color=None)
        a.add_tools(HoverTool(tooltips=[("action", "@action"), ("visits", "@visits"), ("mean value", "@value_txt")]))
        a.ygrid.visible = False
        a.yaxis.major_label_text_font_size = "11px"
        self.acts_fig = a
        self.tiles = html(sizing_mode="stretch_width", name="search-stats")
        on_change(self.state, self.state.clock, "the search chart", self._render, ["stats"])
        self._render()
        self._panel = pn.Row(
            pn.Column(chart_title("partex-history-title", "Best predicted step time"),
                      pn.pane.Bokeh(h, sizing_mode="stretch_width"), sizing_mode="stretch_width"),
            pn.Column(chart_title("partex-root-actions-title", "Root actions", "colour: mean value"),
                      pn.pane.Bokeh(a, sizing_mode="stretch_width"), sizing_mode="stretch_width"),
            pn.Column(self.tiles, width=210),
            sizing_mode="stretch_width",
        )

    def __panel__(self):
        return self._panel

    @staticmethod
    def _tips(decimals: int) -> list:
        return [("simulation", "@sim"), ("step time", f"@ms{{0.{'0' * decimals}}} ms"), ("after", "@secs{0.00} s")]

    def _y_axis(self, lo: float, hi: float) -> None:
        ticks, decimals = nice_ticks(lo, hi)
        self.y_ticker.ticks = ticks
        self.y_format.format = "0." + "0" * decimals if decimals else "0"
        self.hover.tooltips = self._tips(decimals + 1)

    @bokeh_update
    def _render(self, *_):
        st = self.state.stats
        hist = st.best_history
        sims = st.simulations
        if hist:
            xs = [h[0] for h in hist] + [max(sims, hist[-1][0])]
            ys = [h[2] * 1e3 for h in hist] + [hist[-1][2] * 1e3]
            secs = [h[1] for h in hist] + [hist[-1][1]]
            self.hist.data = dict(sim=xs, ms=ys, secs=secs)
            self.start.data = dict(sim=xs[:1], ms=ys[:1], text=["warm start"]) if xs[0] == 0 else \
                dict(sim=[], ms=[], text=[])
            lo, hi = min(ys), max(ys)
            pad = (hi - lo) * 0.08 or hi * 0.05 or 1.0
            end = max(xs[-1], 1) * 1.03
            # a little room left of 0: the point the search starts from shows whole there
            self.hist_fig.x_range.update(start=-0.02 * end, end=end)
            self.hist_fig.y_range.update(start=max(lo - pad, 0), end=hi + pad)
            self._y_axis(max(lo - pad, 0), hi + pad)
        else:
            self.hist.data = dict(sim=[], ms=[], secs=[])
            self.start.data = dict(sim=[], ms=[], text=[])
            self.hist_fig.x_range.update(start=0, end=1)
            self.hist_fig.y_range.update(start=0, end=1)
            self._y_axis(0, 1)
        acts = sorted(st.root_actions, key=lambda r: -r.visits)[:12]
        values = [float(r.value) for r in acts]
        if values:
            self.cmap.low, self.cmap.high = min(values), max(max(values), min(values) + 1e-9)
        self.acts_range.factors = [r.action for r in reversed(acts)]
        self.acts.data = dict(action=[r.action for r in acts], visits=[r.visits for r in acts],
                              value=values, value_txt=[f"{v:.3f}" for v in values])
        self.acts_fig.x_range.update(start=0, end=max([r.visits for r in acts], default=1) * 1.05)
        mem = st.smallest_memory
        tiles = [("simulations", f"{sims:,}"), ("simulations / s", f"{st.sims_per_s:,.0f}"),
                 ("tree nodes", f"{st.nodes:,}"), ("tree depth", f"{st.depth}"),
                 ("plans evaluated", f"{st.evaluations:,}"),
                 ("smallest peak seen", fmt_bytes(mem) if 0 < mem < math.inf else "—")]
        self.tiles.object = "<div class='tiles'>" + "".join(
            f"<div class='tile'><div class='t-label'>{k}</div><div class='t-value'>{v}</div></div>" for k, v in tiles
        ) + "</div>"


def chart_title(name: str, title: str, note: str = ""):
    """A chart's title as HTML (it wraps where the chart is narrow), with a note beside it."""
    extra = f" <span class='muted small'>{esc(note)}</span>" if note else ""
    return html(f"<div class='chart-title' style='font-size:13px;font-weight:600;color:#0f172a;"
                f"overflow-wrap:anywhere'>{esc(title)}{extra}</div>", name=name, sizing_mode="stretch_width",
                margin=(4, 10, 0, 10))


_BLUES = ["#dbeafe", "#bfdbfe", "#93c5fd", "#60a5fa", "#3b82f6", "#2563eb", "#1d4ed8", "#1e40af"]
