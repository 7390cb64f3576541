"""verify's numerics on steps that amplify rounding (tests/numerics_models): a correct plan
passes, a wrong one is caught, each output leaf judged against the unsharded step's own noise
(partex/plan/_numerics.py). ``tests/numerics_models/table.py`` prints the same cases as a
table, the fixed tolerance beside the calibrated one."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partex
from partex.plan._numerics import (NUMERICS_NOISE_FACTOR, NUMERICS_RTOL, calibrate, compare_outputs,
                                   perturbed, step_noise)

from numerics_models import attention, quant
from numerics_models.wrong import swapped, unreduced

# hidden on `model`, d_model on `data` (the norms' sums split), the batch on `data`
INT8_PLAN = [("*/w1[1]", "model"), ("*/w1[0]", "data"), ("b/x[0]", "data")]


def _calibrated(step, args, mesh: str, decisions):
    s = partex.Session(step, args, mesh=mesh)
    plan = s.plan(strategy=decisions) if isinstance(decisions, str) else s.plan(decisions)
    cal, run_planned = calibrate(types.SimpleNamespace(fn=step, args=args), partex.apply_plan(plan, step))
    return cal, run_planned()


def _rel_noise(cal) -> dict[str, float]:
    """Each leaf's noise over its own RMS."""
    return {p: n / max(float(np.sqrt(np.mean(np.square(np.asarray(r, np.float64))))), 1e-30)
            for p, n, r in zip(cal.paths, cal.noise, cal.ref)}


# --------------------------------------------------------------------------- the parts

def test_perturbed_moves_floats_by_a_few_ulps_and_leaves_data_alone():
    x = np.linspace(-3.0, 3.0, 1001, dtype=np.float32) + 0.1
    keep = [np.arange(4), np.array([0.0, 1.0, 2.0], np.float32), np.ones(3, jnp.float8_e4m3fn),
            np.array([np.inf, np.nan, 0.5], np.float32)]
    out = perturbed([x, *keep, jax.random.key(0), np.full(4, 1.5, jnp.bfloat16)], seed=0, ulps=4)
    moved = np.abs(out[0].astype(np.float64) - x) / np.abs(np.spacing(x))
    assert out[0].dtype == np.float32 and moved.max() == 4 and np.mean(moved > 0) > 0.8
    assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(out[1:4], keep[:3]))
    assert out[4][0] == np.inf and np.isnan(out[4][1]) and out[4][2] != 0.5  # inf/NaN kept, the rest moved
    assert out[6].dtype == jnp.bfloat16  # 16-bit floats alone unless widened
    widened = perturbed([np.full(64, 1.5, jnp.bfloat16)], seed=0, widen=True)[0]
    assert widened.dtype == np.float32 and 0 < np.abs(widened - 1.5).max() <= 4 * np.spacing(np.float32(1.5))
    assert np.array_equal(perturbed([x], seed=3)[0], perturbed([x], seed=3)[0])  # seeded


def test_compare_outputs_tolerance_is_the_fixed_one_or_a_multiple_of_the_noise():
    rng = np.random.default_rng(0)
    ref = [rng.normal(size=64), rng.normal(size=64), np.float64(2.0)]
    paths = ["out/0/a", "out/0/b", "out/1"]
    got = [ref[0] + 1e-3 * rng.normal(size=64), ref[1] * (1 + 1e-7), ref[2]]
    noisy = [np.sqrt(np.mean(ref[0] ** 2)) * 5e-4, 0.0, 0.0]  # leaf a: the step's own noise, 5e-4 of its RMS
    assert not compare_outputs(paths, ref, got)["ok"]  # the fixed tolerance cries wolf on a
    out = compare_outputs(paths, ref, got, noise=noisy)
    assert out["ok"] and out["worst_output"] == "out/0/a", out
    assert out["tolerance"] == pytest.approx(NUMERICS_NOISE_FACTOR * 5e-4) and out["noise"] == pytest.approx(5e-4)
    # beyond the multiple: caught; a leaf without noise keeps the fixed tolerance
    assert not compare_outputs(paths, ref, [ref[0] + 1e-2 * rng.normal(size=64), *got[1:]], noise=noisy)["ok"]
    off = compare_outputs(paths, ref, [got[0], ref[1] * (1 + 3e-4), ref[2]], noise=noisy)
    assert not off["ok"] and off["worst_output"] == "out/0/b" and off["tolerance"] == NUMERICS_RTOL, off
    same = compare_outputs(paths, ref, list(ref), noise=noisy)
    assert same["ok"] and same["worst_output"] is None and same["max_rel_err"] == 0.0


def test_step_noise_is_zero_for_a_step_that_ignores_rounding():
    def step(x, n):
        return jnp.round(x * 0), n + 1

    args = (np.linspace(0.1, 1.0, 8, dtype=np.float32), np.arange(3))
    ref = [np.asarray(x) for x in jax.tree.leaves(step(*args))]
    assert step_noise(jax.jit(step), args, ref) == [0.0, 0.0]


# --------------------------------------------------------------------------- the steps

def test_int8_quantised_step_passes_a_correct_plan_and_catches_wrong_ones():
    step, args = quant.make("int8", blocks=3, seed=1)
    cal, got = _calibrated(step, args, "data=4,model=2", INT8_PLAN)
    # the unsharded step itself moves beyond the fixed tolerance when its inputs move by ulps
    # (quantisers round to the other level), so the fixed tolerance cannot judge a plan here
    assert max(_rel_noise(cal).values()) > NUMERICS_RTOL
    ok = cal.compare(got)
    assert ok["ok"] and ok["max_rel_err"] <= ok["tolerance"] / 2, ok
    bad = cal.compare(swapped(cal.paths, got, "out/0/blocks/0/w1"))
    assert not bad["ok"] and bad["worst_output"] == "out/0/blocks/0/w1" and bad["max_rel_err"] > 100 * bad["tolerance"]
    unred = cal.compare(unreduced(step, args))
    assert not unred["ok"] and unred["max_rel_err"] > 100 * unred["tolerance"], unred


def test_fp8_quantised_step_passes_a_correct_plan_and_catches_a_misplaced_shard():
    step, args = quant.make("fp8", blocks=2, seed=1)
    cal, got = _calibrated(step, args, "data=4,model=2", INT8_PLAN)
    assert cal.compare(got)["ok"], cal.compare(got)
    bad = cal.compare(swapped(cal.paths, got, "out/0/blocks/1/w2"))
    assert not bad["ok"] and bad["worst_output"] == "out/0/blocks/1/w2", bad


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_adam_on_a_zero_gradient_bias_passes_a_correct_plan_and_catches_wrong_ones(dtype):
    """The key bias's gradient is zero: Adam makes its update and moments of rounding noise."""
    step, args = attention.make(dtype)
    s = partex.Session(step, args, mesh="data=4,model=2")
    report = s.verify(s.plan(strategy="megatron"), run=True).numerics
    assert report.ok, report
    cal, got = _calibrated(step, args, "data=4,model=2", "megatron")
    assert (cal.computed_in is not None) == (dtype == jnp.bfloat16)
    noise = _rel_noise(cal)
    assert noise["out/0/bk"] > 1e-3  # noise as large as the bias itself (lr-sized steps) ...
    assert cal.compare(got)["tolerance"] > 1e-3
    fixed = compare_outputs(cal.paths, cal.ref, got)
    assert fixed["worst_output"].endswith("/bk") and not fixed["ok"]  # ... where the fixed tolerance fails
    # ... and the leaves that hold no noise keep the fixed tolerance: a misplaced shard of the
    # new query weights is caught by 4 orders of magnitude
    bad = cal.compare(swapped(cal.paths, got, "out/0/wq"))
    assert not bad["ok"] and bad["tolerance"] == NUMERICS_RTOL and bad["max_rel_err"] > 1.0, bad
    wide = jax.tree.map(lambda x: x.astype(np.float32) if x.dtype == jnp.bfloat16 else x, args)
    unred = cal.compare(unreduced(step, wide))  # computed in float32, as verify compares it
    assert not unred["ok"] and unred["max_rel_err"] > 100 * unred["tolerance"], unred


def test_flax_vit_dp_passes_and_still_catches_wrong_plans():
    """linen's MultiHeadDotProductAttention (key bias initialised to zero), optax Adam, dp on
    data=8: the new key biases differ from the unsharded step's by their own size."""
    pytest.importorskip("flax")
    from numerics_models import vit

    step, args = vit.make(layers=1, batch=8)
    cal, got = _calibrated(step, args, "data=8", "dp")
    ok = cal.compare(got)
    assert ok["ok"], ok
    key_bias = "out/0/params/block_0/MultiHeadDotProductAttention_0/key/bias"
    fixed = compare_outputs(cal.paths, cal.ref, got)  # the fixed tolerance's alarm, on the key bias or its moments
    assert not fixed["ok"] and fixed["worst_output"].endswith(key_bias.removeprefix("out/0/params/")), fixed
    query = "out/0/params/block_0/MultiHeadDotProductAttention_0/query/kernel"
    bad = cal.compare(swapped(cal.paths, got, query))  # the query kernel holds no noise: the fixed tolerance
    assert not bad["ok"] and bad["worst_output"] == query and bad["tolerance"] == NUMERICS_RTOL, bad
    unred = cal.compare(unreduced(step, args))
    assert not unred["ok"] and unred["max_rel_err"] > 100 * unred["tolerance"], unred


def test_cli_verify_run_reports_each_tolerance_and_where_it_comes_from(capsys, tmp_path):
    """``partex verify --run`` prints the worst leaf, its tolerance and its calibrated noise;
    ``--json`` carries the same figures, and they read back as the same ``Numerics``."""
    import json
    import pathlib

    from partex.cli import main

    model = f"{pathlib.Path(__file__).parent / 'numerics_models' / 'quant.py'}:int8"
    plan = tmp_path / "plan.json"
    assert main(["plan", model, "--mesh", "data=4,model=2", "--strategy", "megatron", "--out", str(plan)]) == 0
    capsys.readouterr()
    assert main(["verify", model, str(plan), "--run"]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if "numerics:" in x)
    assert main(["verify", model, str(plan), "--run", "--json"]) == 0
    n = json.loads(capsys.readouterr().out)["numerics"]
    assert n["ok"] and n["noise_runs"] == 3 and n["noise_factor"] == NUMERICS_NOISE_FACTOR and n["noise"] > 0
    # the worst leaf's tolerance is its calibrated noise or the fixed least tolerance,
    # whichever is larger (which leaf is worst depends on where the quantiser's rounding
    # flips: on the CPU's instruction set), and the line says which, with both figures
    assert n["tolerance"] == pytest.approx(max(NUMERICS_RTOL, n["noise_factor"] * n["noise"]))
    basis = partex.Numerics.from_json(n).basis()
    assert f"ok: {n['worst_output']}" in line and f"tolerance {n['tolerance']:.1e}" in line and basis in line, line
    assert "3 perturbed runs" in basis or "over 3 runs" in basis
    assert n["largest_rel_err"] >= n["max_rel_err"] and n["largest_output"]
    assert partex.Numerics.from_json(n).to_json() == n
