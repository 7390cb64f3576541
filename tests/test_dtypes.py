"""Typed PRNG keys and narrow dtypes through every stage: analyze, each kind of decision
(a group sharded on a mesh axis, a conflict's resolutions, each recompute kind), apply,
verify (compile only, and run) and export.

One training step, built for a set of dtypes: two identical layers (a layer stack, so a
recompute unit) and an attention-like product over the batch (``h @ h.T``: a conflict), with

- ``key<fry>`` / ``key<rbg>``: a typed key argument of that implementation: dropout masks
  (``fold_in`` per layer, ``bernoulli``), per-example noise from keys ``split`` over the
  batch (``normal``), the key returned split, and a raw state (``key_data``) re-wrapped
  (``wrap_key_data``), folded and returned as key data;
- ``float8_e4m3fn`` / ``float8_e5m2``: the input projection on float8 operands accumulated
  in float32 (``preferred_element_type``; both types: e4m3fn inputs, e5m2 weights), each
  layer's weight cast to float8 and back, as fp8 training casts around its matmuls;
- ``int4``: frozen int4 weights dequantised with a scale, a trained float delta on top;
- ``int8``: the input projection quantised (int8 x int8 accumulated in int32, rescaled), each
  layer's weight quantised to int8 and back;
- ``bfloat16`` / ``float16``: as float8, in 16 bits (bfloat16 inputs, float16 weights).

Only inputs are rounded to a narrow type: a value a sharded plan sums in another order than
the unsharded step differs in its last float32 bits, and one rounding step flipped is a
float8 ulp (6%) or a bfloat16 one: a comparison would see the cast, not the plan.

XLA:CPU compiles all of these but a matmul with int4 operands (its HLO verifier rejects the
int4 -> int32 convert: "does not support custom element sizes on non-sub-byte types"), so
the int4 weights are dequantised before their matmul.

``python tests/test_dtypes.py`` prints the dtype x stage matrix, one dtype at a time
(``PARTEX_CHECKOUT=<dir>``: of another checkout's partex, see scripts/_checkout.py).
"""

from __future__ import annotations

import math
import os
import sys
from typing import Callable

if __name__ == "__main__":  # the matrix: 8 simulated devices, partex from $PARTEX_CHECKOUT if set
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
    from _checkout import use_checkout_from_env

    use_checkout_from_env()

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partex

MESH = "data=4,model=2"
B, D = 8, 16
DTYPES = ("key<fry>", "key<rbg>", "float8_e4m3fn", "float8_e5m2", "int4", "int8", "bfloat16", "float16")
# What the suite runs: dtypes together where the step has a place for each (both key kinds;
# both float8 types; int4 weights and int8 quantisation; both 16-bit floats)
KINDS = (("key<fry>", "key<rbg>"), ("float8_e4m3fn", "float8_e5m2"), ("int4", "int8"), ("bfloat16", "float16"))
KEY_IMPLS = {"key<fry>": "threefry2x32", "key<rbg>": "rbg"}
NARROW_FLOATS = ("float8_e4m3fn", "float8_e5m2", "bfloat16", "float16")
RTOL = 1e-4


def _quantised(w, dtype=jnp.int8):
    """``w`` through int8 and back, its scale per column (out of the gradient, as quantised
    training takes it)."""
    scale = jax.lax.stop_gradient(jnp.max(jnp.abs(w), axis=0) / 127 + 1e-6)
    return jnp.round(w / scale).astype(dtype), scale


def _input_projection(dtypes):
    """The first matmul ``x @ w_in`` (both inputs: exact values) as the dtypes compute it: on
    narrow float operands accumulated in float32, or int8 ones accumulated in int32."""
    narrow = [getattr(jnp, d) for d in dtypes if d in NARROW_FLOATS]
    if narrow:
        fa, fw = narrow[0], narrow[-1]
        return lambda x, w: jnp.dot(x.astype(fa), w.astype(fw), preferred_element_type=jnp.float32)
    if "int8" in dtypes:
        def int8_dot(x, w):
            (xq, sx), (wq, sw) = _quantised(x.T), _quantised(w)
            acc = jnp.dot(xq.T, wq, preferred_element_type=jnp.int32)
            # the quantised product, and a float path for the gradient
            return acc.astype(jnp.float32) * sx[:, None] * sw + 1e-2 * (x @ w)
        return int8_dot
    return lambda x, w: x @ w


def _layer_weight(dtypes):
    """A layer's weight as the dtypes keep it: cast to the narrow float and back, or
    quantised to int8 and back (a rounding of an input: the same values on every device)."""
    narrow = [getattr(jnp, d) for d in dtypes if d in NARROW_FLOATS]
    if narrow:
        return lambda w: w.astype(narrow[-1]).astype(jnp.float32)
    if "int8" in dtypes:
        def int8_weight(w):
            wq, sw = _quantised(w)
            return wq.astype(jnp.float32) * sw
        return int8_weight
    return lambda w: w


def dtype_step(dtypes: tuple[str, ...]):
    """(step, args) of the training step for ``dtypes`` (module docstring)."""
    keys = [d for d in dtypes if d in KEY_IMPLS]
    project, weight = _input_projection(dtypes), _layer_weight(dtypes)

    def loss(params, frozen, x, y, rng):
        h = project(x, params["in"])
        for i, layer in enumerate(params["layers"]):
            w = weight(layer["w"])
            if "int4" in dtypes:  # a frozen int4 base, dequantised, plus the trained delta
                w = frozen["int4"][i]["q"].astype(jnp.float32) * frozen["int4"][i]["scale"] + w
            h = jnp.tanh(h @ w + layer["b"])
            for d in keys:
                keep = jax.random.bernoulli(jax.random.fold_in(rng[d]["key"], i), 0.8, h.shape)
                h = jnp.where(keep, h / 0.8, 0.0)
        for d in keys:  # per-example noise: keys split over the batch
            per_example = jax.random.split(jax.random.fold_in(rng[d]["key"], 7), B)
            h = h + 0.1 * jax.vmap(lambda k: jax.random.normal(k, (D,)))(per_example)
        s = jax.nn.softmax(h @ h.T / frozen["temperature"], axis=-1)  # [batch, batch]: a conflict
        return jnp.mean((s @ h @ params["out"] - y) ** 2)

    def step(params, frozen, x, y, rng):
        value, grads = jax.value_and_grad(loss)(params, frozen, x, y, rng)
        new = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
        new_rng = {"count": rng["count"] + 1}
        for d in keys:
            r = rng[d]
            state = jax.random.wrap_key_data(r["raw"], impl=KEY_IMPLS[d])
            new_rng[d] = {"key": jax.random.split(r["key"])[1],
                          "raw": jax.random.key_data(jax.random.fold_in(state, 1))}
        return new, value, new_rng

    k = jax.random.split(jax.random.PRNGKey(1), 8)
    params = {"in": jax.random.normal(k[7], (D, D)) * 0.3,
              "layers": [{"w": jax.random.normal(k[i], (D, D)) * 0.3, "b": jnp.zeros(D) + 0.01 * i}
                         for i in range(2)],
              "out": jax.random.normal(k[2], (D, 4)) * 0.3}
    frozen = {"temperature": jnp.float32(math.sqrt(D))}
    if "int4" in dtypes:
        frozen["int4"] = [{"q": jax.random.randint(k[4 + i], (D, D), -8, 8).astype(jnp.int4),
                           "scale": jnp.full((D,), 0.02)} for i in range(2)]
    x, y = jax.random.normal(k[3], (B, D)), jnp.ones((B, 4))
    rng = {d: {"key": jax.random.key(j, impl=KEY_IMPLS[d]),
               "raw": jax.random.key_data(jax.random.key(5 + j, impl=KEY_IMPLS[d]))} for j, d in enumerate(keys)}
    rng["count"] = jnp.int32(0)
    return step, (params, frozen, x, y, rng)


# --------------------------------------------------------------------------- helpers

def _is_key(x) -> bool:
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _numbers(tree) -> list[np.ndarray]:
    """Leaves as float64 numpy arrays (a typed key as its key data): exact for every dtype here."""
    return [np.asarray(jax.random.key_data(x) if _is_key(x) else x).astype(np.float64) for x in jax.tree.leaves(tree)]


def assert_same(got, want, what: str) -> None:
    assert jax.tree.structure(got) == jax.tree.structure(want), what
    for k, (g, w) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want))):
        assert g.shape == w.shape and g.dtype == w.dtype, (what, k, g.shape, g.dtype, w.shape, w.dtype)
    for k, (g, w) in enumerate(zip(_numbers(got), _numbers(want))):
        scale = float(np.max(np.abs(w))) if w.size else 0.0
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=RTOL * (scale or 1.0), err_msg=f"{what}: leaf {k}")


def fresh(args):
    """A copy of the arguments (a plan donates the step's state)."""
    def copy(a):
        if _is_key(a):
            return jax.random.wrap_key_data(jnp.array(jax.random.key_data(a)), impl=jax.random.key_impl(a))
        return jnp.array(a)
    return jax.tree.map(copy, args)


def _session(dtypes):
    fn, args = dtype_step(dtypes)
    return fn, args, partex.Session(fn, args, mesh=MESH, hardware="tpu-v4")


def _applied(plan, fn, args, want, what: str) -> None:
    assert_same(partex.apply_plan(plan, fn)(*fresh(args)), want, what)


# --------------------------------------------------------------------------- the stages

def stage_analyze(dtypes) -> None:
    """Every primitive known, the layer stack a recompute unit, h @ h.T a conflict."""
    fn, args = dtype_step(dtypes)
    an = partex.analyze(fn, *args).analysis
    assert an.unknown_primitives == {}, an.unknown_primitives
    (unit,) = an.units
    assert unit.kinds == partex.RECOMPUTE_KINDS and unit.layers == 2
    assert an.conflicts, "h @ h.T holds two batch dims"
    assert any(g.id == an.conflicts[0].group for g in an.decision_groups)


# the ops that make or read typed keys (key arrays, key data), not the random bits they draw
_KEY_OPS = {"random_split": "both", "random_fold_in": "both", "random_wrap": "both", "random_unwrap": "both",
            "random_bits": "in", "threefry2x32": "in"}


def dtype_groups(s, dtypes) -> list:
    """The decision groups of the values of ``dtypes``: of their dtype, or keys and key data
    (made or read by the key ops)."""
    p, an = s.program, s.analysis
    vids = {v.id for v in p.values if str(v.dtype) in set(dtypes)}
    for op in p.ops:
        side = _KEY_OPS.get(op.primitive)
        if side is not None:
            vids.update(op.inputs + (op.outputs if side == "both" else ()))
    ids = {an.group_of(v, d) for v in vids for d in range(len(p.values[v].shape))}
    return [g for g in s.groups if g.id in ids]


def stage_shard(dtypes, most: int | None = None) -> None:
    """Each decision group of the dtypes' values (the ``most`` largest) alone on the first
    mesh axis that divides it."""
    fn, args, s = _session(dtypes)
    want = jax.jit(fn)(*args)
    groups = sorted(dtype_groups(s, dtypes), key=lambda g: (-g.size, g.id))[:most]
    assert groups
    for g in groups:
        axis = next((a for a in s.mesh.axes if g.size % s.mesh.axis_size(a) == 0), None)
        if axis is not None:
            _applied(s.plan([partex.Shard(g.id, axis)]), fn, args, want, f"{dtypes}: {g.label} -> {axis}")


def _resolve(resolution: str) -> Callable:
    def stage(dtypes) -> None:
        fn, args, s = _session(dtypes)
        batch = s.conflicts[0].group
        plan = s.plan([*s.strategy("megatron"), partex.Resolve(batch, resolution)])
        assert any(d.axis == f"resolve:{resolution}" for d in plan.decisions)
        _applied(plan, fn, args, jax.jit(fn)(*args), f"{dtypes}: resolve:{resolution}")
    return stage


def _recompute(kind: str) -> Callable:
    def stage(dtypes) -> None:
        fn, args, s = _session(dtypes)
        (unit,) = s.units
        plan = s.plan([*s.strategy("zero3"), partex.Recompute(unit.id, kind)])
        _applied(plan, fn, args, jax.jit(fn)(*args), f"{dtypes}: recompute:{kind}")
    return stage


def stage_verify_compile(dtypes) -> None:
    """Compile only (from ShapeDtypeStructs): XLA's figures beside the prediction. The
    collectives' bytes are exact (XLA:CPU moves float8 as f16, int4 as 8-bit, bfloat16 as
    f32); so are the arguments' (int4 half a byte, a key 2 or 4 uint32 words)."""
    fn, args, s = _session(dtypes)
    out = partex.verify(s.plan(strategy="zero3"), fn, args)
    assert out.numerics is None and out.memory.xla > 0
    for kind, c in out.collectives.items():
        assert c.predicted_bytes == c.xla_bytes, (kind, c)
    assert out.arguments.predicted == out.arguments.xla, out.arguments


def stage_verify_run(dtypes) -> None:
    fn, args, s = _session(dtypes)
    (unit,) = s.units
    out = partex.verify(s.plan([*s.strategy("zero3"), partex.Recompute(unit.id, "dots")]), fn, args, run=True)
    assert out.numerics is not None and out.numerics.ok, out.numerics


def stage_export(dtypes, tmp_path) -> None:
    """The plan JSON round trip, and the exported specs module used alone by jax.jit."""
    fn, args, s = _session(dtypes)
    plan = s.plan(strategy="zero3")
    plan.save(tmp_path / "plan.json")
    again = partex.Plan.load(tmp_path / "plan.json")
    assert again.inputs == plan.inputs and again.signature == plan.signature
    want = jax.jit(fn)(*args)
    _applied(again, fn, args, want, f"{dtypes}: the plan loaded from JSON")
    ns: dict = {}
    exec(compile(partex.export(again, "specs"), "plan_specs.py", "exec"), ns)  # partex's own export
    mesh = ns["mesh"]()
    jitted = jax.jit(fn, in_shardings=ns["in_shardings"](mesh, *args),
                     out_shardings=ns["out_shardings"](mesh, jax.eval_shape(fn, *args)))
    assert_same(jitted(*fresh(args)), want, f"{dtypes}: the exported specs")


STAGES: dict[str, Callable] = {
    "analyze": stage_analyze, "shard": stage_shard,
    **{f"resolve:{r}": _resolve(r) for r in partex.RESOLUTIONS},
    **{f"recompute:{k}": _recompute(k) for k in partex.RECOMPUTE_KINDS},
    "verify compile": stage_verify_compile, "verify run": stage_verify_run, "export": stage_export,
}


# --------------------------------------------------------------------------- tests

_IDS = ["+".join(k) for k in KINDS]


@pytest.mark.parametrize("dtypes", KINDS, ids=_IDS)
def test_analyze_finds_the_layer_stack_and_the_conflict(dtypes):
    stage_analyze(dtypes)


@pytest.mark.parametrize("dtypes", KINDS, ids=_IDS)
def test_each_group_sharded_alone_matches(dtypes):
    stage_shard(dtypes, most=3)  # the matrix (python tests/test_dtypes.py) takes them all


@pytest.mark.parametrize("stage", [f"resolve:{r}" for r in partex.RESOLUTIONS]
                         + [f"recompute:{k}" for k in partex.RECOMPUTE_KINDS])
@pytest.mark.parametrize("dtypes", KINDS, ids=_IDS)
def test_resolutions_and_recompute_kinds_match(dtypes, stage):
    STAGES[stage](dtypes)


@pytest.mark.parametrize("dtypes", KINDS, ids=_IDS)
def test_verify_compiles_with_xlas_bytes(dtypes):
    stage_verify_compile(dtypes)


@pytest.mark.parametrize("dtypes", KINDS, ids=_IDS)
def test_verify_runs_and_matches(dtypes):
    stage_verify_run(dtypes)


@pytest.mark.parametrize("dtypes", KINDS, ids=_IDS)
def test_export_round_trips_and_its_specs_run(dtypes, tmp_path):
    stage_export(dtypes, tmp_path)


def _matrix() -> None:
    """Each dtype alone through each stage: ok, or the first line of what failed."""
    import tempfile
    import traceback

    print("dtype".ljust(15) + "".join(s.ljust(16) for s in STAGES))
    notes = []
    for d in DTYPES:
        row = d.ljust(15)
        for name, stage in STAGES.items():
            try:
                with tempfile.TemporaryDirectory() as tmp:
                    stage((d,), __import__("pathlib").Path(tmp)) if name == "export" else stage((d,))
                cell = "ok"
            except Exception as e:  # a cell of the matrix: what failed, and go on
                cell = f"FAIL[{len(notes)}]"
                notes.append(f"[{len(notes)}] {d} / {name}: {type(e).__name__}: "
                             + " ".join(str(e).split())[:300] + "\n    at " + traceback.extract_tb(e.__traceback__)[-1].filename.split("/work/")[-1]
                             + f":{traceback.extract_tb(e.__traceback__)[-1].lineno}")
            row += cell.ljust(16)
        print(row, flush=True)
    print("\n".join(notes))


if __name__ == "__main__":
    _matrix()


def test_an_output_mirrors_an_input_of_its_own_dtype_only():
    """numpy spells int4 and every float8 alike (``dtype.str`` is ``<V1``): a float8 copy of
    a frozen int4 weight is no update of it. The int4 argument is not state: not donated,
    its buffer not reused; the float32 weight (a bare array argument) is, as XLA aliases it."""
    def step(q, w):
        deq = q.astype(jnp.float32) * 0.1
        return w - 0.1 * deq, deq.astype(jnp.float8_e4m3fn)

    q, w = jnp.ones((64, 64), jnp.int4), jnp.ones((64, 64))
    s = partex.Session(step, (q, w), mesh=MESH)
    assert s.donate == (1,)
    plan = s.plan(strategy="dp")
    out = partex.verify(plan, step, (q, w))
    assert out.predicted_memory["alias"] == out.xla_memory["alias"] == w.nbytes


def test_verify_run_leaves_the_callers_keys_alive():
    """verify(run=True) runs the plan, which donates the step's state, on copies of the
    arguments: the caller's arrays, typed keys included, are still there afterwards."""
    def step(w, key):
        return w - 0.1 * jax.random.normal(key, w.shape), jax.random.split(key)[1]

    w, key = jnp.ones((8, 4)), jax.random.key(0)
    s = partex.Session(step, (w, key), mesh="data=8")
    assert s.donate == (0, 1)
    out = partex.verify(s.plan(strategy="dp"), step, (w, key), run=True)
    assert out.numerics is not None and out.numerics.ok
    assert not w.is_deleted()
    assert not jax.random.key_data(key).is_deleted()


def test_exported_specs_take_an_argument_without_leaves(tmp_path):
    """An argument without array leaves (no optimizer state yet, ``None``) keeps its place:
    the exported ``in_shardings`` gives one entry per argument."""
    def step(w, state, x):
        return w - 0.1 * jnp.tanh(x @ w).T @ x, state

    args = (jnp.ones((4, 4)), None, jnp.ones((8, 4)))
    plan = partex.Session(step, args, mesh=MESH).plan(strategy="dp")
    assert plan.signature["args"] == ["w", "state", "x"]
    ns: dict = {}
    exec(compile(partex.export(plan, "specs"), "plan_specs.py", "exec"), ns)  # partex's own export
    shardings = ns["in_shardings"](ns["mesh"](), *args)
    assert len(shardings) == 3 and shardings[1] is None
    np.testing.assert_allclose(jax.jit(step, in_shardings=shardings)(*args)[0], jax.jit(step)(*args)[0], rtol=1e-6)
