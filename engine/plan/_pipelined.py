"""A layer stack run as a pipeline: the decision, and the step it makes.

A ``Pipeline`` says which layer stack (a ``scan`` over stacked weights whose rows are
independent: ``analysis._pipeline``), over which mesh axis (its size: the stages) and in how
many microbatches, on which schedule. It is a decision about the program rather than about
one group's dims: the pipelined step (``plan._pipeline.pipelined_scan`` in place of both of
the stack's loops) is a program of its own -- a loop over ticks, each stage's layers, the
activations' rotation over the stage axis, per-microbatch buffers -- and ``pipelined``
traces and analyses it, so that everything else (the decisions inside the stages, their
cost, the search, the ILP, verify, apply) runs on it as on any step. The stage dim of every
per-stage value is the step's own sharding there (a fixed decision), and the plan records
the pipeline, so that ``plan.apply(fn)`` rewrites the user's step the same way.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import jax

from .._errors import PartexError
from .._loader import LoadedModel, ModelAnalysis, analyze_loaded
from .._mesh import MeshSpec, get_hardware
from ..analysis._pipeline import PipelineStack, pipeline_stacks
from ..cost import CostModel
from ..tracing._program import Program, dynamic_args
from ._apply import constrained_function
from ._pipeline import PipelineRun

SCHEDULES = ("gpipe",)


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """Layer stack ``stack`` (its label, ``stack0``) pipelined over mesh axis ``axis``, in
    ``microbatches`` microbatches, on ``schedule`` (``gpipe``: fill and drain)."""

    stack: str
    axis: str
    microbatches: int
    schedule: str = "gpipe"

    def text(self) -> str:
        """``stack0:stage:8`` (``:schedule`` when not gpipe): what ``parse`` reads."""
        tail = f":{self.schedule}" if self.schedule != "gpipe" else ""
        return f"{self.stack}:{self.axis}:{self.microbatches}{tail}"

    def describe(self, stages: int) -> str:
        return (f"{self.stack} pipelined over {self.axis} ({stages} stages), {self.microbatches} microbatches, "
                f"{self.schedule}: bubble {bubble(stages, self.microbatches):.0%}")

    @classmethod
    def parse(cls, text: str) -> "Pipeline":
        """``STACK:AXIS:MICROBATCHES[:SCHEDULE]`` (e.g. ``stack0:stage:8``)."""
        parts = str(text).split(":")
        if len(parts) not in (3, 4) or not all(parts):
            raise PartexError(f"pipeline {text!r}: expected STACK:AXIS:MICROBATCHES[:SCHEDULE], "
                              "e.g. stack0:stage:8")
        try:
            m = int(parts[2])
        except ValueError:
            raise PartexError(f"pipeline {text!r}: microbatches must be a whole number, got {parts[2]!r}") from None
        return cls(parts[0], parts[1], m, parts[3] if len(parts) == 4 else "gpipe")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Any, where: str = "plan") -> "Pipeline":
        try:
            return cls(str(d["stack"]), str(d["axis"]), int(d["microbatches"]), str(d.get("schedule", "gpipe")))
        except (TypeError, KeyError, ValueError):
            raise PartexError(f"{where}: 'pipeline' must be {{\"stack\": str, \"axis\": str, "
                              "\"microbatches\": int, \"schedule\": str}") from None


def bubble(stages: int, microbatches: int) -> float:
    """The share of a fill-and-drain pipeline's ticks a stage idles: (S-1) / (M+S-1)."""
    return (stages - 1) / (microbatches + stages - 1)


def stack_of(model: ModelAnalysis, pipeline: Pipeline, mesh: MeshSpec) -> PipelineStack:
    """The stack ``pipeline`` names, checked against the model and mesh (bad input: one line)."""
    an = model.analysis
    if pipeline.schedule not in SCHEDULES:
        raise PartexError(f"pipeline {pipeline.text()}: unknown schedule {pipeline.schedule!r}; known: "
                          f"{', '.join(SCHEDULES)}")
    unit = an.unit_by_label(pipeline.stack)
    stacks = pipeline_stacks(an, an.units, an.roles.batch_groups)
    if unit is None:
        scans = ", ".join(an.units[u].label for u in stacks) or "none (its layers are not under a scan)"
        raise PartexError(f"pipeline {pipeline.text()}: the step has no layer stack {pipeline.stack!r}; "
                          f"stacks that may be pipelined: {scans}")
    stack = stacks.get(unit.id, f"{unit.label} is unrolled: only a scan over stacked layers is pipelined")
    if isinstance(stack, str):
        raise PartexError(f"pipeline {pipeline.text()}: {stack}")
    if pipeline.axis not in mesh.axes:
        raise PartexError(f"pipeline {pipeline.text()}: the mesh ({mesh.text()}) has no axis {pipeline.axis!r}")
    stages = mesh.sizes[mesh.index(pipeline.axis)]
    if stages < 2 or stack.layers % stages:
        raise PartexError(f"pipeline {pipeline.text()}: {stack.layers} layers do not split into {stages} stages "
                          f"(the size of {pipeline.axis})")
    m = pipeline.microbatches
    if m < 1 or stack.batch % m:
        raise PartexError(f"pipeline {pipeline.text()}: a batch of {stack.batch} does not split into {m} microbatches")
    return stack


def pipelined(model: ModelAnalysis, pipeline: Pipeline, mesh: MeshSpec) -> ModelAnalysis:
    """The step with ``pipeline`` applied, traced and analysed (module docstring); its
    ``pipeline`` field set, its ``base`` the model as it was."""
    stack = stack_of(model, pipeline, mesh)
    run = PipelineRun(stack, pipeline.axis, mesh.sizes[mesh.index(pipeline.axis)], pipeline.microbatches)
    step = pipelined_step(model.program, run, abstract_mesh(mesh))
    m = model.model
    loaded = LoadedModel(m.name, step, m.args, m.axis_names, m.preset, m.config)
    out = analyze_loaded(loaded)
    # the pipelined step computes in its bubble too: its MFU counts the step's own work
    work = CostModel(model.analysis, MeshSpec(("one",), (1,)), get_hardware("cpu")).tables.total_flops
    return dataclasses.replace(out, pipeline=pipeline, base=model, work_flops=work)


def pipelined_step(program: Program, run: PipelineRun, mesh):
    """The traced step as a function of the user's arguments (static leaves too) with its
    stack's loops pipelined as ``run`` says, on ``mesh`` (a Mesh or an AbstractMesh with the
    plan's axes): apply's interpreter with no constraint but the stages'."""
    inner = constrained_function(program, mesh, {}, pipelines=[run])

    def step(*args):
        return program.full_outputs(inner(*dynamic_args(args)))

    names = program.arg_names or tuple(f"arg{i}" for i in range(len(program.in_tree.children())))
    step.__signature__ = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                            for n in names])  # type: ignore[attr-defined]
    step.__name__ = "pipelined_step"
    return step


def abstract_mesh(mesh: MeshSpec):
    """An abstract mesh of ``mesh``'s axes (Auto), enough to trace a pipelined step."""
    return jax.sharding.AbstractMesh(mesh.sizes, mesh.axes,
                                     axis_types=(jax.sharding.AxisType.Auto,) * len(mesh.axes))
