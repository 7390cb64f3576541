"""Plans run on this machine's devices (here simulated CPU devices): ``partex verify --time``,
``Session.measure``, ``partex search --measure-top`` and ``partex calibrate`` on the command
line. The figures are the host's and prove nothing of an accelerator's speed: what is tested
is what runs, what comes back and what is said."""

from __future__ import annotations

import json

import jax.numpy as jnp
import pytest

import partex
from partex.cli import main

from conftest import ROOT

MICRO = ROOT / "tests" / "fixtures" / "h200" / "micro.json"


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_calibrate_from_measurements_and_a_plan_priced_by_it(capsys, tmp_path):
    profile = tmp_path / "h200.json"
    code, out, err = _run(capsys, "calibrate", "--measurements", MICRO, "--out", profile)
    assert code == 0, err
    assert "NVIDIA H200" in out and "98.5 GiB" in out and "75% of the 141 GB" in out
    code, out, err = _run(capsys, "plan", "mlp", "--mesh", "data=2", "--hardware", profile, "--strategy", "dp",
                          "--out", tmp_path / "dp.json")
    assert code == 0, err
    assert "priced by NVIDIA H200 profile (measurements micro.json" in out
    assert partex.Plan.load(tmp_path / "dp.json").hardware.profile is not None


def test_calibrate_says_what_is_wrong_with_its_input(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('[{"kind": "gemm", "m": 8, "n": 8, "k": 8, "s": 0.001}]')
    code, out, err = _run(capsys, "calibrate", "--measurements", bad, "--out", tmp_path / "p.json")
    assert code == 2 and err.count("\n") == 1 and "no \"device\" row" in err
    code, _, err = _run(capsys, "plan", "mlp", "--mesh", "data=2", "--hardware", tmp_path / "none.json",
                        "--strategy", "dp", "--out", tmp_path / "x.json")
    assert code == 2 and "no hardware profile at" in err and "partex calibrate" in err


def test_verify_time_runs_the_plan_and_reports_it(capsys, tmp_path):
    plan = tmp_path / "megatron.json"
    assert _run(capsys, "plan", "transformer", "--mesh", "data=4,model=2", "--hardware", "cpu", "--strategy",
                "megatron", "--out", plan)[0] == 0
    code, out, err = _run(capsys, "verify", "transformer", plan, "--time", "--steps", "2", "--json")
    assert code == 0, err
    m = json.loads(out)["measured"]
    assert m["error"] is None and m["devices"] == 8 and m["platform"] == "cpu" and len(m["step_times_s"]) == 2
    assert m["step_time_s"] > 0 and m["predicted_step_time_s"] > 0 and m["xla_bytes"] > 0
    code, out, err = _run(capsys, "verify", "transformer", plan, "--time", "--steps", "2")
    assert code == 0, err
    assert "measured on 8 x cpu (simulated on the CPU" in out and "predicted / measured" in out


def test_search_measure_top_writes_the_plan_measured_fastest(capsys, tmp_path):
    out_plan = tmp_path / "best.json"
    code, out, err = _run(capsys, "search", "mlp", "--mesh", "data=4,model=2", "--hardware", "cpu",
                          "--simulations", "30", "--measure-top", "2", "--steps", "2", "--out", out_plan, "--json")
    assert code == 0, err
    d = json.loads(out)
    measured = d["measured"]
    assert 1 <= len(measured) <= 2 and all(m["error"] is None for m in measured)
    times = [m["step_time_s"] for m in measured]
    assert times == sorted(times)  # fastest measured first, and that is the plan written
    assert partex.Plan.load(out_plan).strategy == measured[0]["label"]
    code, out, _ = _run(capsys, "search", "mlp", "--mesh", "data=4,model=2", "--hardware", "cpu", "--simulations",
                        "30", "--measure-top", "2", "--steps", "2", "--out", out_plan)
    assert code == 0 and "wrote the fastest measured" in out and ("disagree" in out or "agrees" in out)


def test_a_function_session_measures_in_this_process():
    def step(w, x):
        loss, g = partex_value_and_grad(w, x)
        return w - 0.1 * g, loss

    s = partex.Session(step, (jnp.ones((64, 32)), jnp.ones((16, 64))), mesh="data=2", hardware="cpu")
    (m,) = s.measure([s.plan(strategy="dp")], steps=2, warmup=1)
    assert m.error is None and m.step_time > 0 and m.devices == 2 and len(m.step_times) == 2
    with pytest.raises(partex.PartexError, match="steps >= 1"):
        s.measure([s.plan(strategy="dp")], steps=0)


def partex_value_and_grad(w, x):
    import jax

    return jax.value_and_grad(lambda w: jnp.tanh(x @ w).sum())(w)


def test_a_worker_killed_by_the_system_says_so_and_how_to_fix_it(tmp_path):
    """A worker the system kills (SIGKILL: most often out of memory, as a 7b step on simulated
    CPU devices) is bad luck with the machine, said in one line that teaches the fix, not a
    crash of partex's own."""
    import os

    from partex.plan._worker import run_worker

    (tmp_path / "killed_worker.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    with pytest.raises(partex.PartexError, match=r"measuring dp: its process was killed by SIGKILL \(the system's "
                                                 r"out-of-memory killer.*try a smaller preset"):
        run_worker("killed_worker", "measure", {}, env, 60, "measuring dp")
