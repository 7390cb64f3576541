"""Tests for demo_models: every model trains (tiny), traces at full size, names its axes."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from partex.demo_models import MODELS, DemoModelError, Model, build, parse_overrides

NAMES = ["mlp", "transformer", "transformer-scan", "unet", "gns", "moe", "llama"]

# Presets whose full-size trace is checked; (model, preset, overrides).  Unrolled T32/T48
# are traced with layers=2 (the per-layer math is identical; only the trace gets longer).
FULL = [
    ("mlp", "full", {}),
    ("transformer", "t32", {"layers": "2"}),
    ("transformer", "t48", {"layers": "2"}),
    ("transformer-scan", "full", {}),
    ("transformer-scan", "t48", {}),
    ("unet", "full", {}),
    ("gns", "full", {}),
    ("moe", "full", {}),
    ("llama", "7b", {}),
]


def _is_names(x) -> bool:
    return isinstance(x, tuple) and all(e is None or isinstance(e, str) for e in x)


def _leaves_with_names(model: Model):
    arrays, treedef = jax.tree.flatten(model.args)
    names, names_def = jax.tree.flatten(model.axis_names, is_leaf=_is_names)
    return arrays, treedef, names, names_def


def test_registry_keys():
    assert list(MODELS) == NAMES
    for name, mdef in MODELS.items():
        assert mdef.name == name
        assert "tiny" in mdef.presets and "full" in mdef.presets
    for name in ("transformer", "transformer-scan"):
        assert {"t32", "t48"} <= set(MODELS[name].presets)
        assert MODELS[name].presets["full"] == MODELS[name].presets["t32"]


@pytest.mark.parametrize("name", NAMES)
def test_tiny_step_runs_and_learns(name):
    model = build(name)
    assert model.name == name and model.preset == "tiny"
    params, opt_state, batch = model.args
    for leaf in jax.tree.leaves(model.args):
        assert isinstance(leaf, jax.Array)
    assert opt_state["count"].dtype == jnp.int32 and opt_state["count"].shape == ()
    step = jax.jit(model.fn)
    losses = []
    for _ in range(5):
        params, opt_state, loss = step(params, opt_state, batch)
        losses.append(float(loss))
    assert all(math.isfinite(l) for l in losses), losses
    assert losses[-1] < losses[0], losses
    assert int(opt_state["count"]) == 5
    # Output structure matches input structure (params, opt_state).
    assert jax.tree.structure(params) == jax.tree.structure(model.args[0])
    assert jax.tree.structure(opt_state) == jax.tree.structure(model.args[1])


def test_tiny_is_deterministic():
    a, b = build("gns"), build("gns")
    for x, y in zip(jax.tree.leaves(a.args), jax.tree.leaves(b.args)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("name", NAMES)
def test_axis_names_match_args(name):
    model = build(name)
    arrays, treedef, names, names_def = _leaves_with_names(model)
    assert names_def == treedef
    for arr, nm in zip(arrays, names):
        assert len(nm) == arr.ndim, (nm, arr.shape)
        real = [n for n in nm if n is not None]
        assert len(real) == len(set(real)), f"repeated axis name in {nm}"
    # opt_state: mu/nu carry the params' names, count has none.
    pnames, onames, _ = model.axis_names
    assert onames["mu"] == pnames and onames["nu"] == pnames and onames["count"] == ()
    # Names usable as a prefix tree of args (what engine code does with them).
    jax.tree.map(lambda a, n: None, model.args, model.axis_names)


def test_transformer_param_layout():
    model = build("transformer", overrides={"layers": "3"})
    params = model.args[0]
    c = model.config
    assert set(params) == {"embed", "pos", "ln_f", "unembed", "layers"}
    assert len(params["layers"]) == 3
    hd = c.d_model // c.heads
    shapes = {k: v.shape for k, v in params["layers"][0].items()}
    assert shapes == {
        "ln1": (c.d_model,), "wq": (c.d_model, c.heads, hd), "wk": (c.d_model, c.heads, hd),
        "wv": (c.d_model, c.heads, hd), "wo": (c.heads, hd, c.d_model), "ln2": (c.d_model,),
        "w1": (c.d_model, c.d_ff), "b1": (c.d_ff,), "w2": (c.d_ff, c.d_model),
        "b2": (c.d_model,),
    }
    paths = {jax.tree_util.keystr(p, simple=True, separator="/")
             for p, _ in jax.tree_util.tree_leaves_with_path(params)}
    assert "layers/2/w1" in paths
    scan = build("transformer-scan", overrides={"layers": "3"}).args[0]
    assert {k: v.shape for k, v in scan["layers"].items()} == \
        {k: (3,) + s for k, s in shapes.items()}
    _, batch_names = build("transformer").axis_names[::2]
    assert batch_names == {"tokens": ("batch", "seq"), "targets": ("batch", "seq")}


def test_transformer_scan_matches_unrolled():
    unrolled = build("transformer")
    scan = build("transformer-scan")
    params, _, batch = unrolled.args
    stacked = dict(params)
    stacked["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *params["layers"])
    loss_u = jax.jit(lambda p, b: MODELS["transformer"].loss(unrolled.config, p, b))
    loss_s = jax.jit(lambda p, b: MODELS["transformer-scan"].loss(scan.config, p, b))
    lu, ls = float(loss_u(params, batch)), float(loss_s(stacked, batch))
    assert abs(lu - ls) < 1e-5, (lu, ls)


@pytest.mark.parametrize("name,preset,overrides", FULL, ids=lambda v: str(v))
def test_full_preset_is_abstract_and_traces(name, preset, overrides):
    model = build(name, preset, overrides)
    leaves = jax.tree.leaves(model.args)
    assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    arrays, treedef, names, names_def = _leaves_with_names(model)
    assert names_def == treedef
    assert all(len(n) == len(a.shape) for a, n in zip(arrays, names))
    jaxpr = jax.make_jaxpr(model.fn)(*model.args)
    out_loss = jaxpr.out_avals[-1]
    assert out_loss.shape == () and out_loss.dtype == jnp.float32


def test_t32_t48_sizes():
    t32 = build("transformer", "t32").config
    assert (t32.layers, t32.d_model, t32.heads, t32.d_ff, t32.vocab, t32.batch, t32.seq) == \
        (32, 4096, 32, 16384, 32000, 48, 512)
    t48 = build("transformer-scan", "t48")
    c = t48.config
    assert (c.layers, c.d_model, c.heads, c.d_ff, c.vocab, c.batch, c.seq) == \
        (48, 8192, 64, 32768, 32000, 64, 128)
    n = sum(math.prod(x.shape) for x in jax.tree.leaves(t48.args[0]))
    assert 38e9 < n < 41e9


def test_overrides_parse_by_type():
    m = build("moe", overrides={"layers": "1", "capacity_factor": "2.0", "lr": "1e-3"})
    assert m.config.layers == 1 and m.config.capacity_factor == 2.0 and m.config.lr == 1e-3
    assert len(m.args[0]["layers"]) == 1
    assert build("mlp", overrides={"hidden": 7}).config.hidden == 7  # typed values accepted


def test_parse_overrides():
    assert parse_overrides(["layers=12", "batch=1"]) == {"layers": "12", "batch": "1"}
    assert parse_overrides([]) == {}
    assert parse_overrides(["name=a=b"]) == {"name": "a=b"}
    for bad in ["layers", "=3", "layers="]:
        with pytest.raises(DemoModelError, match="malformed override"):
            parse_overrides([bad])


@pytest.mark.parametrize("call,fragment", [
    (lambda: build("resnet"), "unknown model 'resnet'; valid models: mlp, transformer"),
    (lambda: build("mlp", "huge"), "unknown preset 'huge' for mlp; valid presets: tiny, full"),
    (lambda: build("transformer", "tiny", {"layer": "2"}),
     "unknown config key 'layer' for transformer; valid keys: batch, d_ff, d_model"),
    (lambda: build("transformer", "tiny", {"layers": "two"}),
     "bad value 'two' for transformer config key 'layers' (expected int)"),
    (lambda: build("moe", "tiny", {"capacity_factor": "x"}), "(expected float)"),
    (lambda: build("transformer", "tiny", {"heads": "5"}),
     "d_model must be divisible by heads"),
    (lambda: build("gns", "tiny", {"steps": "0"}), "'steps' must be > 0"),
    (lambda: build("unet", "tiny", {"image": "10"}), "image must be divisible by 2**levels"),
])
def test_bad_inputs_raise_one_line(call, fragment):
    with pytest.raises(DemoModelError) as info:
        call()
    msg = str(info.value)
    assert fragment in msg
    assert "\n" not in msg
    assert isinstance(info.value, ValueError)
