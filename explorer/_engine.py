"""The explorer's side of the engine: a cache of demo-model analyses, the mesh / hardware /
budget form, and the plans the views show. Everything goes through the public ``partex``
API (``partex.Session`` does the work); nothing here touches Panel, and everything here
may run in a worker thread.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import math
import os
import threading
from typing import Any, Callable, Sequence

from partex import (
    HARDWARE, CostReport, Decision, Hardware, Memory, MeshSpec, ModelAnalysis, ModelSpec, PartexError, Pipeline,
    Plan, Recompute, Session, analyze_model, as_hardware, as_mesh, demo_models, format_bytes, parse_bytes,
)

from ._access import MAX_UPLOAD, MAX_UPLOAD_ENV, MODELS_DIR_ENV

CUSTOM = "custom"  # the model picker's entry for a user's own FILE.py:attr

# Hardware profiles measured on the operator's devices (``partex serve --hardware-profile
# FILE``, passed to the server in PARTEX_HARDWARE_PROFILES): the hardware field offers each by
# its hardware's name (``Hardware.name``) beside the presets. A bad file is the operator's
# input: ``register_profiles`` says which and why.
PROFILES: dict[str, str] = {}
PROFILES_ENV = "PARTEX_HARDWARE_PROFILES"


def register_profiles(paths: Sequence[str]) -> None:
    """Offer the profiles at ``paths`` in the hardware field (PartexError: a file that is no
    profile)."""
    for path in paths:
        hw = Hardware.load(path)
        name = hw.name if hw.name not in PROFILES else f"{hw.name} ({os.path.basename(path)})"
        PROFILES[name] = os.path.abspath(path)


register_profiles([p for p in os.environ.get(PROFILES_ENV, "").split(os.pathsep) if p])


def hardware_names() -> list[str]:
    """The hardware field's choices: the presets, then the profiles the server was given."""
    return [*HARDWARE, *PROFILES]


def hardware_of(name: str, budget: str | float | None = None) -> Hardware:
    """The hardware a field value names (a preset, or a profile's name), with a budget."""
    return as_hardware(PROFILES.get(name, name), budget)


# --------------------------------------------------------------------------- models

def demo_presets(name: str) -> list[str]:
    return list(demo_models.MODELS[name].presets) if name in demo_models.MODELS else ["custom"]


def split_overrides(text: str) -> list[str]:
    """'layers=4, batch=16' -> ['layers=4', 'batch=16']."""
    return [s.strip() for s in (text or "").replace(";", ",").split(",") if s.strip()]


class _AnalysisCache:
    """Demo-model analyses are immutable and take a second or two to trace: share them
    between browser sessions. User models are never cached (their file may change)."""

    def __init__(self, size: int = 8):
        self.size = size
        self._lock = threading.Lock()
        self._items: collections.OrderedDict[ModelSpec, ModelAnalysis] = collections.OrderedDict()
        self._key_locks: dict[ModelSpec, threading.Lock] = collections.defaultdict(threading.Lock)
        self._derived: dict[tuple[int, str], Any] = {}  # (id of a cached analysis, what) -> value

    def get(self, spec: ModelSpec, models_dir: str | None = None) -> ModelAnalysis:
        """The analysis of ``spec``: a demo model's shared, a user's own (only from
        ``models_dir``: ``_analyze``) made anew."""
        if spec.spec not in demo_models.MODELS:
            return _analyze(spec, models_dir)
        with self._lock:
            key_lock = self._key_locks[spec]
        with key_lock:  # two sessions asking for one model trace it once
            with self._lock:
                if spec in self._items:
                    self._items.move_to_end(spec)
                    return self._items[spec]
            res = _analyze(spec)
            settle_heap()
            with self._lock:
                self._items[spec] = res
                while len(self._items) > self.size:
                    _, old = self._items.popitem(last=False)
                    self._derived = {k: v for k, v in self._derived.items() if k[0] != id(old)}
            return res

    def derived(self, res: ModelAnalysis, what: str, make: Callable[[], Any]) -> Any:
        """make(), computed once per cached analysis (graph layout, group details)."""
        with self._lock:
            cached = any(r is res for r in self._items.values())
            key = (id(res), what)
            if cached and key in self._derived:
                return self._derived[key]
        value = make()
        if cached:
            with self._lock:
                self._derived[key] = value
        return value


def settle_heap() -> None:
    """Move what is alive now (modules, a cached analysis) out of the garbage collector's
    reach. A full collection scans every tracked object and holds the GIL throughout:
    with JAX, Bokeh and Panel loaded that is ~100 ms or more, a stall of the page; frozen
    objects are skipped. Only long-lived objects are alive at these points."""
    gc.collect()
    gc.freeze()


def _analyze(spec: ModelSpec, models_dir: str | None = None) -> ModelAnalysis:
    """The model's analysis; its bad input names the form field that holds it: a user's
    model ("custom", its FILE.py:attr) or a demo model's config ("overrides": the preset
    itself is always valid, so a demo fails to build only on what the overrides made). A
    user's model comes from ``models_dir`` only (None: from nowhere), whoever named it: the
    form, or a saved session's file; and by its real path (``ModelSpec.within``), the name
    that what runs it later (a verification, a measurement, in a process of its own) loads
    again."""
    try:
        if spec.spec not in demo_models.MODELS:
            if models_dir is None:
                raise PartexError(CUSTOM_OFF)
            confined = spec.within(models_dir)
            if confined != spec:
                raise PartexError(f"{spec.spec}: the page loads that model only by its real path, "
                                  f"{confined.spec}")
        return analyze_model(spec.spec, preset=spec.preset, overrides=list(spec.overrides), models_dir=models_dir)
    except PartexError as e:
        field = e.field or ("overrides" if spec.overrides else None) if spec.spec in demo_models.MODELS else "custom"
        raise PartexError(str(e), field=field) from None


ANALYSES = _AnalysisCache()

CUSTOM_OFF = ("models of your own are off on this server: it loads the demo models only (its operator "
              "allows a folder of models with `partex serve --models-dir DIR`)")


class ModelFolder:
    """Where a page may load its user's own models from: ``FILE.py:function`` inside
    ``folder`` (None: ``$PARTEX_MODELS_DIR``, which ``partex serve --models-dir`` sets; unset:
    nowhere, the demo models only). Every model a page loads comes through ``analysis``,
    which checks the folder again whatever named the model (the form, a saved session)."""

    def __init__(self, folder: str | os.PathLike | None = None):
        folder = folder if folder is not None else os.environ.get(MODELS_DIR_ENV) or None
        self.folder = os.path.realpath(folder) if folder is not None else None

    def choice(self, text: str) -> ModelSpec:
        """The user's own model the form names, as a ModelSpec of the file's real path
        (PartexError at the "custom" field: off, or not a function of a file in the folder)."""
        text = (text or "").strip()
        if self.folder is None:
            raise PartexError(CUSTOM_OFF, field="custom")
        if not text:
            raise PartexError(f"name your model as FILE.py:function, FILE in {self.folder} (a function that "
                              "returns (fn, example_args))", field="custom")
        try:
            return ModelSpec(text, "custom", ()).within(self.folder)
        except PartexError as e:
            raise PartexError(str(e), field="custom") from None

    def analysis(self, spec: ModelSpec) -> ModelAnalysis:
        """The analysis of ``spec`` (``ANALYSES.get``): a user's own model only from the folder."""
        return ANALYSES.get(spec, self.folder)

    def about(self) -> str:
        """Where the page's own models come from, in words (the field's tooltip)."""
        if self.folder is None:
            return "Off on this server: its operator allows a folder of models with partex serve --models-dir DIR"
        return (f"A function in a Python file in {self.folder}, as FILE.py:function, returning (fn, example_args) "
                "or (fn, example_args, axis_names)")


def max_upload(limit: int | str | None = None) -> int:
    """The largest file a page takes, in bytes: ``limit`` (None: ``$PARTEX_MAX_UPLOAD``,
    which ``partex serve --max-upload`` sets; unset: ``MAX_UPLOAD``). PartexError for a size
    that does not read."""
    limit = limit if limit is not None else os.environ.get(MAX_UPLOAD_ENV) or MAX_UPLOAD
    return int(parse_bytes(limit))


def upload_refusal(size: int, limit: int, filename: str) -> str | None:
    """Why a file of ``size`` bytes is refused (None: it is not): over ``limit``."""
    if size <= limit:
        return None
    return (f"{filename} is {format_bytes(size)}, over the {format_bytes(limit)} this server takes: nothing was "
            "uploaded (its operator sets the limit with `partex serve --max-upload`)")


# --------------------------------------------------------------------------- mesh / hardware

@dataclasses.dataclass(frozen=True)
class Config:
    mesh: MeshSpec
    hw: Hardware
    pipeline: Pipeline | None = None  # a layer stack run as a pipeline over a mesh axis

    def to_json(self) -> dict:
        return {"mesh": self.mesh.text(), "hardware": self.hw.name, "budget": self.hw.budget,
                "margin": self.hw.memory_margin, "pipeline": self.pipeline.text() if self.pipeline else None}

    def bubble(self) -> float | None:
        p = self.pipeline
        return p.bubble(self.mesh.sizes[self.mesh.index(p.axis)]) if p is not None and p.axis in self.mesh.axes \
            else None


def parse_config(mesh_text: str, hardware: str, budget_text: str, margin_text: str = "",
                 pipeline_text: str = "") -> Config:
    """The mesh / hardware / budget / margin / pipeline form -> Config; PartexError with a
    one-line message (the pipeline's stack and sizes are checked when the model is)."""
    if hardware not in HARDWARE and hardware not in PROFILES:
        raise PartexError(f"unknown hardware {hardware!r}; choose one of {', '.join(hardware_names())}",
                          field="hardware")
    margin = None
    if (margin_text or "").strip():
        try:
            margin = float(margin_text)
        except ValueError:
            raise PartexError(f"margin must be a fraction of the budget such as 0.1, got {margin_text!r}",
                              field="margin") from None
    mesh = _at("mesh", as_mesh, mesh_text)
    budget = (budget_text or "").strip() or None
    hw = _at("budget", hardware_of, hardware, budget) if budget else hardware_of(hardware)
    pipe = _at("pipeline", Pipeline.parse, pipeline_text.strip()) if (pipeline_text or "").strip() else None
    if pipe is not None and pipe.axis not in mesh.axes:
        raise PartexError(f"pipeline {pipe.text()}: the mesh ({mesh.text()}) has no axis {pipe.axis!r}: add one "
                          f"(e.g. {pipe.axis}=2), name an axis it has, or clear the pipeline", field="pipeline")
    return Config(mesh, _at("margin", as_hardware, hw, None, margin) if margin is not None else hw, pipe)


MESH_TRIES = 6  # the larger meshes scored when no baseline fits (the load waits on them)


def fitting_mesh(res: ModelAnalysis, config: Config, *, tries: int = MESH_TRIES) -> tuple[MeshSpec | None, int]:
    """A mesh, with ``config``'s axis names and links, on which a baseline fits the budget:
    each try doubles one axis (in turn: data=8,model=2, then data=8,model=4, ...). Returns
    the first that fits (None if none does) and the most devices tried. Each try is a
    session that scores its baselines (no warm start): about a second on a full-size
    U-Net, a fraction of that on the tiny demos."""
    mesh = config.mesh
    sizes = list(mesh.sizes)
    for i in range(tries):
        k = i % len(sizes)
        sizes[k] = max(2, sizes[k] * 2)
        candidate = dataclasses.replace(mesh, sizes=tuple(sizes))
        try:
            session = Session.from_analysis(res, mesh=candidate, hardware=config.hw, warm_start=False)
            if any(c.report.fits for c in session.baselines().values()):
                return candidate, candidate.size
        except PartexError:  # an axis that divides nothing there: that mesh is no answer
            continue
    return None, math.prod(sizes)


def _at(field: str, fn, *args):
    """fn(*args), its PartexError naming the form field that was wrong."""
    try:
        return fn(*args)
    except PartexError as e:
        raise PartexError(str(e), field=e.field or field) from None


# --------------------------------------------------------------------------- plan summaries

@dataclasses.dataclass(frozen=True)
class PlanSummary:
    """One plan as the views show it: its decisions, detailed cost report and Plan."""

    name: str  # "search", "uploaded" or a baseline's name
    decisions: tuple[Decision, ...]
    pinned: frozenset
    report: CostReport  # with collectives (detail=True)
    plan: Plan
    simulation: int | None = None  # for the search's best: found at this simulation
    # the same sharding without its recompute and memory decisions (None: it has none): what they save
    saving_all: CostReport | None = None

    @property
    def recomputes(self) -> bool:
        """Whether the plan recomputes or keeps state in host memory (``saving_all`` set)."""
        return self.saving_all is not None

    @property
    def saving_what(self) -> str:
        """What the plan's memory-saving decisions are, in words."""
        kinds = {type(d) for d in self.decisions if isinstance(d, (Recompute, Memory))}
        return " and ".join(w for k, w in ((Recompute, "recompute"), (Memory, "host memory")) if k in kinds)

    def labels(self, an) -> list[str]:
        return [an.decision_label(d) for d in self.decisions]


class Workspace:
    """The page's Session: one analysed model on one mesh and hardware. Its search is
    stepped in the runner (a forked copy of this session); here the session scores
    baselines and uploads and makes plans. The cost model caches as it goes: hold ``lock``."""

    def __init__(self, choice: ModelSpec, session: Session):
        self.choice, self.session = choice, session
        self.config = Config(session.mesh, session.hardware, session.pipeline)
        self.lock = threading.Lock()
        # the layer stacks the step as written may pipeline (``Session.pipeline_stacks``): found
        # here, in the load's worker thread; the sidebar says them with every new best
        self.pipeline_stacks = session.pipeline_stacks() if session.pipeline is None else {}

    @property
    def an(self):
        return self.session.analysis

    @property
    def res(self) -> ModelAnalysis:
        return self.session.model

    @property
    def base(self) -> ModelAnalysis:
        """The model as written (a pipelined session's step is another program)."""
        m = self.session.model
        return m.base if m.pipeline is not None else m

    def summarize(self, name: str, decisions: Sequence[Decision], pinned=(), plan: Plan | None = None,
                  simulation: int | None = None, report: CostReport | None = None) -> PlanSummary:
        """A PlanSummary; given both the plan and its detailed report, no evaluation."""
        decisions = tuple(decisions)
        sharding = tuple(d for d in decisions if not isinstance(d, (Recompute, Memory)))
        saving_all = None
        if report is None or plan is None or len(sharding) < len(decisions):
            with self.lock:
                if report is None:
                    report = self.session.evaluate(decisions)
                if plan is None:
                    plan = self.session.plan(decisions, strategy=name, pinned=list(pinned))
                if len(sharding) < len(decisions):
                    saving_all = self.session.evaluate(sharding)
        return PlanSummary(name, decisions, frozenset(pinned), report, plan, simulation, saving_all)

    def baselines(self) -> dict[str, PlanSummary]:
        with self.lock:
            scored = self.session.baselines()
        return {name: self.summarize(name, c.decisions, report=c.report) for name, c in scored.items()}

    def uploaded(self, text: str, filename: str) -> PlanSummary:
        """An uploaded plan, scored against this model on its own mesh and on the page's
        hardware and budget, as the plans listed beside it are."""
        plan = Plan.loads(text, where=filename)
        with self.lock:
            c = self.session.scored(plan, hardware=self.session.hardware)
        pinned = {d for d, pd in zip(c.decisions, plan.decisions) if pd.pinned}
        return PlanSummary("uploaded", c.decisions, frozenset(pinned), c.report, plan)

    def same_model(self, summary: PlanSummary) -> bool:
        return summary.plan.signature.get("inputs") == self.session.signature["inputs"]


def short_source(src: str) -> str:
    """'/work/main/demo_models/_transformer.py:113:13 (causal_attention)' ->
    '_transformer.py:113 (causal_attention)'."""
    loc, _, fn = src.partition(" ")
    parts = loc.rsplit("/", 1)[-1].split(":")
    where = ":".join(parts[:2])
    return f"{where} {fn}".strip()


def plan_rows(state) -> list:
    """(row label, PlanSummary) in display order: the search, an upload, the baselines
    (``state``: an ``ExplorerState``, or a ``ParamSlice`` of it that reads ``best``,
    ``uploaded`` and ``baselines``)."""
    rows = []
    if state.best is not None:
        rows.append(("search", state.best))
    if state.uploaded is not None:
        rows.append(("uploaded", state.uploaded))
    rows += list(state.baselines.items())
    return rows
