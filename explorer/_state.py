"""The state of one explorer session (one browser tab): the model, mesh and hardware the
user chose, the engine objects built from them, the background search, and the plans the
views show.

Views never reach for global state: each is handed an ``ExplorerState`` and reacts to its
parameters. Slow work (tracing a model, building a search, verifying with XLA) runs in a
worker thread (``_loop.Jobs``); its result is applied by ``poll``, which the page calls
periodically in the document's own context.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pathlib
import re
import time
from typing import Any, Callable

import param

from partex import (GroupInfo, ModelSpec, PartexError, SearchStats, Session, VerifyReport,
                    candidate_meshes, demo_models, parse_bytes)

from ._engine import (
    ANALYSES, CUSTOM, MESH_TRIES, Config, PlanSummary, Workspace, demo_presets, fitting_mesh, hardware_names,
    hardware_of, parse_config, plan_rows, settle_heap, split_overrides,
)
from ._format import fmt_bytes, fmt_time
from ._layout import GraphLayout, graph_layout
from ._loop import Jobs, PageClock
from ._meshes import DEFAULT_PIPELINES, MeshRequest, MeshSearchJob
from ._runner import SearchSnapshot, make_runner

log = logging.getLogger("partex.explorer")

DEFAULT_MODEL = "transformer"
DEFAULT_MESH = "data=4,model=2"
DEFAULT_HARDWARE = "tpu-v4"
# The tiny demo models need a few MiB per device: a budget in that range makes the
# trade-offs visible (replicating the tiny transformer does not fit, sharding does).
DEFAULT_BUDGET = "3MiB"  # the tiny demos': tight enough that sharding matters


# The form fields a bad input can be shown at (the sidebar's, always in view): the message
# goes there and nowhere else. Said also in the banner and a toast it was shown three times,
# the toast covering the page; a message tied to no field (a broken upload, a failed
# verification, the search's own failure) has no such place and goes to the banner and toast.
MODEL_FIELDS = ("overrides", "custom")
CONFIG_FIELDS = ("mesh", "hardware", "budget", "margin", "pipeline")
MESH_SEARCH_FIELDS = ("devices", "topology", "pipelines", "seconds")  # the Meshes card's form, where the user is
FORM_FIELDS = (*MODEL_FIELDS, *CONFIG_FIELDS, "session", *MESH_SEARCH_FIELDS)


def default_budget(preset: str) -> str:
    """The budget the form shows for a preset: 3 MiB for the tiny demos, the chip's HBM
    (empty) for the full-size ones."""
    return DEFAULT_BUDGET if preset == "tiny" else ""

# After picking up a snapshot the page renders it and Bokeh serialises the changes; a search
# in a thread (ThreadRunner) keeps off the GIL that long, so that it never holds the page up.
QUIET_SECONDS = 0.1
APPLY_SECONDS = 0.5  # while the search runs, the page shows its progress this often
_SESSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclasses.dataclass(frozen=True)
class Loaded:
    """What a load job hands back: everything built for one model + configuration."""

    workspace: Workspace
    infos: dict[int, GroupInfo]
    graph: GraphLayout
    baselines: dict[str, PlanSummary]
    session: Session  # the one the runner steps (a fork of it, in a child process)
    notes: tuple[str, ...] = ()
    form: dict | None = None  # form values to show (a loaded session)
    origin: str = ""  # "loaded session NAME" for a saved session
    held: tuple[tuple, tuple] = ((), ())  # pins and forbids that do not apply here, kept for later
    # where no baseline fits: a larger mesh on which one does (None: none up to tried_devices)
    fitting_mesh: str | None = None
    tried_devices: int = 0


class ExplorerState(param.Parameterized):
    """One browser session's explorer state. Its parameters are what the views watch; each
    method is one action of the page (load, run, pin, upload, verify, save) and sets several
    of them together, in the order a page relies on (the message before the data it explains,
    ``busy`` cleared last). That is why it is one class of ~600 lines: split, each part would
    set the others' parameters. What needs none of them lives beside it: the jobs and the
    page's clock (``_loop``), the messages and the probe (module functions below)."""

    # ---- the forms
    model_name = param.Selector(default=DEFAULT_MODEL, objects=[*demo_models.MODELS, CUSTOM], doc="""
        A demo model, or 'custom' for a module:attr of your own.""")
    preset = param.Selector(default="tiny", objects=demo_presets(DEFAULT_MODEL), doc="Demo model preset.")
    overrides = param.String(default="", doc="Demo config overrides, e.g. 'layers=4,batch=16'.")
    custom_model = param.String(default="", doc="module:attr or path/file.py:attr returning (fn, example_args).")
    mesh_text = param.String(default=DEFAULT_MESH, doc="Mesh axes as name=size pairs.")
    hardware = param.Selector(default=DEFAULT_HARDWARE, objects=hardware_names())
    budget_text = param.String(default=DEFAULT_BUDGET, doc="Per-device memory budget; empty: the chip's HBM.")
    margin_text = param.String(default="0.1", doc="Share of the budget plans keep free (the cost model's count).")
    pipeline_text = param.String(default="", doc="A layer stack run as a pipeline, STACK:AXIS:MICROBATCHES; empty: none.")
    seed = param.Integer(default=0, bounds=(0, None), doc="Seed of the search's RNG.")
    step_size = param.Integer(default=50, bounds=(1, 100_000), doc="Simulations per Step click.")
    session_name = param.String(default="my-session", doc="Name to save the session under.")

    # ---- live state (set by the state itself)
    phase = param.Selector(default="loading", objects=["loading", "ready", "failed"], constant=False)
    busy = param.List(default=[], item_type=str, doc="Kinds of background jobs in flight.")
    running = param.Boolean(default=False)
    message = param.String(default="")
    message_level = param.Selector(default="info", objects=["info", "success", "warning", "danger"])
    # the form field a bad input came from (one of FORM_FIELDS) and its message: the field
    # shows it where the user typed it
    field_error = param.Dict(default={})
    workspace = param.Parameter(default=None, doc="The loaded Workspace.")
    config = param.Parameter(default=None, doc="The Config in effect (the last valid form).")
    infos = param.Dict(default={}, doc="GroupInfo per decision group.")
    graph = param.Parameter(default=None, doc="GraphLayout of the named-dimension graph.")
    best = param.Parameter(default=None, doc="PlanSummary of the search's best plan.")
    stats = param.ClassSelector(class_=SearchStats, default=SearchStats())
    baselines = param.Dict(default={}, doc="name -> PlanSummary.")
    uploaded = param.Parameter(default=None, doc="PlanSummary of an uploaded plan.")
    pins = param.List(default=[], doc="Pinned (group id, axis).")
    forbidden = param.List(default=[], doc="Forbidden (group id, axis).")
    selected_group = param.Integer(default=None, allow_None=True, doc="Group clicked in the graph.")
    shown_plan = param.String(default="search", doc="The plan the plan view shows.")
    verify_status = param.String(default="")
    verify_result = param.ClassSelector(class_=VerifyReport, default=None, allow_None=True)
    verified_plan = param.String(default="")  # the plan verify_result is of: "search" or a baseline
    measure_status = param.String(default="")
    measured = param.Dict(default={}, doc="plan name -> (its plan's digest, Measured): run on this machine's devices")
    sessions = param.List(default=[], doc="Saved sessions in the sessions folder.")
    mesh_rows = param.List(default=[], doc="MeshRow per mesh the mesh search tried, best first.")
    mesh_status = param.String(default="", doc="The mesh search's progress or outcome, in words.")
    probe = param.String(default="{}", doc="JSON of the state, for tests and scripts.")
    ping = param.String(default="")

    def __init__(self, sessions_dir: str | os.PathLike | None = None, session_id: str = "", **params):
        super().__init__(**params)
        self.session_id = session_id or f"{id(self):x}"
        self.sessions_dir = pathlib.Path(sessions_dir or os.environ.get("PARTEX_SESSIONS_DIR") or "sessions")
        self.runner = None  # a ProcessRunner or ThreadRunner
        self.meshes: MeshSearchJob | None = None  # the mesh search in flight or last run
        self._meshes_for = None  # (analysis, hardware) the mesh rows were found for
        self.held: tuple[tuple, tuple] = ((), ())  # pins, forbids set aside: they do not apply on this mesh
        self.jobs = Jobs(self.session_id)
        self.clock = PageClock(self.session_id, lambda: self.running)
        self._seen_version = -1
        self._last_apply = 0.0
        self._quiet = False  # set while the state writes its own forms
        self._warned_budget = False
        # a warning that no plan fits: "searching" and "paused" messages add to it, never
        # replace it, until the search finds a plan that fits or another model or mesh loads
        self._standing = ""
        self._pausing = False  # paused: the message's count waits for the search's last snapshot
        self.param.watch(self._on_model_name, ["model_name"])
        self.param.watch(self._on_choice_form, ["model_name", "preset"])
        self.param.watch(self._on_config_form, ["mesh_text", "hardware", "budget_text", "margin_text", "pipeline_text"])
        self.param.watch(self._on_probed, ["ping", "message", "message_level", "field_error", "phase", "busy", "running", "best",
                                           "pins", "forbidden", "uploaded", "verify_status", "measure_status",
                                           "sessions",
                                           "selected_group", "workspace", "baselines", "stats",
                                           "mesh_rows", "mesh_status"])
        self.refresh_sessions()
        self.load()

    # ------------------------------------------------------------------ messages
    def bad_input(self, e) -> None:
        """A bad input's message, shown once: at the form field it came from, or (tied to no
        field) in the banner (see FORM_FIELDS)."""
        field = getattr(e, "field", None)
        hidden = "overrides" if self.model_name == CUSTOM else "custom"  # the model picker shows one of the two
        if field in FORM_FIELDS and field != hidden:
            self.field_error = {field: str(e)}
        else:
            self.notify(e, "danger")

    def clear_field_error(self, *fields: str) -> None:
        """The inputs of ``fields`` are good (applied, or no longer shown): their marks go."""
        if any(f in self.field_error for f in fields):
            self.field_error = {k: v for k, v in self.field_error.items() if k not in fields}

    def _say(self, text: str) -> None:
        """An info message; with a standing warning, after it (the warning stays)."""
        if self._standing:
            self.notify(f"{self._standing}; {text}", "warning")
        else:
            self.notify(text, "info")

    def notify(self, text: str, level: str = "info") -> None:
        """Show a one-line message on the page (the text and its level change together). A
        newer message replaces a pause's: its count is no longer rewritten (``pause``)."""
        self._pausing = False
        with param.parameterized.batch_call_watchers(self):
            self.message_level = level
            self.message = " ".join(str(text).split())

    # ------------------------------------------------------------------ jobs
    def _submit(self, kind: str, work: Callable[[], Any], done: Callable[[Any], None]) -> None:
        """Run work() in a worker thread; done(result) runs later in the page's context
        (from poll). A newer job of one kind supersedes an older one still running."""
        if kind not in self.busy:
            self.busy = [*self.busy, kind]
        self.jobs.submit(kind, work, done)

    def internal_error(self, what: str, e: Exception) -> None:
        """A bug in the explorer or the engine while ``what``: log its traceback, say so on
        the page in one line, and leave the session usable (the last model stays loaded)."""
        log.error("partex: internal error while %s (session %s)", what, self.session_id, exc_info=e)
        try:
            if "load" not in self.busy and "session" not in self.busy:
                self.phase = "ready" if self.workspace is not None and self.runner is not None else "failed"
            self.notify(f"internal error while {what}: {type(e).__name__}: {e} (the server's log has the "
                        "traceback); the page goes on", "danger")
        except Exception as again:  # saying so failed too: the log has both, nothing is raised
            log.error("partex: internal error while reporting an internal error (session %s)", self.session_id,
                      exc_info=again)

    def _drain(self) -> None:
        for kind, gen, done, status, value in self.jobs.finished():  # less the superseded
            if status == "ok":
                try:
                    done(value)
                except Exception as e:  # partex's own bug: the traceback goes to the log, the page goes on
                    self._done(kind, gen)
                    self.internal_error(f"applying the {kind} job's result", e)
            else:
                if kind in ("load", "session"):
                    self.phase = "ready" if self.workspace is not None else "failed"
                if kind == "verify":
                    self.verify_status = "failed"
                if kind == "measure":
                    self.measure_status = "failed"
                self.bad_input(value)
            # the job leaves ``busy`` once its result is in place: a page never sees it done
            # with the old model or configuration still shown
            self._done(kind, gen)

    def _done(self, kind: str, gen: int) -> None:
        if self.jobs.latest(kind, gen):  # no newer job of its kind was started by its result
            self.busy = [b for b in self.busy if b != kind]

    # ------------------------------------------------------------------ model / config
    def model_choice(self) -> ModelSpec:
        if self.model_name == CUSTOM:
            spec = self.custom_model.strip()
            if not spec:
                raise PartexError("name your model as module:attr or path/file.py:attr (a callable that "
                                  "returns (fn, example_args))", field="custom")
            return ModelSpec(spec, "custom", ())
        overrides = split_overrides(self.overrides)
        try:  # malformed (no key=value) at once; unknown keys and bad values when it loads
            demo_models.parse_overrides(overrides)
        except ValueError as e:
            raise PartexError(str(e), field="overrides") from None
        return ModelSpec(self.model_name, self.preset, tuple(overrides))

    def _on_model_name(self, event) -> None:
        presets = demo_presets(event.new)
        self.param.preset.objects = presets
        if self.preset not in presets:
            self.preset = presets[0]

    def _on_choice_form(self, event) -> None:
        """The model or preset in the form changed: nothing is analysed until Analyze, so say
        so; and the budget follows the preset while the user has not typed one (3 MiB suits
        the tiny demos; a full-size preset opens on the chip's HBM, not on "no plan fits")."""
        if self._quiet:
            return
        self.clear_field_error(*MODEL_FIELDS)  # another model: its fields are checked anew on Analyze
        budget = ""
        if (event.name == "preset" and self.budget_text == default_budget(event.old)
                and default_budget(event.new) != self.budget_text):
            self._quiet = True  # the form only: the new budget applies with the new model
            try:
                self.budget_text = default_budget(event.new)
            finally:
                self._quiet = False
            hbm = hardware_of(self.hardware).budget
            budget = ", " + budget_words(parse_bytes(self.budget_text) if self.budget_text else hbm,
                                               self.hardware, self.preset)
        ws = self.workspace
        if ws is not None and ws.choice.spec == self.model_name and ws.choice.preset == self.preset:
            if budget:
                self.notify(f"press Analyze to load {ws.choice.title} again{budget}", "info")
            return
        what = self.custom_model or "your model" if self.model_name == CUSTOM else f"{self.model_name} ({self.preset})"
        self.notify(f"press Analyze to load {what}{budget}; the page still shows "
                    f"{ws.choice.title if ws else 'nothing'}", "info")

    def load(self) -> None:
        """Analyse the model in the forms on the mesh in the forms (Analyze button)."""
        try:
            choice = self.model_choice()
            config = parse_config(self.mesh_text, self.hardware, self.budget_text, self.margin_text, self.pipeline_text)
        except PartexError as e:
            self.bad_input(e)
            return
        self.phase = "loading"
        seed = self.seed
        self._submit("load", lambda: _build(choice, config, seed), self._install)

    def _on_config_form(self, event) -> None:
        if self._quiet:
            return
        self.apply_config()

    def apply_config(self) -> None:
        """The mesh / hardware / budget form changed: a new search on the same model."""
        try:
            config = parse_config(self.mesh_text, self.hardware, self.budget_text, self.margin_text, self.pipeline_text)
        except PartexError as e:
            self.bad_input(e)  # the old mesh stays in effect
            return
        ws = self.workspace
        if ws is not None and config != self.config:
            # the job first: a page that sees the mark gone sees the new search being built
            pins, forbidden, seed = self._with_held()
            if self.config is not None and config.pipeline != self.config.pipeline:
                pins, forbidden = (), ()  # another pipeline is another step: its groups are others
            self._submit("load", lambda: _build(ws.choice, config, seed, ws.base, pins, forbidden), self._install)
        self.clear_field_error(*CONFIG_FIELDS)  # the form reads well: a new search (whose failure may set it again)
        if ws is None:
            self.load()

    def _install(self, loaded: Loaded) -> None:
        if self.runner is not None:
            self.runner.close(wait=0.2)
            self.runner = None  # should anything below fail, no closed runner is left in place
        ws = loaded.workspace
        was_running = self.running and self.workspace is not None and ws.res is self.workspace.res
        same_model = self.workspace is not None and ws.res is self.workspace.res
        if loaded.form:
            self._set_forms(loaded.form)
        if not same_model:
            # pins and forbids are group ids of the old model: gone before the new model comes,
            # so no view ever reads them against it (the new model's come after it, below)
            with param.parameterized.batch_call_watchers(self):
                self.pins, self.forbidden = [], []
            self.held = ((), ())
        with param.parameterized.batch_call_watchers(self):
            self.workspace = ws
            self.config = ws.config
            self.infos = loaded.infos
            self.graph = loaded.graph
            self.baselines = loaded.baselines
            self.best = None
            self.stats = SearchStats()
            self.uploaded = None if self.uploaded is None or not ws.same_model(self.uploaded) else self.uploaded
            self.verify_result = None
            self.verify_status = ""
            self.measured = {}
            self.measure_status = ""
            if not same_model or self.selected_group not in loaded.infos:
                self.selected_group = None  # group ids belong to one analysis
            if self.shown_plan not in ("search", "uploaded", *loaded.baselines):
                self.shown_plan = "search"
        if self._meshes_for is not None and self._meshes_for != (ws.base, ws.config.hw):
            # the meshes tried were of another model, hardware or budget
            if self.meshes is not None:
                self.meshes.close()
            self._meshes_for = None
            with param.parameterized.batch_call_watchers(self):
                self.mesh_rows, self.mesh_status = [], ""
                self.busy = [b for b in self.busy if b != "meshes"]
        self._seen_version = -1
        self._warned_budget = False
        self._pausing = False
        self.clear_field_error("session")
        try:  # the forms read well; a bad value typed while this loaded keeps its mark
            parse_config(self.mesh_text, self.hardware, self.budget_text, self.margin_text, self.pipeline_text)
            self.clear_field_error(*CONFIG_FIELDS)
        except PartexError:
            pass
        try:  # the form's model is the one loaded: its fields are good too
            if self.model_choice() == ws.choice:
                self.clear_field_error(*MODEL_FIELDS)
        except PartexError:
            pass
        settle_heap()  # the new page and model are long-lived: keep them out of later collections
        self.runner = make_runner(loaded.session, ws, session=self.session_id)
        self.pins = loaded.session.pins
        self.forbidden = loaded.session.forbidden
        self.held = loaded.held
        text, level = loaded_message(loaded)
        self._standing = text if level == "warning" else ""
        self.notify(text, level)
        self.phase = "ready"  # after the message: a page that sees "ready" sees its summary
        if was_running:
            self.run()
        self._update_probe()

    def _set_forms(self, form: dict) -> None:
        self._quiet = True
        try:
            for k, v in form.items():
                if k == "preset":
                    self.param.preset.objects = demo_presets(form.get("model_name", self.model_name))
                setattr(self, k, v)
        finally:
            self._quiet = False

    # ------------------------------------------------------------------ search controls
    def _need_runner(self):
        if self.runner is None or not self.runner.alive:
            self.notify("no search yet: wait for the model to load (or press Analyze)", "warning")
            return None
        return self.runner

    def run(self) -> None:
        r = self._need_runner()
        if r:
            r.run()
            self.running = True
            an = self.workspace.an
            pins = ", ".join(an.decision_label(d) for d in self.pins)
            self._pausing = False
            self._say(f"searching on {self.config.mesh.text()}" + (f" from the pinned {pins}" if pins else "")
                      + "; Pause to stop, pin or forbid a group any time")

    def pause(self) -> None:
        if self.runner:
            self.runner.pause()
        was = self.running
        self.running = False
        if was:  # the "searching on ..." message would outlive the search
            # the search stops between two chunks: the count is said again with its last snapshot
            self._say_paused()
            self._pausing = self.runner is not None

    def _say_paused(self) -> None:
        self._say(f"paused after {self.stats.simulations:,} simulations; Run goes on, Reset "
                  "starts afresh")

    def _with_held(self):
        """The pins and forbids to carry to a new search: those in force, then those set
        aside on an earlier mesh (they come back where they apply)."""
        held_pins, held_forbidden = self.held
        pins = list(self.pins) + [p for p in held_pins if p not in self.pins]
        forbidden = list(self.forbidden) + [f for f in held_forbidden if f not in self.forbidden]
        return pins, forbidden, self.seed

    def step(self) -> None:
        r = self._need_runner()
        if r:
            r.step(self.step_size)

    def reset(self) -> None:
        """A fresh search on the same model and mesh; pins and forbids are kept."""
        ws = self.workspace
        if ws is None:
            return self.load()
        pins, forbidden, seed = self._with_held()
        self.pause()
        self._submit("load", lambda: _build(ws.choice, ws.config, seed, ws.res, pins, forbidden, same_step=True),
                     self._install)

    def _decide(self, how: str, group: int | None, axis: str | None) -> None:
        r = self._need_runner()
        if r is None:
            return
        if group is None or axis is None:
            self.notify("choose a group (click a node in the graph) and a mesh axis", "warning")
            return
        an = self.workspace.an
        lab = f"{an.groups[group].label}->{axis}"
        try:
            pins, forbidden = r.call(how, group, axis)
        except PartexError as e:
            text = str(e)
            self.notify(text if text.startswith("cannot") else f"cannot {how} {lab}: {text}", "danger")
            return
        self._warned_budget = False
        verb = {"pin": "pinned", "forbid": "forbade", "unpin": "released"}[how]
        tail = "" if self.running else "; press Run to resume the search from here"
        # the message first: a page that sees the new pins also sees why
        self._say(f"{verb} {lab}{tail}")
        self.pins, self.forbidden = pins, forbidden
        self._update_probe()

    def pin(self, group: int | None, axis: str | None) -> None:
        self._decide("pin", group, axis)

    def forbid(self, group: int | None, axis: str | None) -> None:
        self._decide("forbid", group, axis)

    def unpin(self, group: int | None, axis: str | None) -> None:
        self._decide("unpin", group, axis)

    # ------------------------------------------------------------------ plans
    def plan_summary(self, name: str | None = None) -> PlanSummary | None:
        name = name or self.shown_plan
        if name == "search":
            return self.best
        if name == "uploaded":
            return self.uploaded
        return self.baselines.get(name)

    def plan_filename(self) -> str:
        ws = self.workspace
        if ws is None:
            return "partex-plan.json"
        mesh = ws.config.mesh.text().replace("=", "").replace(",", "-")
        return f"partex-plan-{_slug(ws.choice.spec)}-{ws.choice.preset}-{mesh}.json"

    def plan_json(self) -> str | None:
        """The best plan's JSON (the Download button)."""
        if self.best is None:
            self.notify("no plan to download yet: run the search until it finds one that fits", "warning")
            return None
        return self.best.plan.dumps()

    def upload_plan(self, data: bytes, filename: str) -> None:
        ws = self.workspace
        if ws is None:
            self.notify("load a model before uploading a plan", "warning")
            return
        filename = filename or "uploaded plan"

        def work():
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise PartexError(f"{filename} is not a text file: a plan is JSON written by partex") from None
            try:
                return ws.uploaded(text, filename)
            except PartexError as e:
                raise PartexError(f"could not read the uploaded plan: {e}") from None

        self._submit("upload", work, self._uploaded)

    def _uploaded(self, summary: PlanSummary) -> None:
        r = summary.report
        # the message first: a page that sees the uploaded plan also sees what it is
        self.notify(f"uploaded plan: {len(summary.decisions)} decisions on {summary.plan.mesh.text()}, "
                    f"predicted step {fmt_time(r.step_time)}, peak {fmt_bytes(r.memory.peak)} per device", "success")
        self.uploaded = summary
        self.shown_plan = "uploaded"
        self._update_probe()

    def verify(self) -> None:
        """Compile the shown plan with XLA on simulated devices (a subprocess) and compare."""
        summary = self.plan_summary() or self.best
        if summary is None:
            self.notify("nothing to verify yet: run the search or pick a baseline in the plan view", "warning")
            return
        if "verify" in self.busy:
            self.notify("a verification is already running", "info")
            return
        ws = self.workspace
        self.verify_status = f"running: compiling the {summary.name} plan on {summary.plan.mesh.size} simulated devices"
        self.verify_result = None

        def work():
            # the page's copy of the session compiles; the search's own copy (in the runner)
            # learns the verdict in _verified, as Session.verify(mark=True) would
            out = ws.session.verify(summary.plan, mark=False, timeout=600, explain=True)
            return summary.name, out

        self._submit("verify", work, self._verified)

    def _verified(self, result: tuple[str, VerifyReport]) -> None:
        name, out = result
        self.verified_plan, self.verify_result = name, out
        self.verify_status = f"done: the {name} plan compiled in {out.compile_seconds} s"
        if not out.fits:
            text = (f"XLA puts the {name} plan at {fmt_bytes(out.memory.xla)} per device, over the "
                    f"budget of {fmt_bytes(out.budget)} (predicted {fmt_bytes(out.memory.predicted)})")
            summary = self.plan_summary(name)
            r = self.runner
            if name == "search" and summary is not None and r is not None and r.alive:
                try:
                    r.call("mark_infeasible", list(summary.decisions), out.memory.xla)
                    text += ": marked infeasible, the search's best moves to the next plan that fits"
                except PartexError as e:
                    text += f"; could not mark it infeasible: {e}"
            self.notify(text, "warning")
        self._update_probe()

    def measure(self, steps: int = 3) -> None:
        """Run the listed plans that fit (the search's, an upload, the baselines) on this
        machine's devices for a few steps, each in its own process (``Session.measure``),
        and put their measured step time and peak beside the prediction."""
        if "measure" in self.busy:
            self.notify("a measurement is already running", "info")
            return
        rows = [(name, r) for name, r in plan_rows(self) if r.report.fits]
        if not rows:
            self.notify("nothing to measure yet: no plan listed fits the budget", "warning")
            return
        ws = self.workspace
        n = rows[0][1].plan.mesh.size
        self.measure_status = (f"running: {len(rows)} plan{'s' if len(rows) > 1 else ''} on {n} devices, "
                               f"{steps} steps each, one process per plan")

        def work():
            plans = [r.plan for _, r in rows]
            out = ws.session.measure(plans, steps=steps, labels=[name for name, _ in rows], timeout=900)
            return {name: (r.plan.digest(), m) for (name, r), m in zip(rows, out)}

        self._submit("measure", work, self._measured)

    def _measured(self, result: dict) -> None:
        self.measured = {**self.measured, **result}
        done = [m for _, m in result.values()]
        where = f"{done[0].devices} x {done[0].device}" if done else "this machine"
        failed = [m.label for m in done if m.error is not None]
        hw = self.config.hw if self.config is not None else None
        other = hw is not None and done and (hw.profile is None or hw.profile.device != done[0].device)
        self.measure_status = (f"done: measured on {where}" + (" (simulated on the CPU: the host's times)"
                                                               if done and done[0].platform == "cpu" else "")
                               + (f"; did not run: {', '.join(failed)}" if failed else "")
                               + (f"; the predictions are priced for {hw.name}, not for these devices"
                                  if other and hw is not None else ""))
        ran = sorted((m for m in done if m.step_time is not None), key=lambda m: m.step_time or 0.0)
        if len(ran) > 1:
            by_pred = min(ran, key=lambda m: m.predicted_step_time or 0.0)
            if by_pred.label != ran[0].label:
                self.notify(f"measured fastest: {ran[0].label} ({fmt_time(ran[0].step_time)}); the prediction "
                            f"ranked {by_pred.label} first ({fmt_time(by_pred.step_time)} measured)", "warning")
        self._update_probe()

    # ------------------------------------------------------------------ sessions
    def refresh_sessions(self) -> None:
        d = self.sessions_dir
        self.sessions = sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []

    def session_path(self, name: str) -> pathlib.Path:
        """The file of session ``name`` in the sessions folder; a name that is not a plain
        file name (a path, '..') is refused, so nothing outside the folder is read or written."""
        if not _SESSION_NAME.match(name or ""):
            raise PartexError(f"session name {name!r}: use letters, digits, '-', '_' or '.' (up to 64)")
        return self.sessions_dir / f"{name}.json"

    def save_session(self) -> None:
        """Save the search (the same file ``partex search --resume`` continues)."""
        name = self.session_name.strip()
        try:
            path = self.session_path(name)
        except PartexError as e:
            self.bad_input(PartexError(str(e), field="session"))
            return
        r = self._need_runner()
        if r is None:
            return
        try:
            self.sessions_dir.mkdir(parents=True, exist_ok=True)
            r.call("save", str(path))
        except (OSError, PartexError) as e:
            self.notify(f"could not save session {name}: {e}", "danger")
            return
        self.refresh_sessions()
        self.clear_field_error("session")
        self.notify(f"saved session {name} ({self.stats.simulations} simulations) to {path}; "
                    f"resume it here or with `partex search {self.workspace.choice.spec} --resume {path} --out plan.json`",
                    "success")

    def load_session(self, name: str | None) -> None:
        if not name:
            self.notify("choose a saved session to load", "warning")
            return
        try:
            path = self.session_path(name)
        except PartexError as e:
            self.notify(str(e), "danger")
            return
        self.pause()
        self.phase = "loading"
        self._submit("load", lambda: _restore(name, path), self._install)

    # ------------------------------------------------------------------ the mesh as a decision
    def search_meshes(self, devices, topology: str, seconds, max_axes, pipelines: str = DEFAULT_PIPELINES) -> None:
        """Search every factorisation of ``devices`` (laid out as ``topology``) with the plan,
        on the page's model, hardware and budget (the Meshes card): ``Session.search_meshes``
        in a forked child, with the pipelined candidates ``pipelines`` names
        (``_meshes.PIPELINES``); its rounds show as they come (``poll``)."""
        ws = self.workspace
        if ws is None:
            self.notify("no model yet: wait for it to load (or press Analyze)", "warning")
            return
        try:
            request = MeshRequest.parse(devices, topology, seconds, max_axes, pipelines)
            meshes = candidate_meshes(request.devices, request.topology, request.max_axes)
        except PartexError as e:
            self.bad_input(PartexError(str(e).replace("--", ""), field=e.field or "devices"))
            return
        self.clear_field_error(*MESH_SEARCH_FIELDS)
        if self.meshes is not None:
            self.meshes.close()
        self.meshes = MeshSearchJob(ws.session, request, name=self.session_id, lock=ws.lock)
        self._meshes_for = (ws.base, ws.config.hw)
        with param.parameterized.batch_call_watchers(self):
            self.mesh_rows = []
            self.mesh_status = (f"searching the {len(meshes)} meshes of {request.text()} for {request.seconds:g} s: "
                                "a session on each from its hand plans, then rounds of successive halving")
        if "meshes" not in self.busy:
            self.busy = [*self.busy, "meshes"]

    def stop_meshes(self) -> None:
        """Stop the mesh search: the meshes tried so far stay in the card."""
        if self.meshes is not None and "meshes" in self.busy:
            self.meshes.close()
            self.mesh_status = f"stopped: {len(self.mesh_rows)} meshes tried so far"
            self.busy = [b for b in self.busy if b != "meshes"]

    def use_mesh(self, text: str | None) -> None:
        """Continue on a candidate the mesh search tried (``MESH`` or ``MESH | PIPELINE``):
        the mesh and pipeline forms take it, and the page's search starts again there (pins
        kept where they apply: on the same step)."""
        if not text:
            self.notify("no mesh to use yet: search the meshes first", "warning")
            return
        mesh, _, pipe = text.partition("|")
        self._set_forms({"mesh_text": mesh.strip(), "pipeline_text": pipe.strip()})
        self.apply_config()

    def _poll_meshes(self) -> None:
        job = self.meshes
        if job is None or "meshes" not in self.busy:
            return
        p = job.receive()
        if list(p.rows) != self.mesh_rows:
            self.mesh_rows = list(p.rows)
        if not p.done:
            if p.rows:
                live = sum(r.live for r in p.rows)
                rounds = max(r.rounds for r in p.rows)
                self.mesh_status = (f"searching: {len(p.rows)} meshes, {live} still in after round {rounds}"
                                    if rounds else f"searching: {len(p.rows)} meshes scored by their hand plans")
            return
        self.busy = [b for b in self.busy if b != "meshes"]
        if p.error:
            self.mesh_status = f"the mesh search failed: {p.error}"
            self.notify(self.mesh_status, "danger")
            return
        best = next((r for r in p.rows if r.step is not None), None)
        n = len(p.rows)
        head = f"{n} mesh{'es' if n != 1 else ''} of {job.request.text()} in {p.seconds:.1f} s"
        if p.rows and all(r.note for r in p.rows):
            self.mesh_status = f"{head}: the model can use none of them ({p.rows[0].note})"
            self.notify(self.mesh_status, "warning")
            return
        if best is None:
            self.mesh_status = (f"{head}: no plan fits the budget of {fmt_bytes(self.config.hw.budget)} per device "
                                "on any: raise the budget or give more devices")
            self.notify(self.mesh_status, "warning")
            return
        self.mesh_status = (f"{head}: the best is {best.label} at {fmt_time(best.step)} per step; pick a mesh "
                            "and press Use this mesh to continue on it")
        self.notify(f"mesh search done: {self.mesh_status}", "success")

    # ------------------------------------------------------------------ the page's clock
    def poll(self) -> None:
        """Apply finished jobs and the search's latest snapshot (called every ~200 ms)."""
        with self.clock.timed():
            self._drain()
            self._poll_meshes()
            r = self.runner
            snap = r.receive() if r is not None else None
            now = time.perf_counter()
            if (r is not None and snap is not None and snap.version != self._seen_version
                    and (not snap.running or snap.best is not self.best or now - self._last_apply >= APPLY_SECONDS)):
                self._seen_version = snap.version  # a snapshot that fails below is not applied again
                self._last_apply = now
                r.quiet(QUIET_SECONDS)
                try:
                    self._apply(snap)
                except Exception as e:
                    self.internal_error("showing the search's progress", e)

    def _apply(self, snap: SearchSnapshot) -> None:
        with param.parameterized.batch_call_watchers(self):
            self.stats = snap.stats
            if snap.best is not self.best:
                self.best = snap.best
            if list(snap.pins) != self.pins:
                self.pins = list(snap.pins)
            if list(snap.forbidden) != self.forbidden:
                self.forbidden = list(snap.forbidden)
            if self.running and self.runner is not None and not self.runner.running and not snap.running:
                self.running = False
        if snap.best is not None and snap.best.report.fits:
            self._standing = ""  # a plan fits after all
        if snap.error:
            self.running = False
            self._pausing = False
            self.notify(snap.error, "danger")
        elif snap.best is None and snap.stats.simulations >= 200 and not self._warned_budget:
            self._warned_budget = True
            smallest = snap.stats.smallest_memory
            budget = self.config.hw.budget
            tail = f"; the smallest predicted peak so far is {fmt_bytes(smallest)}" if smallest < math.inf else ""
            self._standing = (f"no plan fits the budget of {fmt_bytes(budget)} per device after "
                              f"{snap.stats.simulations} simulations{tail}: raise the budget, grow the mesh "
                              "or release a pin")
            if self._pausing and not snap.running:
                self._pausing = False
                self._say_paused()
            else:
                self.notify(self._standing, "warning")
        elif self._pausing and not snap.running:
            self._pausing = False  # the search has stopped: its count is the one the page shows
            self._say_paused()
        self._update_probe()

    def _on_probed(self, *events) -> None:
        self._update_probe()

    def _update_probe(self) -> None:
        self.probe = json.dumps(probe_of(self))

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """The tab closed: stop its searches."""
        if self.runner is not None:
            self.runner.close()
        if self.meshes is not None:
            self.meshes.close()


def budget_source(budget: float, hardware: str, preset: str) -> str:
    """Where a budget came from, when the form chose it: the chip's HBM (a full-size
    preset's default) or the tiny demos' default; "" for one the user typed."""
    if budget == hardware_of(hardware).budget:
        return "the chip's HBM" + (", for a full-size preset" if preset not in ("tiny", "custom") else "")
    if preset == "tiny" and budget == parse_bytes(DEFAULT_BUDGET):
        return "the tiny demos' default"
    return ""


def budget_words(budget: float, hardware: str, preset: str) -> str:
    """'budget: the chip's HBM, 32.0 GiB, for a full-size preset', 'budget 5.0 MiB'."""
    source = budget_source(budget, hardware, preset)
    if source.startswith("the chip's HBM"):
        return "budget: " + source.replace("HBM", f"HBM, {fmt_bytes(budget)}", 1)
    return f"budget {fmt_bytes(budget)}" + (f" ({source})" if source else "")


def loaded_message(loaded: Loaded) -> tuple[str, str]:
    """What the page says of a model just loaded, and its level: its groups, conflicts, mesh
    and budget; a warning where no baseline fits (with a mesh where one does) or a pin was
    set aside."""
    ws = loaded.workspace
    an, c = ws.an, ws.config
    budget = budget_words(c.hw.budget, c.hw.name, ws.choice.preset)
    piped = (f", {c.pipeline.stack} pipelined over {c.pipeline.axis} ({c.pipeline.text()}, bubble {c.bubble():.0%})"
             if c.pipeline is not None else "")
    text = (f"{loaded.origin + ': ' if loaded.origin else ''}{ws.choice.title}: {len(an.decision_groups)} "
            f"decision groups, {len(an.conflicts)} conflict(s) on {c.mesh.text()}{piped} ({c.hw.name}, {budget})")
    static = an.static_inputs()
    if static:  # closed over when traced: no part of any plan
        text += (f"; static argument{'s' if len(static) > 1 else ''} left out of the plan: "
                 + ", ".join(p for p, _ in static[:3]) + (f" and {len(static) - 3} more" if len(static) > 3 else ""))
    level = "success"
    if not any(b.report.fits for b in loaded.baselines.values()):
        smallest = min(loaded.baselines.values(), key=lambda b: b.report.memory.peak)
        grow = (f"on {loaded.fitting_mesh} one does: try that mesh" if loaded.fitting_mesh else
                f"no mesh up to {loaded.tried_devices} devices with these axes fits one either")
        source = budget_source(c.hw.budget, c.hw.name, ws.choice.preset)
        text = (f"{ws.choice.title} on {c.mesh.text()}{piped}: no baseline fits the budget of {fmt_bytes(c.hw.budget)} "
                f"per device ({source + '; ' if source else ''}the smallest, {smallest.name}, needs "
                f"{fmt_bytes(smallest.report.memory.peak)}); {grow}; the search may find no plan here: raise "
                "the budget or grow the mesh")
        level = "warning"
    if loaded.notes:  # after the budget's warning, never in place of it
        text += "; " + "; ".join(loaded.notes)
        level = "warning"
    return text, level


def probe_of(state: ExplorerState) -> dict:
    """The state as JSON data, for tests and scripts (``partex-state``)."""
    best, ws = state.best, state.workspace
    an = ws.an if ws else None
    label = an.decision_label if an else str
    return {
        "phase": state.phase,
        "busy": list(state.busy),
        "model": ws.choice.to_json() if ws else None,
        "config": ws.config.to_json() if ws else None,
        "running": state.running,
        "simulations": state.stats.simulations,
        "best": None if best is None else {
            "step_time": best.report.step_time, "peak": best.report.memory.peak, "fits": best.report.fits,
            "decisions": [d.to_json() for d in best.plan.decisions], "simulation": best.simulation},
        "history": len(state.stats.best_history),
        "pins": [label(d) for d in state.pins],
        "forbidden": [label(d) for d in state.forbidden],
        "held": [label(d) for items in state.held for d in items],
        "baselines": {k: v.report.step_time for k, v in state.baselines.items()},
        "uploaded": None if state.uploaded is None else state.uploaded.plan.mesh.text(),
        "verify": state.verify_status,
        "measure": state.measure_status,
        "measured": {k: m.to_json() for k, (_, m) in state.measured.items()},
        "message": state.message,
        "level": state.message_level,
        "field_error": state.field_error,
        "selected": an.groups[state.selected_group].label if an and state.selected_group is not None else None,
        "sessions": list(state.sessions),
        "meshes": {"status": state.mesh_status, "rows": [
            {"mesh": r.label, "form": r.mesh, "pipeline": r.pipeline or None, "bubble": r.bubble, "hand": r.hand,
             "step": r.step, "note": r.note, "live": r.live}
            for r in state.mesh_rows]},
        "timings": {k: round(v, 1) for k, v in state.clock.timings.items()},
        "ping": state.ping,
        "server_pid": os.getpid(),
        "search_pid": state.runner.pid if state.runner is not None else None,
        "session": state.session_id,
    }


# --------------------------------------------------------------------------- jobs' bodies

def _build(choice: ModelSpec, config: Config, seed: int, res=None, pins=(), forbidden=(),
           same_step: bool = False) -> Loaded:
    """The page's session on ``config``. ``res``: the analysis (the model as written, or the
    pipelined step itself where ``same_step``: a new search on the same step)."""
    if res is None:
        res = ANALYSES.get(choice)
    pipeline = None if same_step else config.pipeline
    try:
        session = Session.from_analysis(res, mesh=config.mesh, hardware=config.hw, seed=seed, spec=choice,
                                        pipeline=pipeline)
    except PartexError as e:  # a pipeline the model cannot run: said at the pipeline field
        if pipeline is None or not str(e).startswith("pipeline "):
            raise
        raise PartexError(str(e), field="pipeline") from None
    notes = session.apply_pins(pins, forbidden)
    held = (tuple(p for p in pins if p not in session.pins), tuple(f for f in forbidden if f not in session.forbidden))
    # a pin that does not apply on this mesh is set aside, not lost: it comes back with a
    # mesh where it applies
    notes = [n.replace(" dropped: ", " set aside until it applies again: ", 1) for n in notes]
    ws = Workspace(choice, session)
    baselines = ws.baselines()
    fitting, tried = None, 0
    if not any(b.report.fits for b in baselines.values()):
        mesh, tried = fitting_mesh(res, config, tries=MESH_TRIES)
        fitting = mesh.text(links=True) if mesh else None
    return Loaded(ws, *_details(session.model), baselines, session, tuple(notes), held=held, fitting_mesh=fitting,
                  tried_devices=tried)


def _restore(name: str, path: pathlib.Path) -> Loaded:
    """A saved session (from the explorer or `partex search`), its search resumed."""
    session = Session.load(path, analyses=ANALYSES.get)
    choice = session.spec
    assert choice is not None  # Session.load without fn= loads MODEL-spec sessions only
    ws = Workspace(choice, session)
    form = {"mesh_text": session.mesh.text(links=True), "hardware": session.hardware.name,
            "budget_text": _budget_text(session.hardware.memory_budget),
            "margin_text": f"{session.hardware.memory_margin:g}", "seed": session.seed,
            "pipeline_text": session.pipeline.text() if session.pipeline is not None else ""}
    if choice.spec in demo_models.MODELS:
        form.update(model_name=choice.spec, preset=choice.preset, overrides=",".join(choice.overrides))
    else:
        form.update(model_name=CUSTOM, custom_model=choice.spec)
    return Loaded(ws, *_details(session.model), ws.baselines(), session, (), form, f"loaded session {name}")


def _budget_text(budget: float | None) -> str:
    """A budget as the form shows it ('3MiB'); empty for the chip's HBM."""
    if budget is None:
        return ""
    for unit, n in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if budget >= n and budget % n == 0:
            return f"{int(budget // n)}{unit}"
    return f"{budget:g}"


def _details(res) -> tuple[dict[int, GroupInfo], GraphLayout]:
    """Group details and the graph's layout (shared by the sessions on one demo model)."""
    infos = ANALYSES.derived(res, "infos", lambda: res.analysis.group_infos())
    return infos, ANALYSES.derived(res, "layout", lambda: graph_layout(res.analysis, infos))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "model"
