"""Exports a training job uses without partex: the standalone specs module trains the demo
transformer as the plan's inputs/outputs say; rules follow flax's own semantics; the CLI
writes both and shows what is lost beside the full plan."""

import importlib.util
import json
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

import demo_models
import partex
from partex.plan._export import logical_spec
from partex._loader import axis_names_by_value
from partex.plan._specs import norm_spec, spec_axes, spec_to_json
from partex.plan._verify import compare_outputs

MESH = "data=4,model=2"


@pytest.fixture(scope="module")
def plan():
    s = partex.Session.from_spec("transformer", mesh=MESH, memory="1MiB", seed=0)
    s.step(200)
    p = s.best_plan()
    assert p is not None and {d.axis for d in p.decisions} >= {"data", "model"}
    return p


def load_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_standalone_specs_module_shards_and_trains_like_the_plan(plan, tmp_path):
    path = tmp_path / "plan_specs.py"
    path.write_text(partex.export(plan, "specs"))
    # the module needs jax only: no partex import anywhere in it
    assert "partex" not in "".join(line for line in path.read_text().splitlines() if line.startswith(("import", "from")))
    ps = load_module(path, "plan_specs")
    model = demo_models.build("transformer", "tiny")
    mesh = ps.mesh()
    assert dict(mesh.shape) == {"data": 4, "model": 2}
    in_sh = ps.in_shardings(mesh, *model.args)
    # every leaf gets the plan's spec
    want = partex.plan_shardings(plan, model.args, mesh)
    for got, exp in zip(jax.tree_util.tree_leaves(in_sh), jax.tree_util.tree_leaves(want)):
        assert got.spec == exp.spec
    out_sh = ps.out_shardings(mesh, jax.eval_shape(model.fn, *model.args))
    step = jax.jit(model.fn, in_shardings=in_sh, out_shardings=out_sh)
    got = step(*model.args)
    ref = jax.jit(model.fn)(*model.args)
    paths = [str(i) for i in range(len(jax.tree_util.tree_leaves(ref)))]
    assert compare_outputs(paths, jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(got))["ok"]
    for x, sh in zip(jax.tree_util.tree_leaves(got[0]), jax.tree_util.tree_leaves(out_sh[0])):
        assert x.sharding.is_equivalent_to(sh, x.ndim)
    # JSON: the same specs, the mesh with its slow axes
    d = json.loads(partex.export(plan, "specs", as_json=True))
    assert d["inputs"] == plan.inputs and d["outputs"] == plan.outputs and d["mesh"]["axes"] == ["data", "model"]


NAMES = ("batch", "length", "embed", "mlp", "heads", None)


@pytest.mark.parametrize("seed", range(6))
def test_logical_spec_is_flax_logical_to_mesh_axes(seed):
    """partex reads rules as flax does: random rule lists (names repeated as fallbacks,
    axes shared between names) over random arrays of logical names."""
    rng = np.random.default_rng(seed)
    axes_choices = [(), ("data",), ("model",), ("data", "model")]
    for _ in range(40):
        rules = [(str(rng.choice(NAMES[:-1])), axes_choices[rng.integers(4)]) for _ in range(rng.integers(1, 7))]
        rank = int(rng.integers(1, 4))
        names = list(rng.choice(NAMES[:-1], size=rank, replace=False))
        names = [n if rng.random() > 0.2 else None for n in names]
        flax_rules = [(n, None if not a else a[0] if len(a) == 1 else a) for n, a in rules]
        want = nn.logical_to_mesh_axes(names, flax_rules)
        got = logical_spec(names, rules)
        norm = [() if w is None else (w,) if isinstance(w, str) else tuple(w) for w in want]
        assert got == norm, (names, rules, want, got)


def test_rules_of_zero3_on_the_demo_transformer_give_every_named_leaf_its_spec():
    """Demo transformer zero3: batch and the weights' d_model both on data (the demo names
    no activations: tests/test_lib_flax_linen.py has a model that does)."""
    model = demo_models.build("transformer", "tiny")
    s = partex.Session.from_spec("transformer", mesh=MESH)
    p = s.plan(strategy="zero3")
    r = partex.flax_rules(p, model.fn, model.args, axis_names=model.axis_names)
    rules = dict(r.rules)
    assert rules["batch"] == ("data",) and rules["d_model"] == ("data",)
    assert r.matched == pytest.approx(1.0)
    assert r.activations == 0  # the demo models name no activations
    # the rules give every named input leaf the plan's spec
    by_value = axis_names_by_value(s.program, model.axis_names)
    for vid, path in zip(s.program.inputs, s.program.input_paths):
        if by_value.get(vid):
            assert norm_spec(spec_to_json(logical_spec(by_value[vid], r.rules))) == norm_spec(p.inputs[path]), path


def partex_cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "partex", *args], capture_output=True, text=True, timeout=600, **kw)


def test_cli_export_writes_files_and_shows_what_is_lost(plan, tmp_path):
    path = tmp_path / "plan.json"
    plan.save(path)
    out = tmp_path / "specs.py"
    r = partex_cli("export", str(path), "--format", "specs", "-o", str(out))
    assert r.returncode == 0, r.stderr
    # the demo model named in the plan was compiled both ways: the table is in the file and on stderr
    for text in (r.stderr, out.read_text()):
        assert "full plan" in text and "specs alone" in text and "memory per device" in text
    load_module(out, "cli_specs")
    r = partex_cli("export", str(path), "--format", "flax-rules", "--json", "--no-compare")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    batch_leaf = next(spec for path, spec in plan.inputs.items() if path.startswith("batch/"))
    assert d["format"] == "partex-flax-rules" and 0 < d["matched_fraction"] <= 1
    # what one rule list cannot say (a logical name the plan shards two ways) is listed
    assert (d["matched_fraction"] == pytest.approx(1.0)) == (not d["conflicts"])
    assert tuple(dict((n, a) for n, a in d["rules"])["batch"] or ()) == tuple(spec_axes(batch_leaf[0]))
    # bad input: one line, exit 2
    r = partex_cli("export", str(tmp_path / "missing.json"), "--format", "specs")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "cannot read plan" in r.stderr
    bad = tmp_path / "custom.json"
    bad.write_text(json.dumps({**json.loads(path.read_text()), "model": {}}))
    r = partex_cli("export", str(bad), "--format", "flax-rules")
    assert r.returncode == 2 and "--model" in r.stderr and r.stderr.count("\n") == 1


def test_verify_export_compares_the_specs_alone_with_the_full_plan(plan):
    model = demo_models.build("transformer", "tiny")
    out = partex.verify(plan, model.fn, model.args, run=True, axis_names=model.axis_names, export="specs")
    c = out.comparison
    assert c is not None and c["plan"]["memory"] == out.memory.xla
    # the plan's constraints matter: without them XLA places the intermediates otherwise
    assert c["export"]["memory"] != c["plan"]["memory"] or c["export"]["collectives"] != c["plan"]["collectives"]
    assert c["export"]["numerics"]["ok"]
    table = partex.export_table(out)
    assert "specs alone" in table and "fits" in table


def test_every_process_count_mismatch_message_names_the_devices():
    spec = partex.MeshSpec.parse("data=4,model=4")
    with pytest.raises(partex.PartexError, match="needs 16 devices but JAX has 8"):
        spec.jax_mesh()

