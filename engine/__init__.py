"""partex engine: trace a JAX training step, find its named dimensions and conflicts,
search for a sharding plan against an analytic cost model, and export / apply / verify it.

The explorer (Panel) and the CLI are two faces on this package; it never imports panel.
"""

from __future__ import annotations

import dataclasses
import time

from ._analysis import Analysis, Conflict, Group, NamedDim, analyze
from ._errors import PartexError
from ._loader import LoadedModel, axis_names_by_value, load_model
from ._program import Op, Program, Value, trace
from ._rules import CONSERVATIVE, Factor, FactorKind, factor_rules


@dataclasses.dataclass(frozen=True)
class ModelAnalysis:
    model: LoadedModel
    program: Program
    analysis: Analysis
    trace_seconds: float


def analyze_model(spec: str, preset: str = "tiny", overrides=None) -> ModelAnalysis:
    """Load a MODEL spec, trace it and run the named-dimension analysis."""
    model = load_model(spec, preset, overrides)
    return analyze_loaded(model)


def analyze_loaded(model: LoadedModel) -> ModelAnalysis:
    t0 = time.perf_counter()
    program = trace(model.fn, model.args)
    t1 = time.perf_counter()
    analysis = analyze(program, axis_names_by_value(program, model.axis_names))
    return ModelAnalysis(model, program, analysis, t1 - t0)


__all__ = [
    "Analysis", "Conflict", "Factor", "FactorKind", "Group", "LoadedModel", "ModelAnalysis",
    "NamedDim", "Op", "PartexError", "Program", "Value", "analyze", "analyze_loaded",
    "analyze_model", "CONSERVATIVE", "factor_rules", "load_model", "trace",
]
