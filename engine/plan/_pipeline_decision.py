"""A layer stack run as a pipeline: the decision, and the step it makes.

A ``Pipeline`` says which layer stack (a ``scan`` over stacked weights whose rows are
independent: ``analysis._pipeline_stacks``), over which mesh axis (its size: the stages) and in how
many microbatches, on which schedule. It is a decision about the program rather than about
one group's dims: the pipelined step (``plan._pipelined_scan.pipelined_scan`` in place of both of
the stack's loops) is a program of its own -- a loop over ticks, each stage's layers, the
activations' rotation over the stage axis, per-microbatch buffers -- and ``pipelined``
traces and analyses it, so that everything else (the decisions inside the stages, their
cost, the search, the ILP, verify, apply) runs on it as on any step. The stage dim of every
per-stage value is the step's own sharding there (a fixed decision), and the plan records
the pipeline, so that ``apply_plan(plan, fn)`` rewrites the user's step the same way.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any

import jax

from .._errors import PartexError
from .._loader import LoadedModel, ModelAnalysis, analyze_loaded
from .._mesh import MeshSpec, get_hardware
from ..analysis._pipeline_stacks import PipelineStack, pipeline_stacks, pipeline_units
from ..analysis._recompute import plan_unit
from ..cost import CostModel
from ..tracing._program import TOP_REGION, Program, dynamic_args
from ._apply import constrained_function
from ._pipelined_scan import PipelineRun, Schedule

SCHEDULES = ("gpipe", "circular")
# what a stage recomputes in its backward ticks (``analysis._recompute``'s loop kinds that
# keep everything on the device): the stack's own recompute decision, taken with the pipeline
RECOMPUTE = ("dots", "full")


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """Layer stack ``stack`` (its label, ``stack0``) pipelined over mesh axis ``axis``, in
    ``microbatches`` microbatches, on ``schedule`` (``gpipe``: fill and drain; ``circular``:
    each stage holding ``repeats`` blocks of layers S apart, every microbatch passing the
    stages ``repeats`` times, which divides the bubble by about that); each stage
    recomputing its layers' residuals in the backward ticks as ``recompute`` says (``dots``:
    keeping the weight matmuls' outputs, ``full``: keeping each layer's input; None: saving
    them all for the in-flight microbatches)."""

    stack: str
    axis: str
    microbatches: int
    schedule: str = "gpipe"
    recompute: str | None = None
    repeats: int = 1

    def text(self) -> str:
        """``stack0:stage:8`` (``:circular<R>`` on the circular schedule, ``:kind`` when
        recomputing): what ``parse`` reads."""
        tail = (f":{self.schedule}" + (str(self.repeats) if self.schedule == "circular" else "")
                if self.schedule != "gpipe" else "") + (f":{self.recompute}" if self.recompute else "")
        return f"{self.stack}:{self.axis}:{self.microbatches}{tail}"

    def bubble(self, stages: int) -> float:
        """The share of the ticks a stage idles on ``stages`` stages (``Schedule.bubble``)."""
        return Schedule(stages, self.microbatches, self.repeats).bubble

    @classmethod
    def parse(cls, text: str) -> "Pipeline":
        """``STACK:AXIS:MICROBATCHES[:SCHEDULE][:RECOMPUTE]`` (e.g. ``stack0:stage:8``,
        ``stack0:stage:8:circular2:full``; SCHEDULE ``gpipe`` or ``circular<R>``): the
        ``Pipeline`` ``text`` spells; PartexError for text it cannot read."""
        parts = str(text).split(":")
        if not 3 <= len(parts) <= 5 or not all(parts):
            raise PartexError(f"pipeline {text!r}: expected STACK:AXIS:MICROBATCHES[:SCHEDULE][:RECOMPUTE], "
                              "e.g. stack0:stage:8 or stack0:stage:8:full")
        try:
            m = int(parts[2])
        except ValueError:
            raise PartexError(f"pipeline {text!r}: microbatches must be a whole number, got {parts[2]!r}") from None
        schedule, recompute = "gpipe", None
        for p in parts[3:]:
            if p in RECOMPUTE and recompute is None:
                recompute = p
            elif p not in RECOMPUTE and schedule == "gpipe" and recompute is None:
                schedule = p
            else:
                raise PartexError(f"pipeline {text!r}: after MICROBATCHES come a schedule (gpipe or circular<R>) "
                                  f"then a recompute kind ({', '.join(RECOMPUTE)}), each at most once")
        repeats = 1
        circular = re.fullmatch(r"circular(\d+)", schedule)
        if circular:
            schedule, repeats = "circular", int(circular.group(1))
        elif schedule == "circular":
            raise PartexError(f"pipeline {text!r}: say how many times the microbatches pass the stages, e.g. circular2")
        return cls(parts[0], parts[1], m, schedule, recompute, repeats)

    def to_json(self) -> dict:
        """Every field as JSON data (a plan's and a session file's ``pipeline``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Any, where: str = "plan") -> "Pipeline":
        """The pipeline in the JSON data ``d`` (``to_json``); ``where`` names it in the
        PartexError for a malformed one."""
        try:
            rc = d.get("recompute")
            return cls(str(d["stack"]), str(d["axis"]), int(d["microbatches"]), str(d.get("schedule", "gpipe")),
                       None if rc is None else str(rc), int(d.get("repeats", 1)))
        except (TypeError, KeyError, ValueError, AttributeError):
            raise PartexError(f"{where}: 'pipeline' must be {{\"stack\": str, \"axis\": str, "
                              "\"microbatches\": int, \"schedule\": str, \"recompute\": str or null, \"repeats\": int}") from None


def stack_of(model: ModelAnalysis, pipeline: Pipeline, mesh: MeshSpec) -> PipelineStack:
    """The stack ``pipeline`` names, checked against the model and mesh (bad input: one line)."""
    an = model.analysis
    if pipeline.schedule not in SCHEDULES:
        raise PartexError(f"pipeline {pipeline.text()}: unknown schedule {pipeline.schedule!r}; known: "
                          f"gpipe, circular<R> (a stage recomputes {' or '.join(RECOMPUTE)})")
    if pipeline.recompute is not None and pipeline.recompute not in RECOMPUTE:
        raise PartexError(f"pipeline {pipeline.text()}: unknown recompute kind {pipeline.recompute!r}; a stage "
                          f"recomputes {' or '.join(RECOMPUTE)}")
    scan_units = {u.label: u for u in pipeline_units(an)}
    unit = scan_units.get(pipeline.stack) or an.unit_by_label(pipeline.stack)
    stacks = pipeline_stacks(an, tuple(scan_units.values()), an.roles.batch_groups)
    if unit is None:
        scans = ", ".join(scan_units) or "none (its layers are not under a scan)"
        raise PartexError(f"pipeline {pipeline.text()}: the step has no layer stack {pipeline.stack!r}; "
                          f"stacks that may be pipelined: {scans}")
    if pipeline.recompute is not None and not unit.kinds:
        raise PartexError(f"pipeline {pipeline.text()}: the step's own jax.checkpoint recomputes {unit.label}'s "
                          f"layers already: drop :{pipeline.recompute}")
    stack = stacks.get(unit.id, f"{unit.label} is unrolled: only a scan over stacked layers is pipelined")
    if isinstance(stack, str):
        raise PartexError(f"pipeline {pipeline.text()}: {stack}")
    if pipeline.axis not in mesh.axes:
        raise PartexError(f"pipeline {pipeline.text()}: the mesh ({mesh.text()}) has no axis {pipeline.axis!r}")
    stages = mesh.sizes[mesh.index(pipeline.axis)]
    r = pipeline.repeats
    if r < 1 or (r > 1) != (pipeline.schedule == "circular"):
        raise PartexError(f"pipeline {pipeline.text()}: {r} repeats: the circular schedule takes 2 or more, gpipe 1")
    if stages < 2 or stack.layers % (stages * r):
        raise PartexError(f"pipeline {pipeline.text()}: {stack.layers} layers do not split into {stages} stages "
                          f"(the size of {pipeline.axis})" + (f" of {r} blocks each" if r > 1 else ""))
    m = pipeline.microbatches
    if m < 1 or stack.batch % m:
        raise PartexError(f"pipeline {pipeline.text()}: a batch of {stack.batch} does not split into {m} microbatches")
    if r > 1 and m < stages:
        raise PartexError(f"pipeline {pipeline.text()}: the circular schedule needs at least as many microbatches "
                          f"as stages ({stages})")
    return stack


def pipelined(model: ModelAnalysis, pipeline: Pipeline, mesh: MeshSpec) -> ModelAnalysis:
    """The step with ``pipeline`` applied, traced and analysed (module docstring); its
    ``pipeline`` field set, its ``base`` the model as it was."""
    stack = stack_of(model, pipeline, mesh)
    m = model.model
    program = model.program
    if pipeline.recompute is not None:  # the stack's loops recomputing (as apply does), then pipelined
        program, stack = _recomputed(model, pipeline, mesh)
    run = PipelineRun(stack, pipeline.axis, mesh.sizes[mesh.index(pipeline.axis)], pipeline.microbatches,
                      pipeline.repeats)
    step = pipelined_step(program, run, abstract_mesh(trace_mesh(model.program, pipeline, mesh)))
    loaded = LoadedModel(m.name, step, m.args, m.axis_names, m.preset, m.config)
    out = analyze_loaded(loaded)
    # the pipelined step computes in its bubble too: its MFU counts the step's own work
    work = CostModel(model.analysis, MeshSpec(("one",), (1,)), get_hardware("cpu")).tables.total_flops
    return dataclasses.replace(out, pipeline=pipeline, base=model, work_flops=work)


def _recomputed(model: ModelAnalysis, pipeline: Pipeline, mesh: MeshSpec) -> tuple[Program, PipelineStack]:
    """The step with ``pipeline``'s stack recomputed as it says (apply's ``LoopPlan``: the
    forward loop stacks only what the recomputation reads, the backward loop recomputes the
    rest), traced, and that stack in it. The rewritten step's loops are its top-level scans
    in the same order as the step's."""
    an = model.analysis
    unit = an.unit_by_label(pipeline.stack)
    plans = plan_unit(model.program, unit, str(pipeline.recompute))
    m = model.model
    step = rewritten_step(model.program, constrained_function(model.program,
                                                              abstract_mesh(trace_mesh(model.program, pipeline, mesh)), {},
                                                              recompute=plans), "recomputed_step")
    inner = analyze_loaded(LoadedModel(m.name, step, m.args, m.axis_names, m.preset, m.config))

    def scans(p: Program) -> list[int]:
        return sorted(r.enter for r in p.regions if r.kind == "scan" and r.parent == TOP_REGION and r.enter >= 0)

    assert unit is not None and unit.loop is not None
    before, after = scans(model.program), scans(inner.program)
    assert len(before) == len(after), (before, after)
    f, b = (after[before.index(e)] for e in unit.loop)
    stack = pipeline_stacks(inner.analysis, (dataclasses.replace(unit, loop=(f, b)),),
                            inner.analysis.roles.batch_groups)[unit.id]
    if isinstance(stack, str):
        raise PartexError(f"pipeline {pipeline.text()}: with its layers recomputed, {stack}")
    return inner.program, stack


def pipelined_step(program: Program, run: PipelineRun, mesh):
    """The traced step as a function of the user's arguments (static leaves too) with its
    stack's loops pipelined as ``run`` says, on ``mesh`` (a Mesh or an AbstractMesh with the
    plan's axes): apply's interpreter with no constraint but the stages'."""
    return rewritten_step(program, constrained_function(program, mesh, {}, pipelines=[run]), "pipelined_step")


def rewritten_step(program: Program, inner, name: str = "rewritten_step"):
    """``inner`` (apply's interpreter of ``program``, on its dynamic leaves) as a function of
    the user's arguments, static leaves too, with the step's argument names."""

    def step(*args):
        return program.full_outputs(inner(*dynamic_args(args)))

    names = program.arg_names or tuple(f"arg{i}" for i in range(len(program.in_tree.children())))
    step.__signature__ = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                            for n in names])  # type: ignore[attr-defined]
    step.__name__ = name
    return step


def trace_mesh(program: Program, pipeline: Pipeline, mesh: MeshSpec) -> MeshSpec:
    """The mesh a pipelined step is traced on: where the step names no mesh of its own (no
    sharding of its own, no explicit mesh, no shard_map), the stage axis and one axis for
    the rest of the devices, so that one trace serves every mesh with those stages (the mesh
    search's); else ``mesh`` itself, whose axes the step's own shardings name. The plan
    applies the pipeline on its own mesh (``bind``)."""
    if program.user_shardings or program.explicit_mesh is not None or \
            any(op.primitive == "shard_map_enter" for op in program.ops):
        return mesh
    stages = mesh.sizes[mesh.index(pipeline.axis)]
    rest = mesh.size // stages
    return MeshSpec.create((pipeline.axis, "_rest"), (stages, rest)) if rest > 1 else \
        MeshSpec.create((pipeline.axis,), (stages,))


def abstract_mesh(mesh: MeshSpec):
    """An abstract mesh of ``mesh``'s axes (Auto), enough to trace a pipelined step."""
    return jax.sharding.AbstractMesh(mesh.sizes, mesh.axes,
                                     axis_types=(jax.sharding.AxisType.Auto,) * len(mesh.axes))
