"""The state of one explorer session (one browser tab): the forms, and the model, search and
plans the page shows of them.

Views never reach for global state: each is handed an ``ExplorerState`` and reacts to its
parameters. Slow work (tracing a model, building a search, verifying with XLA) runs in a
worker thread (``_loop.Jobs``); its result is applied by ``poll``, which the page calls
periodically in the document's own context.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Mapping, Sequence

import param

from partex import PartexError, SearchStats, VerifyReport, demo_models

from ._banner import CONFIG_FIELDS, MESH_SEARCH_FIELDS, MODEL_FIELDS, Banner, one_line
from ._driver import SearchDriver
from ._engine import CUSTOM, ModelFolder, PlanSummary, demo_presets, hardware_names, max_upload
from ._forms import CONFIG_PARAMS, FORM_PARAMS, Forms, config_words, field_value
from ._link import Links
from ._loading import DEFAULT_BUDGET, Held, Loading
from ._loop import Jobs, PageClock
from ._meshcard import MeshCard
from ._meshes import DEFAULT_PIPELINES
from ._plancard import PlanCard
from ._pool import SearchPool, SearchTurn
from ._probe import Probe
from ._slice import ParamSlice
from ._store import SessionStore

log = logging.getLogger("partex.explorer")

DEFAULT_MODEL = "transformer"
DEFAULT_MESH = "data=4,model=2"
DEFAULT_HARDWARE = "tpu-v4"


class ExplorerState(param.Parameterized):
    """One browser session's explorer state: the forms, and what the page shows of the model
    loaded from them. Its parameters are what the views watch; its methods are the page's
    actions (load, run, pin, upload, verify, save). It holds the parameters, the jobs in
    worker threads (``busy``) and the page's clock; each action is carried out by the part
    that owns it, handed the slice of the parameters it sets (``ParamSlice``), which sets
    them in the order a page relies on (the message before the data it explains, ``busy``
    cleared last). The parts:

    - ``banner`` (``Banner``): a bad input's mark at its form field, the standing warning;
    - ``forms`` (``Forms``): the model and configuration the forms name, the preset's budget;
    - ``loading`` (``Loading``): a model built and put on the page, the pins set aside;
    - ``driver`` (``SearchDriver``): the page's search: run, pause, step, pin, its snapshots;
    - ``plan_card`` (``PlanCard``): the plan shown, an upload, verify and measure;
    - ``mesh_card`` (``MeshCard``): the Meshes card's search;
    - ``store`` (``SessionStore``): the sessions folder;
    - ``models`` (``ModelFolder``): the folder a user's own model may come from;
    - ``links`` (``Links``): the page opened on a link's state, and the link to its own (``link``);
    - ``prober`` (``Probe``): the state as JSON, for tests and scripts (``probe``).

    What the server's operator allows (``partex serve``; None: the server's environment):
    ``sessions_dir``, the sessions folder; ``models_dir``, the folder of models a user may
    load (unset: the demo models only); ``upload_limit``, the largest file the page takes
    (bytes or text such as ``4MiB``); ``pool``, the server's search slots the page's search
    takes turns at (``_pool``; None: a slot of the page's own, as where there is no server)."""

    # ---- the forms
    model_name = param.Selector(default=DEFAULT_MODEL, objects=[*demo_models.MODELS, CUSTOM], doc="""
        A demo model, or 'custom' for a FILE.py:function of your own (from the server's models folder).""")
    preset = param.Selector(default="tiny", objects=demo_presets(DEFAULT_MODEL), doc="Demo model preset.")
    overrides = param.String(default="", doc="Demo config overrides, e.g. 'layers=4,batch=16'.")
    custom_model = param.String(default="", doc="FILE.py:function in the server's models folder, returning "
                                                "(fn, example_args).")
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
    search_queue = param.String(default="", doc="""
        The page's place in the queue for one of the server's search slots, in words; empty: not waiting.""")
    message = param.String(default="")
    # "refused": a refused input, said at its field too (``Banner.bad_input``)
    message_level = param.Selector(default="info", objects=["info", "success", "warning", "danger", "refused"])
    # the form field a bad input came from (one of _banner.FORM_FIELDS) and its message: the field
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
    verified_plan = param.String(default="")  # the plan verify_result is of (or awaited for): "search", a baseline
    measure_status = param.String(default="")
    measured = param.Dict(default={}, doc="plan name -> (its plan's digest, Measured): run on this machine's devices")
    sessions = param.List(default=[], doc="Saved sessions in the sessions folder.")
    mesh_rows = param.List(default=[], doc="MeshRow per mesh the mesh search tried, best first.")
    mesh_status = param.String(default="", doc="The mesh search's progress or outcome, in words.")
    opened_session = param.String(default="", doc="""
        The saved session the page's search is (loaded, and no other search since); empty: none.""")
    link = param.String(default="", doc="""
        The query of a link that opens the page's state (``_link.link_query``); empty: no model yet.""")
    probe = param.String(default="{}", doc="JSON of the state, for tests and scripts.")
    ping = param.String(default="")

    def __init__(self, sessions_dir: str | os.PathLike | None = None, session_id: str = "",
                 link: Mapping[str, Any] | None = None, *, models_dir: str | os.PathLike | None = None,
                 upload_limit: int | str | None = None, pool: SearchPool | None = None, **params):
        """``link``: the query of the link the page was opened with (``pn.state.session_args``),
        whose state it opens on (``open_link``); None or empty: the default page."""
        super().__init__(**params)
        self.session_id = session_id or f"{id(self):x}"
        self.jobs = Jobs(self.session_id)
        self.clock = PageClock(self.session_id)
        self.store = SessionStore(sessions_dir)
        self.models = ModelFolder(models_dir)
        self.upload_limit = max_upload(upload_limit)
        self.banner = Banner(ParamSlice(self, "field_error", reads=("message", "message_level")), self.notify,
                             hidden=lambda: "overrides" if self.model_name == CUSTOM else "custom",
                             in_force=self._in_force, kept=lambda field: field_value(self.config, field))
        self.forms = Forms(ParamSlice(self, *FORM_PARAMS, reads=("workspace",)), self.banner, self.param.preset,
                           self.models)
        self.param.watch(self.clock.watcher("the model named", self.forms.model_named), ["model_name"])
        self.param.watch(self.clock.watcher("the model's choice", self.forms.choice_changed), ["model_name", "preset"])
        self.param.watch(self.clock.watcher("the config's form", self._on_config_form), list(CONFIG_PARAMS))
        self.prober = Probe(self, self.clock)
        probe = self.prober.update
        self.driver = SearchDriver(ParamSlice(self, "running", "best", "stats", "pins", "forbidden", "search_queue",
                                              reads=("workspace", "config", "baselines")),
                                   self.banner, probe, self.internal_error, self.session_id,
                                   SearchTurn(pool if pool is not None else SearchPool(1), self.session_id))
        self.plan_card = PlanCard(ParamSlice(self, "uploaded", "shown_plan", "verify_status", "verify_result",
                                             "verified_plan", "measure_status", "measured",
                                             reads=("best", "baselines", "workspace", "config", "busy")),
                                  self.banner, self._submit, lambda: self.driver.runner, probe, self.upload_limit)
        self.mesh_card = MeshCard(ParamSlice(self, "mesh_rows", "mesh_status", reads=("busy", "config")),
                                  self.banner, self._mark, self.session_id, self.driver.turn)
        self.loading = Loading(ParamSlice(self, "workspace", "config", "infos", "graph", "baselines",
                                          "selected_group", "phase", "opened_session",
                                          reads=("pins", "forbidden", "running")),
                               self.banner, self.driver, self.plan_card, self.mesh_card, self._submit,
                               self.forms.write, self.forms.loaded, probe, self.models.analysis)
        # what a failed job leaves on the page besides its message
        self._on_failure: dict[str, Callable[[], None]] = {
            "load": self.loading.failed, "verify": self.plan_card.verify_failed,
            "measure": self.plan_card.measure_failed}
        self.links = Links(ParamSlice(self, "link", reads=(*FORM_PARAMS, "sessions", "workspace", "pins",
                                                           "forbidden", "opened_session")),
                           {p: self.param[p].default for p in FORM_PARAMS}, self.store, self.forms.write,
                           self.loading.open, models=self.models,
                           hardware=list(self.param.hardware.objects))
        self.param.watch(self.clock.watcher("the link's state", self.links.relink),
                         ["workspace", "pins", "forbidden", "opened_session"])
        self.refresh_sessions()
        if link:
            self.open_link(link)
        else:
            self.load()

    @property
    def runner(self):
        """The page's search (a ProcessRunner or ThreadRunner); None until a model loads."""
        return self.driver.runner

    @property
    def held(self) -> Held:
        """The pins and forbids set aside: they do not apply on this mesh."""
        return self.loading.held

    # ------------------------------------------------------------------ messages and jobs
    def notify(self, text: Any, level: str = "info") -> None:
        """Show a one-line message on the page (the text and its level change together)."""
        with param.parameterized.batch_call_watchers(self):
            self.message_level = level
            self.message = one_line(text)

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

    def _submit(self, kind: str, work: Callable[[], Any], done: Callable[[Any], None]) -> None:
        """Run work() in a worker thread; done(result) runs later in the page's context
        (from poll). A newer job of one kind supersedes an older one still running."""
        self._mark(kind, True)
        self.jobs.submit(kind, work, done)

    def _mark(self, kind: str, on: bool) -> None:
        """``kind`` (a job's, or "meshes") joins or leaves ``busy``."""
        if on and kind not in self.busy:
            self.busy = [*self.busy, kind]
        elif not on and kind in self.busy:
            self.busy = [b for b in self.busy if b != kind]

    def _drain(self) -> list[str]:
        """Apply the result of the first job finished (less those superseded; the next poll
        applies the next); returns its kind, or nothing."""
        for kind, gen, done, status, value in self.jobs.finished():  # less the superseded
            if status == "ok":
                try:
                    done(value)
                except Exception as e:  # partex's own bug: the traceback goes to the log, the page goes on
                    self._done(kind, gen)
                    self.internal_error(f"applying the {kind} job's result", e)
            else:
                failed = self._on_failure.get(kind)
                if failed is not None:
                    failed()
                self.banner.bad_input(value, unapplied=self.forms.unapplied(self.config))
            # the job leaves ``busy`` once its result is in place: a page never sees it done
            # with the old model or configuration still shown
            self._done(kind, gen)
            return [kind]
        return []

    def _done(self, kind: str, gen: int) -> None:
        if self.jobs.latest(kind, gen):  # no newer job of its kind was started by its result
            self._mark(kind, False)

    def _on_config_form(self, event) -> None:
        if not self.forms.quiet:
            self.apply_config()

    def _in_force(self, field: str) -> str:
        """What stays in force when the input of ``field`` is refused, in words."""
        if field in MESH_SEARCH_FIELDS:
            return "the Meshes card keeps what it shows"
        if field == "session":
            return "nothing was saved"
        ws = self.workspace
        if ws is None:
            return "nothing is loaded yet: fix it and press Analyze"
        if field in MODEL_FIELDS:
            return f"the page stays on {ws.choice.title}"
        return f"the page stays on {config_words(self.config)}"

    # ------------------------------------------------------------------ the model
    def load(self) -> None:
        """Analyse the model in the forms on the mesh in the forms (Analyze button): the one
        action that puts another model on the page."""
        try:
            choice = self.forms.choice()
            config = self.forms.config()
        except PartexError as e:
            self.banner.bad_input(e)
            return
        self.loading.load(choice, config, self.seed)

    def apply_overrides(self) -> None:
        """Enter in the config overrides: the model on the page again, with them. Where the
        model picker names another model, only Analyze loads it: the page stays, and says so."""
        ws = self.workspace
        if ws is not None and not self.forms.names(ws.choice):
            self.forms.say_analyze()
            return
        self.load()

    def apply_config(self, start: Sequence[tuple[str, str]] = ()) -> None:
        """The mesh / hardware / budget form changed: a new search on the same model.
        ``start``: a plan found on that configuration ((label, slot) pairs: a Meshes card
        row's), which the search starts from (the page's own search, where it is on that
        configuration already). Refused, the configuration in force stays (or the one a load
        in flight brings), and the fields whose value is not its are marked as not applied."""
        try:
            config = self.forms.config()
        except PartexError as e:
            coming = self.loading.coming if "load" in self.busy else None
            self.banner.bad_input(e, unapplied=self.forms.unapplied(coming or self.config))
            return
        if start and config == self.config:
            self.driver.consider(start)
        # the job first: a page that sees the mark gone sees the new search being built
        self.loading.reconfigure(config, self.seed, start)
        self.banner.clear(*CONFIG_FIELDS)  # the form reads well: a new search (whose failure may set it again)
        if self.workspace is None:
            self.load()

    # ------------------------------------------------------------------ the search
    def run(self) -> None:
        self.driver.run()

    def pause(self) -> None:
        self.driver.pause()

    def step(self) -> None:
        self.driver.step(self.step_size)

    def reset(self) -> None:
        """A fresh search on the same model and mesh; pins and forbids are kept."""
        if self.workspace is None:
            return self.load()
        self.loading.reset(self.seed)

    def pin(self, group: int | None, axis: str | None) -> None:
        self.driver.decide("pin", group, axis)

    def forbid(self, group: int | None, axis: str | None) -> None:
        self.driver.decide("forbid", group, axis)

    def unpin(self, group: int | None, axis: str | None) -> None:
        self.driver.decide("unpin", group, axis)

    # ------------------------------------------------------------------ plans
    def plan_summary(self, name: str | None = None) -> PlanSummary | None:
        """The plan ``name`` ("search", "uploaded" or a baseline's; None: the one shown)."""
        return self.plan_card.summary(name)

    def plan_filename(self) -> str:
        return self.plan_card.filename()

    def plan_json(self) -> str | None:
        """The best plan's JSON (the Download button)."""
        return self.plan_card.json()

    def upload_plan(self, data: bytes, filename: str) -> None:
        self.plan_card.upload(data, filename)

    def verify(self) -> None:
        """Compile the shown plan with XLA on simulated devices (a subprocess) and compare."""
        self.plan_card.verify()

    def measure(self, steps: int = 3) -> None:
        """Run the listed plans that fit on this machine's devices (``PlanCard.measure``)."""
        self.plan_card.measure(steps)

    # ------------------------------------------------------------------ links
    def open_link(self, query: Mapping[str, Any]) -> None:
        """Open the state a link's ``query`` names (``Links.open``)."""
        self.links.open(query)

    # ------------------------------------------------------------------ sessions
    def refresh_sessions(self) -> None:
        self.sessions = self.store.names()

    def save_session(self) -> None:
        """Save the search (the same file ``partex search --resume`` continues)."""
        name = self.session_name.strip()
        try:
            path = self.store.path(name)
        except PartexError as e:
            self.banner.bad_input(PartexError(str(e), field="session"))
            return
        r = self.driver.need_runner()
        if r is None:
            return
        def done(ok: bool, value) -> None:
            if not ok:
                self.notify(f"could not save session {name}: {value}", "danger")
                return
            self.refresh_sessions()
            self.notify(f"saved session {name} ({self.stats.simulations} simulations) to {path}; resume it here or "
                        f"with `partex search {self.workspace.choice.spec} --resume {path} --out plan.json`", "success")

        try:
            self.store.save(r, path, done)
        except OSError as e:
            self.notify(f"could not save session {name}: {e}", "danger")
            return
        self.banner.clear("session")
        self.notify(f"saving session {name}: the search writes it once its simulation under way ends", "info")

    def load_session(self, name: str | None) -> None:
        if not name:
            self.notify("choose a saved session to load", "warning")
            return
        try:
            path = self.store.path(name)
        except PartexError as e:
            self.notify(str(e), "danger")
            return
        self.loading.restore(name, path)

    # ------------------------------------------------------------------ the mesh as a decision
    def search_meshes(self, devices, topology: str, seconds, max_axes, pipelines: str = DEFAULT_PIPELINES) -> None:
        """Search the meshes of ``devices`` with the page's model (the Meshes card,
        ``MeshCard.search``)."""
        self.mesh_card.search(self.workspace, devices, topology, seconds, max_axes, pipelines)

    def stop_meshes(self) -> None:
        """Stop the mesh search: the meshes tried so far stay in the card."""
        self.mesh_card.stop()

    def use_mesh(self, text: str | None) -> None:
        """Continue on a candidate the mesh search tried (``MESH`` or ``MESH | PIPELINE``):
        the mesh and pipeline forms take it, and the page's search starts again there from the
        plan the mesh search found (pins kept where they apply: on the same step)."""
        if not text:
            self.notify("no mesh to use yet: search the meshes first", "warning")
            return
        row = next((r for r in self.mesh_rows if r.key == text), None)
        mesh, _, pipe = text.partition("|")
        self.forms.write({"mesh_text": mesh.strip(), "pipeline_text": pipe.strip()})
        self.apply_config(row.plan if row is not None else ())

    # ------------------------------------------------------------------ the page's clock
    def poll(self) -> list[str]:
        """Apply a finished job's result, the mesh search's rounds and the search's latest
        snapshot (called every ~200 ms, timed by the page: ``_app``); returns what it applied
        of the jobs, in words. A poll that applied a job's result leaves the snapshot to the
        next: each redraws most of the page, and one callback doing both held the page up
        twice as long."""
        applied = self._drain()
        self.mesh_card.poll()
        if not applied:
            self.driver.poll()
        return [f"applying the {kind} job's result" for kind in applied]

    def close(self) -> None:
        """The tab closed: stop its searches."""
        self.driver.close()
        self.mesh_card.close()
