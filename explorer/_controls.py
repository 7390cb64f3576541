"""The sidebar: search controls, model picker, mesh / hardware / budget, plan files and
saved sessions. Every control writes to the ExplorerState it is handed."""

from __future__ import annotations

import io

import panel as pn
import param

from partex import demo_models

from ._engine import CUSTOM, hardware_names
from ._format import esc, fmt_bytes
from ._widgets import bind, button, html, keyed, on_change, on_click, page_callback, select, text_input


INVALID_CSS = (":host(.invalid) input, :host(.invalid) select { border-color: #dc2626 !important; "
               "box-shadow: 0 0 0 1px #dc2626 !important; background: #fef2f2; }")


class FieldErrors:
    """A refused input's marks on the form fields of one section: each field marked outlined in
    red, and its message under the section's fields (``partex-field-error-<section>``): why the
    field was refused and how to fix it, or that it is not applied (changed with a refused
    one). The state's ``field_error`` names the fields; a section shows only its own."""

    def __init__(self, state, section: str, fields: dict, labels: dict[str, str] | None = None):
        self.state, self.fields, self.labels = state, fields, labels or {}
        for w in fields.values():  # the input inside the widget's shadow root, outlined
            w.stylesheets = [*w.stylesheets, INVALID_CSS]
        self.note = html(name=f"partex-field-error-{section}", margin=(0, 10), visible=False)
        on_change(state, state.clock, f"the {section} fields' marks", self._show, ["field_error"])

    def _show(self, *_):
        errors = {k: v for k, v in self.state.field_error.items() if k in self.fields}
        for name, w in self.fields.items():
            w.css_classes = ["invalid"] if name in errors else []
        lines = "".join(f"<div>✕ {esc(self.labels.get(label, label))}: {esc(text)}</div>"
                        for label, text in errors.items())
        self.note.object = (f"<div role='alert' style='color:#991b1b;background:#fef2f2;border:1px solid "
                            "#fecaca;border-radius:6px;padding:4px 8px;font-size:12.5px;line-height:1.3'>"
                            f"{lines}</div>" if lines else "")
        self.note.visible = bool(lines)


def pipeline_words(ws, best) -> str:
    """The sidebar's words on the pipeline: the one in effect (its stages, microbatches,
    schedule, bubble, recompute and the best plan's memory per device: one stage's), or
    which stacks the model may pipeline."""
    c = ws.config
    p = c.pipeline
    if p is None:
        stacks = ws.pipeline_stacks
        ok = [f"{k} ({st.layers} layers, batch {st.batch})" for k, st in stacks.items() if not isinstance(st, str)]
        text = ("may be pipelined: " + ", ".join(ok)) if ok else "no layer stack under scan to pipeline"
        return f"<div class='hint'>{esc(text)}</div>"
    stages = c.mesh.sizes[c.mesh.index(p.axis)]
    parts = [f"{p.stack} over {p.axis}: {stages} stages", f"{p.microbatches} microbatches",
             f"{p.schedule}" + (f" ×{p.repeats}" if p.repeats > 1 else ""), f"bubble {c.bubble():.0%}",
             f"recompute {p.recompute}" if p.recompute else "saving residuals"]
    if best is not None:
        parts.append(f"each stage's devices hold {fmt_bytes(best.report.memory.peak)}")
    return f"<div class='hint' style='color:#1e3a8a'>{esc(', '.join(parts))}</div>"


def _section(title: str, *objects, **kw) -> pn.Column:
    return pn.Column(html(f"<div class='side-title'>{title}</div>", margin=(10, 10, 0, 10)), *objects,
                     sizing_mode="stretch_width", css_classes=["side-section"], **kw)


class SearchControls(pn.viewable.Viewer):
    state = param.Parameter()

    def __init__(self, **params):
        super().__init__(**params)
        s = self.state
        self.run = button("partex-run", "▶ Run", color="success", sizing_mode="stretch_width")
        self.pause = button("partex-pause", "❚❚ Pause", color="default", sizing_mode="stretch_width")
        self.step = button("partex-step", "Step", color="default", sizing_mode="stretch_width",
                           description="Run a fixed number of simulations, then stop")
        self.reset = button("partex-reset", "Reset", color="default", sizing_mode="stretch_width",
                            description="Start a fresh search (pins and forbids are kept)")
        for b, fn in ((self.run, s.run), (self.pause, s.pause), (self.step, s.step), (self.reset, s.reset)):
            on_click(b, s.clock, f"the {b.label} button", fn)
        self.step_size = keyed(pn.widgets.IntInput)("partex-step-size", label="Simulations per step", start=1,
                                                     end=100_000, sizing_mode="stretch_width")
        self.seed = keyed(pn.widgets.IntInput)("partex-seed", label="Seed", start=0, sizing_mode="stretch_width")
        bind(self.step_size, s, "step_size", clock=s.clock)
        bind(self.seed, s, "seed", clock=s.clock)
        on_change(s, s.clock, "the search buttons", self._sync, ["running", "phase"])
        self._sync()
        self._panel = _section(
            "Search",
            pn.Row(self.run, self.pause, sizing_mode="stretch_width"),
            pn.Row(self.step, self.reset, sizing_mode="stretch_width"),
            pn.Row(self.step_size, self.seed, sizing_mode="stretch_width"),
        )

    def _sync(self, *_):
        s = self.state
        ready = s.phase == "ready"
        self.run.disabled = s.running or not ready
        self.pause.disabled = not s.running
        self.step.disabled = s.running or not ready

    def __panel__(self):
        return self._panel


class ModelControls(pn.viewable.Viewer):
    state = param.Parameter()

    def __init__(self, **params):
        super().__init__(**params)
        s = self.state
        names = {f"{n} (demo)": n for n in demo_models.MODELS}
        names["your own model: file.py:function"] = CUSTOM
        about = "; ".join(f"**{n}**: {m.description}" for n, m in demo_models.MODELS.items())
        self.model = select("partex-model", "Model", options=names, sizing_mode="stretch_width",
                            description=about)
        self.preset = select("partex-preset", "Preset", options=list(s.param.preset.objects), sizing_mode="stretch_width")
        self.overrides = text_input("partex-overrides", "Config overrides", placeholder="e.g. layers=4,batch=16",
                                    sizing_mode="stretch_width")
        self.custom = text_input("partex-custom", "Your model", placeholder="my_model.py:make_step",
                                 sizing_mode="stretch_width", description=s.models.about())
        self.analyze = button("partex-analyze", "Analyze", color="primary", sizing_mode="stretch_width")
        on_click(self.analyze, s.clock, "the Analyze button", s.load)
        # Enter in the overrides applies them to the model on the page (the text typed so far:
        # the value itself may come after the key press); another model loads only on Analyze
        on_change(self.overrides, s.clock, "Enter in the config overrides", self._on_enter, ["enter_pressed"])
        bind(self.model, s, "model_name", clock=s.clock)
        bind(self.overrides, s, "overrides", clock=s.clock)
        bind(self.custom, s, "custom_model", clock=s.clock)
        on_change(s, s.clock, "the preset picker", self._presets, ["model_name", "preset"])
        self._presets()
        # the preset's choices follow the model: take only values the state accepts
        on_change(self.preset, s.clock, "the preset field", self._on_preset, ["value"])
        on_change(s, s.clock, "the Analyze button's spinner", lambda e: setattr(self.analyze, "loading", "load" in e.new),
                  ["busy"])
        self.errors = FieldErrors(s, "model", {"overrides": self.overrides, "custom": self.custom},
                                  {"overrides": "config overrides", "custom": "your model"})
        self._panel = _section("Model", self.model, pn.Row(self.preset, self.overrides, sizing_mode="stretch_width"),
                               self.custom, self.errors.note, self.analyze)

    def _on_enter(self, event):
        s = self.state
        s.overrides = self.overrides.value_input if self.overrides.value_input is not None else self.overrides.value
        s.apply_overrides()

    def _on_preset(self, event):
        if event.new in self.state.param.preset.objects:
            self.state.preset = event.new

    def _presets(self, *_):
        """The preset picker shows the model's presets and the state's preset, set together:
        a value set apart from its options is one the select does not offer, and the select
        takes its first option instead (Panel's Select does), which the state would take."""
        s = self.state
        custom = s.model_name == CUSTOM
        self.preset.param.update(options=list(s.param.preset.objects), value=s.preset)
        self.preset.disabled = self.overrides.disabled = custom
        self.custom.visible = custom

    def __panel__(self):
        return self._panel


class MeshControls(pn.viewable.Viewer):
    state = param.Parameter()

    def __init__(self, **params):
        super().__init__(**params)
        s = self.state
        self.mesh = text_input("partex-mesh", "Mesh (simulated)", placeholder="data=4,model=2",
                               sizing_mode="stretch_width",
                               description="Axis names and sizes; optionally name=size@GB/s per axis")
        self.hardware = select("partex-hardware", "Hardware", options=hardware_names(), sizing_mode="stretch_width",
                               description="A datasheet preset, or a profile measured on your devices "
                                           "(partex serve --hardware-profile FILE)")
        self.budget = text_input("partex-budget", "Budget / device", placeholder="empty: the chip's HBM",
                                 sizing_mode="stretch_width")
        bind(self.mesh, s, "mesh_text", clock=s.clock)
        bind(self.hardware, s, "hardware", clock=s.clock)
        self.margin = text_input("partex-margin", "Margin", placeholder="0.1", sizing_mode="stretch_width",
                                 description="Share of the budget a plan keeps free by the cost model's count")
        bind(self.budget, s, "budget_text", clock=s.clock)
        bind(self.margin, s, "margin_text", clock=s.clock)
        self.pipeline = text_input("partex-pipeline", "Pipeline", placeholder="none; e.g. stack0:stage:8",
                                   sizing_mode="stretch_width",
                                   description="A layer stack under scan run as a pipeline: STACK:AXIS:MICROBATCHES"
                                               "[:circular<R>][:full|dots] (the stages: the axis's devices)")
        bind(self.pipeline, s, "pipeline_text", clock=s.clock)
        self.pipe_info = html(name="partex-pipeline-info", margin=(0, 10))
        # a bad input's message under the field it came from, the field outlined in red
        self.errors = FieldErrors(s, "mesh", {"mesh": self.mesh, "hardware": self.hardware, "budget": self.budget,
                                              "margin": self.margin, "pipeline": self.pipeline})
        on_change(s, s.clock, "the pipeline's words", self._pipe_info, ["workspace", "best"])
        self._pipe_info()
        self._panel = _section(
            "Mesh & hardware", self.mesh, pn.Row(self.hardware, self.budget, sizing_mode="stretch_width"),
            self.margin, self.pipeline, self.pipe_info, self.errors.note,
            html("<div class='hint'>Press Enter to apply: the search restarts on the new mesh, pins kept.</div>",
                 margin=(0, 10)))

    def _pipe_info(self, *_):
        """The pipeline in effect (stages, microbatches, schedule, bubble, what each stage
        holds), or the stacks the model could pipeline."""
        ws, best = self.state.workspace, self.state.best
        self.pipe_info.object = pipeline_words(ws, best) if ws is not None else ""

    def __panel__(self):
        return self._panel


class FileControls(pn.viewable.Viewer):
    """Download the best plan; upload a plan to inspect; save and load sessions."""

    state = param.Parameter()

    def __init__(self, **params):
        super().__init__(**params)
        s = self.state
        self.download = keyed(pn.widgets.FileDownload)(
            "partex-download", callback=self._plan_file, filename=s.plan_filename(), label="Download plan JSON",
            color="primary", sizing_mode="stretch_width", disabled=True)
        self.upload = keyed(pn.widgets.FileInput)("partex-upload", accept=".json", multiple=False,
                                                  sizing_mode="stretch_width")
        on_change(self.upload, s.clock, "a plan uploaded", self._on_upload, ["value"])
        self.session = text_input("partex-session-name", "Session name", sizing_mode="stretch_width")
        bind(self.session, s, "session_name", clock=s.clock)
        self.save = button("partex-save", "Save", sizing_mode="stretch_width", margin=(27, 10, 5, 10))
        on_click(self.save, s.clock, "the Save session button", s.save_session)
        self.saved = select("partex-sessions", "Saved sessions", options=list(s.sessions), sizing_mode="stretch_width")
        self.load = button("partex-load", "Load", sizing_mode="stretch_width", margin=(27, 10, 5, 10))
        on_click(self.load, s.clock, "the Load session button", lambda: s.load_session(self.saved.value))
        self.errors = FieldErrors(s, "session", {"session": self.session}, {"session": "session name"})
        on_change(s, s.clock, "the saved sessions' list", self._sessions, ["sessions"])
        on_change(s, s.clock, "the Download plan button", self._plan_ready, ["best", "workspace"])
        self._plan_ready()
        self._panel = pn.Column(
            _section("Plan file", self.download,
                     html(f"<div class='hint'>Upload a plan JSON (at most {fmt_bytes(s.upload_limit)}) to inspect and "
                          "compare it:</div>", margin=(4, 10, 0, 10)),
                     self.upload),
            _section("Session", pn.Row(self.session, self.save, sizing_mode="stretch_width"), self.errors.note,
                     pn.Row(self.saved, self.load, sizing_mode="stretch_width")),
            sizing_mode="stretch_width",
        )

    def _plan_file(self):
        with page_callback(self.state.clock, "the plan downloaded"):
            text = self.state.plan_json()
        return io.StringIO(text or "")

    def _plan_ready(self, *_):
        self.download.disabled = self.state.best is None
        self.download.filename = self.state.plan_filename()

    def _on_upload(self, event):
        if event.new:
            self.state.upload_plan(event.new, self.upload.filename)

    def _sessions(self, event):
        self.saved.options = list(event.new)
        if event.new and self.saved.value not in event.new:
            self.saved.value = event.new[-1]

    def __panel__(self):
        return self._panel
