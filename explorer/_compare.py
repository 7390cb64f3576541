"""Compare: two plans side by side. Pick plan A and plan B among those the page holds (the
search's best, an uploaded plan, the baselines); the view shows what B costs against A
(step time, peak memory, MFU, the budget), the decisions that differ, both plans' memory
stacked by kind against the budget, and where the step time goes: compute, communication
and each kind of collective on each set of mesh axes.

Everything comes from the two PlanSummaries (their detailed CostReports): nothing is
evaluated, so the view re-renders in a few milliseconds whenever the search finds a new
best. ``compare_plans`` makes the comparison and knows nothing of Panel.
"""

from __future__ import annotations

import collections
import math
import operator

import panel as pn
import param
from bokeh.models import ColumnDataSource

from partex import Decision, Memory, Recompute, Resolve

from ._charts import MEMORY_PARTS, OVER, _unit, host_text, memory_columns, memory_figure, plan_rows
from ._engine import PlanSummary
from ._format import esc, fmt_bytes, fmt_pct, fmt_time
from ._tables import Table
from ._widgets import bokeh_update, button, html, on_change, on_click, select

# headline figures: where each is read in a CostReport
FIGURES = {
    "step_time": operator.attrgetter("step_time"),
    "compute_time": operator.attrgetter("compute_time"),
    "comm_time": operator.attrgetter("comm_time"),
    "exposed_time": operator.attrgetter("exposed_time"),
    "peak": operator.attrgetter("memory.peak"),
    "mfu": operator.attrgetter("mfu"),
}
DEFAULT_B = ("uploaded", "zero3")  # plan B's first choices, when the page holds them
MINUS = "\u2212"


# --------------------------------------------------------------------------- the comparison

def compare_plans(a: PlanSummary, b: PlanSummary, an) -> dict:
    """Plan B against plan A, from their reports.

    Returns ``a`` and ``b`` (the names); per figure of ``FIGURES`` ``{a, b, delta, ratio}``
    (delta = b - a, ratio = b / a, None where a is 0); ``memory``: the same per part of
    ``MEMORY_PARTS``; ``fits`` and ``budget``: ``{a, b}``; ``decisions``: one row per decision
    group (or layer stack, for recompute) that either plan decides, those that differ first;
    ``collectives``: per (kind, mesh axes) the bytes per step and the time of each plan,
    the largest change in time first.
    """
    ra, rb = a.report, b.report
    out: dict = {"a": a.name, "b": b.name}
    for key, get in FIGURES.items():
        out[key] = _pair(get(ra), get(rb))
    out["memory"] = {k: _pair(ra.memory.breakdown.get(k, 0.0), rb.memory.breakdown.get(k, 0.0))
                     for k in MEMORY_PARTS}
    out["fits"] = {"a": ra.fits, "b": rb.fits}
    out["budget"] = {"a": ra.budget, "b": rb.budget}
    out["decisions"] = _decision_rows(a.decisions, b.decisions, an)
    out["collectives"] = _collective_rows(ra, rb)
    return out


def _pair(a: float, b: float) -> dict:
    a, b = float(a), float(b)
    return {"a": a, "b": b, "delta": b - a, "ratio": b / a if a else None}


# what a plan that takes no decision on a row does: shards nothing, saves a stack's
# residuals, keeps a state set in device memory
_DEFAULT = {"group": "unsharded", "unit": "kept", "state": "in device memory"}


def _subject(decision: Decision) -> tuple[str, int]:
    """What a decision decides on: a recompute decision's id is a layer stack's (a unit), a
    memory decision's a state set's, every other's a decision group's; the numberings overlap."""
    return (decision.ON, decision.id)


def _decision_rows(a_decisions, b_decisions, an) -> list[dict]:
    """Per group or layer stack either plan decides: its label, each plan's choices for it
    (mesh axes, ``recompute:KIND``, ``resolve:...``, in plan order) and their labels, and
    whether they are the same. The order of a group's axes is kept: (data, model) and
    (model, data) lay the devices out differently."""
    by_a: dict[tuple, list] = collections.defaultdict(list)
    by_b: dict[tuple, list] = collections.defaultdict(list)
    for decisions, into in ((a_decisions, by_a), (b_decisions, by_b)):
        for d in decisions:
            into[_subject(d)].append(d)
    rows = []
    for kind, i in dict.fromkeys([*by_a, *by_b]):  # A's order, then what only B decides
        da, db = by_a.get((kind, i), []), by_b.get((kind, i), [])
        rows.append({
            "kind": kind, "id": i, "label": an.subject_label(da[0] if da else db[0]),
            "a": tuple(da), "b": tuple(db),
            "a_labels": tuple(an.decision_label(d, "→") for d in da),
            "b_labels": tuple(an.decision_label(d, "→") for d in db),
            "same": da == db,
        })
    return sorted(rows, key=lambda r: r["same"])  # stable: the differing first, in plan order


def _collective_totals(report) -> dict[tuple, list[float]]:
    """(kind, axes) -> [bytes per step, seconds per step]."""
    out: dict[tuple, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for c in report.collectives:
        t = out[(c.kind, tuple(c.axes))]
        t[0] += c.bytes * c.count
        t[1] += c.time
    return out


def _collective_rows(ra, rb) -> list[dict]:
    ta, tb = _collective_totals(ra), _collective_totals(rb)
    rows = []
    for kind, axes in dict.fromkeys([*ta, *tb]):
        (ab, at), (bb, bt) = ta.get((kind, axes), (0.0, 0.0)), tb.get((kind, axes), (0.0, 0.0))
        rows.append({"kind": kind, "axes": axes, "bytes": _pair(ab, bb), "time": _pair(at, bt)})
    return sorted(rows, key=lambda r: (-abs(r["time"]["delta"]), -abs(r["bytes"]["delta"]), r["kind"], r["axes"]))


# --------------------------------------------------------------------------- formatting

def _same(p: dict) -> bool:
    """Equal but for rounding: two decision orders may sum the same costs differently."""
    return math.isclose(p["a"], p["b"], rel_tol=1e-9, abs_tol=0.0)


def _signed(delta: float, fmt) -> str:
    return ("+" if delta > 0 else MINUS) + fmt(abs(delta))


def _tone(p: dict, lower_is_better: bool = True) -> str:
    """The CSS class of a change: ok where it improves, bad where it worsens."""
    if _same(p):
        return "muted"
    return "ok" if (p["delta"] < 0) == lower_is_better else "bad"


def _relative(p: dict, lower_is_better: bool = True) -> str:
    """'+12%' coloured: B against A."""
    if _same(p):
        return "<span class='muted'>same</span>"
    if not p["a"]:
        text = "new"  # nothing in A to compare with
    else:
        pct = p["delta"] / abs(p["a"]) * 100
        text = _signed(pct, lambda x: f"{x:.0f}%" if x >= 100 else f"{x:.1f}%" if x >= 0.1 else f"{x:.2g}%")
    return f"<span class='{_tone(p, lower_is_better)}'>{text}</span>"


def _delta(p: dict, fmt) -> str:
    """'+163.0 µs' coloured (more time or bytes is worse)."""
    if _same(p):
        return "<span class='muted'>=</span>"
    return f"<span class='{_tone(p)}'>{_signed(p['delta'], fmt)}</span>"


def _cells(p: dict, fmt) -> tuple[str, str, str]:
    """A and B and the change; nothing (a collective one plan does not have, no
    communication at all) is a dash, not '0 B'."""
    a, b = (fmt(p[side]) if p[side] else "—" for side in ("a", "b"))
    return a, b, _delta(p, fmt)


def _names(a: str, b: str) -> tuple[str, str]:
    """The two plans' names as columns and bars show them, told apart when a plan is
    compared with itself."""
    return (a, b) if a != b else (f"{a} (A)", f"{b} (B)")


def _decision_columns(a: str, b: str) -> list[tuple[str, str]]:
    return [("group", "group or layer stack"), ("a", a), ("b", b)]


def _collective_columns(a: str, b: str) -> list[tuple[str, str]]:
    return [("what", "step time / collective"), ("axes", "axes"), ("a_time", f"{a} time"), ("b_time", f"{b} time"),
            ("d_time", "Δ time"), ("a_bytes", f"{a} bytes / step"), ("b_bytes", f"{b} bytes / step"),
            ("d_bytes", "Δ bytes")]


def _chips(summary: PlanSummary, row: dict, side: str) -> str:
    """A plan's choices for one row as the plan view's chips: pinned, recompute, resolution."""
    chips = []
    for d in row[side]:
        cls = "pin" if d in summary.pinned else "remat" if isinstance(d, (Recompute, Memory)) \
            else "resolve" if isinstance(d, Resolve) else ""
        chips.append(f"<span class='chip {cls}'>{'pinned ' if d in summary.pinned else ''}{esc(d.slot)}</span>")
    if not chips:
        return f"<span class='muted'>{_DEFAULT[row['kind']]}</span>"
    return f"<div class='chips'>{''.join(chips)}</div>"


# --------------------------------------------------------------------------- the view

class CompareView(pn.viewable.Viewer):
    """Two plans side by side: the headline change, the decisions that differ, memory bars
    and the step time's parts with each collective."""

    state = param.Parameter()

    def __init__(self, **params):
        super().__init__(**params)
        s = self.state
        self.a = select("partex-compare-a", "Plan A", options=[], width=220)
        self.b = select("partex-compare-b", "Plan B", options=[], width=220)
        self.swap = button("partex-compare-swap", "⇄ Swap", width=90, margin=(24, 10, 5, 10),
                           description="Compare the other way round")
        # a plan the user picked stays picked; an unpicked one follows the defaults (A moves
        # to the search's plan when it finds one)
        self._picked = {"a": False, "b": False}
        self._quiet = False  # set while the view sets the selects itself
        self._shown: tuple | None = None  # what the last render drew: the same again is skipped
        self.head = html(name="partex-compare-head", margin=(0, 0, 6, 0))
        self.decisions = Table("partex-compare-decisions", _decision_columns("A", "B"), height=300,
                               html_fields=("group", "a", "b"), empty="the two plans make the same decisions")
        self.same = html(name="partex-compare-same", margin=(2, 10))
        self.colls = Table("partex-compare-collectives", _collective_columns("A", "B"), height=320,
                           html_fields=("what", "d_time", "d_bytes"), empty="choose two plans")
        self.src = ColumnDataSource(data=self._empty())
        self.fig, self.budget = memory_figure("partex-compare-memory", self.src, height=190, bar=0.6)
        self.caption = html(margin=(0, 10))
        on_change(self.a, s.clock, "Compare's plan A", self._on_pick, ["value"])
        on_change(self.b, s.clock, "Compare's plan B", self._on_pick, ["value"])
        on_click(self.swap, s.clock, "Compare's swap button", lambda: self._on_swap(None))
        on_change(s, s.clock, "the Compare card", self._refresh, ["best", "baselines", "uploaded", "config"])
        self._refresh()
        self._panel = pn.Column(
            pn.Row(self.a, self.swap, self.b, sizing_mode="stretch_width"),
            self.head,
            pn.Row(pn.Column(html("<h4 class='sub'>Decisions that differ</h4>"), self.decisions.pane, self.same,
                             sizing_mode="stretch_width"),
                   pn.Column(html("<h4 class='sub'>Memory per device</h4>"),
                             pn.pane.Bokeh(self.fig, sizing_mode="stretch_width"), self.caption,
                             sizing_mode="stretch_width"),
                   sizing_mode="stretch_width"),
            html("<h4 class='sub'>Step time and collectives (per step, the largest change first)</h4>"),
            self.colls.pane,
            sizing_mode="stretch_width",
        )

    def __panel__(self):
        return self._panel

    # ------------------------------------------------------------------ choices
    def _on_pick(self, event) -> None:
        if self._quiet:
            return
        self._picked["a" if event.obj is self.a else "b"] = True
        self._render()

    def _on_swap(self, event) -> None:
        self._picked = {"a": True, "b": True}
        self._set(self.b.value, self.a.value)
        self._render()

    def _set(self, a: str | None, b: str | None, options: list[str] | None = None) -> None:
        self._quiet = True
        try:
            for w, v in ((self.a, a), (self.b, b)):
                if options is not None:
                    w.options = options
                w.value = v
        finally:
            self._quiet = False

    def _refresh(self, *_) -> None:
        """Plans came or went: keep both choices valid, and follow the defaults where the
        user has not picked."""
        names = [n for n, _ in plan_rows(self.state)]
        a, b = self.a.value, self.b.value
        if not self._picked["a"] or a not in names:
            self._picked["a"] = False
            a = "search" if "search" in names else next((n for n in names if n != "uploaded"), None)
        if not self._picked["b"] or b not in names:
            self._picked["b"] = False
            others = [n for n in names if n != a]
            b = next((n for n in DEFAULT_B if n in others), others[0] if others else a)
        self._set(a, b, names)
        self._render()

    # ------------------------------------------------------------------ rendering
    def _render(self) -> None:
        s = self.state
        sa, sb = (s.plan_summary(w.value) if w.value else None for w in (self.a, self.b))
        shown = (sa, sb, s.config, s.workspace)
        if self._shown is not None and all(x is y for x, y in zip(shown, self._shown)):
            return  # a new best while the view compares two other plans
        self._shown = shown
        if sa is None or sb is None or s.workspace is None or s.config is None:
            self.head.object = "<div class='muted'>No plans yet: they appear here once the model is analysed.</div>"
            self.decisions.update([])
            self.same.object = ""
            self.colls.update([])
            self._draw_memory(None, None, None)
            return
        cmp = compare_plans(sa, sb, s.workspace.an)
        self.head.object = self._headline(cmp, sa, sb)
        self._render_decisions(cmp, sa, sb)
        self._render_collectives(cmp)
        self._draw_memory(sa, sb, s.config.hw.budget)

    def _headline(self, cmp: dict, sa: PlanSummary, sb: PlanSummary) -> str:
        names = f"<b>{esc(cmp['a'])}</b> → <b>{esc(cmp['b'])}</b>"
        ma, mb = sa.plan.mesh.text(), sb.plan.mesh.text()
        where = f"mesh {esc(ma)}" if ma == mb else f"meshes differ: A on {esc(ma)}, B on {esc(mb)}"
        step, peak, mfu = cmp["step_time"], cmp["peak"], cmp["mfu"]
        if _same(mfu):
            mfu_change = "<span class='muted'>same</span>"
        else:  # MFU is a fraction already: its change in points, not a percentage of it
            points = _signed(mfu["delta"], fmt_pct).replace("%", " pt")
            mfu_change = f"<span class='{_tone(mfu, False)}'>{points}</span>"
        fits = cmp["fits"]
        over = [n for n, ok in ((cmp["a"], fits["a"]), (cmp["b"], fits["b"])) if not ok]
        if not over:
            verdict = "<span class='ok'>both fit</span>"
        elif len(over) == 2 and cmp["a"] != cmp["b"]:
            verdict = "<span class='bad'>both over</span>"
        else:
            verdict = f"<span class='bad'>{esc(over[0])} over</span>"
        hw = self.state.config.hw
        kept = f", {hw.memory_margin:.0%} kept free" if hw.memory_margin else ""
        tiles = [
            (" wide", "B against A", f"<div class='k-value small'>{names}</div>", where),
            ("", "Step time", f"<div class='k-value'>{_relative(step)}</div>",
             f"{fmt_time(step['a'])} → {fmt_time(step['b'])}"),
            ("", "Peak memory", f"<div class='k-value'>{_relative(peak)}</div>",
             f"{fmt_bytes(peak['a'])} → {fmt_bytes(peak['b'])} per device"),
            ("", "MFU", f"<div class='k-value'>{mfu_change}</div>", f"{fmt_pct(mfu['a'])} → {fmt_pct(mfu['b'])}"),
            (" bad" if over else "", "Budget", f"<div class='k-value'>{verdict}</div>",
             f"{fmt_bytes(hw.budget)} per device{kept}"),
        ]
        # its lines wrap (the page's headline cuts them: "2.5 MiB → 1.1 MiB per de…" said too little)
        return "<div class='kpis wrap'>" + "".join(
            f"<div class='kpi{cls}'><div class='k-label'>{label}</div>{value}<div class='k-sub'>{sub}</div></div>"
            for cls, label, value, sub in tiles) + "</div>"

    def _render_decisions(self, cmp: dict, sa: PlanSummary, sb: PlanSummary) -> None:
        an = self.state.workspace.an
        self.decisions.columns = _decision_columns(*_names(cmp["a"], cmp["b"]))
        rows = []
        same = []
        for r in cmp["decisions"]:
            if r["same"]:
                same += r["a_labels"]
                continue
            group = esc(r["label"])
            if r["kind"] == "unit":  # say which layers: "stack0" alone means little
                group += f"<div class='small muted'>{esc(an.units[r['id']].description)}</div>"
            rows.append((group, _chips(sa, r, "a"), _chips(sb, r, "b")))
        self.decisions.update(rows)
        self.same.object = (
            f"<div class='caption'>{len(same) or 'no'} decision{'' if len(same) == 1 else 's'} the same"
            + (": " + ", ".join(esc(label) for label in same) if same else "") + "</div>")

    def _render_collectives(self, cmp: dict) -> None:
        self.colls.columns = _collective_columns(*_names(cmp["a"], cmp["b"]))
        colls = cmp["collectives"]
        total = _pair(sum(r["bytes"]["a"] for r in colls), sum(r["bytes"]["b"] for r in colls))
        no_bytes = ("", "", "")
        rows = [("<b>step time</b>", "", *_cells(cmp["step_time"], fmt_time), *no_bytes),
                ("<b>compute</b>", "", *_cells(cmp["compute_time"], fmt_time), *no_bytes),
                ("<b>communication</b>", "", *_cells(cmp["comm_time"], fmt_time), *_cells(total, fmt_bytes)),
                ("<b>… exposed</b>", "", *_cells(cmp["exposed_time"], fmt_time), *no_bytes)]
        rows += [(esc(r["kind"]), ",".join(r["axes"]), *_cells(r["time"], fmt_time), *_cells(r["bytes"], fmt_bytes))
                 for r in colls]
        self.colls.update(rows)

    # ------------------------------------------------------------------ memory bars
    @staticmethod
    def _empty() -> dict:
        return memory_columns()

    @bokeh_update
    def _draw_memory(self, sa: PlanSummary | None, sb: PlanSummary | None, budget: float | None) -> None:
        if sa is None or sb is None or budget is None:
            self.src.data = self._empty()
            self.fig.y_range.factors = []
            self.caption.object = ""
            return
        names = _names(sa.name, sb.name)
        peak_max = max(sa.report.memory.peak, sb.report.memory.peak)
        # a budget far beyond both plans (the chip's HBM) would squash the bars: leave it out
        shown_budget = budget <= peak_max * 4
        # room for the labels right of the bars; the budget line needs none
        x_end = max(peak_max * 1.45, budget * 1.05) if shown_budget else peak_max * 1.45
        unit, scale = _unit(x_end)
        d = self._empty()
        for name, summary in zip(names, (sa, sb)):
            r = summary.report
            for k in MEMORY_PARTS:
                v = float(r.memory.breakdown.get(k, 0.0))
                d[k].append(v / scale)
                d[f"{k}_txt"].append(fmt_bytes(v))
            note = fmt_bytes(r.memory.peak) + host_text(r.memory) + ("" if r.fits else "  over budget")
            d["row"].append(name)
            d["total"].append(r.memory.peak / scale)
            d["outline"].append(None if r.fits else OVER)
            d["note"].append(note if r.fits else "")
            d["note_over"].append("" if r.fits else note)
            d["peak_txt"].append(fmt_bytes(r.memory.peak))
            d["host_txt"].append(fmt_bytes(r.memory.host))
        self.fig.y_range.factors = list(names[::-1])  # A on top
        self.src.data = d
        self.budget.visible = shown_budget
        self.budget.location = budget / scale
        self.fig.x_range.start = 0
        self.fig.x_range.end = x_end / scale
        self.fig.xaxis.axis_label = f"per-device memory ({unit})"
        note = (f"Dashed red line: the budget, {fmt_bytes(budget)} per device." if shown_budget else
                f"The budget, {fmt_bytes(budget)} per device, is far beyond both plans: not drawn.")
        self.caption.object = f"<div class='caption'>{note}</div>"

