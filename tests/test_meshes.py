"""Meshes of three and four axes with per-axis links (a slow data axis over DCN, fsdp, tensor,
seq): hand plans as MaxText's, the ILP and the search on them, plans that XLA compiles and that
compute what the unsharded step does (16 simulated devices for four axes), at tiny size; and
the cost model at production mesh sizes."""

from __future__ import annotations

import pytest

import partex

M3 = "data=2@25,fsdp=2@100,tensor=2@100"
M4 = "data=2@25,fsdp=2@100,tensor=2@100,seq=2@100"


def _labels(s, name):
    return {s.label(d) for d in s.strategy(name)}


@pytest.mark.parametrize("model", ["llama", "transformer"])
def test_hand_plans_on_three_and_four_axes_are_maxtexts(model):
    for mesh in (M3, M4):
        s = partex.Session.from_spec(model, preset="tiny", mesh=mesh, hardware="tpu-v5p")
        assert s.mesh.slow_axes() == ("data",)
        zero3 = _labels(s, "zero3")
        batch = {"batch->data", "batch->fsdp"} | ({"batch->seq"} if "seq" in mesh else set())
        assert batch <= zero3 and "d_model->fsdp" in zero3 and "heads->tensor" in zero3
        assert not any(x.endswith("->data") for x in zero3 - batch)  # parameters replicated over data


@pytest.mark.parametrize("model,mesh", [("llama", M3), ("transformer-scan", M4), ("moe", M4)])
def test_search_on_more_axes_compiles_and_computes_the_unsharded_step(model, mesh):
    probe = partex.Session.from_spec(model, preset="tiny", mesh=mesh, hardware="tpu-v5p")
    peaks = [c.report.memory.peak for n, c in probe.baselines().items() if n != "replicated" and c.report]
    s = partex.Session.from_spec(model, preset="tiny", mesh=mesh, hardware="tpu-v5p", memory=1.2 * min(peaks) / 0.9)
    s.run(4)
    best = s.best()
    assert best is not None
    hand = [c.report.step_time for c in s.baselines().values() if c.report and c.report.fits]
    assert best.report.step_time <= min(hand) * (1 + 1e-9)
    assert len({d.axis for d in best.decisions if hasattr(d, "axis")}) >= 2
    out = s.verify(s.best_plan(), run=True)
    assert out.devices == s.mesh.size and out.numerics is not None and out.numerics.ok
    if model != "moe":  # the MoE's recompute is under-counted (below)
        assert 0.7 <= out.memory.ratio <= 1.3


@pytest.mark.xfail(strict=True, reason="the MoE's layer stack recomputed with its batch unsharded: partex predicts "
                   "the recompute saves 1.3 MB, XLA:CPU's peak does not fall (the experts' dispatched tokens, "
                   "f32[8,40,64], held several times over)")
def test_moe_recompute_with_the_batch_unsharded_matches_xla():
    """A plan the search finds on four axes (ffn over three of them, heads over fsdp, the layer
    stack recomputed, the batch not sharded): without the recompute the prediction is 0.93 of
    XLA's peak, with it 0.58."""
    s = partex.Session.from_spec("moe", preset="tiny", mesh=M4, hardware="tpu-v5p")
    plan = s.plan(s.decisions([("ffn", "tensor"), ("ffn", "seq"), ("stack0", "recompute:full"), ("ffn", "fsdp"),
                               ("heads", "fsdp")]))
    assert 0.7 <= s.verify(plan).memory.ratio <= 1.3


@pytest.mark.parametrize("mesh", ["data=2@6.25,fsdp=64@100,tensor=4@100", "data=4@6.25,fsdp=16@100,tensor=4@100,seq=2@100"])
def test_production_meshes_cost_model_only(mesh):
    """T32's dims (2 layers) on 512 chips of v5p, three and four axes: the hand plans, the
    ILP and the search; the search's plan fits and is at least as fast as the hand plans."""
    s = partex.Session.from_spec("transformer", preset="t32", overrides=["layers=2"], mesh=mesh, hardware="tpu-v5p")
    base = {n: c.report for n, c in s.baselines().items() if c.report is not None}
    assert base["zero3"].fits and base["zero3"].step_time < base["dp"].step_time
    ilp = s.ilp(20)
    assert ilp.report is not None and ilp.report.fits
    s.run(6)
    best = s.best()
    assert best is not None and best.report.fits
    assert best.report.step_time <= min(r.step_time for r in base.values() if r.fits) * (1 + 1e-9)
