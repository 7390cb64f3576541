"""Putting a model on the page (``Loading``): its session built in a worker thread (``_build``
for the forms' model and mesh, ``_restore`` for a saved session), then installed in the page
with the message that says what loaded (``loaded_message``)."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Callable, NamedTuple, Sequence

from partex import Decision, GroupInfo, ModelAnalysis, ModelSpec, PartexError, Session, demo_models, parse_bytes

from ._banner import Banner
from ._driver import SearchDriver
from ._engine import (ANALYSES, CUSTOM, MESH_TRIES, Config, PlanSummary, Workspace, fitting_mesh, hardware_of,
                      settle_heap)
from ._format import fmt_bytes
from ._layout import GraphLayout, graph_layout
from ._loop import Submit
from ._meshcard import MeshCard
from ._plancard import PlanCard
from ._slice import ParamSlice

Analyses = Callable[[ModelSpec], ModelAnalysis]  # a model's analysis (``ModelFolder.analysis``)

# The tiny demo models need a few MiB per device: a budget in that range makes the
# trade-offs visible (replicating the tiny transformer does not fit, sharding does).
DEFAULT_BUDGET = "3MiB"  # the tiny demos': tight enough that sharding matters


def default_budget(preset: str) -> str:
    """The budget the form shows for a preset: 3 MiB for the tiny demos, the chip's HBM
    (empty) for the full-size ones."""
    return DEFAULT_BUDGET if preset == "tiny" else ""


class Held(NamedTuple):
    """Pins and forbids set aside: they do not apply on the page's mesh, and come back with a
    mesh where they apply."""

    pins: tuple[Decision, ...] = ()
    forbidden: tuple[Decision, ...] = ()


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
    saved: str = ""  # the saved session's name, for a saved session
    held: Held = Held()  # pins and forbids that do not apply here, kept for later
    # form fields whose value the load did not take (a link's, ``_link``), each with why: marked as
    # a refused input's are, once the model is on the page
    marks: tuple[tuple[str, str], ...] = ()
    # where no baseline fits: a larger mesh on which one does (None: none up to tried_devices)
    fitting_mesh: str | None = None
    tried_devices: int = 0


class Loading:
    """Puts a model on the page and keeps what carries over to the next one. Owns the pins and
    forbids set aside on a mesh where they do not apply (``held``). ``page`` sets the model's
    parameters (``workspace``, ``config``, ``infos``, ``graph``, ``baselines``,
    ``selected_group``, ``phase``; ``opened_session``: the saved session it is) and reads the
    search's pins, forbids and ``running``.
    Installing a model also starts its search (``driver``), clears the plan and mesh cards
    (``plans``, ``meshes``) of what belonged to another, shows the forms a saved session was
    made with (``set_forms``) and lifts the marks of the forms that read well now
    (``forms_loaded``). The builds run through ``submit``; ``probe()`` updates the state's JSON;
    every model comes from ``analyses`` (the one gate a user's own model passes)."""

    def __init__(self, page: ParamSlice, banner: Banner, driver: SearchDriver, plans: PlanCard, meshes: MeshCard,
                 submit: Submit, set_forms: Callable[[dict], None], forms_loaded: Callable[[Workspace], None],
                 probe: Callable[[], None], analyses: Analyses):
        self.page = page
        self.analyses = analyses
        self.banner = banner
        self.driver = driver
        self.plans = plans
        self.meshes = meshes
        self.submit = submit
        self.set_forms = set_forms
        self.forms_loaded = forms_loaded
        self.probe = probe
        self.held = Held()
        self.coming: Config | None = None  # the configuration of the last build asked for (None: a saved one's)

    # ------------------------------------------------------------------ the page's actions
    def load(self, choice: ModelSpec, config: Config, seed: int) -> None:
        """Analyse ``choice`` on ``config``: a new model on the page."""
        self.page.phase = "loading"
        self.coming = config
        self.submit("load", lambda: _build(choice, config, seed, self.analyses), self.install)

    def reconfigure(self, config: Config, seed: int, start: Sequence[tuple[str, str]] = ()) -> None:
        """A new search on the page's model with ``config`` (another mesh, hardware or budget),
        its pins carried over where they apply; ``start``: a plan found there, (label, slot)
        pairs, that the search starts from (``Session.consider``)."""
        ws = self.page.workspace
        if ws is None or config == self.page.config:
            return
        pins, forbidden = self.carried()
        if self.page.config is not None and config.pipeline != self.page.config.pipeline:
            pins, forbidden = (), ()  # another pipeline is another step: its groups are others
        self.coming = config
        self.submit("load", lambda: _build(ws.choice, config, seed, self.analyses, ws.base, pins, forbidden,
                                           start=start),
                    self.install)

    def reset(self, seed: int) -> None:
        """A fresh search on the page's model and mesh (there must be one); pins and forbids
        are kept."""
        ws = self.page.workspace
        pins, forbidden = self.carried()
        self.driver.pause()
        self.coming = ws.config
        self.submit("load", lambda: _build(ws.choice, ws.config, seed, self.analyses, ws.res, pins, forbidden,
                                           same_step=True),
                    self.install)

    def restore(self, name: str, path: pathlib.Path) -> None:
        """Load the saved session ``name`` (its file ``path``), its search resumed."""
        self.open(lambda: _restore(name, path, self.analyses), None)

    def open(self, build: Callable[[], Loaded], coming: Config | None) -> None:
        """Put on the page what ``build()`` makes in a worker thread (a saved session, a link's
        state); ``coming``: the configuration it brings (None: a saved session's own)."""
        self.driver.pause()
        self.page.phase = "loading"
        self.coming = coming
        self.submit("load", build, self.install)

    def failed(self) -> None:
        """A load failed: the model before stays (if there was one)."""
        self.page.phase = "ready" if self.page.workspace is not None else "failed"

    def carried(self) -> tuple[list, list]:
        """The pins and forbids to carry to a new search: those in force, then those set
        aside on an earlier mesh (they come back where they apply)."""
        pins, forbidden = self.page.pins, self.page.forbidden
        return (list(pins) + [p for p in self.held.pins if p not in pins],
                list(forbidden) + [f for f in self.held.forbidden if f not in forbidden])

    # ------------------------------------------------------------------ a build's result
    def install(self, loaded: Loaded) -> None:
        """Show what a load built, in the order a page relies on: the old model's pins gone
        before the new model comes, the new model's after it; the message before ``ready``."""
        driver, page = self.driver, self.page
        driver.stop()  # should anything below fail, no closed runner is left in place
        ws, old = loaded.workspace, page.workspace
        same_model = old is not None and ws.res is old.res
        was_running = page.running and same_model
        if loaded.form:
            self.set_forms(loaded.form)
        if not same_model:
            # pins and forbids are group ids of the old model: gone before the new model comes,
            # so no view ever reads them against it (the new model's come after it, below);
            # the page says which went
            if old is not None:
                before = Held((*page.pins, *self.held.pins), (*page.forbidden, *self.held.forbidden))
                after = Held((*loaded.session.pins, *loaded.held.pins),
                             (*loaded.session.forbidden, *loaded.held.forbidden))
                dropped = dropped_words(old, ws, before, after)
                loaded = dataclasses.replace(loaded, notes=(*loaded.notes, dropped) if dropped else loaded.notes)
            driver.drop_decisions()
            self.held = Held()
        with page.batch():
            page.set(workspace=ws, config=ws.config, infos=loaded.infos, graph=loaded.graph,
                     baselines=loaded.baselines, opened_session=loaded.saved)
            driver.fresh()
            self.plans.keep_for(ws)
            if not same_model or page.selected_group not in loaded.infos:
                page.selected_group = None  # group ids belong to one analysis
            self.plans.keep_shown(loaded.baselines)
        self.meshes.keep_for(ws)
        self.forms_loaded(ws)
        if loaded.marks:  # after the marks of the fields that read well went: these do not
            self.banner.mark(dict(loaded.marks))
        driver.start(loaded.session, ws)
        self.plans.score_again()
        self.held = loaded.held
        text, level = loaded_message(loaded)
        self.banner.standing = text if level == "warning" else ""
        self.banner.notify(text, level)
        page.phase = "ready"  # after the message: a page that sees "ready" sees its summary
        if was_running:
            driver.run()
        self.probe()


# --------------------------------------------------------------------------- the page's words

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


def dropped_words(old: Workspace, new: Workspace, before: Held, after: Held) -> str:
    """What a new step on the page drops of the old one's, in words ("" for nothing): the pins
    and forbids ``before`` (in force or set aside; decisions on the old step's groups) that
    are not among those ``after`` (the new step's), and, on the same model, the old step's
    own shardings the new one has not (a pipeline's layers on its stage axis)."""
    now = {new.an.decision_label(d) for d in (*after.pins, *after.forbidden)}
    lost = ([f"pin {label}" for label in map(old.an.decision_label, before.pins) if label not in now]
            + [f"forbid {label}" for label in map(old.an.decision_label, before.forbidden) if label not in now])
    if new.choice != old.choice:
        why, own = f"another model: {old.choice.title}'s decisions do not carry over", []
    else:
        kept = {(f["group"], f["axis"]) for f in new.session.fixed}
        own = [f"{_group_title(old.an, f['group'])}→{f['axis'] or 'unsharded'}" for f in old.session.fixed
               if (f["group"], f["axis"]) not in kept]
        why = "another pipeline is another step, with groups of its own"
    said = ([f"dropped {', '.join(lost)} (pin again what still applies)"] if lost else []) + (
        [f"the old step's own {', '.join(own)} went with it"] if own else [])
    return f"{why}: {'; '.join(said)}" if said else ""


def _group_title(an, label: str) -> str:
    """A group's title from its label (the label itself where the analysis has no such group)."""
    group = an.group_by_label(label)
    return an.titles[group.id] if group is not None else label


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


# --------------------------------------------------------------------------- jobs' bodies

def _build(choice: ModelSpec, config: Config, seed: int, analyses: Analyses, res=None, pins=(), forbidden=(),
           same_step: bool = False, start: Sequence[tuple[str, str]] = ()) -> Loaded:
    """The page's session on ``config``. ``res``: the analysis (the model as written, or the
    pipelined step itself where ``same_step``: a new search on the same step; None: the
    model's, from ``analyses``); ``start``: a plan found on ``config`` that the search starts
    from, after the pins."""
    if res is None:
        res = analyses(choice)
    pipeline = None if same_step else config.pipeline
    try:
        session = Session.from_analysis(res, mesh=config.mesh, hardware=config.hw, seed=seed, spec=choice,
                                        pipeline=pipeline)
    except PartexError as e:  # a pipeline the model cannot run: said at the pipeline field
        if pipeline is None or not str(e).startswith("pipeline "):
            raise
        raise PartexError(str(e), field="pipeline") from None
    notes = session.apply_pins(pins, forbidden)
    if start:
        session.consider(start)
    held = Held(pins=tuple(p for p in pins if p not in session.pins),
                forbidden=tuple(f for f in forbidden if f not in session.forbidden))
    # a pin that does not apply on this mesh is set aside, not lost: it comes back with a
    # mesh where it applies
    notes = [n.replace(" dropped: ", " set aside until it applies again: ", 1) for n in notes]
    ws = Workspace(choice, session)
    baselines = ws.baselines()
    fitting, tried = None, 0
    if not any(b.report.fits for b in baselines.values()):
        mesh, tried = fitting_mesh(res, config, tries=MESH_TRIES)
        fitting = mesh.text(links=True) if mesh else None
    loaded = Loaded(ws, *_details(session.model), baselines, session, tuple(notes), held=held, fitting_mesh=fitting,
                    tried_devices=tried)
    settle_heap()  # here, not on the page's event loop: the new model is long-lived, out of later collections
    return loaded


def _restore(name: str, path: pathlib.Path, analyses: Analyses) -> Loaded:
    """A saved session (from the explorer or `partex search`), its search resumed; its model
    from ``analyses`` (a user's own only from the page's models folder)."""
    session = Session.load(path, analyses=analyses)
    choice = session.spec
    assert choice is not None  # Session.load without fn= loads MODEL-spec sessions only
    ws = Workspace(choice, session)
    form = {"mesh_text": session.mesh.text(links=True), "hardware": session.hardware.name,
            "budget_text": budget_text(session.hardware.memory_budget),
            "margin_text": f"{session.hardware.memory_margin:g}", "seed": session.seed,
            "pipeline_text": session.pipeline.text() if session.pipeline is not None else ""}
    if choice.spec in demo_models.MODELS:
        form.update(model_name=choice.spec, preset=choice.preset, overrides=",".join(choice.overrides))
    else:
        form.update(model_name=CUSTOM, custom_model=choice.spec)
    loaded = Loaded(ws, *_details(session.model), ws.baselines(), session, (), form, f"loaded session {name}",
                    saved=name)
    settle_heap()
    return loaded


def budget_text(budget: float | None) -> str:
    """A budget as the form shows it ('3MiB'); empty for the chip's HBM."""
    if budget is None:
        return ""
    for unit, n in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if budget >= n and budget % n == 0:
            return f"{int(budget // n)}{unit}"
    # every digit: the form (and a link) reads back the same budget
    return f"{int(budget)}" if float(budget).is_integer() else repr(float(budget))


def _details(res) -> tuple[dict[int, GroupInfo], GraphLayout]:
    """Group details and the graph's layout (shared by the sessions on one demo model)."""
    infos = ANALYSES.derived(res, "infos", lambda: res.analysis.group_infos())
    return infos, ANALYSES.derived(res, "layout", lambda: graph_layout(res.analysis, infos))
