"""Tables: the plan (pytree path -> PartitionSpec, and the collectives it implies), the
baselines side by side with the search's plan, and predicted vs XLA."""

from __future__ import annotations

import math

import pandas as pd
import panel as pn
import param

from ._charts import plan_rows
from ._engine import short_source
from ._format import esc, fmt_bytes, fmt_spec, fmt_time
from ._widgets import button, html, keyed

_TABLE = dict(show_index=False, disabled=True, sizing_mode="stretch_width", theme="simple",
              layout="fit_data_stretch", stylesheets=[":host .tabulator {font-size: 12.5px;}"])


class PlanView(pn.viewable.Viewer):
    """The shown plan: its decisions, each input leaf's PartitionSpec, and its collectives."""

    state = param.Parameter()

    def __init__(self, **params):
        super().__init__(**params)
        s = self.state
        self.which = keyed(pn.widgets.RadioButtonGroup)("partex-plan-choice", options=["search"], value="search",
                                                          button_type="primary", button_style="outline")
        self.which.param.watch(self._on_which, ["value"])
        self.header = html(sizing_mode="stretch_width", margin=(4, 10))
        self.specs = pn.widgets.Tabulator(pd.DataFrame(columns=["path", "shape", "dtype", "PartitionSpec", "per device"]),
                                          height=330, pagination=None, header_filters={"path": {"type": "input", "func": "like", "placeholder": "filter paths"}},
                                          **_TABLE)
        self.colls = pn.widgets.Tabulator(pd.DataFrame(columns=["collective", "axes", "bytes", "count", "time", "cause", "source"]),
                                          height=330, pagination=None, **_TABLE)
        s.param.watch(self._choices, ["best", "uploaded", "baselines"])
        s.param.watch(self._render, ["shown_plan", "best", "uploaded", "baselines"])
        s.param.watch(lambda e: setattr(self.which, "value", e.new), ["shown_plan"])
        self._choices()
        self._render()
        self._panel = pn.Column(
            pn.Row(self.which, sizing_mode="stretch_width"),
            self.header,
            pn.Row(pn.Column(html("<h4 class='sub'>Inputs: pytree path → PartitionSpec</h4>"), self.specs,
                             sizing_mode="stretch_width"),
                   pn.Column(html("<h4 class='sub'>Collectives it implies (per step)</h4>"), self.colls,
                             sizing_mode="stretch_width"),
                   sizing_mode="stretch_width"),
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
            self.specs.value = self.specs.value.iloc[0:0]
            self.colls.value = self.colls.value.iloc[0:0]
            return
        plan = summary.plan
        r = summary.report
        chips = "".join(
            f"<span class='chip {'pin' if d.pinned else ''}'>{'📌 ' if d.pinned else ''}{esc(d.group)}→{esc(d.axis)}</span>"
            for d in plan.decisions) or "<span class='muted'>no decisions: everything replicated</span>"
        fits = "fits" if r.fits else "<span class='bad'>over budget</span>"
        self.header.object = (
            f"<div class='plan-head'><div class='chips'>{chips}</div><div class='muted'>mesh {esc(plan.mesh.text())} · "
            f"step {fmt_time(r.step_time)} (compute {fmt_time(r.compute_time)}, communication "
            f"{fmt_time(r.comm_time)}) · MFU {r.mfu:.1%} · peak {fmt_bytes(r.memory.peak)} per device, {fits}</div></div>")
        sig = {p: (shape, dtype) for p, shape, dtype in plan.signature.get("inputs", [])}
        mesh = plan.mesh
        rows = []
        for path, spec in plan.inputs.items():
            shape, dtype = sig.get(path, ([], ""))
            n = 1
            for e in spec:
                for a in ([] if e is None else [e] if isinstance(e, str) else e):
                    n *= mesh.axis_size(a)
            nbytes = math.prod(shape) * _itemsize(dtype)
            rows.append((path, str(tuple(shape)), dtype, fmt_spec(spec), fmt_bytes(nbytes / n)))
        self.specs.value = pd.DataFrame(rows, columns=["path", "shape", "dtype", "PartitionSpec", "per device"])
        colls = sorted(r.collectives, key=lambda c: -c.time)
        self.colls.value = pd.DataFrame(
            [(c.kind, ",".join(c.axes), fmt_bytes(c.bytes), c.count, fmt_time(c.time), c.cause,
              short_source(c.source) if c.source else f"op {c.op}") for c in colls],
            columns=["collective", "axes", "bytes", "count", "time", "cause", "source"])


def _itemsize(dtype: str) -> int:
    import numpy as np

    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        return 4


class BaselinesView(pn.viewable.Viewer):
    """The search's plan next to the hand-written strategies on the same cost model."""

    state = param.Parameter()

    def __init__(self, **params):
        super().__init__(**params)
        self.table = pn.widgets.Tabulator(pd.DataFrame(), height=250, pagination=None, **_TABLE)
        self.state.param.watch(self._render, ["best", "uploaded", "baselines"])
        self._render()

    def __panel__(self):
        return self.table

    def _render(self, *_):
        s = self.state
        rows = plan_rows(s)
        ref = s.baselines.get("replicated")
        out = []
        for name, r in rows:
            rep = r.report
            speed = f"{ref.report.step_time / rep.step_time:.2f}×" if ref and rep.step_time else "-"
            out.append({
                "plan": name, "step time": fmt_time(rep.step_time), "vs replicated": speed, "MFU": f"{rep.mfu:.1%}",
                "communication": fmt_time(rep.comm_time), "peak memory": fmt_bytes(rep.memory.peak),
                "fits": "✓" if rep.fits else "✗ over",
                "decisions": ", ".join(f"{d.group}→{d.axis}" for d in r.plan.decisions) or "—",
            })
        self.table.value = pd.DataFrame(out, columns=["plan", "step time", "vs replicated", "MFU", "communication",
                                                      "peak memory", "fits", "decisions"])


class VerifyView(pn.viewable.Viewer):
    """Compile the shown plan with XLA (a subprocess on simulated CPU devices) and put its
    memory and collective bytes beside the prediction."""

    state = param.Parameter()

    def __init__(self, **params):
        super().__init__(**params)
        s = self.state
        self.btn = button("partex-verify", "Verify with XLA", button_type="primary", width=170,
                          description="Compile the plan shown above on simulated CPU devices in a subprocess")
        self.btn.on_click(lambda e: s.verify())
        self.status = html(sizing_mode="stretch_width", name="verify-status")
        self.spinner = pn.indicators.LoadingSpinner(value=False, size=22, visible=False, margin=(12, 4))
        self.table = pn.widgets.Tabulator(pd.DataFrame(), height=240, pagination=None, **_TABLE)
        s.param.watch(self._render, ["verify_result", "verify_status", "busy", "shown_plan"])
        self._render()
        self._panel = pn.Column(pn.Row(self.btn, self.spinner, self.status, sizing_mode="stretch_width"),
                                self.table, sizing_mode="stretch_width")

    def __panel__(self):
        return self._panel

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
            self.table.value = pd.DataFrame(columns=["quantity", "predicted", "XLA", "predicted / XLA"])
            return
        rows = [("peak memory per device", out["memory"]["predicted"], out["memory"]["xla"], out["memory"]["ratio"]),
                ("arguments per device", out["arguments"]["predicted"], out["arguments"]["xla"], out["arguments"]["ratio"])]
        for kind, c in out["collectives"].items():
            if c["predicted_bytes"] or c["xla_bytes"]:
                rows.append((f"{kind} bytes", c["predicted_bytes"], c["xla_bytes"], c["ratio"]))
        self.table.value = pd.DataFrame(
            [(q, fmt_bytes(p), fmt_bytes(x), "-" if r is None else f"{r:.2f}") for q, p, x, r in rows],
            columns=["quantity", "predicted", "XLA", "predicted / XLA"])
