"""Memory the forms' XLA programs hold beyond their values, and the prediction of it
(``scripts/forms/<form>.py``; the searched plans of ``test_forms.py`` are only as good as it).

On every backend a kernel holds buffers of its own: JAX's Pallas flash-attention kernels
write their softmax statistics lane-broadcast, [batch, heads, seq, 128]. Where verify compiles
(XLA:CPU) more is held, which its prediction (``lowering="cpu"``) must hold too for its ratio
to XLA's figure to say anything: a Pallas kernel runs in the interpreter, a loop over its grid
whose state copies its operands; ``ragged_dot`` is rolled out densely (every group's rows
against every weight); threefry's rolled loops are started as soon as their key is ready.
The search prices plans for TPU, where none of these is held: that prediction stays the
kernel's."""

from __future__ import annotations

import pytest

import _libcheck as lc
import partex
from partex.cost import CostModel

load = lc.load_form


def _session(form: str) -> partex.Session:
    mod = load(form)
    return lc.session(mod.make(), mesh=mod.MESH)


def _shard(s: partex.Session, label: str, axis: str) -> partex.Shard:
    return partex.Shard(next(g.id for g in s.analysis.decision_groups if s.group(g.id).label == label), axis)


def _recompute(s: partex.Session, kind: str) -> partex.Recompute:
    (u,) = s.units
    return partex.Recompute(u.id, kind)


def _ratio(s: partex.Session, decisions) -> float:
    """verify's predicted / XLA peak memory (XLA:CPU's figure, the CPU lowering's prediction)."""
    return s.verify(s.plan(decisions, strategy="checked"), mark=False).memory.ratio


@pytest.mark.parametrize("plan", ["w_in on model, dots recomputed", "megatron, dots recomputed"])
def test_an_interpreted_pallas_kernel_holds_its_loop_state_on_xla_cpu(plan):
    """XLA:CPU runs the Pallas matmul in the interpreter: a loop whose state copies the
    operands it reads as they are (made as soon as they are ready) and whose results start
    as copies of a constant made at the step's start; recomputed in the backward pass, the
    kernel runs there again. The CPU prediction holds these (0.79 and 0.85 of XLA's peak
    without them); the TPU prediction, for which the search prices the plan, holds none."""
    s = _session("pallas_matmul")
    base = [_shard(s, "*/w_in[1]", "model")] if plan.startswith("w_in") else s.strategy("megatron")
    decisions = [*base, _recompute(s, "dots")]
    assert 0.9 <= _ratio(s, decisions) <= 1.1
    cpu = CostModel(s.analysis, s.cost_model.mesh, s.hardware, donate=s.donate, lowering="cpu")
    assert s.evaluate(decisions).memory.peak < cpu.evaluate(decisions).memory.peak


def test_flash_attentions_kernels_hold_their_statistics_where_they_run():
    """The backward flash-attention op (``custom_partitioning`` over the Pallas kernels)
    broadcasts the softmax statistics and the output-gradient dot to [batch, heads, seq, 128]
    for its two kernels: three such buffers per device while it runs, on TPU as on any
    backend, which the prediction the search uses holds at that op."""
    s = _session("flash_attention")
    decisions = s.strategy("zero3")
    report = s.evaluate(decisions, detail=True)
    backward = [op.id for op in s.program.ops if op.primitive == "custom_partitioning" and len(op.inputs) == 7]
    q = s.program.values[s.program.ops[backward[0]].inputs[0]]  # [batch, heads, seq, head_dim]
    spec = s.cost_model.value_specs(decisions)[q.id]
    devices = 1
    for axes in spec:
        for a in axes:
            devices *= s.mesh.sizes[s.mesh.axes.index(a)]
    stats = q.nbytes / devices * 128 / q.shape[-1]  # one statistic's [batch, heads, seq, 128], per device
    held = [h for h in report.memory.held if h.start in backward and h.stop == h.start + 1]
    assert report.memory.peak_op in backward and held, report.memory.held[:4]
    assert max(h.bytes for h in held) >= 3 * stats, held


@pytest.mark.parametrize("plan", ["zero3", "dp, dots recomputed"])
def test_flash_attention_interpreted_on_xla_cpu_is_predicted(plan):
    """On XLA:CPU the flash kernels run in the interpreter: each loop copies its operands
    (the broadcast statistics among them) as soon as they are ready, the recomputed forward
    kernels' from where the recomputation makes them, and starts its results from copies of
    a constant made at the step's start. The CPU prediction holds them (0.31 and 0.30 of
    XLA's peak without them)."""
    s = _session("flash_attention")
    decisions = s.strategy("zero3") if plan == "zero3" else [*s.strategy("dp"), _recompute(s, "dots")]
    assert 0.9 <= _ratio(s, decisions) <= 1.1


def test_ragged_dot_is_rolled_out_densely_on_xla_cpu_and_a_grouped_kernel_elsewhere():
    """XLA:CPU runs ``ragged_dot`` as JAX's dense rollout: its ragged operand broadcast over
    the groups and masked ([groups, tokens, dim]), both operands for a weight's gradient, whose
    expansion of the forward's lhs is the forward's own buffer where that lhs is a buffer (the
    sorted tokens). The CPU prediction holds these (dp 0.59 and the searched plan 0.54 of
    XLA's peak without them); the TPU prediction, a grouped kernel's, holds none."""
    s = _session("ragged_dot_moe")
    searched = [_recompute(s, "dots"), _shard(s, "*/w_in[0]", "data"), _shard(s, "*/w_in[1]", "model"),
                _shard(s, "*/w_out[0]", "model")]
    assert 0.75 <= _ratio(s, s.strategy("dp")) <= 1.25
    assert 0.8 <= _ratio(s, searched) <= 1.25
    for lowering, held in (("tpu", False), ("cpu", True)):
        cm = CostModel(s.analysis, s.cost_model.mesh, s.hardware, donate=s.donate, lowering=lowering)
        ops = cm.tables.workspace[0].tolist() if cm.tables.workspace else []
        assert any(s.program.ops[o].primitive == "ragged_dot_general" for o in ops) == held, lowering


@pytest.mark.parametrize("plan", ["w_in on model, dots recomputed", "zero3, dots recomputed"])
def test_dropout_bits_are_made_as_soon_as_their_key_is_on_xla_cpu(plan):
    """XLA:CPU starts every threefry loop whose key is ready: all the forward pass's dropout
    bits are made at the step's start (two uint32 halves each, and the round's next two
    beside the running loop's), and the backward pass makes the recomputed masks' bits
    again. The CPU prediction holds them (0.65 of XLA's peak where each mask's bits were
    made where the program makes them)."""
    s = _session("dropout_typed_keys")
    base = [_shard(s, "*/w_in[1]", "model")] if plan.startswith("w_in") else s.strategy("zero3")
    assert 0.8 <= _ratio(s, [*base, _recompute(s, "dots")]) <= 1.1
