"""partex: an automatic partitioner for JAX.

It traces a JAX training step, finds its named dimensions and conflicts, searches for the
fastest sharding plan that fits each device's memory (MCTS against an analytic cost model),
and exports, applies and verifies the plan with XLA::

    import partex

    plan = partex.search(train_step, (params, opt_state, batch), mesh="data=4,model=2",
                         hardware="tpu-v4", memory="16GiB", seconds=30)
    plan.save("plan.json")
    step = partex.apply_plan(partex.Plan.load("plan.json"), train_step)   # jax.jit with the shardings
    params, opt_state, loss = step(params, opt_state, batch)

``partex.Session`` holds one model on one mesh for interactive work (step, pin, resume,
compare, verify, save); the CLI (``partex``) and the explorer (``partex serve``) are thin
shells over it. This package never imports Panel; ``partex.explorer`` does.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ._decisions import (MEMORY_SPACES, RECOMPUTE_KINDS, RECOMPUTE_WHAT, RESOLUTIONS, STATE_LABELS, STATES, Decision,
                         Memory, Recompute, Resolve, Shard)
from ._errors import PartexError
from ._loader import LoadedModel, ModelAnalysis, ModelSpec, analyze_loaded, analyze_model, load_model
from ._mesh import HARDWARE, Hardware, MeshSpec, format_bytes, get_hardware, parse_bytes
from ._profile import Profile
from ._results import (CollectiveCompared, Compared, Measured, Numerics, RootAction, SearchStats, VerifyReport,
                       WorkCompared)
from ._meshes import MeshSearch, MeshSearcher, MeshTrial, ProgramSearch, Topology, candidate_meshes, effort_of
from .plan._pipeline_decision import Pipeline
from ._options import as_hardware, as_mesh
from ._session import Candidate, Session, mesh_searcher, search_meshes
from .analysis._types import Analysis, Conflict, Group, GroupInfo, NamedDim
from .analysis._recompute import Unit
from .analysis._rules import CONSERVATIVE, Factor, FactorKind, factor_rules
from .cost import CostReport, MemoryReport
from .plan._export import FORMATS as EXPORT_FORMATS
from .plan._export import RulesExport, comparison_table, export_text
from .plan._export import flax_rules as rules_of
from .plan._plan import Plan, PlanDecision
from .plan._planned import PlannedFunction, apply_plan, plan_shardings, shard_inputs
from .plan._verify import KINDS as COLLECTIVE_KINDS
from .plan._numerics import Calibration
from .plan._numerics import calibrate as _calibrate
from .plan._verify import verify_loaded
from .planner._exhaustive import ExhaustiveResult
from .planner._ilp import ILPResult
from .planner._search import SearchResult
from .tracing._program import Op, Program, Value, trace


def measure_devices(*, quick: bool = False, progress: Callable[[str, float], None] | None = None,
                    collectives: bool = True) -> list[dict]:
    """Run ``partex calibrate``'s micro-benchmarks on this process's devices.

    Matmuls, memory-bound kernels, the kernel floor, host copies and, with 2+ devices, the
    collectives, each timed inside one step on every device at once.

    Args:
      quick: fewer shapes and repetitions (a check that everything runs, not a profile to trust).
      progress: called as ``progress(what, fraction)`` as it goes.
      collectives: time the collectives too (with 2+ devices).

    Returns:
      The measurement rows (``Profile.from_measurements`` makes the profile).
    """
    from ._calibrate import calibrate  # JAX, only when measuring

    return calibrate(quick=quick, progress=progress, collectives=collectives)


def analyze(fn: Callable, *args, axis_names=None) -> ModelAnalysis:
    """Trace ``fn(*args)`` and run the named-dimension analysis.

    Args:
      fn: the training step.
      *args: its example arguments: arrays or ``jax.ShapeDtypeStruct`` pytrees (nothing is allocated).
      axis_names: optional logical axis names mirroring ``args`` (labels only).

    Returns:
      A ``ModelAnalysis``: the Program (``.program``) and the Analysis (``.analysis``: named
      dimensions, decision groups, conflicts; ``.analysis.summary()`` for the counts).

    Raises:
      PartexError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise PartexError(f"analyze(fn, *args): fn must be callable, got {type(fn).__name__}")
    name = getattr(fn, "__name__", "fn")
    return analyze_loaded(LoadedModel(name, fn, tuple(args), axis_names, "custom", None))


def search(fn: Callable, args: Sequence[Any], *, mesh, hardware: str | Hardware = "tpu-v4",
           memory: str | float | None = None, seconds: float = 30.0, simulations: int | None = None,
           seed: int = 0, axis_names=None) -> Plan:
    """Search for the fastest plan of ``fn(*args)`` on ``mesh`` that fits ``memory`` per device.

    Args:
      fn: the training step.
      args: a tuple of its example arguments (arrays or ``jax.ShapeDtypeStruct`` pytrees).
      mesh: ``'data=4,model=2'`` (optionally ``name=size@GB/s``), a dict or a ``MeshSpec``.
      hardware: a preset name (``partex.HARDWARE``) or a ``Hardware``.
      memory: the per-device budget (``'16GiB'`` or bytes); None: the hardware's own.
      seconds: how long to search.
      simulations: run exactly that many MCTS simulations instead of ``seconds``.
      seed: the search's RNG seed: the same seed and simulations give the same plan.
      axis_names: optional logical axis names mirroring ``args`` (labels only).

    Returns:
      The best ``Plan`` found.

    Raises:
      PartexError: no plan fits the budget (or the arguments are wrong).
    """
    s = Session(fn, args, mesh=mesh, hardware=hardware, memory=memory, seed=seed, axis_names=axis_names)
    if simulations is not None:
        s.step(simulations)
    else:
        s.run(seconds)
    plan = s.best_plan()
    if plan is None:
        no_fit = s.stats().no_fit
        raise PartexError(f"no plan fits: {no_fit}; "
                          + ("give more host memory (hardware.host_memory_bytes) or raise memory"
                             if "host memory" in no_fit else "raise memory")
                          + ", use a larger mesh or search longer")
    return plan


def verify(plan: Plan, fn: Callable, args: Sequence[Any], *, run: bool = False, axis_names=None,
           export: str | None = None, explain: bool = False) -> VerifyReport:
    """Compile ``plan`` applied to ``fn`` with XLA on this process's devices and compare with the prediction.

    Args:
      plan: the ``Plan``, made for ``fn``.
      fn: the training step.
      args: its example arguments (real arrays with ``run``).
      run: also run the planned step and compare with the unsharded ``fn`` (``out.numerics``).
      axis_names: the inputs' logical axis names, as the plan was made with.
      export: ``"specs"`` or ``"flax-rules"``: also compile that export alone,
        ``out.comparison`` holding XLA's figures of both (``export_table(out)`` prints them).
      explain: ``out.explain``, XLA's collectives each with its source line and op, matched
        to the predicted collective and the decision that causes it (``matched_fraction``:
        the share of XLA's bytes matched).

    Returns:
      A ``VerifyReport``: ``out.memory`` (predicted / xla / ratio, per device),
      ``out.collectives`` (bytes by kind), ``out.fits``.
    """
    name = getattr(fn, "__name__", "fn")
    return verify_loaded(LoadedModel(name, fn, tuple(args), axis_names, "custom", None), plan, run=run,
                         export=export, explain=explain)


def export(plan: Plan, format: str, fn: Callable | None = None, args: Sequence[Any] | None = None, *,
           axis_names=None, as_json: bool = False) -> str:
    """Write the plan as a file a training job uses without partex (``partex export``).

    ``flax_rules`` gives the flax rules as data.

    Args:
      plan: the ``Plan``.
      format: ``"specs"``, a standalone Python module of the mesh and the step's input and
        output PartitionSpecs; ``"flax-rules"``, logical-axis rules for flax's
        ``nn.logical_axis_rules`` / MaxText's ``logical_axis_rules`` (activations' names come
        from the model's ``nn.with_logical_constraint``); ``"explicit"``, for a step in
        explicit sharding mode, the mesh with Explicit axes, the inputs' shardings and the
        ``out_sharding=`` / ``reshard`` annotations that reproduce the plan.
      fn: the training step; ``"flax-rules"`` and ``"explicit"`` need it.
      args: its example arguments, needed with ``fn``.
      axis_names: the inputs' logical axis names (``"flax-rules"`` needs them).
      as_json: the export as JSON instead of Python.

    Returns:
      The file's text.

    Raises:
      PartexError: an unknown ``format``, or one that needs ``fn`` without it.
    """
    model = None
    if fn is not None:
        model = LoadedModel(getattr(fn, "__name__", "fn"), fn, tuple(args or ()), axis_names, "custom", None)
    return export_text(plan, format, model, as_json=as_json)


def flax_rules(plan: Plan, fn: Callable, args: Sequence[Any], *, axis_names) -> "RulesExport":
    """Give ``plan`` as logical-axis rules.

    Args:
      plan: the ``Plan``, made for ``fn``.
      fn: the training step.
      args: its example arguments.
      axis_names: the inputs' logical axis names, mirroring ``args``.

    Returns:
      A ``RulesExport``: ``.rules`` [(name, mesh axes)], ``.flax()`` as
      ``nn.logical_axis_rules`` takes them, ``.matched`` (share of the named arrays' bytes
      the rules shard as the plan does), ``.conflicts`` (names the plan shards two ways).
    """
    return rules_of(plan, LoadedModel(getattr(fn, "__name__", "fn"), fn, tuple(args), axis_names, "custom", None))


def calibrate_numerics(planned: PlannedFunction, fn: Callable, args: Sequence[Any]
                       ) -> tuple[Calibration, Callable[[], list]]:
    """Split ``verify``'s numerics in two parts: the unsharded reference and the planned run.

    Args:
      planned: the planned step (``apply_plan(plan, fn)``).
      fn: the unsharded training step.
      args: the example arguments (real arrays) both run on.

    Returns:
      (``Calibration``, run): the unsharded ``fn`` run on ``args`` with each output leaf's
      tolerance calibrated on its own noise (its ``compare(leaves)`` judges any run's output
      leaves), and a function that runs ``planned`` on the same arguments and returns its
      output leaves.
    """
    import types

    return _calibrate(types.SimpleNamespace(fn=fn, args=args), planned)


def export_table(verified: VerifyReport) -> str:
    """Give the side-by-side lines of ``verify(..., export=...)``.

    Args:
      verified: the ``VerifyReport`` of ``verify(..., export="specs" or "flax-rules")``.

    Returns:
      XLA's memory and collective bytes of the full plan and of the export alone, as text.

    Raises:
      PartexError: ``verified`` holds no comparison (verify ran without ``export``).
    """
    if verified.comparison is None:
        raise PartexError("export_table needs the result of verify(..., export=\"specs\" or \"flax-rules\")")
    return "\n".join(comparison_table(verified.comparison))


__all__ = [
    # the public API
    "Session", "Plan", "PlannedFunction", "PlanDecision", "apply_plan", "plan_shardings", "shard_inputs", "analyze", "search", "verify", "PartexError",
    "search_meshes", "mesh_searcher", "effort_of", "candidate_meshes", "MeshSearch", "MeshSearcher", "MeshTrial",
    "ProgramSearch", "Topology", "Pipeline",
    "calibrate_numerics", "Calibration",
    "export", "flax_rules", "export_table", "EXPORT_FORMATS", "RulesExport",
    "MeshSpec", "Hardware", "HARDWARE", "Profile", "measure_devices", "get_hardware", "as_mesh", "as_hardware", "parse_bytes", "format_bytes",
    "ModelSpec", "Candidate", "CostReport", "MemoryReport", "SearchResult", "ExhaustiveResult", "ILPResult",
    "VerifyReport", "Measured", "Compared", "WorkCompared", "CollectiveCompared", "Numerics", "SearchStats", "RootAction",
    "Decision", "Shard", "Resolve", "Recompute", "Memory", "COLLECTIVE_KINDS", "RECOMPUTE_KINDS", "RECOMPUTE_WHAT",
    "RESOLUTIONS", "STATES", "STATE_LABELS", "MEMORY_SPACES",
    # the analysis, for those who look inside
    "ModelAnalysis", "LoadedModel", "Analysis", "Unit", "Conflict", "Group", "GroupInfo", "NamedDim", "Program", "Op", "Value",
    "Factor", "FactorKind", "CONSERVATIVE", "factor_rules", "trace", "analyze_model", "load_model",
]
