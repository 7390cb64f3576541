"""The partex command line: analyze, and clear one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from partex.cli import main

from conftest import ROOT


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_analyze_json_has_the_documented_keys(capsys):
    code, out, err = _run(capsys, "analyze", "transformer", "--json")
    assert code == 0, err
    d = json.loads(out)
    for key in ("ops", "values", "dims", "named_dims", "groups", "conflicts", "unknown_primitives", "seconds"):
        assert key in d
    assert d["unknown_primitives"] == {}
    assert d["conflicts"] >= 1 and d["groups"] == len([g for g in d["group_list"] if g["decidable"]])
    assert {g["label"] for g in d["group_list"]} >= {"batch", "seq", "d_model", "ffn", "heads"}
    assert d["conflict_list"][0]["named_dim"] == "seq"


def test_analyze_human_summary(capsys):
    code, out, _ = _run(capsys, "analyze", "mlp", "--config", "batch=8")
    assert code == 0
    assert "decision groups" in out and "conflicts" in out


@pytest.fixture()
def user_models(tmp_path):
    f = tmp_path / "user_models.py"
    f.write_text(textwrap.dedent("""
        import jax, jax.numpy as jnp
        NOT_CALLABLE = 3
        def good():
            return (lambda x, w: jnp.tanh(x @ w).sum()), (jnp.ones((8, 4)), jnp.ones((4, 2)))
        def fails_to_trace():
            return (lambda x: x @ x), (jnp.ones((3, 4)),)
        def non_array_leaf():
            return (lambda p, opt: p["w"] * 2), ({"w": jnp.ones(4)}, "adam")
        def returns_junk():
            return 42
    """))
    bad = tmp_path / "broken.py"
    bad.write_text("import not_a_module_anywhere\n")
    return f, bad


def test_user_model_file(capsys, user_models):
    f, _ = user_models
    code, out, err = _run(capsys, "analyze", f"{f}:good", "--json")
    assert code == 0, err
    assert json.loads(out)["ops"] > 0


def test_a_non_array_argument_is_static_and_analyze_says_so(capsys, user_models):
    """A string among the args is closed over as jit's static arguments are, not refused."""
    f, _ = user_models
    code, out, err = _run(capsys, "analyze", f"{f}:non_array_leaf")
    assert code == 0, err
    assert "static arguments (not arrays: closed over when traced, left out of the plan): opt (str 'adam')" in out
    code, out, err = _run(capsys, "analyze", f"{f}:non_array_leaf", "--json")
    assert json.loads(out)["static_inputs"] == [{"path": "opt", "value": "str 'adam'"}]


@pytest.mark.parametrize("spec,needle", [
    ("{f}:NOT_CALLABLE", "not a callable"),
    ("{f}:missing", "has no attribute 'missing'"),
    ("{f}:fails_to_trace", "failed to trace: TypeError: dot_general requires contracting dimensions to have the same shape"),
    ("{f}:returns_junk", "must return (fn, example_args)"),
    ("{bad}:anything", "importing"),
    ("no_such_module_xyz:fn", "cannot import module 'no_such_module_xyz'"),
    ("nonexistent/file.py:fn", "does not exist"),
    ("transformr", "unknown model 'transformr'"),
])
def test_bad_models_get_one_line_and_exit_2(capsys, user_models, spec, needle):
    f, bad = user_models
    code, out, err = _run(capsys, "analyze", spec.format(f=f, bad=bad))
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("partex: error: "), err
    assert needle in lines[0]


@pytest.mark.parametrize("argv,needle", [
    (["analyze", "transformer", "--preset", "huge"], "preset"),
    (["analyze", "transformer", "--config", "layer=3"], "unknown config key 'layer'"),
    (["analyze", "transformer", "--config", "layers=two"], "layers"),
    (["analyze", "transformer", "--config", "layers"], "layers"),
])
def test_bad_demo_config_exit_2(capsys, argv, needle):
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_console_entry_point_runs_as_module():
    r = subprocess.run([sys.executable, "-m", "partex", "analyze", "nope:fn"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "partex: error:" in r.stderr


def test_a_models_own_prints_do_not_corrupt_json(tmp_path):
    """A user model that prints while it is imported, built and traced (MaxText does) leaves
    stdout to partex: `--json` parses, and the prints appear on stderr."""
    f = tmp_path / "noisy.py"
    f.write_text(textwrap.dedent('''
        import jax.numpy as jnp
        print("[import] hello")

        def step(w, x):
            print("[trace] tracing step")
            return w - 0.1 * (x.T @ jnp.tanh(x @ w)), jnp.sum(x @ w)

        def make():
            print("[factory] building")
            return step, (jnp.ones((8, 8)), jnp.ones((16, 8)))
    '''))
    for argv in (["analyze", f"{f}:make", "--json"],
                 ["search", f"{f}:make", "--mesh", "data=4,model=2", "--simulations", "5",
                  "--out", str(tmp_path / "p.json"), "--json"]):
        r = subprocess.run([sys.executable, "-m", "partex", *argv], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        json.loads(r.stdout)
        assert "[import] hello" in r.stderr and "[trace] tracing step" in r.stderr, r.stderr
