"""The explorer's side of the engine: loading models (with a cache of demo analyses),
parsing the mesh / hardware / budget form, and summarising plans for the views.

Nothing here touches Panel; everything here may run in a worker thread.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import threading
from typing import Any, Callable, Sequence

from partex import demo_models
from partex import ModelAnalysis, PartexError, analyze_model
from partex._analysis import NO_DIM
from partex._cost import CostModel, CostReport
from partex._mesh import HARDWARE, Hardware, MeshSpec, get_hardware, parse_bytes
from partex._plan import Plan, check_signature, default_donate, make_plan, resolve_decisions
from partex._program import NO_PRODUCER
from partex._strategies import baseline_names, strategy_decisions

from partex._search import Search

Decision = tuple[int, str]
CUSTOM = "custom"  # the model picker's entry for a user's own module:attr


# --------------------------------------------------------------------------- models

def demo_presets(name: str) -> list[str]:
    return list(demo_models.MODELS[name].presets) if name in demo_models.MODELS else ["custom"]


def split_overrides(text: str) -> list[str]:
    """'layers=4, batch=16' -> ['layers=4', 'batch=16']."""
    return [s.strip() for s in (text or "").replace(";", ",").split(",") if s.strip()]


@dataclasses.dataclass(frozen=True)
class ModelChoice:
    spec: str  # a demo name or module:attr / path/file.py:attr
    preset: str
    overrides: tuple[str, ...]

    @property
    def title(self) -> str:
        extra = f" [{', '.join(self.overrides)}]" if self.overrides else ""
        return f"{self.spec} ({self.preset}){extra}"

    def to_json(self) -> dict:
        return {"spec": self.spec, "preset": self.preset, "overrides": list(self.overrides)}


class _AnalysisCache:
    """Demo-model analyses are immutable and take a second or two to trace: share them
    between browser sessions. User models are never cached (their file may change)."""

    def __init__(self, size: int = 8):
        self.size = size
        self._lock = threading.Lock()
        self._items: collections.OrderedDict[ModelChoice, ModelAnalysis] = collections.OrderedDict()
        self._key_locks: dict[ModelChoice, threading.Lock] = collections.defaultdict(threading.Lock)
        self._derived: dict[tuple[int, str], Any] = {}  # (id of a cached analysis, what) -> value

    def get(self, choice: ModelChoice) -> ModelAnalysis:
        if choice.spec not in demo_models.MODELS:
            return _analyze(choice)
        with self._lock:
            key_lock = self._key_locks[choice]
        with key_lock:  # two sessions asking for one model trace it once
            with self._lock:
                if choice in self._items:
                    self._items.move_to_end(choice)
                    return self._items[choice]
            res = _analyze(choice)
            settle_heap()
            with self._lock:
                self._items[choice] = res
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


def _analyze(choice: ModelChoice) -> ModelAnalysis:
    overrides = list(choice.overrides) if choice.spec in demo_models.MODELS else None
    return analyze_model(choice.spec, preset=choice.preset, overrides=overrides)


ANALYSES = _AnalysisCache()


# --------------------------------------------------------------------------- mesh / hardware

@dataclasses.dataclass(frozen=True)
class Config:
    mesh: MeshSpec
    hw: Hardware

    def to_json(self) -> dict:
        return {"mesh": self.mesh.text(), "hardware": self.hw.name, "budget": self.hw.budget}


def parse_config(mesh_text: str, hardware: str, budget_text: str) -> Config:
    """The mesh / hardware / budget form -> Config; PartexError with a one-line message."""
    mesh = MeshSpec.parse(mesh_text)
    budget = parse_bytes(budget_text) if (budget_text or "").strip() else None
    if hardware not in HARDWARE:
        raise PartexError(f"unknown hardware {hardware!r}; presets: {', '.join(HARDWARE)}")
    return Config(mesh, get_hardware(hardware, memory_budget=budget))


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

    def labels(self, an) -> list[str]:
        return [f"{an.groups[g].label}->{a}" for g, a in self.decisions]


class Workspace:
    """One analysed model on one mesh and hardware, with a cost model for the UI's own
    evaluations (baselines, uploads). The cost model caches as it goes: hold ``lock``."""

    def __init__(self, choice: ModelChoice, res: ModelAnalysis, config: Config):
        self.choice, self.res, self.config = choice, res, config
        self.donate = default_donate(res.program)
        self.lock = threading.Lock()
        self.cm = CostModel(res.analysis, config.mesh, config.hw, donate=self.donate)

    @property
    def an(self):
        return self.res.analysis

    def summarize(self, name: str, decisions: Sequence[Decision], pinned=(), plan: Plan | None = None,
                  simulation: int | None = None, report: CostReport | None = None) -> PlanSummary:
        """A PlanSummary; given both the plan and its detailed report, no evaluation."""
        decisions = tuple((int(g), a) for g, a in decisions)
        if report is None or plan is None:
            with self.lock:
                if report is None:
                    report = self.cm.evaluate(list(decisions), detail=True)
                if plan is None:
                    plan = make_plan(self.res, self.config.mesh, self.config.hw, list(decisions), strategy=name,
                                     pinned=pinned, donate=self.donate, cost_model=self.cm)
        return PlanSummary(name, decisions, frozenset(pinned), report, plan, simulation)

    def baselines(self) -> dict[str, PlanSummary]:
        out = {}
        for name in baseline_names(self.an):
            out[name] = self.summarize(name, strategy_decisions(name, self.an, self.config.mesh))
        return out

    def uploaded(self, text: str, filename: str) -> PlanSummary:
        """An uploaded plan, scored on its own mesh and hardware against this model."""
        plan = Plan.loads(text, where=filename)
        check_signature(plan, self.res.program)
        decisions = resolve_decisions(plan, self.an)
        cm = CostModel(self.an, plan.mesh, plan.hardware, donate=plan.donate)
        pinned = {d for d, pd in zip(decisions, plan.decisions) if pd.pinned}
        report = cm.evaluate(decisions, detail=True)
        return PlanSummary("uploaded", tuple(decisions), frozenset(pinned), report, plan)

    def new_search(self, seed: int, pins=(), forbidden=()) -> tuple[Search, list[str]]:
        """A fresh search with the user's pins and forbids re-applied; returns the search and
        a note per pin that no longer applies (its axis left the mesh)."""
        s = Search(self.res, self.config.mesh, self.config.hw, seed=seed, donate=self.donate)
        dropped = []
        for how, items in (("pin", pins), ("forbid", forbidden)):
            for g, a in items:
                try:
                    getattr(s, how)(int(g), a)
                except PartexError as e:
                    dropped.append(f"{how} {self.an.groups[g].label}->{a} dropped: {e}")
        return s, dropped


# --------------------------------------------------------------------------- group details

@dataclasses.dataclass(frozen=True)
class GroupInfo:
    """What the graph's hover and click show about one decision group."""

    id: int
    label: str
    size: int
    bytes: int
    layers: int  # named dims in the group (one per layer for layer-local dims)
    tensors: tuple[tuple[str, tuple[int, ...], int], ...]  # (input path, shape, dim)
    sources: tuple[tuple[str, int], ...]  # (source line, ops) of ops producing its tensors
    conflicts: tuple[dict, ...]  # describe_conflict of its intra conflicts


def group_infos(res: ModelAnalysis, max_tensors: int = 64, max_sources: int = 8) -> dict[int, GroupInfo]:
    an = res.analysis
    p = res.program
    shape_of = {path: p.values[vid].shape for vid, path in zip(p.inputs, p.input_paths)}
    sources: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    gnd = [nd.group for nd in an.named_dims]
    for v in p.values:
        if v.producer == NO_PRODUCER:
            continue
        src = p.ops[v.producer].source
        if not src:
            continue
        base = int(an.node_base[v.id])
        for d in range(len(v.shape)):
            nd = int(an.node_nd[base + d])
            if nd != NO_DIM:
                sources[gnd[nd]][src] += 1
    conflicts: dict[int, list[dict]] = collections.defaultdict(list)
    for c in an.conflicts:
        conflicts[c.group].append(an.describe_conflict(c))
    out = {}
    for g in an.decision_groups:
        tensors = []
        for nd in g.named_dims:
            for path, dim in an.named_dims[nd].inputs:
                tensors.append((path, tuple(shape_of.get(path, ())), dim))
        tensors.sort(key=lambda t: (_depth_key(t[0]), t[0]))
        out[g.id] = GroupInfo(g.id, g.label, g.size, g.bytes, len(g.named_dims), tuple(tensors[:max_tensors]),
                              tuple(sources[g.id].most_common(max_sources)), tuple(conflicts[g.id]))
    return out


def _depth_key(path: str) -> int:
    head = path.split("/", 1)[0]
    return {"params": 0, "batch": 2}.get(head, 1)


def short_source(src: str) -> str:
    """'/work/main/demo_models/_transformer.py:113:13 (causal_attention)' ->
    '_transformer.py:113 (causal_attention)'."""
    loc, _, fn = src.partition(" ")
    parts = loc.rsplit("/", 1)[-1].split(":")
    where = ":".join(parts[:2])
    return f"{where} {fn}".strip()
