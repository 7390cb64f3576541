"""engine._apply.constrained_function: the traced program re-evaluated with sharding
constraints (also inside scan / while / cond bodies) computes what the original does."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from partex import PartexError, demo_models
from jax._src import ad_checkpoint
from partex.plan._apply import constrained_function
from partex.tracing._program import trace

DEMOS = ["mlp", "transformer", "transformer-scan", "unet", "gns", "moe"]


def make_mesh():
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def assert_same(ref, got, rtol=1e-5, atol=1e-6):
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(ref)
    for a, b in zip(jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(got)):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=rtol, atol=atol)


def assert_same_sharded(ref, got):
    """Sharded runs reduce in another order, and Adam's first step (lr * g / (|g| + eps))
    turns that float noise on near-zero gradients into noise of up to ~lr on single params:
    compare as ``verify --run`` does (each leaf at its output's scale, partex's numerics)."""
    from partex.tracing._program import path_str
    from partex.plan._verify import compare_outputs

    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(ref)
    paths = [path_str("out", k) for k, _ in jax.tree_util.tree_leaves_with_path(ref)]
    res = compare_outputs(paths, jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(got))
    assert res["ok"], res


def sub_jaxprs(eqn):
    for v in eqn.params.values():
        for x in v if isinstance(v, (tuple, list)) else (v,):
            j = getattr(x, "jaxpr", x)
            if hasattr(j, "eqns"):
                yield j


def count_prim(jaxpr, prim, inside=None, _in=False):
    """Eqns of primitive ``prim`` in ``jaxpr`` (recursively); with ``inside``, only those
    nested in an eqn of that primitive."""
    n = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == prim and (inside is None or _in):
            n += 1
        for j in sub_jaxprs(eqn):
            n += count_prim(j, prim, inside, _in or eqn.primitive.name == inside)
    return n


def dim0_specs(program, size, region_kinds=None):
    """P("data") on dim 0 of every value whose dim 0 is ``size`` (optionally only values
    made inside regions of the given kinds)."""
    specs = {}
    for v in program.values:
        if not v.shape or v.shape[0] != size:
            continue
        if region_kinds is not None:
            if v.producer < 0:
                continue
            if program.regions[program.ops[v.producer].region].kind not in region_kinds:
                continue
        specs[v.id] = P("data", *[None] * (len(v.shape) - 1))
    return specs


def test_unconstrained_matches_every_demo_model():
    mesh = make_mesh()
    for name in DEMOS:
        m = demo_models.build(name, "tiny")
        program = trace(m.fn, m.args)
        f = constrained_function(program, mesh, {})
        assert not hasattr(f, "lower"), "must not be jitted"
        ref = jax.jit(m.fn)(*m.args)
        got = jax.jit(f)(*m.args)
        assert_same(ref, got)


def test_batch_constraints_reach_scan_bodies():
    mesh = make_mesh()
    m = demo_models.build("transformer-scan", "tiny", {"batch": "8"})
    program = trace(m.fn, m.args)
    specs = dim0_specs(program, 8)
    in_body = dim0_specs(program, 8, region_kinds={"scan"})
    assert in_body, "expected batch-sized values inside the layer scan"
    f = constrained_function(program, mesh, specs)

    jaxpr = jax.make_jaxpr(f)(*m.args).jaxpr
    assert count_prim(jaxpr, "sharding_constraint", inside="scan") >= len(in_body)

    jitted = jax.jit(f)
    hlo = jitted.lower(*m.args).compile().as_text()
    body_constraints = [
        line for line in hlo.splitlines()
        if "while/body" in line and "sharding_constraint" in line
    ]
    assert body_constraints, "no sharding constraint reached the compiled while body"
    assert_same_sharded(jax.jit(m.fn)(*m.args), jitted(*m.args))


def gathered_shapes(hlo):
    """Result shapes of the all-gathers in compiled HLO text."""
    return [m.group(1) for m in re.finditer(r"= (\S+?)(?:\{[^}]*\})? all-gather(?:-start)?\(", hlo)]


def test_zero3_weight_gathered_before_matmul():
    mesh = make_mesh()
    m = demo_models.build("transformer", "tiny", {"batch": "8"})
    program = trace(m.fn, m.args)
    w1 = [vid for vid, path in zip(program.inputs, program.input_paths)
          if path.startswith("params/layers/") and path.endswith("/w1")]
    assert len(w1) == 2
    full = "f32[%d,%d]" % program.values[w1[0]].shape
    value_specs = {vid: P("data", None) for vid in w1}
    operand_specs = {
        (op.id, i): P(None, None)
        for op in program.ops if op.primitive == "dot_general"
        for i, vid in enumerate(op.inputs) if vid in w1
    }
    assert len(operand_specs) >= 2

    # The weight sharded alone: XLA all-reduces activations instead of gathering it.
    alone = jax.jit(constrained_function(program, mesh, value_specs))
    assert full not in gathered_shapes(alone.lower(*m.args).compile().as_text())

    f = constrained_function(program, mesh, value_specs, operand_specs)
    jaxpr = jax.make_jaxpr(f)(*m.args).jaxpr
    assert count_prim(jaxpr, "sharding_constraint") == len(value_specs) + len(operand_specs)
    jitted = jax.jit(f)
    hlo = jitted.lower(*m.args).compile().as_text()
    assert full in gathered_shapes(hlo), "the ZeRO-3 weight was not all-gathered"
    assert_same_sharded(jax.jit(m.fn)(*m.args), jitted(*m.args))


def _cond_while_fn(x, w, flag):
    def body(c):
        i, h = c
        return i + 1, jnp.tanh(h @ w)

    _, h = jax.lax.while_loop(lambda c: c[0] < 3, body, (0, x))

    def yes(h):
        return jnp.sin(h) * 2.0

    def no(h):
        return jnp.cos(h @ w.T)

    out = jax.lax.cond(flag > 0, yes, no, h)
    return {"out": out, "sum": out.sum()}


def test_constraints_inside_cond_branches_and_while_body():
    mesh = make_mesh()
    x = jnp.arange(8 * 16, dtype=jnp.float32).reshape(8, 16) / 100.0
    w = jnp.eye(16, dtype=jnp.float32) * 0.5 + 0.01
    program = trace(_cond_while_fn, (x, w, jnp.int32(1)))
    kinds = {r.kind for r in program.regions}
    assert {"while", "cond"} <= kinds
    value_specs = dim0_specs(program, 8, region_kinds={"while", "cond"})
    # the loop carry as each iteration sees it (the while_enter outputs)
    enter = next(program.ops[r.enter] for r in program.regions if r.kind == "while")
    carry = [v for v in enter.outputs if program.values[v].shape == (8, 16)]
    assert carry
    value_specs.update({v: P("data", None) for v in carry})
    # an operand-only constraint inside the while body: the weight replicated at its matmul
    (dot,) = [op for op in program.ops
              if op.primitive == "dot_general"
              and program.regions[op.region].kind == "while"]
    operand_specs = {(dot.id, 1): P()}
    f = constrained_function(program, mesh, value_specs, operand_specs)

    jaxpr = jax.make_jaxpr(f)(x, w, jnp.int32(1)).jaxpr
    assert count_prim(jaxpr, "sharding_constraint", inside="while") >= 3
    assert count_prim(jaxpr, "sharding_constraint", inside="cond") >= 2

    jitted = jax.jit(f)
    for flag in (1, 0):
        assert_same(_cond_while_fn(x, w, jnp.int32(flag)), jitted(x, w, jnp.int32(flag)))
    hlo = jitted.lower(x, w, jnp.int32(1)).compile().as_text()
    assert any("while/body" in l and "sharding_constraint" in l for l in hlo.splitlines())


def test_scan_reverse_unroll_and_consts():
    mesh = make_mesh()

    def fn(xs, w, b):
        def step(c, x):
            c = jnp.tanh(c @ w + x) + b
            return c, c.sum(axis=1)

        c, ys = jax.lax.scan(step, jnp.zeros((8, 4)), xs, reverse=True, unroll=2)
        c2, zs = jax.lax.scan(lambda c, _: (c * 0.5, c[0]), c, None, length=3)
        return c2, ys, zs

    args = (jnp.linspace(0, 1, 5 * 8 * 4).reshape(5, 8, 4), jnp.eye(4) * 0.9, jnp.ones(4) * 0.1)
    program = trace(fn, args)
    specs = dim0_specs(program, 8, region_kinds={"scan"})
    assert specs
    f = constrained_function(program, mesh, specs)
    assert_same(jax.jit(fn)(*args), jax.jit(f)(*args))
    scans = [e for e in jax.make_jaxpr(f)(*args).jaxpr.eqns if e.primitive.name == "scan"]
    assert [e.params["reverse"] for e in scans] == [True, False]
    assert scans[0].params["unroll"] == 2


def test_remat_is_kept_and_constrained_inside():
    mesh = make_mesh()

    @jax.checkpoint
    def block(x, w):
        return jnp.tanh(x @ w) @ w.T

    def loss(x, w):
        return jnp.sum(block(x, w) ** 2)

    step = jax.value_and_grad(loss, argnums=1)
    args = (jnp.ones((8, 16)) * 0.1, jnp.eye(16) * 0.3)
    program = trace(step, args)
    specs = dim0_specs(program, 8)
    f = constrained_function(program, mesh, specs)
    jaxpr = jax.make_jaxpr(f)(*args).jaxpr
    remat = ad_checkpoint.remat_p.name  # "remat2" in the jaxpr, jax.checkpoint's primitive
    assert count_prim(jaxpr, remat) >= 1, "remat must survive apply"
    assert count_prim(jaxpr, "sharding_constraint", inside=remat) >= 1
    assert_same(jax.jit(step)(*args), jax.jit(f)(*args))


def test_apply_exactly_what_is_given_including_replicated():
    mesh = make_mesh()

    def fn(x):
        return jnp.sin(x) * 2.0

    x = jnp.ones((8, 4))
    program = trace(fn, (x,))
    specs = {program.inputs[0]: P("data", None), program.outputs[0]: P()}
    f = constrained_function(program, mesh, specs)
    jaxpr = jax.make_jaxpr(f)(x).jaxpr
    shardings = [e.params["sharding"] for e in jaxpr.eqns
                 if e.primitive.name == "sharding_constraint"]
    assert [s.spec for s in shardings] == [P("data", None), P()]
    assert all(isinstance(s, NamedSharding) and s.mesh.shape == mesh.shape for s in shardings)


def test_bad_args_raise_partex_error():
    mesh = make_mesh()
    program = trace(lambda x: x * 2.0, (jnp.ones((8, 4)),))
    g = constrained_function(program, mesh, {})
    with pytest.raises(PartexError, match="do not match"):
        g(jnp.ones((8, 4)), jnp.ones(3))


def test_call_sites_of_a_shared_jaxpr_are_distinct():
    mesh = make_mesh()

    @jax.jit
    def h(x):
        return jnp.sin(x) * 3.0

    def fn(x):
        return h(x) + h(x * 2.0)

    x = jnp.ones((8, 4))
    program = trace(fn, (x,))
    sins = [op for op in program.ops if op.primitive == "sin"]
    assert len(sins) == 2
    first = sins[0].outputs[0]
    f = constrained_function(program, mesh, {first: P("data", None)})
    jaxpr = jax.make_jaxpr(f)(x).jaxpr
    assert count_prim(jaxpr, "sharding_constraint") == 1


def test_a_constraint_jax_refuses_keeps_its_own_error_and_traceback():
    """A constraint partex made that JAX refuses is partex's bug, not bad input: it is not
    turned into a one-line PartexError, and it says which value partex was constraining."""
    x = jnp.ones((8, 4))
    program = trace(lambda a: jnp.tanh(a) * 2.0, (x,))
    vid = next(v.id for v in program.values if v.producer >= 0)
    f = constrained_function(program, make_mesh(), {vid: P("no-such-axis")}, {})
    with pytest.raises(Exception) as e:
        jax.jit(f)(x)
    assert not isinstance(e.value, PartexError)
    assert any("partex: while constraining value" in n for n in getattr(e.value, "__notes__", [])), e.value
