"""The step's own shardings: with_sharding_constraint, reshard and a called
jit's in/out shardings are fixed decisions, as XLA honours them; a constraint over another
mesh is one clear line naming its source; "replace" lets the plan re-place them."""

import importlib.util
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import partex

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mesh(shape=(4, 2)):
    return jax.make_mesh(shape, ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def _load_example():
    spec = importlib.util.spec_from_file_location("constrained_mlp", os.path.join(ROOT, "scripts", "constrained_mlp.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLE = _load_example()
make_step = EXAMPLE.make_step
with open(EXAMPLE.__file__) as f:
    CONSTRAINT_LINE = "constrained_mlp.py:%d" % next(i for i, line in enumerate(f, 1) if "# CONSTRAINT_LINE" in line)




def test_user_shardings_are_read_with_their_source_lines():
    step, args = make_step(_mesh())
    an = partex.analyze(step, *args).analysis
    kinds = {us.kind for us in an.user_shardings}
    assert {"with_sharding_constraint", "jit in_shardings"} <= kinds, kinds
    wsc = [us for us in an.user_shardings if us.kind == "with_sharding_constraint"]
    assert any(CONSTRAINT_LINE in us.source for us in wsc), [us.source for us in wsc]
    assert wsc[0].spec == (("data",), ("model",)) and dict(wsc[0].mesh) == {"data": 4, "model": 2}
    assert an.summary()["user_shardings"] == len(an.user_shardings)
    listed = an.to_json()["user_sharding_list"]
    assert {tuple(x["groups"]) for x in listed if x["kind"] == "with_sharding_constraint"} == {("x[0]", "params/w1[1]")}


def test_kept_constraints_are_fixed_decisions_the_search_cannot_move():
    step, args = make_step(_mesh())
    s = partex.Session(step, args, mesh="data=4,model=2")
    fixed = {(f["group"], f["axis"]) for f in s.fixed}
    assert fixed == {("x[0]", "data"), ("params/w1[1]", "model")}
    assert all(CONSTRAINT_LINE in f["source"] or "jit" in f["kind"] for f in s.fixed)
    fixed_ids = {s.group(g).id for g, _ in fixed}
    assert fixed_ids
    assert not any(d.id in fixed_ids for d in s._search.actions if d.ON_GROUP)
    with pytest.raises(partex.PartexError, match="fixed by the step's own"):
        s.pin("params/w1[1]", "data")
    # every plan honours them, hand plans too: even "replicated" pays the Megatron collectives
    rep = s.evaluate([])
    assert rep.collective_bytes.get("all-reduce", 0) > 0
    plan = s.plan(strategy="replicated")
    assert {(f["group"], f["axis"]) for f in plan.fixed} == fixed
    assert json.loads(plan.dumps())["user_shardings"]["mode"] == "keep"
    assert plan.inputs["params/w1"] == [None, "model"]


def test_a_dim_a_constraint_leaves_replicated_is_replicated_in_that_value_only():
    """A constraint P("data", None) on the hidden activation holds its hidden dim whole in that
    value; the hidden group stays the plan's to decide: Megatron shards it over model in the
    weights and the matmul, and the activation is gathered at the constraint, as XLA does
    (MaxText's activations constrained with their embed dim replicated meet FSDP weights so)."""
    mesh = _mesh()

    def loss(params, x, y):
        h = jax.nn.relu(x @ params["w1"])
        h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P("data", None)))
        return jnp.mean((h @ params["w2"] - y) ** 2)

    def step(params, x, y):
        l, g = jax.value_and_grad(loss)(params, x, y)
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, g), l

    k = jax.random.split(jax.random.key(1), 4)
    args = ({"w1": jax.random.normal(k[0], (64, 256)) / 8, "w2": jax.random.normal(k[1], (256, 32)) / 16},
            jax.random.normal(k[2], (32, 64)), jax.random.normal(k[3], (32, 32)))
    s = partex.Session(step, args, mesh="data=4,model=2")
    assert {(f["group"], f["axis"]) for f in s.fixed} == {("x[0]", "data")}
    hidden = s.group("params/w1:1")
    assert hidden.id in {d.id for d in s._search.actions if d.ON_GROUP}
    plan = s.plan([(hidden.label, "model")])
    assert plan.inputs["params/w1"] == [None, "model"]
    gathers = s.evaluate([(hidden.label, "model")]).collective_bytes.get("all-gather", 0)
    assert gathers >= 32 * 256 * 4 / 4 * (1 - 1 / 2)  # the hidden activation, gathered over model
    out = s.verify(plan, run=True)
    assert out.numerics.ok, out.numerics
    for kind in ("all-gather", "all-reduce"):
        assert 0.75 <= out.collectives[kind].ratio <= 1.25, out.collectives
    assert 0.65 <= out.memory.ratio <= 1.35, out.memory


def test_kept_constraints_predicted_like_xla_and_numerics_hold():
    step, args = make_step(_mesh())
    s = partex.Session(step, args, mesh="data=4,model=2")
    for strategy in ("replicated", "zero3"):
        out = s.verify(s.plan(strategy=strategy), run=True)
        assert out.numerics.ok, out.numerics
        assert out.arguments.ratio == 1.0, out.arguments  # inputs sharded as the constraints say
        for kind, c in out.collectives.items():
            if c.xla_bytes or c.predicted_bytes:  # the collectives the constraints force
                assert c.ratio is not None and 0.95 <= c.ratio <= 1.05, (strategy, kind, c)


def test_constraint_over_another_mesh_is_one_line_naming_it_and_replace_re_places_it():
    step, args = make_step(_mesh())
    with pytest.raises(partex.PartexError) as e:
        partex.Session(step, args, mesh="data=2,model=4")
    msg = str(e.value)
    assert "\n" not in msg and CONSTRAINT_LINE in msg and "model=2" in msg and "replace" in msg
    s = partex.Session(step, args, mesh="data=2,model=4", user_shardings="replace")
    assert s.fixed == [] and s.user_shardings == "replace"
    s.step(40)
    plan = s.best_plan()
    assert json.loads(plan.dumps())["user_shardings"]["mode"] == "replace"
    out = s.verify(plan, run=True)  # the user's constraints re-placed on the plan's mesh
    assert out.numerics.ok, out.numerics


def test_cli_names_the_constraint_and_takes_user_shardings_replace(tmp_path):
    src = tmp_path / "model.py"
    src.write_text(
        "import jax\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "def make():\n"
        "    mesh = jax.make_mesh((2, 4), ('data', 'model'), axis_types=(jax.sharding.AxisType.Auto,) * 2)\n"
        "    def step(w, x):\n"
        "        h = jax.lax.with_sharding_constraint(x @ w, NamedSharding(mesh, P('data', 'model')))\n"
        "        return (h ** 2).sum()\n"
        "    return step, (jax.numpy.ones((16, 32)), jax.numpy.ones((8, 16)))\n")
    env = dict(os.environ, JAX_NUM_CPU_DEVICES="8")

    def cli(*a):
        return subprocess.run([sys.executable, "-m", "partex", *a], capture_output=True, text=True, env=env,
                              cwd=tmp_path)

    r = cli("analyze", f"{src}:make")
    assert r.returncode == 0, r.stderr
    assert "with_sharding_constraint P('data', 'model') over mesh data=2,model=4 at" in r.stdout
    assert "model.py:6" in r.stdout
    r = cli("plan", f"{src}:make", "--mesh", "data=4,model=2", "--strategy", "dp", "--out", "p.json")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "model.py:6" in r.stderr, r.stderr
    r = cli("plan", f"{src}:make", "--mesh", "data=4,model=2", "--strategy", "dp", "--out", "p.json",
            "--user-shardings", "replace")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "p.json").read_text())["user_shardings"]["mode"] == "replace"


def test_a_constraint_over_a_one_device_mesh_is_another_mesh():
    """MaxText on one device drops its size-1 axes: P(None, None) over a 1-device mesh is not
    'replicated on the plan's mesh' but another mesh: one line, not silent pins."""
    one = jax.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1],
                        axis_types=(jax.sharding.AxisType.Auto,) * 2)

    def step(w, x):
        h = jax.lax.with_sharding_constraint(x @ w, NamedSharding(one, P(None, None)))
        return w - 0.1 * jax.grad(lambda w: (jnp.tanh(x @ w) ** 2).mean())(w), h.sum()

    with pytest.raises(partex.PartexError, match=r"mesh of 1 device\(s\).*has 8"):
        partex.Session(step, (jnp.ones((16, 32)), jnp.ones((8, 16))), mesh="data=4,model=2")
