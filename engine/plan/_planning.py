"""Decisions on an analysed model to a ``Plan``: its decisions as the file names them, the
PartitionSpec of every input and output leaf, the donated arguments and the prediction."""

from __future__ import annotations

from .._decisions import Decision
from .._mesh import Hardware, MeshSpec
from ..analysis._space import anchor_of
from ..cost import CostModel
from ._plan import Plan, PlanDecision
from ._planned import default_donate, fixed_json
from ._specs import signature_of, spec_to_json


def decision_json(an, decision: Decision, pinned: bool) -> PlanDecision:
    """A decision as its plan file writes it: the group's (layer stack's, state set's)
    label, its slot, its anchor."""
    return PlanDecision(an.subject_label(decision), decision.slot, anchor_of(an, decision), pinned)


def make_plan(model_analysis, mesh: MeshSpec, hardware: Hardware, decisions, *, strategy=None,
              pinned=(), donate=None, cost_model=None, user_shardings: str = "keep") -> Plan:
    """Build a Plan from decisions on an analysed model."""
    program = model_analysis.program
    an = model_analysis.analysis
    if donate is None:
        donate = default_donate(program)
    cm = cost_model or CostModel(an, mesh, hardware, donate=donate, user_shardings=user_shardings)
    decisions = [d for d in decisions if not d.ON_GROUP or d.id not in cm.fixed.groups]
    specs = cm.value_specs(decisions)
    report = cm.evaluate(decisions, detail=True)
    host = cm.host_state_values(decisions)
    pinned = set(pinned)
    m = model_analysis.model
    return Plan(
        mesh=mesh,
        hardware=hardware,
        decisions=tuple(decision_json(an, d, d in pinned) for d in decisions),
        inputs={p: spec_to_json(specs[v]) for v, p in zip(program.inputs, program.input_paths)},
        outputs={p: spec_to_json(specs[v]) for v, p in zip(program.outputs, program.output_paths)},
        signature=signature_of(program),
        donate=tuple(donate),
        predicted={**report.to_json(), "priced_by": hardware.priced_by()},
        model={"name": m.name, "preset": m.preset},
        strategy=strategy,
        user_shardings=cm.user_shardings,
        fixed=fixed_json(cm),
        host_inputs=tuple(p for v, p in zip(program.inputs, program.input_paths) if v in host),
        host_outputs=tuple(p for v, p in zip(program.outputs, program.output_paths) if v in host),
        pipeline=model_analysis.pipeline.to_json() if getattr(model_analysis, "pipeline", None) is not None else None,
    )
