"""Cost model, hand strategies, the plan format and apply (in-process, 8 simulated devices)."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from partex import PartexError, analyze_model
from partex.cost import CostModel
from partex import MeshSpec, Plan, Session, apply_plan, get_hardware, parse_bytes
from partex.plan._planned import default_donate
from partex.plan._planning import make_plan
from partex.planner._strategies import strategy_decisions
from partex.cli import main


@pytest.fixture(scope="module")
def tiny():
    return analyze_model("transformer")


@pytest.fixture(scope="module")
def mesh42():
    return MeshSpec.parse("data=4,model=2")


def _cm(res, mesh, hw="tpu-v4"):
    return CostModel(res.analysis, mesh, get_hardware(hw), donate=default_donate(res.program))


def test_hand_strategies_shard_what_they_say(tiny, mesh42):
    cm = _cm(tiny, mesh42)
    p = tiny.program
    w1 = p.inputs[p.input_paths.index("params/layers/0/w1")]
    tokens = p.inputs[p.input_paths.index("batch/tokens")]
    specs = {s: cm.value_specs(strategy_decisions(s, tiny.analysis, mesh42)) for s in ("replicated", "dp", "megatron", "zero3")}
    assert specs["replicated"][w1] == ((), ())
    assert specs["dp"][tokens] == (("data",), ())
    assert specs["megatron"][w1] == ((), ("model",))
    assert specs["zero3"][w1] == (("data",), ("model",))


def test_memory_falls_and_argument_bytes_are_exact(tiny, mesh42):
    cm = _cm(tiny, mesh42)
    peaks = {}
    for s in ("replicated", "dp", "megatron", "zero3"):
        r = cm.evaluate(strategy_decisions(s, tiny.analysis, mesh42), detail=True)
        peaks[s] = r.memory.peak
        assert set(r.memory.breakdown) == {"parameters", "optimizer", "activations", "temporaries"}
    assert peaks["replicated"] > peaks["dp"] > peaks["megatron"] > peaks["zero3"]
    total = sum(v.nbytes for v in (tiny.program.values[i] for i in tiny.program.inputs))
    assert cm.evaluate([]).memory.arguments == total
    # zero3 shards params and optimizer state 8 ways (biases/norms: fewer)
    assert cm.evaluate(strategy_decisions("zero3", tiny.analysis, mesh42)).memory.arguments < total / 4


def test_collectives_follow_the_plan(tiny, mesh42):
    cm = _cm(tiny, mesh42)
    dp = cm.evaluate(strategy_decisions("dp", tiny.analysis, mesh42), detail=True)
    assert {c.kind for c in dp.collectives} >= {"all-reduce"}
    assert all(c.axes == ("data",) for c in dp.collectives if c.kind == "all-reduce")
    # dp all-reduces every gradient once: at least the parameter bytes
    params = sum(tiny.program.values[i].nbytes for i, path in zip(tiny.program.inputs, tiny.program.input_paths)
                 if path.startswith("params/"))
    assert dp.collective_bytes["all-reduce"] >= params
    z3 = cm.evaluate(strategy_decisions("zero3", tiny.analysis, mesh42), detail=True)
    assert z3.collective_bytes.get("all-gather", 0) > 0  # weights gathered before use
    assert all(c.source and c.cause for c in z3.collectives)
    assert cm.evaluate([]).comm_time == 0.0


def test_evaluation_is_deterministic_and_cached_consistently(tiny, mesh42):
    dec = strategy_decisions("zero3", tiny.analysis, mesh42)
    a = _cm(tiny, mesh42).evaluate(dec)
    cm = _cm(tiny, mesh42)
    for other in ("dp", "megatron"):
        cm.evaluate(strategy_decisions(other, tiny.analysis, mesh42))
    b = cm.evaluate(dec)
    assert (a.step_time, a.memory.peak) == (b.step_time, b.memory.peak)
    assert 0 < a.mfu <= 1 and a.ideal_time > 0


def test_plan_round_trips_and_applies_with_matching_numerics(tmp_path, tiny, mesh42):
    hw = get_hardware("tpu-v4")
    plan = make_plan(tiny, mesh42, hw, strategy_decisions("megatron", tiny.analysis, mesh42), strategy="megatron")
    path = tmp_path / "plan.json"
    plan.save(path)
    d = json.loads(path.read_text())
    assert d["format"] == "partex-plan" and d["version"] == 1
    assert d["inputs"]["params/layers/0/w1"] == [None, "model"]
    assert d["donate"] == [0, 1]
    loaded = Plan.load(path)
    assert loaded.inputs == plan.inputs and loaded.decisions == plan.decisions
    m = tiny.model
    ref = jax.jit(m.fn)(*m.args)
    planned = apply_plan(loaded, m.fn)
    args = jax.tree.map(lambda x: jax.numpy.array(x), m.args)  # donated: fresh copies
    got = planned(*args)
    np.testing.assert_allclose(got[2], ref[2], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(got[1]["mu"]), jax.tree.leaves(ref[1]["mu"])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
    assert planned.num_constraints[0] > 100
    # ZeRO-3 gathers each weight right where a matmul reads it: operand constraints
    z3 = _cm(tiny, mesh42).operand_specs(strategy_decisions("zero3", tiny.analysis, mesh42))
    w1 = tiny.program.inputs[tiny.program.input_paths.index("params/layers/0/w1")]
    assert any(tiny.program.ops[op].inputs[i] == w1 and spec == ((), ("model",)) for (op, i), spec in z3.items())
    w1 = got[0]["layers"][0]["w1"]
    assert w1.sharding.spec == jax.sharding.PartitionSpec(None, "model")


def _plan_file(tmp_path, tiny, mesh, edit=None, name="p.json"):
    plan = make_plan(tiny, mesh, get_hardware("tpu-v4"), strategy_decisions("dp", tiny.analysis, mesh), strategy="dp")
    d = plan.to_json()
    if edit:
        edit(d)
    path = tmp_path / name
    path.write_text(json.dumps(d))
    return path


def test_signature_mismatch_names_the_first_differing_leaf(tmp_path, mesh42):
    other = analyze_model("transformer", "tiny", ["d_ff=128"])
    path = _plan_file(tmp_path, other, mesh42)
    m = analyze_model("transformer").model
    with pytest.raises(PartexError, match=r"input \d+ is params/layers/0/b1 \(256,\) float32 here but "
                                          r"params/layers/0/b1 \(128,\) float32 in the plan"):
        apply_plan(Plan.load(path), m.fn).lower(*m.args)


@pytest.mark.parametrize("edit,needle", [
    (lambda d: d.update(version=7), "format version 7"),
    (lambda d: d.update(format="other"), "not a partex plan"),
    (lambda d: d["mesh"].update(sizes=[4, 0]), "sizes must be positive integers"),
    (lambda d: d["inputs"].update({"params/embed": ["nope", None]}), "unknown mesh axis 'nope'"),
    (lambda d: d["hardware"].update(peak_flops=float("nan")), "peak_flops must be a positive finite number"),
    (lambda d: d["hardware"].update(hbm_bandwidth=-1), "hbm_bandwidth must be a positive finite number"),
    (lambda d: d["decisions"].append({"group": "batch", "axis": "pipe"}), "unknown mesh axis 'pipe'"),
    (lambda d: d.pop("signature"), "lacks the 'signature' field"),
])
def test_bad_plan_files_get_clear_errors(tmp_path, tiny, mesh42, edit, needle):
    path = _plan_file(tmp_path, tiny, mesh42, edit)
    with pytest.raises(PartexError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        Plan.load(path)


def test_truncated_and_malformed_json(tmp_path, tiny, mesh42):
    path = _plan_file(tmp_path, tiny, mesh42)
    path.write_text(path.read_text()[:200])
    with pytest.raises(PartexError, match="not valid JSON.*truncated"):
        Plan.load(path)


def test_indivisible_input_spec_names_leaf_and_dim(tmp_path, tiny, mesh42):
    def edit(d):
        d["inputs"]["params/layers/0/b1"] = [["data", "model"]]
        d["mesh"]["sizes"] = [4, 2]
    path = _plan_file(tmp_path, analyze_model("transformer", "tiny", ["d_ff=36"]), mesh42, edit)
    m = analyze_model("transformer", "tiny", ["d_ff=36"]).model
    with pytest.raises(PartexError, match=r"size 8 does not divide dim 0 \(size 36\) of params/layers/0/b1"):
        apply_plan(Plan.load(path), m.fn).lower(*m.args)


def test_mesh_size_must_match_devices(tmp_path, tiny):
    path = _plan_file(tmp_path, tiny, MeshSpec.parse("data=16"))
    m = tiny.model
    with pytest.raises(PartexError, match="needs 16 devices but JAX has 8"):
        apply_plan(Plan.load(path), m.fn).lower(*m.args)


@pytest.mark.parametrize("argv,needle", [
    (["--mesh", "data=4,model=2", "--hardware", "tpu-v9"], "unknown hardware preset 'tpu-v9'"),
    (["--mesh", "data=4;model=2"], "cannot parse mesh"),
    (["--mesh", "data=0"], "sizes must be positive integers"),
    (["--mesh", "data=-2"], "sizes must be positive integers"),
    (["--mesh", "data=8", "--peak-flops", "nan"], "peak_flops must be a positive finite number"),
    (["--mesh", "data=8", "--link-bandwidth", "-5"], "link_bandwidth must be a positive finite number"),
    (["--mesh", "data=8", "--memory", "lots"], "cannot read memory size 'lots'"),
    (["--mesh", "data=8", "--strategy", "magic"], "unknown strategy 'magic'"),
    (["--mesh", "data=3,model=2"], "mesh axis 'data' (size 3) divides no dimension of this model"),
])
def test_cli_plan_bad_inputs(capsys, tmp_path, argv, needle):
    if "--strategy" not in argv:
        argv = argv + ["--strategy", "dp"]
    code = main(["plan", "transformer", *argv, "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "x.json").exists()


def test_cli_verify_bad_plan_exit_2(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["verify", "transformer", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_parse_bytes_and_mesh_text():
    assert parse_bytes("16GiB") == 16 * 2**30 and parse_bytes("1.5e9") == 1.5e9
    m = MeshSpec.parse("data=4, model=2")
    assert m.axes == ("data", "model") and m.sizes == (4, 2) and m.size == 8
    assert MeshSpec.from_json(m.to_json()) == m
    with pytest.raises(PartexError, match="unique"):
        MeshSpec.parse("data=2,data=4")
    assert math.isclose(MeshSpec.parse("data=4@25,model=2@100").axis_bandwidth("data", get_hardware("cpu")), 25e9)


def test_tampered_plan_is_refused(tmp_path, tiny, mesh42):
    def edit(d):
        d["inputs"]["params/layers/0/w1"] = ["data", None]
    path = _plan_file(tmp_path, tiny, mesh42, edit)
    m = tiny.model
    with pytest.raises(PartexError, match=r"the plan was modified: input params/layers/0/w1 has spec"):
        apply_plan(Plan.load(path), m.fn).lower(*m.args)


def test_a_mesh_axis_that_divides_nothing_is_refused_and_the_session_keeps_its_mesh_and_pins(tiny):
    from partex import Session

    s = Session.from_analysis(tiny, mesh="data=4,model=2", memory="3MiB")
    s.pin("ffn", "model")
    with pytest.raises(PartexError, match=r"mesh axis 'data' \(size 3\) divides no dimension.*use e.g. data=2 or "
                                          r"data=4"):
        s.reconfigure(mesh="data=3,model=2")
    assert s.mesh.text() == "data=4,model=2" and [s.label(p) for p in s.pins] == ["ffn->model"]
    assert s.reconfigure(mesh="data=2,model=4") == []  # a mesh that divides: accepted, pin kept
    assert [s.label(p) for p in s.pins] == ["ffn->model"]


def test_a_detailed_memory_report_lists_what_its_peak_holds(tiny, mesh42):
    """With detail, the report names the op its temporaries peak at and every buffer live
    there, largest first: their bytes sum to the temporaries; zero3 holds gathered weights
    (buffers the plan adds), and a recomputed stack holds recomputed copies past its
    recompute point."""
    import partex

    cm = _cm(tiny, mesh42)
    zero3 = strategy_decisions("zero3", tiny.analysis, mesh42)
    assert "buffer" in {h.kind for h in cm.evaluate(zero3, detail=True).memory.held}
    for decisions in (zero3, [*zero3, partex.Recompute(tiny.analysis.units[0].id, "full")]):
        m = cm.evaluate(decisions, detail=True).memory
        assert 0 <= m.peak_op < len(tiny.program.ops)
        assert math.isclose(sum(h.bytes for h in m.held), m.temporaries, rel_tol=1e-9)
        assert [h.bytes for h in m.held] == sorted((h.bytes for h in m.held), reverse=True)
        assert all(h.start <= m.peak_op < h.stop for h in m.held)
        assert all(h.value >= 0 for h in m.held if h.kind in ("value", "recomputed copy"))
    kinds = {h.kind for h in m.held}
    assert "recomputed copy" in kinds or "recomputation temporaries" in kinds, kinds
    assert cm.evaluate(zero3).memory.held == ()  # without detail: not computed


def _loss_over_logits(x, w, targets):
    """A bf16 logits block read by a float32 log-softmax and a one-hot loss (MaxText's)."""
    logits = (x @ w).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.sum(jax.nn.one_hot(targets, w.shape[1], dtype=logp.dtype) * logp, axis=-1))


def test_tpu_recomputes_a_cheap_float32_chain_from_its_bf16_logits_where_each_reader_reads_it():
    """On TPU and GPU the float32 log-softmax chain over a bf16 [tokens, vocab] block, read
    by several fusions (the forward's reductions, the backward's), is computed in each of
    them from the logits, which stay in memory instead: the peak holds no float32
    [tokens, vocab] value. XLA:CPU materialises the chain: its lowering keeps it."""
    def step(x, w, t):
        return jax.grad(_loss_over_logits, argnums=1)(x, w, t)

    x = jnp.ones((256, 64), jnp.bfloat16)
    w = jnp.ones((64, 1024), jnp.bfloat16)
    t = jnp.zeros((256,), jnp.int32)
    s = Session(step, (x, w, t), mesh="data=8", hardware="tpu-v5p")
    block = 256 * 1024 * 4  # one float32 [tokens, vocab] value
    reports = {}
    for lowering in ("tpu", "cpu"):
        cm = CostModel(s.analysis, s.cost_model.mesh, s.cost_model.hw, lowering=lowering)
        r = cm.evaluate([], detail=True)
        held = [h for h in r.memory.held if h.value >= 0]
        reports[lowering] = (r.memory.peak, [s.program.values[h.value] for h in held])
    peak_tpu, held_tpu = reports["tpu"]
    peak_cpu, held_cpu = reports["cpu"]
    assert not [v for v in held_tpu if v.nbytes >= block and str(v.dtype) == "float32"]
    assert [v for v in held_tpu if v.shape == (256, 1024) and str(v.dtype) == "bfloat16"]  # the logits
    assert [v for v in held_cpu if v.nbytes >= block and str(v.dtype) == "float32"]
    assert peak_tpu < peak_cpu - block / 2


def _lookup(table, tokens):
    return jnp.take(table, tokens, axis=0)


def _lookup_step(table, tokens):
    return jax.value_and_grad(lambda t: jnp.sum(jnp.take(t, tokens, axis=0) ** 2))(table)


@pytest.mark.parametrize("vocab", [128, 512])  # XLA moves the table's block, then the indices' and lookups'
@pytest.mark.parametrize("fn", [_lookup, _lookup_step])
def test_a_lookup_leaving_the_first_mesh_axis_out_is_moved_onto_it_as_xla_does(fn, vocab):
    """An embedding lookup with its vocabulary on one axis and its batch on another, on a
    mesh whose first axis it leaves out: XLA's partitioner moves the lookup onto that axis
    with a collective-permute (of the table's block, or of the indices' and the looked-up
    rows' where those are smaller; the gradient's scatter-add likewise), and the cost model
    predicts it; every other placement moves nothing. Each placement compiled, compile-only."""
    from partex import LoadedModel, ModelAnalysis, Shard, trace, verify
    from partex.analysis._analysis import analyze

    args = (jnp.ones((vocab, 64), jnp.float32), jnp.zeros((8, 32), jnp.int32))
    program = trace(fn, args)
    an = analyze(program)
    ma = ModelAnalysis(LoadedModel(fn.__name__, fn, args), program, an, 0.0)
    mesh = MeshSpec.parse("a=2,b=2,c=2")
    rows, batch = an.group_of(program.inputs[0], 0), an.group_of(program.inputs[1], 0)
    moved = {}
    for v in mesh.axes:
        others = [a for a in mesh.axes if a != v]
        for b in ([], [others[0]], [others[1]], others):
            decisions = [Shard(rows, v)] + [Shard(batch, a) for a in b]
            if len(program.outputs) > 1:  # the gradient's rows where the table's are
                decisions.append(Shard(an.group_of(program.outputs[1], 0), v))
            out = verify(make_plan(ma, mesh, get_hardware("cpu"), decisions), fn, args)
            c = out.collectives.get("collective-permute")
            pred, xla = (c.predicted_bytes, c.xla_bytes) if c else (0.0, 0.0)
            # a step that moves the indices moves them once for the lookup and its gradient
            # (XLA reuses them; the cost model moves them for each: 512 bytes of 66048)
            assert pred == pytest.approx(xla, rel=0.01), (v, b, pred, xla)
            moved[(v, "+".join(b))] = xla
    assert {k for k, x in moved.items() if x} == {("b", "c"), ("c", "b")}, moved
