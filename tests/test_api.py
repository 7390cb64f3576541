"""The public API: ``import partex`` (one import name, a wheel that carries everything), the
README's Python example, the Session, and the explorer and scripts using nothing private."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import re
import subprocess
import sys
import sysconfig
import zipfile

import pytest

import partex
from conftest import ROOT


def _readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("### Python API", 1)[1]  # under "## Quick start"
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "README's Python API section has no python example"
    return m.group(1)


def _env(**extra) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", **extra)
    env.pop("PYTHONPATH", None)
    return env


def test_readme_python_api_example_runs(tmp_path):
    """search -> save -> Plan.load -> apply -> one training step matching the unsharded
    step, verify, and a Session saved and resumed: the README's example, as written."""
    (tmp_path / "example.py").write_text(_readme_example())
    r = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=_env(JAX_NUM_CPU_DEVICES="8"),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "sharded step matches" in r.stdout
    plan = partex.Plan.load(tmp_path / "plan.json")
    assert plan.mesh.text() == "data=4,model=2" and plan.strategy == "mcts"
    assert any(spec != [None] * len(spec) for spec in plan.inputs.values())  # it shards something
    assert json.loads((tmp_path / "mlp.session.json").read_text())["format"] == "partex-session"


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            dots = "." * node.level
            for a in node.names:  # `from partex import _x` and `from . import x` name the module imported
                mod = (f"{dots}{a.name}" if not node.module else
                       f"{node.module}.{a.name}" if node.module == "partex" else dots + node.module)
                out.append((node.lineno, mod))
    return out


def _private(mod: str, folder: str) -> bool:
    """An import of the engine's insides: an old top-level name, a relative import out of
    the folder, or a ``partex._module``. The explorer's own modules are its business."""
    if mod.split(".")[0] in ("engine", "explorer", "demo_models") or mod.startswith(".."):
        return True
    if folder == "explorer" and mod.startswith(("partex.explorer.", ".")):
        return False
    return mod.startswith("partex") and any(part.startswith("_") for part in mod.split(".")[1:])


@pytest.mark.parametrize("folder", ["explorer", "scripts"])
def test_explorer_and_scripts_use_only_the_public_api(folder):
    bad = [f"{path.name}:{line} imports {mod}" for path in sorted((ROOT / folder).glob("*.py"))
           for line, mod in _imports(path) if _private(mod, folder)]
    assert not bad, bad
    assert _private("partex.plan._plan", folder) and _private("engine", folder)  # the check itself bites


def test_session_from_spec_holds_analysis_baselines_search_and_pins():
    s = partex.Session.from_spec("transformer", preset="tiny", mesh="data=4,model=2", hardware="tpu-v4",
                                 memory="3MiB", seed=0)
    assert len(s.groups) == 9 and s.conflicts
    base = s.baselines()
    assert list(base) == ["replicated", "dp", "megatron", "zero3", "dp+remat", "megatron+remat", "zero3+remat"]
    assert not base["replicated"].report.fits and base["megatron"].report.fits
    s.pin("heads", "model")
    s.forbid("batch", "model")
    s.step(60)
    best = s.best()
    assert best is not None and best.report.fits
    assert s.pins[0] in best.decisions and s.forbidden[0] not in best.decisions
    plan = s.best_plan()
    assert plan.model == {"spec": "transformer", "preset": "tiny", "overrides": []}
    assert any(d.pinned for d in plan.decisions)
    notes = s.reconfigure(mesh="data=8")  # the model axis leaves the mesh: both are dropped
    assert len(notes) == 2 and all("dropped" in n for n in notes) and s.pins == []
    assert s.stats().simulations == 0 and s.mesh.text() == "data=8"


def test_public_names_resolve():
    for name in partex.__all__:
        assert getattr(partex, name) is not None, name
    assert partex.Plan.__module__ == "partex.plan._plan" and partex.Session.__module__ == "partex._session"


def test_wheel_installs_partex_alone_and_serves_its_static_files(tmp_path):
    """`pip wheel .` gives one top-level package, partex, with the explorer's static files;
    installed into a fresh virtualenv (which borrows this one's dependencies, not partex) it
    runs `partex analyze mlp` and imports partex.Plan."""
    wheels = tmp_path / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = wheels.glob("partex-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"partex", next(t for t in tops if t.endswith(".dist-info"))}, tops
    for needed in ("partex/static/explorer.css", "partex/static/logo.svg", "partex/explorer/app.py",
                   "partex/demo_models/_transformer.py", "partex/cli.py", "partex/_session.py"):
        assert needed in names, needed

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = pathlib.Path(subprocess.check_output(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    # this virtualenv's packages as a plain path: its .pth files (the editable partex) are not run
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    before = set(os.listdir(site))
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    added = {n for n in set(os.listdir(site)) - before if not n.startswith("__pycache__")}
    assert {n for n in added if not n.endswith(".dist-info")} == {"partex"}, added

    env = _env()
    r = subprocess.run([str(venv / "bin" / "partex"), "analyze", "mlp", "--json"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["groups"] > 0
    code = ("import importlib, partex, partex.explorer as e; "
            "assert partex.__file__.startswith(%r), partex.__file__; "
            "assert (e.STATIC / 'explorer.css').is_file() and e.APP.is_file(); "
            "cmd = e.serve_command(); server = importlib.import_module(cmd[cmd.index('-m') + 1]); "
            "print(partex.Plan.__name__, server.__file__)" % str(site))
    r = subprocess.run([str(py), "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[0] == "Plan" and r.stdout.split()[1].startswith(str(site))


def test_a_plan_xla_puts_over_the_budget_is_marked_and_the_best_moves_on():
    """Session.verify (the CLI's --verify and the explorer's Verify alike): with the budget
    at the best plan's predicted peak, XLA (which needs a little more for this model) puts it
    over; it is marked infeasible and the search's best becomes another plan that fits."""
    s = partex.Session.from_spec("transformer", mesh="data=4,model=2", memory="3MiB", seed=0,
                                     hardware=partex.get_hardware("tpu-v4", memory_margin=0.0))  # a plan at the budget
    for u in s.units:  # sharding alone: XLA needs a little more than predicted there
        for kind in partex.RECOMPUTE_KINDS:
            s.forbid(u.label, "recompute:" + kind)
    for state in ("optimizer", "parameters"):
        s.forbid(state, "memory:host")
    s.step(100)
    best = s.best()
    for _ in range(4):  # the budget at the best plan's predicted peak, until the best stays put
        s.reconfigure(memory=best.report.memory.peak)
        s.step(100)
        again = s.best()
        if again.decisions == best.decisions:
            break
        best = again
    best = s.best()
    assert best is not None and best.report.memory.peak <= s.hardware.budget
    out = s.verify()
    assert out.memory.xla > s.hardware.budget and not out.fits, out.memory
    assert out.marked_infeasible
    after = s.best()
    assert after is None or (after.decisions != best.decisions and after.report.fits)
    ev = s._search.evaluator
    assert ev.evals[ev.key(best.decisions)].fits is False  # scored as not fitting from now on


def test_a_python_int_step_counter_is_a_scalar_as_jit_sees_it():
    """flax's TrainState.step is a Python int: partex traces it as jax.jit does (a weakly
    typed scalar) instead of refusing the state, and the applied plan counts as jit does."""
    import jax
    import jax.numpy as jnp

    def step(state, batch):
        w = state["w"]
        return {"w": w - 0.01 * batch.T @ (batch @ w), "count": state["count"] + 1}, jnp.sum(batch @ w)

    args = ({"w": jnp.ones((64, 64)), "count": 0}, jnp.ones((32, 64)))
    an = partex.analyze(step, *args)
    assert an.program.input_paths == ["state/count", "state/w", "batch"]
    plan = partex.search(step, args, mesh="data=4,model=2", simulations=20)
    assert plan.inputs["state/count"] == []
    expected = jax.jit(step)(*args)
    got = partex.apply_plan(plan, step)(*args)
    assert int(got[0]["count"]) == int(expected[0]["count"]) == 1


def test_static_leaves_are_closed_over_and_left_out_of_the_plan(tmp_path):
    """A state holding non-array leaves (a model's name, an activation enum) traces as jit
    would with them static: they are no inputs of the plan, analyze lists them, the applied
    plan takes and returns them as the function does, verify --run compares the arrays, and
    another value of a static leaf re-applies the plan (it picks another branch)."""
    import enum

    import jax
    import jax.numpy as jnp
    import numpy as np

    class Act(enum.Enum):
        RELU = "relu"
        TANH = "tanh"

    def step(state, batch):
        act = jax.nn.relu if state["cfg"]["act"] is Act.RELU else jnp.tanh

        def loss(p):
            return jnp.mean((act(batch @ p["w1"]) @ p["w2"]) ** 2)

        l, g = jax.value_and_grad(loss)(state["params"])
        params = jax.tree.map(lambda p, g: p - 0.1 * g, state["params"], g)
        return {"params": params, "cfg": state["cfg"]}, l

    key = jax.random.key(0)
    params = {"w1": jax.random.normal(key, (64, 128)) * 0.1, "w2": jax.random.normal(key, (128, 64)) * 0.1}
    state = {"params": params, "cfg": {"act": Act.RELU, "name": "mlp"}}
    batch = jax.random.normal(key, (32, 64))
    s = partex.Session(step, (state, batch), mesh="data=4,model=2")
    assert s.analysis.static_inputs() == [("state/cfg/act", "Act <Act.RELU: 'relu'>"), ("state/cfg/name", "str 'mlp'")]
    assert s.analysis.to_json()["static_inputs"][1] == {"path": "state/cfg/name", "value": "str 'mlp'"}
    assert "state/cfg/name" not in s.program.input_paths and "state/params/w1" in s.program.input_paths
    plan = s.plan(strategy="megatron")
    assert set(plan.inputs) == {"state/params/w1", "state/params/w2", "batch"}
    planned = partex.apply_plan(plan, step)
    got_state, got_loss = planned(state, batch)
    want_state, want_loss = step(state, batch)
    assert got_state["cfg"] == {"act": Act.RELU, "name": "mlp"}
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    assert s.verify(plan, run=True).numerics.ok
    tanh = {"params": params, "cfg": {"act": Act.TANH, "name": "mlp"}}
    np.testing.assert_allclose(planned(tanh, batch)[1], step(tanh, batch)[1], rtol=1e-5)
    assert planned(state, batch)[1] == got_loss
