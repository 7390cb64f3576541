"""Typed results: what verify returns, a bench row, the search's statistics.

Frozen dataclasses read by attribute. ``to_json`` gives the JSON the CLI prints with
``--json``, key for key and in the same order; ``from_json`` reads it back (verify's worker
process hands its report over as JSON). This module imports nothing of partex: the CLI, the
explorer and scripts read results without the engine behind them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping


def _ratio(pred: float, xla: float) -> float | None:
    return None if not xla else pred / xla


@dataclasses.dataclass(frozen=True)
class Compared:
    """A predicted figure per device beside XLA's; ``ratio`` = predicted / XLA (None where
    XLA's is 0)."""

    predicted: float
    xla: float
    ratio: float | None

    @classmethod
    def of(cls, predicted: float, xla: float) -> Compared:
        """``predicted`` beside ``xla``, with their ratio (None where ``xla`` is 0)."""
        return cls(predicted, xla, _ratio(predicted, xla))

    def to_json(self) -> dict[str, Any]:
        """``{"predicted", "xla", "ratio"}`` as JSON data."""
        return {"predicted": self.predicted, "xla": self.xla, "ratio": self.ratio}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Compared:
        """The figure read back from its JSON data ``d`` (``to_json``)."""
        return cls(d["predicted"], d["xla"], d["ratio"])


@dataclasses.dataclass(frozen=True)
class WorkCompared(Compared):
    """FLOPs or bytes accessed per device beside XLA's HloCostAnalysis, which counts a loop's
    body once: ``predicted`` counts loop bodies once too, ``predicted_per_step`` every trip.
    ``xla_transcendentals`` (FLOPs only): XLA's count apart, included in ``xla``."""

    predicted_per_step: float = 0.0
    xla_transcendentals: float | None = None

    def to_json(self) -> dict[str, Any]:
        """``Compared.to_json`` with ``predicted_per_step`` (and ``xla_transcendentals`` where known)."""
        out = {**super().to_json(), "predicted_per_step": self.predicted_per_step}
        if self.xla_transcendentals is not None:
            out["xla_transcendentals"] = self.xla_transcendentals
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> WorkCompared:
        """The figure read back from its JSON data ``d`` (``to_json``)."""
        return cls(d["predicted"], d["xla"], d["ratio"], d["predicted_per_step"], d.get("xla_transcendentals"))


@dataclasses.dataclass(frozen=True)
class CollectiveCompared:
    """One collective kind's bytes per device, predicted beside XLA's."""

    predicted_bytes: float
    xla_bytes: float
    ratio: float | None

    @classmethod
    def of(cls, predicted: float, xla: float) -> CollectiveCompared:
        """``predicted`` bytes beside ``xla``'s, with their ratio (None where ``xla`` is 0)."""
        return cls(predicted, xla, _ratio(predicted, xla))

    def to_json(self) -> dict[str, Any]:
        """``{"predicted_bytes", "xla_bytes", "ratio"}`` as JSON data."""
        return {"predicted_bytes": self.predicted_bytes, "xla_bytes": self.xla_bytes, "ratio": self.ratio}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CollectiveCompared:
        """The figures read back from their JSON data ``d`` (``to_json``)."""
        return cls(d["predicted_bytes"], d["xla_bytes"], d["ratio"])


@dataclasses.dataclass(frozen=True)
class Numerics:
    """A sharded run's outputs against the unsharded step's (``_numerics.compare_outputs``).

    ``max_rel_err``: the error (RMS over the leaf's scale) of the leaf nearest its tolerance,
    ``worst_output``; ``tolerance``: that leaf's, ``noise_factor`` times its calibrated
    ``noise`` (the unsharded step's own output change when its float inputs move by a few
    ulps, over ``noise_runs`` runs) and never under ``floor``; ``ok``: every leaf within its
    own. ``largest_rel_err`` / ``largest_output``: the largest error of any leaf, which may
    be a noisier leaf's within its wider tolerance. ``computed_in`` says when the comparison
    ran in float32."""

    max_rel_err: float
    worst_output: str | None
    loss_rel_err: float | None
    ok: bool
    tolerance: float
    floor: float
    computed_in: str | None = None
    noise: float | None = None
    noise_factor: float | None = None
    noise_runs: int = 0
    largest_rel_err: float | None = None
    largest_output: str | None = None

    def basis(self) -> str:
        """Where the worst leaf's tolerance comes from, in words."""
        if self.noise is None or self.noise_factor is None:
            return "the fixed tolerance" + (": no calibration runs" if not self.noise_runs else "")
        calibrated = self.noise * self.noise_factor
        if calibrated < self.tolerance:
            return f"the fixed least tolerance; {self.noise_factor:g}x its noise over {self.noise_runs} runs is {calibrated:.1e}"
        return f"{self.noise_factor:g}x its noise {self.noise:.1e}, over {self.noise_runs} perturbed runs"

    def to_json(self) -> dict[str, Any]:
        """Every field as JSON data (``computed_in`` where set)."""
        out = {"max_rel_err": self.max_rel_err, "worst_output": self.worst_output,
               "loss_rel_err": self.loss_rel_err, "ok": self.ok, "tolerance": self.tolerance, "floor": self.floor,
               "noise": self.noise, "noise_factor": self.noise_factor, "noise_runs": self.noise_runs,
               "largest_rel_err": self.largest_rel_err, "largest_output": self.largest_output}
        if self.computed_in is not None:
            out["computed_in"] = self.computed_in
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Numerics:
        """The comparison read back from its JSON data ``d`` (``to_json``)."""
        return cls(d["max_rel_err"], d["worst_output"], d["loss_rel_err"], d["ok"], d["tolerance"], d["floor"],
                   d.get("computed_in"), d.get("noise"), d.get("noise_factor"), d.get("noise_runs", 0),
                   d.get("largest_rel_err"), d.get("largest_output"))


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """A plan compiled by XLA and compared with its prediction, per device.

    ``memory``: peak memory (XLA: argument + output + temp - alias); ``arguments``: the
    arguments' share; ``xla_memory``: XLA's figures by part; ``predicted_memory``: the
    prediction's parts; ``collectives``: bytes by kind; ``flops`` and ``bytes_accessed``:
    against XLA's cost analysis; ``fits``: XLA's peak within ``budget``. Optional parts:
    ``numerics`` (``run``), ``explain`` (XLA's collectives by source line, matched to the
    predicted ones), ``comparison`` (an export compiled alone beside the plan),
    ``xla_cpu_scheduler`` (on CPU: which XLA scheduler gave the memory figure),
    ``marked_infeasible`` (a session's verify: the plan, over the budget per XLA, was marked so
    that the search moves on), ``host_unchecked`` (on a backend that ignores memory spaces,
    XLA:CPU: the host memory per device the plan predicts, which XLA cannot check there; the
    device figure ``xla_memory["device"]`` that ``fits`` judges leaves it out) and ``notes``
    (what else this backend's figures cannot say, one line each)."""

    model: str
    preset: str | None
    mesh: str
    strategy: str | None
    devices: int
    memory: Compared
    arguments: Compared
    xla_memory: Mapping[str, float]
    predicted_memory: Mapping[str, float]
    collectives: Mapping[str, CollectiveCompared]
    constraints: Mapping[str, int]  # the sharding constraints apply inserted: values, operands
    constrained: bool
    fits: bool
    budget: float
    lower_seconds: float
    compile_seconds: float
    flops: WorkCompared
    bytes_accessed: WorkCompared
    explain: Mapping[str, Any] | None = None
    xla_cpu_scheduler: str | None = None
    numerics: Numerics | None = None
    comparison: Mapping[str, Any] | None = None
    marked_infeasible: bool | None = None
    host_unchecked: float | None = None
    notes: tuple[str, ...] = ()

    def replace(self, **changes) -> VerifyReport:
        """A copy with the fields given by keyword changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON data (``verify --json``): every field, the optional parts where set."""
        out: dict[str, Any] = {
            "model": self.model, "preset": self.preset, "mesh": self.mesh, "strategy": self.strategy,
            "devices": self.devices, "memory": self.memory.to_json(), "arguments": self.arguments.to_json(),
            "xla_memory": dict(self.xla_memory), "predicted_memory": dict(self.predicted_memory),
            "collectives": {k: c.to_json() for k, c in self.collectives.items()},
            "constraints": dict(self.constraints), "constrained": self.constrained, "fits": self.fits,
            "budget": self.budget, "lower_seconds": self.lower_seconds, "compile_seconds": self.compile_seconds,
            "flops": self.flops.to_json(), "bytes_accessed": self.bytes_accessed.to_json(),
        }
        if self.explain is not None:
            out["explain"] = self.explain
        if self.xla_cpu_scheduler is not None:
            out["xla_cpu_scheduler"] = self.xla_cpu_scheduler
        if self.numerics is not None:
            out["numerics"] = self.numerics.to_json()
        if self.comparison is not None:
            out["comparison"] = self.comparison
        if self.marked_infeasible is not None:
            out["marked_infeasible"] = self.marked_infeasible
        if self.host_unchecked is not None:
            out["host_unchecked"] = self.host_unchecked
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> VerifyReport:
        """The report read back from its JSON data ``d`` (``to_json``; verify's worker hands it over so)."""
        return cls(
            d["model"], d["preset"], d["mesh"], d["strategy"], d["devices"], Compared.from_json(d["memory"]),
            Compared.from_json(d["arguments"]), d["xla_memory"], d["predicted_memory"],
            {k: CollectiveCompared.from_json(c) for k, c in d["collectives"].items()}, d["constraints"],
            d["constrained"], d["fits"], d["budget"], d["lower_seconds"], d["compile_seconds"],
            WorkCompared.from_json(d["flops"]), WorkCompared.from_json(d["bytes_accessed"]), d.get("explain"),
            d.get("xla_cpu_scheduler"), Numerics.from_json(d["numerics"]) if "numerics" in d else None,
            d.get("comparison"), d.get("marked_infeasible"), d.get("host_unchecked"), tuple(d.get("notes", ())))


@dataclasses.dataclass(frozen=True)
class Measured:
    """A plan run on the local devices for a few steps, beside its prediction.

    ``step_time``: the median of the timed steps (seconds, after the warm-up steps);
    ``peak_bytes``: the most any of the plan's devices held at once (the allocator's
    ``peak_bytes_in_use``; None where the backend does not say: XLA:CPU), which counts the
    step's arguments and what the program kept; ``xla_bytes``: XLA's compiled figure
    (arguments + outputs + temporaries - aliases, per device); ``predicted_*``: the
    prediction of the hardware that priced the plan (``priced_by``). ``error``: why the
    plan did not run (out of memory), one line; its figures are then None."""

    label: str
    mesh: str
    device: str  # the device kind measured on, as JAX names it
    platform: str
    devices: int
    steps: int
    step_time: float | None
    step_times: tuple[float, ...]
    peak_bytes: float | None
    xla_bytes: float | None
    compile_seconds: float | None
    predicted_step_time: float | None
    predicted_peak: float | None
    priced_by: str
    error: str | None = None

    @property
    def time_ratio(self) -> float | None:
        """Predicted / measured step time."""
        return None if not self.step_time or self.predicted_step_time is None else self.predicted_step_time / self.step_time

    @property
    def memory_ratio(self) -> float | None:
        """Predicted / XLA's compiled peak (the allocator's where XLA's is unknown)."""
        ref = self.xla_bytes or self.peak_bytes
        return None if not ref or self.predicted_peak is None else self.predicted_peak / ref

    def to_json(self) -> dict[str, Any]:
        """The measurement as JSON data (times ``*_s`` in seconds), with both ratios."""
        return {"label": self.label, "mesh": self.mesh, "device": self.device, "platform": self.platform,
                "devices": self.devices, "steps": self.steps, "step_time_s": self.step_time,
                "step_times_s": list(self.step_times), "peak_bytes": self.peak_bytes, "xla_bytes": self.xla_bytes,
                "compile_s": self.compile_seconds, "predicted_step_time_s": self.predicted_step_time,
                "predicted_peak_bytes": self.predicted_peak, "time_ratio": self.time_ratio,
                "memory_ratio": self.memory_ratio, "priced_by": self.priced_by, "error": self.error}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Measured:
        """The measurement read back from its JSON data ``d`` (``to_json``)."""
        return cls(d["label"], d["mesh"], d["device"], d["platform"], d["devices"], d["steps"], d["step_time_s"],
                   tuple(d["step_times_s"]), d["peak_bytes"], d["xla_bytes"], d["compile_s"],
                   d["predicted_step_time_s"], d["predicted_peak_bytes"], d["priced_by"], d.get("error"))


@dataclasses.dataclass(frozen=True)
class RootAction:
    """One of the search root's actions: its label (``"stop"``: take no more decisions), how
    often the search tried it and the mean value it backed up."""

    action: str
    visits: int
    value: float

    def to_json(self) -> dict[str, Any]:
        """``{"action", "visits", "value"}`` as JSON data."""
        return {"action": self.action, "visits": self.visits, "value": self.value}


@dataclasses.dataclass(frozen=True)
class SearchStats:
    """The search so far (``Session.stats()``); ``SearchStats()`` is a search not yet run.

    ``best_history``: (simulation, seconds, step time) each time the best improved;
    ``smallest_memory``: the smallest predicted peak met; ``no_fit``: while no plan fits,
    which limit binds (device or host memory) and by how much, one line ("" once one fits);
    ``depth``: the deepest plan tried, in decisions beyond the pins."""

    simulations: int = 0
    nodes: int = 0
    depth: int = 0
    evaluations: int = 0
    seconds: float = 0.0
    sims_per_s: float = 0.0
    best_step_time: float | None = None
    best_history: tuple[tuple[int, float, float], ...] = ()
    smallest_memory: float = float("inf")
    no_fit: str = ""
    root_actions: tuple[RootAction, ...] = ()
    pins: tuple[str, ...] = ()
    forbidden: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Every field as JSON data, the root actions as ``RootAction.to_json`` gives them."""
        return {"simulations": self.simulations, "nodes": self.nodes, "depth": self.depth,
                "evaluations": self.evaluations, "seconds": self.seconds, "sims_per_s": self.sims_per_s,
                "best_step_time": self.best_step_time, "best_history": [list(h) for h in self.best_history],
                "smallest_memory": self.smallest_memory, "no_fit": self.no_fit,
                "root_actions": [a.to_json() for a in self.root_actions],
                "pins": list(self.pins), "forbidden": list(self.forbidden)}


@dataclasses.dataclass(frozen=True)
class BenchRow:
    """One strategy's row of ``Session.bench``: its plan's decisions, predicted step time, MFU,
    peak memory, whether it fits, and how long finding it took (``search_s``; None for a row
    with no plan). The rest belongs to some rows only: the ILP's ``status`` and ``build_s``;
    the search's ``simulations``, ``total_s`` and ``smallest_memory``; the exhaustive row's
    ``plans``, ``space``, ``per_axis``, ``complete`` and ``projected_s``; with ``verify``, XLA's
    device peak (``xla_memory_bytes``: on XLA:CPU less what the plan keeps in host memory,
    as ``VerifyReport.xla_memory["device"]``), predicted / XLA (``memory_ratio``) and ``xla_fits``; a plan
    keeping values in host memory, ``host_bytes``.
    ``to_json`` writes the keys a row was given, in the order given."""

    strategy: str
    decisions: tuple[Any, ...]  # Decision
    step_time_s: float | None
    mfu: float | None
    memory_bytes: float | None
    fits: bool
    search_s: float | None
    status: str | None = None
    build_s: float | None = None
    simulations: int | None = None
    total_s: float | None = None
    smallest_memory: float | None = None
    xla_memory_bytes: float | None = None
    memory_ratio: float | None = None
    xla_fits: bool | None = None
    plans: int | None = None
    space: int | None = None
    per_axis: int | None = None
    complete: bool | None = None
    projected_s: float | None = None
    host_bytes: float | None = None  # host memory per device (offloaded values), where any
    given: tuple[str, ...] = dataclasses.field(default=(), repr=False, compare=False)  # the extras set, in order

    _BASE = ("strategy", "decisions", "step_time_s", "mfu", "memory_bytes", "fits", "search_s")

    @classmethod
    def make(cls, strategy: str, decisions, report, search_s: float | None, **extra) -> BenchRow:
        """A row from a cost report (None: no plan) and the row's own extras (and its host
        memory, where the plan keeps values there)."""
        if report is not None and report.memory.host:
            extra = {**extra, "host_bytes": report.memory.host}
        return cls(strategy, tuple(decisions), report.step_time if report else None, report.mfu if report else None,
                   report.memory.peak if report else None, bool(report.fits) if report else False, search_s,
                   given=tuple(extra), **extra)

    def with_(self, **extra) -> BenchRow:
        """The row with more extras set (verify's figures)."""
        return dataclasses.replace(self, given=self.given + tuple(k for k in extra if k not in self.given), **extra)

    def to_json(self) -> dict[str, Any]:
        """The row as JSON, without its decisions (their names come from the analysis:
        ``Session.label``)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in self._BASE if k != "decisions"}
        out.update((k, getattr(self, k)) for k in self.given)
        return out
