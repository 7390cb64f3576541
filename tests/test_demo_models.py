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
    # the presets mirroring published MaxText runs (bf16, MaxText remat policies)
    ("llama", "maxtext-32b", {}),
    ("llama", "maxtext-22b", {}),
    ("llama", "llama2-70b", {}),
    ("llama", "llama2-70b-v6e", {}),
    ("llama", "llama3.1-70b-v6e", {}),
    ("llama", "llama3.1-8b-v6e", {}),
    ("llama", "llama3.1-405b", {"layers": "2"}),
    ("llama", "llama3.1-405b", {"layers": "2", "scan": "false"}),
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
    (lambda: build("llama", "tiny", {"dtype": "float16"}),
     "llama: unknown dtype 'float16'; valid: float32, bfloat16"),
    (lambda: build("llama", "tiny", {"remat": "everything"}),
     "llama: unknown remat 'everything'; valid: none, full, minimal,"),
    (lambda: build("llama", "tiny", {"remat": "custom:query_proj=host"}),
     "llama: bad custom remat entry 'query_proj=host'"),
    (lambda: build("llama", "tiny", {"remat": "custom:wq=offload"}),
     "NAME one of decoder_layer_input"),
    (lambda: build("llama", "tiny", {"remat": "custom:decoder_layer_input=remat"}),
     "cannot rematerialise decoder_layer_input"),
])
def test_bad_inputs_raise_one_line(call, fragment):
    with pytest.raises(DemoModelError) as info:
        call()
    msg = str(info.value)
    assert fragment in msg
    assert "\n" not in msg
    assert isinstance(info.value, ValueError)


# --------------------------------------------------------------------------- llama: dtype, remat

LLAMA_REMATS = ["none", "full", "minimal", "minimal_with_context", "save_dot_except_mlpwi",
                "save_qkv_proj", "qkv_proj_offloaded",
                "custom:decoder_layer_input=offload+query_proj=offload+key_proj=offload"
                "+value_proj=offload"]


def _eqns(jaxpr):
    """Every eqn of a jaxpr, nested call / scan / checkpoint bodies included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for v in eqn.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _eqns(inner)


def _llama_loss(model, params, batch) -> float:
    return float(jax.jit(lambda p, b: MODELS["llama"].loss(model.config, p, b))(params, batch))


@pytest.mark.parametrize("remat", LLAMA_REMATS)
def test_llama_bf16_and_remat_trace_and_match_float32(remat):
    ref = build("llama")
    params, _, batch = ref.args
    l32 = _llama_loss(ref, params, batch)
    for dtype in ("float32", "bfloat16"):
        m = build("llama", overrides={"dtype": dtype, "remat": remat})
        assert (m.config.dtype, m.config.remat) == (dtype, remat)
        jaxpr = jax.make_jaxpr(m.fn)(*m.args)
        out_loss = jaxpr.out_avals[-1]
        assert out_loss.shape == () and out_loss.dtype == jnp.float32
        # parameters and Adam state keep their dtypes (float32: MaxText's weight_dtype)
        assert [a.dtype for a in jaxpr.out_avals[:-1]] == \
            [x.dtype for x in jax.tree.leaves(m.args[:2])]
        assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(m.args[0]))
        loss = _llama_loss(m, params, batch)
        if dtype == "float32":  # remat recomputes the same float32 math
            assert abs(loss - l32) <= 1e-6 * abs(l32), (remat, loss, l32)
        else:  # bf16 compute: close to float32, but not the float32 number itself
            assert loss != l32
            assert abs(loss - l32) <= 1e-2 * abs(l32), (remat, loss, l32)


def test_llama_remat_primitives():
    def prims(remat, dtype="float32"):
        m = build("llama", overrides={"remat": remat, "dtype": dtype})
        return list(_eqns(jax.make_jaxpr(m.fn)(*m.args).jaxpr))

    remat_prims = {"checkpoint", "remat2"}
    assert not any(e.primitive.name in remat_prims for e in prims("none"))
    full = prims("full")
    assert any(e.primitive.name in remat_prims for e in full)
    assert not any(e.primitive.name == "name" for e in full)  # full: nothing tagged
    minimal = prims("minimal", "bfloat16")
    assert any(e.primitive.name in remat_prims for e in minimal)
    names = {e.params["name"] for e in minimal if e.primitive.name == "name"}
    assert {"query_proj", "key_proj", "value_proj", "out_proj", "mlpwi_0", "mlpwi_1",
            "mlpwo"} <= names
    offloaded = build("llama", overrides={"remat": "qkv_proj_offloaded"})
    text = str(jax.make_jaxpr(offloaded.fn)(*offloaded.args))
    assert "<host>" in text  # q/k/v residuals live in pinned host memory


def test_llama_bf16_matmuls_are_bf16_and_defaults_untouched():
    bf16 = build("llama", overrides={"dtype": "bfloat16"})
    dots = [e for e in _eqns(jax.make_jaxpr(bf16.fn)(*bf16.args).jaxpr)
            if e.primitive.name == "dot_general"]
    assert dots and all(v.aval.dtype == jnp.bfloat16 for e in dots for v in e.invars)
    for leaf in jax.tree.leaves(bf16.args[0]):
        assert leaf.dtype == jnp.float32
    # the defaults (every preset that predates the options): float32, no remat, no tags
    for preset in ("tiny", "7b"):
        m = build("llama", preset)
        assert (m.config.dtype, m.config.remat) == ("float32", "none")
        eqns = list(_eqns(jax.make_jaxpr(m.fn)(*m.args).jaxpr))
        assert not any(e.primitive.name in ("checkpoint", "remat2", "name") for e in eqns)
        assert all(v.aval.dtype != jnp.bfloat16 for e in eqns for v in e.outvars)


def test_llama_bf16_minimal_step_learns():
    model = build("llama", overrides=parse_overrides(["dtype=bfloat16", "remat=minimal"]))
    params, opt_state, batch = model.args
    step = jax.jit(model.fn)
    losses = []
    for _ in range(4):
        params, opt_state, loss = step(params, opt_state, batch)
        losses.append(float(loss))
    assert all(math.isfinite(l) for l in losses) and losses[-1] < losses[0], losses
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))


def test_llama_maxtext_presets_mirror_the_published_runs():
    from partex.demo_models._llama import PUBLISHED_RUNS
    presets = MODELS["llama"].presets
    assert set(PUBLISHED_RUNS) < set(presets)
    per_device = {"maxtext-32b": 6, "maxtext-22b": 16, "llama2-70b": 4, "llama2-70b-v6e": 2,
                  "llama3.1-70b-v6e": 5, "llama3.1-8b-v6e": 4}
    assert set(per_device) == set(PUBLISHED_RUNS)
    for name, run in PUBLISHED_RUNS.items():
        c = presets[name]
        assert c.dtype == "bfloat16"
        assert c.batch == per_device[name] * run["chips"]
        assert math.prod(run["mesh"].values()) == run["chips"]
    dims = lambda c: (c.layers, c.d_model, c.heads, c.kv_heads, c.head_dim, c.d_ff, c.vocab, c.seq)
    assert dims(presets["maxtext-32b"]) == (32, 8192, 64, 64, 128, 28672, 32000, 2048)
    assert dims(presets["maxtext-22b"]) == (48, 6144, 24, 24, 256, 16384, 32768, 1024)
    assert dims(presets["llama2-70b"]) == (80, 8192, 64, 8, 128, 28672, 32000, 4096)
    assert dims(presets["llama3.1-70b-v6e"]) == (80, 8192, 64, 8, 128, 28672, 128256, 8192)
    assert dims(presets["llama3.1-8b-v6e"]) == (32, 4096, 32, 8, 128, 14336, 128256, 8192)
    assert [presets[n].remat for n in ("maxtext-32b", "maxtext-22b", "llama2-70b",
                                       "llama2-70b-v6e")] == \
        ["minimal", "full", "save_dot_except_mlpwi", "qkv_proj_offloaded"]
    n = lambda p: sum(math.prod(x.shape) for x in jax.tree.leaves(build("llama", p).args[0]))
    assert 31.5e9 < n("maxtext-32b") < 31.8e9
    assert 68.9e9 < n("llama2-70b") < 69.1e9
    # the 22B: SwiGLU d_ff 16384 holds what the published ReLU MLP (24576) held, + untied head
    assert abs(n("maxtext-22b") - (21.945e9 + 32768 * 6144)) < 0.01e9
