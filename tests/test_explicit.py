"""Steps in explicit sharding mode (jax's default mesh type): the arrays' shardings are part
of their types, ops take ``out_sharding=``, and ``jax.sharding.reshard`` / ``auto_axes`` move
between them. partex traces such a step under its own mesh, reads the typed shardings the
user wrote (the inputs', ``out_sharding=``, ``reshard``) as the user's own shardings, and
applies and verifies plans for it on the plan's mesh."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import partex

D, F, B = 16, 32, 8


def _explicit_step(auto_region: bool = False, layers: int = 2):
    """A two-layer MLP step whose weights and batch carry explicit shardings (Megatron over
    `model`, the batch over `data`), with ``out_sharding=`` on its matmuls and a ``reshard``
    of the residual; ``auto_region``: the activation is computed inside ``auto_axes``."""
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    ks = jax.random.split(jax.random.key(0), 2 * layers + 1)
    params = [{"w1": jax.device_put(jax.random.normal(ks[2 * i], (D, F)) / 4, NamedSharding(mesh, P(None, "model"))),
               "w2": jax.device_put(jax.random.normal(ks[2 * i + 1], (F, D)) / 6, NamedSharding(mesh, P("model", None)))}
              for i in range(layers)]
    x = jax.device_put(jax.random.normal(ks[-1], (B, D)), NamedSharding(mesh, P("data", None)))

    def act(a):
        return jax.nn.gelu(a)

    def loss(params, x):
        h = x
        for p in params:
            a = jnp.einsum("bd,df->bf", h, p["w1"], out_sharding=P("data", "model"))
            a = jax.sharding.auto_axes(act, out_sharding=P("data", "model"))(a) if auto_region else act(a)
            h = h + jnp.einsum("bf,fd->bd", a, p["w2"], out_sharding=P("data", None))
            h = jax.sharding.reshard(h, P("data", None))
        return jnp.mean(h ** 2)

    def step(params, x):
        value, g = jax.value_and_grad(loss)(params, x)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, g), value

    return step, (params, x), mesh


def test_an_explicit_mode_step_traces_with_its_typed_shardings_as_the_users():
    step, args, mesh = _explicit_step()
    an = partex.analyze(step, *args)
    kinds = {us.kind for us in an.analysis.user_shardings}
    assert {"explicit input", "out_sharding", "reshard"} <= kinds, kinds
    s = partex.Session(step, args, mesh="data=4,model=2")
    fixed = {(f["kind"], f["axis"]) for f in s.fixed}
    # the weights' typed sharding fixes the Megatron pair on `model`, the batch's the batch on `data`
    assert ("explicit input", "model") in fixed and ("explicit input", "data") in fixed, s.fixed


def test_a_plan_applies_to_an_explicit_mode_step_and_matches_it():
    step, args, mesh = _explicit_step()
    with jax.set_mesh(mesh):
        want = jax.jit(step)(*args)
    s = partex.Session(step, args, mesh="data=4,model=2")
    plan = s.plan(strategy="zero3")
    got = partex.apply_plan(plan, step)(*args)  # the typed arguments as the user holds them
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(got[0]), jax.tree.leaves(want[0])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    out = s.verify(plan, run=True, mark=False)
    assert out.numerics.ok, out.numerics
    # the plan's all-reduces of the Megatron pair's partial sums are XLA's
    ar = out.collectives["all-reduce"]
    assert ar.xla_bytes > 0 and 0.5 <= ar.ratio <= 2.0, ar


def test_an_auto_axes_region_is_the_partitioners_to_place():
    """The reshards at an ``auto_axes`` region's ends take the value off the explicit types:
    inside, nothing is fixed; the region's out_sharding is the user's again."""
    step, args, mesh = _explicit_step(auto_region=True)
    an = partex.analyze(step, *args).analysis
    program = an.program
    entries = [op.id for op in program.ops if op.primitive == "reshard"
               and AxisType.Explicit not in op.params["dst_sharding"].mesh.axis_types]
    assert len(entries) >= 2  # into the region, forward and backward
    users = {us.op for us in an.user_shardings}
    assert not users & set(entries)  # the region's entry fixes nothing
    assert all(program.values[program.ops[e].inputs[0]].shape == (B, F) for e in entries)
    s = partex.Session(step, args, mesh="data=4,model=2")
    out = s.verify(s.plan(strategy="megatron"), run=True, mark=False)
    assert out.numerics.ok and out.fits is not False, out


def test_explicit_shardings_can_be_replaced_by_the_plan():
    step, args, _ = _explicit_step()
    with pytest.raises(partex.PartexError, match="the input params/0/w1: explicit input shards over mesh axis model=2"):
        partex.Session(step, args, mesh="data=8")  # the types name an axis the plan's mesh lacks
    s = partex.Session(step, args, mesh="data=8", user_shardings="replace")
    assert not s.fixed
    out = s.verify(s.plan(strategy="dp"), run=True, mark=False)
    assert out.numerics.ok, out.numerics


def test_readme_explicit_mode_example_runs(tmp_path):
    """The explicit-mode example of docs/sharding-forms.md, as written."""
    import os
    import re
    import subprocess
    import sys

    from conftest import ROOT

    section = (ROOT / "docs" / "sharding-forms.md").read_text().split("## Explicit sharding mode", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "example.py").write_text(code)
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="8")
    env.pop("PYTHONPATH", None)
    r = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "explicit-mode step matches; numerics ok: True" in r.stdout
    assert "'explicit input'" in r.stdout


def test_the_explicit_export_gives_the_annotations_that_reproduce_the_plan(tmp_path):
    """``partex export --format explicit``: the mesh with Explicit axes, the inputs' shardings
    and the out_sharding= / reshard annotations. The step written with them (its matmuls'
    out_sharding taken from the export) runs in explicit mode as the plan does: XLA's memory
    and collectives of it are the applied plan's."""
    import importlib.util

    from partex.plan._hlo import collective_bytes_by_kind, memory_stats, parse_collectives

    step, args, _ = _explicit_step()
    s = partex.Session(step, args, mesh="data=4,model=2", user_shardings="replace")
    plan = s.plan(strategy="dp")
    path = tmp_path / "plan_explicit.py"
    path.write_text(partex.export(plan, "explicit", step, args))
    spec = importlib.util.spec_from_file_location("plan_explicit", path)
    pe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pe)
    mesh = pe.mesh()
    assert set(mesh.axis_types) == {AxisType.Explicit}
    here = [a for a in pe.ANNOTATIONS if "test_explicit.py" in a[0]]
    outs = {int(a[0].split(":")[1]): a[2] for a in here if a[1] == "out_sharding="}
    assert len(outs) == 2, pe.ANNOTATIONS  # the two matmul lines of the layer
    first, second = sorted(outs)
    assert outs[first] == P("data", None) and outs[second] == P("data", None)  # dp: the batch only

    def loss(params, x):  # the step as the user would rewrite it from the export
        h = x
        for p in params:
            a = jax.nn.gelu(jnp.einsum("bd,df->bf", h, p["w1"], out_sharding=outs[first]))
            h = h + jnp.einsum("bf,fd->bd", a, p["w2"], out_sharding=outs[second])
        return jnp.mean(h ** 2)

    def annotated(params, x):
        value, g = jax.value_and_grad(loss)(params, x)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, g), value

    host = jax.tree.map(np.asarray, args)
    with jax.set_mesh(mesh):
        placed = jax.device_put(host, pe.in_shardings(mesh, *host))
        want = jax.jit(annotated)(*placed)
        compiled = jax.jit(annotated).lower(*placed).compile()
    ours = memory_stats(compiled)
    colls = collective_bytes_by_kind(parse_collectives(compiled.as_text(), mesh))
    out = s.verify(plan, mark=False)
    assert ours["total"] == out.memory.xla  # XLA's memory of the annotated step: the applied plan's
    assert {k: v for k, v in colls.items() if v} == {k: c.xla_bytes for k, c in out.collectives.items() if c.xla_bytes}
    got = partex.apply_plan(plan, step)(*args)
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), rtol=1e-5)
    assert want[0][0]["w1"].sharding.spec == P(None, None)  # dp: the weights replicated, as the plan has them


def test_a_step_traced_under_the_users_mesh_context_from_host_arrays():
    """The user sets the explicit mesh as the context and passes plain arrays: the step is in
    explicit mode all the same (its out_sharding= are the user's), and the plan runs on it."""
    step, args, mesh = _explicit_step()
    host = jax.tree.map(np.asarray, args)
    with jax.set_mesh(mesh):
        s = partex.Session(step, host, mesh="data=4,model=2")
        assert s.model.program.explicit_mesh is not None
        assert {f["kind"] for f in s.fixed} == {"out_sharding"}
        out = s.verify(s.plan(strategy="dp"), run=True, mark=False)
    assert out.numerics.ok, out.numerics


def test_an_explicit_axes_region_inside_an_auto_mode_step():
    """``explicit_axes`` types a region of an Auto-mode step: its reshards are the user's
    shardings, and the plan applies to the step (the region run on the plan's mesh)."""
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    w, x = jnp.ones((D, F)) / D, jnp.arange(B * D, dtype=jnp.float32).reshape(B, D) / 128

    def matmul(x, w):
        return jnp.einsum("bd,df->bf", x, w, out_sharding=P("data", "model"))

    def step(w, x):
        def loss(w):
            h = jax.sharding.explicit_axes(matmul, in_sharding=(P("data", None), P(None, "model")))(x, w)
            return jnp.mean(jax.nn.relu(h) ** 2)
        value, g = jax.value_and_grad(loss)(w)
        return w - 0.1 * g, value

    with jax.set_mesh(mesh):
        s = partex.Session(step, (w, x), mesh="data=4,model=2")
        assert {(f["kind"], f["axis"]) for f in s.fixed} == {("reshard", "data"), ("reshard", "model")}
        out = s.verify(s.plan(strategy="megatron"), run=True, mark=False)
    assert out.numerics.ok, out.numerics


def test_zero3_puts_a_weights_free_dim_on_data_beside_its_typed_one():
    """The weights' `model` dims are typed (fixed): ZeRO-3 shards each weight's other dim over
    data instead of choosing the fixed one, which the step's own sharding already holds."""
    step, args, _ = _explicit_step()
    s = partex.Session(step, args, mesh="data=4,model=2")
    fixed = {f["group"] for f in s.fixed}
    extra = [d for d in s.strategy("zero3") if d not in s.strategy("dp") and s.group(d.group).label not in fixed]
    assert [(s.group(d.group).label, d.axis) for d in extra] == [("*/w1[0]", "data")]
