"""Tables: the plan (pytree path -> PartitionSpec, and the collectives it implies), the
baselines side by side with the search's plan, and predicted vs XLA."""

from __future__ import annotations

import math
from typing import Any, Mapping

import panel as pn
import param

from partex import RECOMPUTE_WHAT, Memory, Recompute, Resolve

from ._charts import plan_rows
from ._engine import short_source
from ._format import esc, fmt_bytes, fmt_pct, fmt_spec, fmt_time
from ._widgets import button, html, keyed, on_change, on_click

class Table:
    """An HTML table in a Div: replacing the rows sends one string. (Bokeh 3.9's DataTable
    stops repainting after its first data change, and updating a Tabulator costs ~90 ms of
    the server's loop.) ``max_rows`` rows show; the rest wait, folded, in a ``<details>``
    under the table that opens in the page with no round trip to the server."""

    def __init__(self, name: str, columns: list[tuple[str, str]], height: int | None, html_fields=(),
                 wrap_fields=(), max_rows: int = 400, empty: str = ""):
        self.columns = columns
        self.height = height
        self.html_fields = set(html_fields)
        self.wrap_fields = set(wrap_fields)  # long text that may wrap; other cells keep one line
        self.max_rows = max_rows
        self.empty = empty
        self.view = html(name=name, margin=(0, 6))
        self.update([])

    @property
    def pane(self):
        return self.view

    def _table(self, rows, empty: str = "") -> str:
        head = "".join(f"<th>{esc(title)}</th>" for _, title in self.columns)
        body = []
        for r in rows:
            cells = "".join(f"<td{' class=wrap' if f in self.wrap_fields else ''}>"
                            f"{v if f in self.html_fields else esc(v)}</td>"
                            for (f, _), v in zip(self.columns, r))
            body.append(f"<tr>{cells}</tr>")
        if not rows and empty:
            body.append(f"<tr><td colspan='{len(self.columns)}' class='muted'>{empty}</td></tr>")
        cap = f" style='max-height:{self.height}px'" if self.height else ""  # None: every row in view
        return (f"<div class='grid-wrap'{cap}><table class='grid'>"
                f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>")

    def update(self, rows: list[tuple], empty: str | None = None) -> None:
        """Show ``rows``; none: the line ``empty`` (default: the table's own)."""
        rest = rows[self.max_rows:]
        more = (f"<details class='more-rows'><summary class='muted more' style='cursor:pointer'>"
                f"{len(rest)} more row{'s' if len(rest) > 1 else ''}: show them</summary>"
                f"{self._table(rest)}</details>" if rest else "")
        self.view.object = self._table(rows[: self.max_rows], self.empty if empty is None else empty) + more


class PlanView(pn.viewable.Viewer):
    """The shown plan: its decisions, each input leaf's PartitionSpec, and its collectives."""

    state = param.Parameter()

    def __init__(self, **params):
        super().__init__(**params)
        s = self.state
        self.which = keyed(pn.widgets.RadioButtonGroup)("partex-plan-choice", options=["search"], value="search",
                                                          color="primary", variant="outline")
        on_change(self.which, s.clock, "the Plan card's choice", self._on_which, ["value"])
        self.header = html(sizing_mode="stretch_width", margin=(4, 10))
        self.specs = Table("partex-plan-specs", [("path", "pytree path"), ("shape", "shape"), ("dtype", "dtype"),
                                                 ("spec", "PartitionSpec"), ("local", "per device")], height=360,
                           wrap_fields=("path",),
                           empty="no plan yet")
        self.colls = Table("partex-plan-collectives", [("kind", "collective"), ("axes", "axes"), ("bytes", "bytes"),
                                                       ("count", "count"), ("time", "time"),
                                                       ("exposed", "exposed (the step waits)"), ("cause", "cause"),
                                                       ("source", "source")], height=360, wrap_fields=("source",),
                           empty="no communication: nothing is sharded, or nothing needs gathering")
        on_change(s, s.clock, "the Plan card's choices", self._choices, ["best", "uploaded", "baselines"])
        on_change(s, s.clock, "the Plan card", self._render, ["shown_plan", "best", "uploaded", "baselines"])
        on_change(s, s.clock, "the Plan card's choice shown", lambda e: setattr(self.which, "value", e.new),
                  ["shown_plan"])
        self._choices()
        self._render()
        self._panel = pn.Column(
            pn.Row(self.which, sizing_mode="stretch_width"),
            self.header,
            # one above the other: side by side, a model's long paths and specs cut columns off
            html("<h4 class='sub'>Inputs: pytree path → PartitionSpec</h4>"), self.specs.pane,
            html("<h4 class='sub'>Collectives it implies (per step, slowest first)</h4>"), self.colls.pane,
            sizing_mode="stretch_width",
        )

    def __panel__(self):
        return self._panel

    def _on_which(self, event):
        if event.new and self.state.shown_plan != event.new:
            self.state.shown_plan = event.new

    def _choices(self, *_):
        s = self.state
        opts = ["search"] + (["uploaded"] if s.uploaded is not None else []) + list(s.baselines)
        self.which.options = opts
        if s.shown_plan not in opts:
            s.shown_plan = "search"
        self.which.value = s.shown_plan

    def _render(self, *_):
        s = self.state
        summary = s.plan_summary()
        ws = s.workspace
        if summary is None or ws is None:
            self.header.object = ("<div class='muted'>No plan yet: press <b>Run</b> and the search's best plan "
                                  "appears here (or pick a baseline).</div>")
            self.specs.update([])
            self.colls.update([])
            return
        plan = summary.plan
        r = summary.report
        chips = "".join(
            f"<span class='chip {_chip_class(d)}'"
            f"{_chip_title(ws, d)}>{'pinned ' if d.pinned else ''}{esc(d.group)}→{esc(d.axis)}</span>"
            for d in plan.decisions) or "<span class='muted'>no decisions: everything replicated</span>"
        fits = "fits" if r.fits else "<span class='bad'>over budget</span>"
        if summary.recomputes:
            w = summary.saving_all
            what = summary.saving_what
            fits += (f" · {what} save{'' if ' and ' in what else 's'} {fmt_bytes(w.memory.peak - r.memory.peak)} "
                     "per device for "
                     f"{fmt_time(r.step_time - w.step_time)} more step time")
        self.header.object = (
            f"<div class='plan-head'><div class='chips'>{chips}</div><div class='muted'>mesh {esc(plan.mesh.text())} · "
            f"step {fmt_time(r.step_time)} (compute {fmt_time(r.compute_time)}, communication "
            f"{fmt_time(r.comm_time)}: {comm_split(r, plan.hardware)}) · MFU {fmt_pct(r.mfu)} · "
            f"peak {fmt_bytes(r.memory.peak)} per device, {fits}</div></div>")
        sig = {p: (shape, dtype) for p, shape, dtype in plan.signature.get("inputs", [])}
        mesh = plan.mesh
        rows = []
        host = set(plan.host_inputs)  # kept in host memory by a memory decision
        for path, spec in plan.inputs.items():
            shape, dtype = sig.get(path, ([], ""))
            n = 1
            for e in spec:
                for a in ([] if e is None else [e] if isinstance(e, str) else e):
                    n *= mesh.axis_size(a)
            nbytes = math.prod(shape) * _itemsize(dtype)
            rows.append((path, str(tuple(shape)), dtype, fmt_spec(spec),
                         fmt_bytes(nbytes / n) + (" in host memory" if path in host else "")))
        self.specs.update(rows)
        colls = sorted(r.collectives, key=lambda c: -c.time)
        self.colls.update([(c.kind, ",".join(c.axes), fmt_bytes(c.bytes), c.count, fmt_time(c.time),
                            fmt_time(c.exposed), c.cause,
                            short_source(c.source) if c.source else f"op {c.op}") for c in colls])


def _where(where: str) -> str:
    """A source line as a file's name, its line and function (not its folders); a
    parameter's path as it is."""
    return where.rsplit("/", 1)[-1] if ".py:" in where else where


def unmatched_rows(xla_only: list[dict], predicted_only: list[dict]) -> list[tuple]:
    """Rows of what one side has and the other lacks (``explain``'s collectives that are not
    matched, and its ``unmatched_predicted``), each side's largest first."""
    rows = [("XLA only", r["kind"], fmt_bytes(r["bytes"]), _where(r["where"] or r["op_name"] or r["hlo"]),
             f"no prediction: XLA's {r['hlo']}") for r in sorted(xla_only, key=lambda r: -r["bytes"])]
    rows += [("predicted only", r["kind"], fmt_bytes(r["bytes"]), _where(r["where"] or r.get("param") or "-"),
              "; ".join(x for x in (r.get("decision"), r.get("cause")) if x) or "-") for r in predicted_only]
    return rows


def comm_split(r, hw) -> str:
    """'12 ms exposed, 30 ms hidden under compute' (or why nothing is hidden)."""
    if not hw.overlap:
        return f"all exposed: {esc(hw.name)} runs collectives in line"
    return f"{fmt_time(r.exposed_time)} exposed, {fmt_time(r.hidden_time)} hidden under compute"


def _chip_class(d) -> str:
    if d.pinned:
        return "pin"
    return "remat" if d.kind in (Recompute, Memory) else "resolve" if d.kind is Resolve else ""


def _chip_title(ws, d) -> str:
    """A recompute chip's tooltip: the layer stack it covers; a resolution's: what it keeps;
    a memory decision's: where the state lives."""
    if d.kind is Resolve:
        g = ws.an.group_by_label(d.group)
        c = next((c for c in ws.an.conflicts if g is not None and c.group == g.id), None)
        if c is None:
            return ""
        text = c.options[1] if d.axis == Resolve.PREFIX + "second" else c.options[2]
        return f" title='{esc(text)}'"
    if d.kind is Memory:
        return (f" title='{esc(d.group)} kept in host memory between steps: copied to the device where the step "
                "first reads it, its update copied back'")
    if d.kind is not Recompute:
        return ""
    u = ws.an.unit_by_label(d.group)
    kind = d.axis[len(Recompute.PREFIX):]
    what = RECOMPUTE_WHAT.get(kind, kind)
    return f" title='{esc(u.description)}: {esc(what)}'" if u is not None else ""


def decisions_by_axis(decisions) -> str:
    """'batch, d_model → data · heads, ffn (pinned) → model'."""
    by_axis: dict[str, list[str]] = {}
    for d in decisions:
        by_axis.setdefault(d.axis, []).append(esc(d.group) + (" (pinned)" if d.pinned else ""))
    return " · ".join(f"{', '.join(gs)} → <b>{esc(a)}</b>" for a, gs in by_axis.items())


def _itemsize(dtype: str) -> int:
    import numpy as np

    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        return 4


class BaselinesView(pn.viewable.Viewer):
    """The search's plan next to the hand-written strategies on the same cost model, and,
    once measured on this machine's devices ("Measure"), each plan's measured step time."""

    state = param.Parameter()

    def __init__(self, **params):
        super().__init__(**params)
        s = self.state
        self.table = Table("partex-baselines", [("plan", "plan and its decisions"), ("step", "step"),
                                                ("mfu", "MFU"), ("peak", "peak"), ("measured", "measured")],
                           height=None, html_fields=("plan", "peak", "measured"), wrap_fields=("plan",))
        self.btn = button("partex-measure", "Measure on this machine", min_width=190,
                          description="Run each plan that fits for a few steps on this machine's devices (one "
                                      "process per plan) and show its step time beside the prediction")
        on_click(self.btn, s.clock, "the Measure button", s.measure)
        self.spinner = pn.indicators.LoadingSpinner(value=False, size=22, visible=False, margin=(12, 4))
        self.status = html(sizing_mode="stretch_width", name="partex-measure-status")
        on_change(s, s.clock, "the Baselines card", self._render,
                  ["best", "uploaded", "baselines", "measured", "measure_status", "busy"])
        self._render()
        self._panel = pn.Column(self.table.pane, pn.Row(self.btn, self.spinner, self.status,
                                                        sizing_mode="stretch_width"),
                                sizing_mode="stretch_width")

    def __panel__(self):
        return self._panel

    def _render(self, *_):
        s = self.state
        rows = plan_rows(s)
        out = []
        for name, r in rows:
            rep = r.report
            fits = ("<span class='ok' title='fits the budget'>✓</span>" if rep.fits else
                    "<span class='bad' title='over the budget'>✗</span>")
            decisions = decisions_by_axis(r.plan.decisions) or "nothing sharded"
            label = f"<b>{esc(name)}</b><div class='small muted'>{decisions}</div>"
            out.append((label, fmt_time(rep.step_time), fmt_pct(rep.mfu), f"{fmt_bytes(rep.memory.peak)} {fits}",
                        measured_cell(s.measured.get(name), r.plan)))
        self.table.update(out)
        running = "measure" in s.busy
        self.spinner.value = self.spinner.visible = running
        self.btn.disabled = running or not rows
        self.status.object = (f"<div class='muted' style='padding-top:8px'>{esc(s.measure_status)}</div>"
                              if s.measure_status else
                              "<div class='muted' style='padding-top:8px'>runs each plan that fits for 3 steps on "
                              "this machine's devices (on the CPU, simulated ones)</div>")


def measured_cell(entry, plan) -> str:
    """A plan's measured step time (and predicted / measured), '-' where not measured, and
    'stale' where the plan changed since (the search's best moved on). The plan's digest (its
    JSON, hashed) is taken only for a plan measured: the table is drawn again with each new
    best, on the page's event loop."""
    if entry is None:
        return "<span class='muted'>-</span>"
    was, m = entry
    if was != plan.digest():
        return "<span class='muted' title='the plan changed since it was measured'>stale</span>"
    if m.error is not None:
        return f"<span class='bad' title='{esc(m.error)}'>did not run</span>"
    ratio = (f"<div class='small muted' title='predicted / measured step time'>pred/meas {m.time_ratio:.2f}</div>"
             if m.time_ratio is not None else "")
    return f"{fmt_time(m.step_time)}{ratio}"


class VerifyView(pn.viewable.Viewer):
    """Compile the shown plan with XLA (a subprocess on simulated CPU devices) and put its
    memory and collective bytes beside the prediction."""

    state = param.Parameter()

    def __init__(self, **params):
        super().__init__(**params)
        s = self.state
        self.btn = button("partex-verify", "Verify with XLA", color="primary", min_width=170,
                          description="Compile the plan shown above on simulated CPU devices in a subprocess")
        on_click(self.btn, s.clock, "the Verify button", s.verify)
        self.status = html(sizing_mode="stretch_width", name="verify-status")
        self.spinner = pn.indicators.LoadingSpinner(value=False, size=22, visible=False, margin=(12, 4))
        self.table = Table("partex-verify-table", [("quantity", "quantity"), ("predicted", "predicted"),
                                                   ("xla", "XLA"), ("ratio", "predicted / XLA")], height=260,
                           empty="press Verify: the comparison appears here (a compile takes a few seconds)")
        # which line of the model made each of XLA's collectives, and which decision
        self.cpu_note = html(name="partex-verify-cpu-note", sizing_mode="stretch_width")
        self.explain_head = html(name="partex-explain-head", sizing_mode="stretch_width")
        self.explain = Table("partex-explain-table", [("kind", "XLA collective"), ("bytes", "bytes / step"),
                                                      ("where", "source line or parameter"), ("op", "op"),
                                                      ("decision", "decision (predicted bytes)")],
                             height=300, wrap_fields=("where", "decision"), max_rows=200,
                             empty="press Verify: each of XLA's collectives appears here with its source line")
        # what one side has and the other does not: XLA's collectives no prediction explains,
        # predicted collectives XLA's program does not have
        self.unmatched_head = html(name="partex-explain-unmatched-head", sizing_mode="stretch_width")
        self.unmatched = Table("partex-explain-unmatched", [("side", "found in"), ("kind", "collective"),
                                                            ("bytes", "bytes / step"),
                                                            ("where", "source line or parameter"),
                                                            ("why", "decision or cause")],
                               height=260, wrap_fields=("where", "why"), max_rows=5)
        on_change(s, s.clock, "the Verify card", self._render, ["verify_result", "verify_status", "busy", "shown_plan"])
        self._render()
        self._panel = pn.Column(pn.Row(self.btn, self.spinner, self.status, sizing_mode="stretch_width"),
                                self.table.pane, self.cpu_note, self.explain_head, self.explain.pane,
                                self.unmatched_head, self.unmatched.pane, sizing_mode="stretch_width")

    def __panel__(self):
        return self._panel

    def _render_explain(self, ex: Mapping[str, Any] | None) -> None:
        if not ex:
            self.explain_head.object = ""
            self.explain.update([])
            self.unmatched_head.object = ""
            self.unmatched.update([])
            self.unmatched.view.visible = False
            return
        xla_only = [r for r in ex["collectives"] if not r["matched"]]
        predicted_only = ex["unmatched_predicted"]
        sides = [f"{n} of XLA's that no prediction explains" if what == "xla" else
                 f"{n} predicted one{'s' if n > 1 else ''} not in XLA's program"
                 for what, n in (("xla", len(xla_only)), ("pred", len(predicted_only))) if n]
        self.explain_head.object = (
            f"<div class='caption'><b>Where XLA's collectives come from</b>: {ex['matched_fraction']:.0%} of "
            f"{fmt_bytes(ex['xla_bytes'])} matched to a predicted collective on the same source line (or of the "
            "same parameter), with the decision that causes it"
            + (f"; {' and '.join(sides)}: listed under the table" if sides else "") + ".</div>")
        self.unmatched_head.object = (
            "<h4 class='sub'>Not matched on one side</h4>" if sides else
            "<div class='caption'>Every collective is matched on both sides.</div>")
        self.unmatched.update(unmatched_rows(xla_only, predicted_only))
        self.unmatched.view.visible = bool(sides)
        rows = []
        for r in ex["collectives"]:
            where = _where(r["where"])
            op = "parameter" if r["where"] == r.get("param") or r["op_name"].startswith("args[") else \
                (r["op_name"].rsplit("/", 1)[-1] if r["op_name"] else "-")
            dec = (f"{esc(r['decision'])} <span class='muted'>({fmt_bytes(r['predicted_bytes'])})</span>"
                   if r["matched"] else "<span class='over'>not predicted</span>")
            rows.append((r["kind"], fmt_bytes(r["bytes"]), where, op, dec))
        self.explain.html_fields = {"decision"}
        self.explain.update(rows)

    def _render(self, *_):
        s = self.state
        running = "verify" in s.busy
        self.spinner.value = self.spinner.visible = running
        self.btn.disabled = running
        self.btn.name = f"Verify '{s.shown_plan}' with XLA"
        status = s.verify_status or (f"Compiles the <b>{esc(s.shown_plan)}</b> plan (chosen above) with XLA on "
                                     "simulated devices, in its own process, and compares.")
        self.status.object = f"<div class='muted' style='padding-top:8px'>{status}</div>"
        out = s.verify_result
        if not out:
            # while XLA compiles, the tables say so (not "press Verify", which is done)
            waiting = f"verifying the {s.verified_plan} plan: XLA is compiling it…" if running else None
            self.table.update([], waiting)
            self.cpu_note.object = ""
            self.explain_head.object = ""
            self.explain.update([], waiting)
            return
        self._render_explain(out.explain)
        shown = s.plan_summary()
        scatter = shown.report.collective_bytes.get("reduce-scatter", 0.0) if shown is not None else 0.0
        # the Plan card lists reduce-scatters (TPU and GPU run them) that this table has not
        self.cpu_note.object = (
            f"<div class='caption'>Why no reduce-scatter here: the Plan card's {fmt_bytes(scatter)} of "
            "reduce-scatter per step are what TPUs and GPUs run; XLA on the simulated CPU devices lowers "
            "each to an all-reduce of the whole partial result and a slice, so both columns count them as "
            "all-reduce (the prediction here is made for that lowering).</div>"
            if scatter and out.xla_cpu_scheduler and not out.collectives["reduce-scatter"].xla_bytes else "")
        rows = [("peak memory per device", out.memory.predicted, out.memory.xla, out.memory.ratio),
                ("arguments per device", out.arguments.predicted, out.arguments.xla, out.arguments.ratio)]
        for kind, c in out.collectives.items():
            if c.predicted_bytes or c.xla_bytes:
                rows.append((f"{kind} bytes", c.predicted_bytes, c.xla_bytes, c.ratio))
        table = [(q, fmt_bytes(p), fmt_bytes(x), "-" if r is None else f"{r:.2f}") for q, p, x, r in rows]
        if out.host_unchecked is not None:  # XLA:CPU ignores memory spaces: the budget judges the device part
            device = out.xla_memory["device"]
            table[1:1] = [(f"device part ({'fits' if out.fits else 'over'} the {fmt_bytes(out.budget)} budget)", "",
                           fmt_bytes(device), ""),
                          ("host memory per device (not checked on this backend)", fmt_bytes(out.host_unchecked),
                           "-", "")]
        self.table.update(table)
