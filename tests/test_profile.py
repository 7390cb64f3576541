"""Hardware profiles: measurements into tables, tables into prices, and the H200 reference.

``fixtures/h200`` holds micro-benchmarks and whole training steps measured on one NVIDIA H200
(``micro.json``: kernels timed one jitted call each; ``steps.json``: the llama demo at 1B
widths, step time and XLA GPU's compiled peak). A profile fitted from the micro-benchmarks
alone must predict the steps within the bounds partex promises.
"""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import pytest

import partex
from partex import Hardware, PartexError, Recompute
from partex._profile import JAX_GPU_MEMORY_FRACTION, Profile, from_measurements, load_measurements

from conftest import ROOT

H200 = ROOT / "tests" / "fixtures" / "h200"
BIG = dict(layers=16, d_model=2048, heads=16, kv_heads=8, d_ff=5632, vocab=32000, seq=2048, batch=8,
           dtype="bfloat16")


@pytest.fixture(scope="module")
def h200():
    return from_measurements(load_measurements(H200 / "micro.json"), source="micro.json")


def _rows(rate=100e12, bw=1e12, floor=5e-6, devices=1) -> list[dict]:
    """Measurements of an ideal device: every matmul at ``rate``, every byte at ``bw``."""
    rows = [{"kind": "device", "name": "Ideal", "platform": "gpu", "jax": "x", "devices": devices,
             "bytes_limit": 64e9},
            {"kind": "kernel", "s": floor}]
    for m, n, k in [(256, 256, 256), (4096, 4096, 4096), (1024, 8192, 512), (8192, 1024, 2048)]:
        rows.append({"kind": "gemm", "dtype": "float32", "m": m, "n": n, "k": k, "s": 2 * m * n * k / rate,
                     "in_step": True})
    for b in (2**20, 2**24, 2**28):
        rows.append({"kind": "elementwise", "dtype": "float32", "bytes": b, "s": b / bw, "in_step": True})
    return rows


def test_a_profile_round_trips_and_prices_what_it_measured(h200, tmp_path):
    path = tmp_path / "h200.json"
    h200.save(path)
    again = Profile.load(path)
    assert again == h200
    # a measured shape is priced at its own measured rate (the table point itself)
    dt, b, m, n, k, s = next(r for r in h200.gemm if (r[2], r[3], r[4]) == (16384, 2048, 2048))
    assert math.isclose(h200.gemm_time(dt, b, m, n, k), s, rel_tol=1e-9)
    # a matmul and its transpose cost the same; an unmeasured dtype at its relative rate
    assert math.isclose(h200.gemm_rate("bfloat16", 1, 3000, 700, 900), h200.gemm_rate("bfloat16", 1, 700, 3000, 900))
    assert math.isclose(h200.gemm_rate("float32", 1, 4096, 4096, 4096),
                        h200.gemm_rate("bfloat16", 1, 4096, 4096, 4096) / 2)
    # bandwidth never falls with size on this GPU; a call's ~90 us overhead is off every kernel
    sizes = [2**k for k in range(20, 34)]
    bws = [x / h200.memory_time(x) for x in sizes]
    assert all(a <= b * (1 + 1e-9) for a, b in zip(bws, bws[1:]))
    assert 2.5e12 < bws[-1] < 4.8e12
    # the memory a program may take: JAX's default share of the H200's 141 GB, said in a note
    assert math.isclose(h200.memory_bytes, 141e9 * JAX_GPU_MEMORY_FRACTION)
    assert any("75%" in n for n in h200.notes) and any("kernel floor not measured" in n for n in h200.notes)


def test_hardware_from_a_profile_is_hardware_everywhere(h200, tmp_path):
    path = tmp_path / "p.json"
    h200.save(path)
    hw = Hardware.load(path)
    assert hw.profile == h200 and hw.lowering == "gpu" and hw.peak_flops == 989e12
    assert hw.hbm_bytes == h200.memory_bytes and hw.overlap
    # a preset by name, a profile by path: the same function and the same JSON round trip
    assert partex.get_hardware(str(path)) == hw
    assert Hardware.from_json(json.loads(json.dumps(hw.to_json()))) == hw
    assert "micro.json" in hw.priced_by() and "datasheet" in partex.get_hardware("tpu-v4").priced_by()
    # a plan made on it carries the profile and says what priced it
    s = partex.Session.from_spec("mlp", mesh="data=2", hardware=hw)
    plan = s.plan(strategy="dp")
    assert plan.predicted["priced_by"] == hw.priced_by()
    assert partex.Plan.loads(plan.dumps()).hardware == hw


def test_the_cost_model_prices_each_kernel_from_the_profile():
    """On an ideal device (every matmul at 100 TFLOP/s, every byte at 1 TB/s, 5 us a
    kernel) a matmul costs its FLOPs at that rate plus the floor, and an elementwise op its
    bytes plus the floor: nothing else."""
    hw = Hardware.from_profile(from_measurements(_rows(), source="test"))

    def step(x, w):
        return jnp.tanh(x @ w)

    x, w = jnp.ones((512, 1024)), jnp.ones((1024, 2048))
    s = partex.Session(step, (x, w), mesh="data=1", hardware=hw)
    rep = s.evaluate([])
    matmul = 2 * 512 * 1024 * 2048 / 100e12 + 5e-6
    tanh = (512 * 2048 * 4 * 2) / 1e12 + 5e-6  # reads and writes its float32 [512, 2048]
    assert math.isclose(rep.compute_time, matmul + tanh, rel_tol=1e-6)


@pytest.mark.parametrize("bad, message", [
    ([{"kind": "gemm", "m": 1, "n": 1, "k": 1, "s": 1}], "no \"device\" row"),
    ([{"kind": "device", "name": "X"}], "no matmul timings"),
    ([{"kind": "device", "name": "X"}, {"kind": "gemm", "m": 4, "n": 4, "k": 4, "s": -1}], "expected a finite"),
    ([{"kind": "device", "name": "X"}, {"kind": "gemm", "m": 4, "n": 4, "k": 4, "s": 1e-3}], "no memory-bound"),
    ({"not": "rows"}, "must be a JSON list"),
])
def test_bad_measurements_say_what_is_wrong(bad, message):
    with pytest.raises(PartexError, match=message):
        from_measurements(bad, source="test")


def test_a_file_that_is_not_a_profile_is_refused(tmp_path):
    p = tmp_path / "plan.json"
    p.write_text('{"format": "partex-plan"}')
    with pytest.raises(PartexError, match="not a partex hardware profile"):
        Hardware.load(p)
    with pytest.raises(PartexError, match="no hardware profile at"):
        Hardware.load(tmp_path / "missing.json")


def test_calibrate_measures_the_local_devices(tmp_path):
    """``partex calibrate`` on 8 simulated CPU devices (quick): every table filled, the
    kernels timed inside a step, the collectives over groups of 2, 4 and 8; the profile
    prices a plan."""
    from partex._calibrate import calibrate

    seen = []
    rows = calibrate(quick=True, progress=lambda what, frac: seen.append(frac))
    assert seen[-1] == 1.0 and all(a <= b for a, b in zip(seen, seen[1:]))
    kinds = {r["kind"] for r in rows}
    assert {"device", "gemm", "elementwise", "kernel", "launch", "collective"} <= kinds
    assert all(r.get("in_step") for r in rows if r["kind"] in ("gemm", "elementwise", "collective"))
    dev = rows[0]
    assert dev["name"] == jax.devices()[0].device_kind and dev["devices"] == 8 and dev["bytes_limit"] > 0
    groups = {(r["op"], r["devices"]) for r in rows if r["kind"] == "collective"}
    assert {("all-gather", 2), ("reduce-scatter", 4), ("all-reduce", 8), ("all-to-all", 8),
            ("collective-permute", 2)} <= groups
    profile = from_measurements(rows, source="test")
    assert profile.platform == "cpu" and profile.devices == 8 and profile.collectives
    assert profile.collective_time("all-gather", 4, 1e6) > 0
    hw = Hardware.from_profile(profile)
    assert hw.lowering == "cpu" and not hw.overlap
    s = partex.Session.from_spec("transformer", mesh="data=4,model=2", hardware=hw)
    assert s.evaluate(s.strategy("megatron")).step_time > 0


# ----------------------------------------------------------------------------- the H200 reference

def _reference_cases():
    steps = json.loads((H200 / "steps.json").read_text())
    return {c["case"]: c for c in steps["cases"]}


def _session(hw, remat: str, **over):
    return partex.Session.from_spec("llama", preset="7b", overrides={**BIG, "remat": remat, **over}, mesh="data=1",
                                    hardware=hw)


@pytest.mark.parametrize("case, remat, decisions", [
    ("remat full", "full", ()),
    ("qkv_proj_offloaded", "qkv_proj_offloaded", ()),
    ("searched at half memory", "none", (Recompute(0, "dots"),)),
])
def test_the_h200_steps_are_predicted_within_bounds(h200, case, remat, decisions):
    """Step time within +-15% of the H200's measured, peak memory within 0.95-1.10 of XLA
    GPU's compiled peak, from the micro-benchmarks' profile alone."""
    ref = _reference_cases()[case]
    rep = _session(Hardware.from_profile(h200), remat).evaluate(list(decisions))
    assert 0.85 <= rep.step_time / ref["measured_step_s"] <= 1.15, (rep.step_time, ref["measured_step_s"])
    assert 0.95 <= rep.memory.peak / (ref["xla_peak_gib"] * 2**30) <= 1.10, (rep.memory.peak / 2**30,
                                                                          ref["xla_peak_gib"])


def test_the_h200_step_without_remat_is_refused(h200):
    """XLA GPU could not even compile the step without rematerialisation at this size on the
    141 GB card: it does not fit what JAX lets a program take."""
    rep = _session(Hardware.from_profile(h200), "none").evaluate([])
    assert not rep.fits and rep.memory.peak > h200.memory_bytes
