"""Pipelined layer loops: the transform (``plan._pipelined_scan.pipelined_scan``), which stacks may
be pipelined (``analysis._pipeline_stacks``), and the pipelined step's numerics against the step."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import partex
from partex._meshes import Topology, candidate_pipelines
from partex.analysis._pipeline_stacks import SUM, PipelineStack, pipeline_stacks
from partex.plan._apply import constrained_function
from partex.plan._numerics import compare_outputs
from partex.plan._pipelined_scan import PipelineRun, pipelined_scan, unskew

L, B, D = 8, 16, 32


def _compare(want, got) -> dict:
    """verify's comparison of two steps' outputs, leaf by leaf (``compare_outputs``)."""
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(want)[0]]
    return compare_outputs(paths, jax.tree.leaves(want), jax.tree.leaves(got))


def _mesh(stages: int):
    return jax.make_mesh((stages, 8 // stages), ("stage", "data"), axis_types=(AxisType.Auto,) * 2)


def _layer(cs, c, x):
    """A layer that reads a per-row const (a mask), makes a residual, a sum over the rows (a
    weight gradient's form) and a value of its weight alone."""
    (mask,), (h,), (w,) = cs, c, x
    out = jnp.tanh(h @ w) * mask[:, None]
    return [out], [out, jnp.einsum("bd,be->de", h, out), w.T * 2.0]


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("stages,microbatches,repeats", [(2, 4, 1), (4, 8, 1), (4, 2, 1), (2, 4, 2), (4, 4, 2)])
def test_a_pipelined_loop_computes_what_the_loop_computes(reverse, stages, microbatches, repeats):
    k = jax.random.split(jax.random.key(0), 3)
    w = jax.random.normal(k[0], (L, D, D)) / np.sqrt(D)
    x0 = jax.random.normal(k[1], (B, D))
    mask = jax.random.normal(k[2], (B,))
    want_c, want_y = jax.lax.scan(lambda c, x: _layer([mask], c, x), [x0], [w], reverse=reverse)

    def piped(w, x0, mask):
        return pipelined_scan(_layer, [mask], [x0], [w], length=L, reverse=reverse, stages=stages,
                              microbatches=microbatches, axis="stage", const_batch=[0], carry_batch=[0],
                              xs_batch=[None], ys_batch=[0, SUM, None], repeats=repeats)

    mesh = _mesh(stages)
    with jax.set_mesh(mesh):
        args = (jax.device_put(w, NamedSharding(mesh, P("stage"))), jax.device_put(x0, NamedSharding(mesh, P("data"))),
                jax.device_put(mask, NamedSharding(mesh, P("data"))))
        got_c, got_y = jax.jit(piped)(*args)
        hlo = jax.jit(piped).lower(*args).compile().as_text()
    np.testing.assert_allclose(got_c[0], want_c[0], rtol=1e-5, atol=1e-5)
    # the per-row result (a residual) comes back in the stages' skewed row order (circular: in
    # the stages' own layout, [S, L/(RS), B/M, RM, ...])
    if repeats == 1:
        assert not np.allclose(got_y[0], want_y[0], rtol=1e-5, atol=1e-5)
    else:
        assert got_y[0].shape == (stages, L // (stages * repeats), B // microbatches, repeats * microbatches, D)
    np.testing.assert_allclose(unskew(got_y[0], 0, stages, microbatches, repeats), want_y[0], rtol=1e-5, atol=1e-5)
    for g, w_ in zip(got_y[1:], want_y[1:]):
        np.testing.assert_allclose(g, w_, rtol=1e-5, atol=1e-5)
    # the activations move from stage to stage as collective-permutes over the stage axis
    pairs = re.findall(r"collective-permute(?:-start)?\(.*?source_target_pairs=\{([^}]*(?:\}[^}]*)*?)\}\}", hlo)
    assert pairs, "no collective-permute in the pipelined loop"
    # stage s's devices send to stage s+1's (s-1 in a reverse loop): device d -> d +- 8/stages
    step = 8 // stages
    first = [tuple(map(int, p.split(","))) for p in re.findall(r"\{(\d+,\d+)", pairs[0])]
    assert {(b - a) % 8 for a, b in first} == {(step if not reverse else -step) % 8}


def test_layers_that_do_not_divide_into_stages_are_refused():
    with pytest.raises(ValueError, match="do not split into 3 stages"):
        pipelined_scan(_layer, [jnp.ones(B)], [jnp.ones((B, D))], [jnp.ones((L, D, D))], length=L, reverse=False,
                       stages=3, microbatches=2, axis="stage", const_batch=[0], carry_batch=[0], xs_batch=[None],
                       ys_batch=[0, SUM, None])


@pytest.fixture(scope="module")
def sessions():
    return {name: partex.Session.from_spec(name, preset="tiny", overrides=["layers=4"], mesh="data=4,model=2")
            for name in ("transformer-scan", "llama")}


def test_scanned_stacks_may_be_pipelined_and_their_loops_say_where_the_batch_is(sessions):
    for s in sessions.values():
        an = s.analysis
        (stack,) = pipeline_stacks(an, an.units, an.roles.batch_groups).values()
        assert isinstance(stack, PipelineStack) and stack.layers == 4 and stack.batch == 8
        fwd, bwd = stack.forward, stack.backward
        assert fwd.carry == (0,) and bwd.carry == (0,)  # the activation, its cotangent: [batch, seq, d_model]
        # the forward loop's weights have no batch; its residuals do; the backward loop makes
        # the weights' gradients, each a sum over the batch
        assert all(b is None for b in fwd.xs) and any(b == 0 for b in fwd.ys)
        assert set(bwd.ys) == {SUM}
        # a broadcast sized for the whole batch is resized per microbatch
        assert any(k == "shape" for r in fwd.resize.values() for k, _ in r)


def test_unrolled_stacks_are_not_offered_as_pipelines():
    s = partex.Session.from_spec("transformer", preset="tiny", mesh="data=4,model=2")
    assert pipeline_stacks(s.analysis, s.analysis.units, s.analysis.roles.batch_groups) == {}


def _stack_norm_step():
    """A scanned stack whose layers normalise over the batch (batch-norm statistics): its rows
    are not independent, so microbatches would change what it computes."""
    def layer(h, w):
        h = h @ w
        h = (h - h.mean(axis=0)) / (h.std(axis=0) + 1e-3)
        return h, None

    def loss(ws, x):
        h, _ = jax.lax.scan(layer, x, ws)
        return jnp.mean(h ** 2)

    def step(ws, x):
        g = jax.grad(loss)(ws, x)
        return ws - 0.1 * g

    return step, (jnp.ones((4, 16, 16)), jnp.ones((8, 16)))


def test_a_stack_that_mixes_the_rows_of_its_batch_is_not_pipelined():
    fn, args = _stack_norm_step()
    an = partex.analyze(fn, *args).analysis
    (why,) = pipeline_stacks(an, an.units, an.roles.batch_groups).values()
    assert isinstance(why, str) and "sum over the batch" in why


@pytest.mark.parametrize("name,stages,microbatches,repeats", [
    ("transformer-scan", 2, 4, 1), ("transformer-scan", 4, 8, 1), ("llama", 4, 4, 1), ("llama", 2, 8, 1),
    ("transformer-scan", 2, 4, 2), ("llama", 2, 8, 2)])
def test_a_pipelined_step_computes_what_the_step_computes(sessions, name, stages, microbatches, repeats):
    s = sessions[name]
    an, program = s.analysis, s.program
    (stack,) = pipeline_stacks(an, an.units, an.roles.batch_groups).values()
    run = PipelineRun(stack, "stage", stages, microbatches, repeats)
    fn = constrained_function(program, _mesh(stages), {}, pipelines=[run])
    model = s.model.model
    want = jax.jit(model.fn)(*model.args)
    with jax.set_mesh(_mesh(stages)):
        got = jax.jit(fn)(*model.args)
    r = _compare(want, got)
    assert r["ok"], r


# ---------------------------------------------------------------- the pipelined step as a session

def test_a_session_on_a_pipelined_step_plans_verifies_and_applies_it(tmp_path):
    """transformer-scan with its stack over two stages in four microbatches: the session's
    step is the pipelined one (a tick loop, the stages' values on the stage axis); a plan of
    it records the pipeline and applies to the user's step, with its numerics."""
    s = partex.Session.from_spec("transformer-scan", preset="tiny", overrides=["layers=4"],
                                 mesh="stage=2,data=2,model=2", pipeline="stack0:stage:4")
    assert s.pipeline == partex.Pipeline("stack0", "stage", 4)
    # the stage dim of every per-stage value is the step's own sharding: fixed on the stage axis
    assert {d.axis for d in s.cost_model.fixed.decisions} == {"stage"}
    # each tick reads and writes its buffers at one slot for every stage: dynamic slices, not
    # the scatters a per-stage index makes (which XLA partitions by gathering the buffer)
    prims = {op.primitive for op in s.program.ops}
    assert "dynamic_update_slice" in prims and "scatter" not in prims
    # its MFU counts the step's own FLOPs: the pipelined step computes more (in its bubble)
    report = s.evaluate(s.strategy("zero3"))
    work = s.model.work_flops
    assert s.cost_model.tables.total_flops > 1.2 * work
    assert report.ideal_time == pytest.approx(work / (8 * s.hardware.peak_flops))
    plan = s.plan(strategy="zero3")
    assert plan.pipeline == {"stack": "stack0", "axis": "stage", "microbatches": 4, "schedule": "gpipe",
                             "recompute": None, "repeats": 1}
    again = partex.Plan.loads(plan.dumps())
    assert again.pipeline == plan.pipeline
    # the exports say what the specs alone do not carry: the pipeline, which apply_plan makes
    from partex.plan._export import export_text
    spec = json.loads(export_text(again, "specs", as_json=True))
    assert spec["pipeline"]["microbatches"] == 4 and "use partex.apply_plan(plan, step)" in spec["pipeline"]["note"]
    assert "Not carried: the pipeline. The plan runs layer stack stack0 as a pipeline over mesh axis stage" in \
        export_text(again, "specs")
    model = s.model.base.model
    want = jax.jit(model.fn)(*model.args)
    got = partex.apply_plan(again, model.fn)(*model.args)
    assert _compare(want, got)["ok"]


def test_pipeline_errors_say_what_to_change():
    def session(text, mesh="stage=2,data=4"):
        return partex.Session.from_spec("transformer-scan", preset="tiny", overrides=["layers=4"], mesh=mesh,
                                        pipeline=text)
    for text, says in [("stack0:stage", "STACK:AXIS:MICROBATCHES"), ("stack0:stage:x", "whole number"),
                       ("stack9:stage:4", "no layer stack 'stack9'"), ("stack0:pipe:4", "has no axis 'pipe'"),
                       ("stack0:stage:3", "does not split into 3 microbatches"),
                       ("stack0:stage:4:1f1b", "unknown schedule"),
                       ("stack0:stage:4:offload", "a stage recomputes dots or full"),
                       ("stack0:stage:4:full:gpipe", "a schedule (gpipe or circular<R>) then a recompute kind"),
                       ("stack0:stage:4:circular", "e.g. circular2"),
                       ("stack0:stage:4:circular4", "4 layers do not split into 2 stages (the size of stage) of 4 blocks"),
                       ("stack0:stage:1:circular2", "at least as many microbatches as stages (2)")]:
        with pytest.raises(partex.PartexError, match=re.escape(says)):
            session(text)
    with pytest.raises(partex.PartexError, match="4 layers do not split into 8 stages"):
        session("stack0:stage:4", mesh="stage=8")
    with pytest.raises(partex.PartexError, match="unrolled"):
        partex.Session.from_spec("transformer", preset="tiny", mesh="stage=2,data=4", pipeline="stack0:stage:4")


@pytest.mark.parametrize("name,layers,mesh,pipeline", [
    ("transformer-scan", 4, "stage=2,data=2,model=2", "stack0:stage:4:full"),
    ("llama", 4, "stage=4,data=2", "stack0:stage:8:dots"),
    ("llama", 8, "stage=4,data=2", "stack0:stage:4:circular2:full")])
def test_a_stage_recomputes_its_layers_in_the_backward_ticks(name, layers, mesh, pipeline):
    """Recompute taken with the pipeline: the forward ticks keep only what the recomputation
    reads, the backward ticks bind the layers' forward ops again behind a barrier; less
    memory for the in-flight microbatches, the user's numerics (on either schedule)."""
    s = partex.Session.from_spec(name, preset="tiny", overrides=[f"layers={layers}"], mesh=mesh, pipeline=pipeline)
    kind = pipeline.rsplit(":", 1)[1]
    assert s.pipeline is not None and s.pipeline.recompute == kind and s.pipeline.text() == pipeline
    saving = partex.Session.from_spec(name, preset="tiny", overrides=[f"layers={layers}"], mesh=mesh,
                                      pipeline=pipeline.rsplit(":", 1)[0])
    ticks = [r for r in s.program.regions if r.kind == "scan" and r.parent == 0]
    barriers = [op for op in s.program.ops if op.primitive == "optimization_barrier"]
    assert len(ticks) == 2 and barriers and all(op.id > ticks[1].enter for op in barriers)
    strategy = "megatron" if "model" in mesh else "dp"
    less, more = (x.evaluate(x.strategy(strategy)).memory for x in (s, saving))
    # (``dots`` keeps the weight matmuls' outputs: it saves less than ``full``)
    assert less.breakdown["activations"] < (0.6 if kind == "full" else 0.8) * more.breakdown["activations"], \
        (less, more)
    plan = s.plan(strategy=strategy)
    assert plan.pipeline is not None and plan.pipeline["recompute"] == kind
    model = s.model.base.model
    want = jax.jit(model.fn)(*model.args)
    got = partex.apply_plan(partex.Plan.loads(plan.dumps()), model.fn)(*model.args)
    r = _compare(want, got)
    assert r["ok"], r


def test_a_stack_the_step_checkpoints_itself_is_pipelined_as_it_is():
    """Llama with ``remat="full"`` (its layers under the step's own ``jax.checkpoint``): no
    recompute decision is left on its stack, yet it may be pipelined (the checkpointed body
    re-traced per microbatch), with the user's numerics; a recompute kind on it is refused."""
    over = ["layers=4", "remat=full"]
    s = partex.Session.from_spec("llama", preset="tiny", overrides=over, mesh="stage=2,data=4",
                                 pipeline="stack0:stage:4")
    assert s.model.base.analysis.units == () and "stack0" in s.pipeline_stacks()
    model = s.model.base.model
    want = jax.jit(model.fn)(*model.args)
    got = partex.apply_plan(s.plan(strategy="dp"), model.fn)(*model.args)
    assert _compare(want, got)["ok"]
    with pytest.raises(partex.PartexError, match="recomputes stack0's layers already: drop :full"):
        partex.Session.from_spec("llama", preset="tiny", overrides=over, mesh="stage=2,data=4",
                                 pipeline="stack0:stage:4:full")


@pytest.mark.parametrize("mesh,pipeline,extra", [("stage=4,data=2", "stack0:stage:8", []),
                                                  ("stage=2,data=4", "stack0:stage:4:circular2", ["remat=full"])])
def test_a_stack_with_custom_partitioned_kernels_is_pipelined(mesh, pipeline, extra):
    """Llama with its flash kernels (``custom_partitioning`` around Pallas): each stage binds
    the kernels again at the rows it runs, every stage's microbatch merged into the kernel's
    batch (the pipelined program holds them at S x B/M rows), and the pipelined plan runs with
    the step's numerics, the step's own checkpoint and the circular schedule too."""
    over = ["layers=4", "attention=flash", "seq=128", *extra]
    base = partex.Session.from_spec("llama", preset="tiny", overrides=over, mesh="data=8")
    assert not isinstance(base.pipeline_stacks()["stack0"], str)
    s = partex.Session.from_spec("llama", preset="tiny", overrides=over, mesh=mesh, pipeline=pipeline)
    p = s.program
    kernels = [op for op in p.ops if op.primitive == "custom_partitioning"]
    stages, microbatches = s.mesh.axis_size("stage"), s.pipeline.microbatches
    assert kernels and all(p.values[op.inputs[0]].shape[0] == stages * 8 // microbatches for op in kernels)
    model = s.model.base.model
    want = jax.jit(model.fn)(*model.args)
    got = partex.apply_plan(s.plan(strategy="zero3"), model.fn)(*model.args)
    assert _compare(want, got)["ok"]


PIPELINED = [
    ("transformer-scan", "stage=2,data=2,model=2", 4, "zero3"),  # the embedding's lookup moved onto `stage`
    ("transformer-scan", "stage=4,data=2", 8, "dp"),
    ("llama", "stage=4,data=2", 4, "zero3"),  # one layer a stage: its gathers hoisted out of the tick loop
    ("llama", "stage=2,data=2,model=2", 8, "megatron"),
]


@pytest.fixture(scope="module")
def pipelined_rows(tmp_path_factory):
    """The four pipelined plans compiled on 8 simulated devices (verify in a fresh process,
    from the plan files; compile-only: their numerics are the tests above, in this process)."""
    from partex.plan._verify import verify_many

    paths: dict = {}
    for model, mesh, microbatches, strategy in PIPELINED:
        s = partex.Session.from_spec(model, preset="tiny", overrides=["layers=4"], mesh=mesh,
                                     pipeline=f"stack0:stage:{microbatches}")
        path = tmp_path_factory.mktemp("pipelined") / "plan.json"
        s.plan(strategy=strategy).save(path)
        paths.setdefault(model, []).append((mesh, str(path)))
    rows = {}
    for model, items in paths.items():  # one process per model
        for (mesh, _), row in zip(items, verify_many(model, [p for _, p in items], overrides=["layers=4"],
                                                     timeout=900, explain=True)):
            rows[(model, mesh)] = row
    return rows


@pytest.mark.parametrize("model,mesh", [(m, mesh) for m, mesh, *_ in PIPELINED])
def test_pipelined_plans_compile_with_the_arguments_flops_and_permutes_predicted(pipelined_rows, model, mesh):
    """What XLA compiles of a pipelined plan: the arguments as predicted (within 1%), the
    FLOPs within 10%, the stages' collective-permutes there and within a factor of two."""
    row = pipelined_rows[(model, mesh)]
    assert abs(row.arguments.ratio - 1) <= 0.01
    assert abs(row.flops.ratio - 1) <= 0.10, row.flops
    permute = row.collectives["collective-permute"]
    assert permute.xla_bytes > 0 and 0.5 <= permute.ratio <= 2.0, permute
    # --explain: XLA's permutes of the stages' rotation are the pipeline decision's
    rotation = [r for r in row.explain["collectives"] if r["kind"] == "collective-permute" and r["matched"]
                and r.get("cause") == "layers"]
    assert rotation and all(r["decision"].startswith("layers->stage: the pipeline stack0:stage:") for r in rotation)


@pytest.mark.parametrize("model,mesh", [(m, mesh) for m, mesh, *_ in PIPELINED])
def test_pipelined_plans_are_predicted_within_the_bounds_of_hand_plans(pipelined_rows, model, mesh):
    from _accuracy import check_report

    assert [p for p in check_report(pipelined_rows[(model, mesh)]) if "numerics" not in p] == []


def test_the_cli_searches_a_pipelined_step_and_resumes_it(tmp_path, capsys):
    from partex.cli import main

    out = tmp_path / "plan.json"
    argv = ["search", "transformer-scan", "--config", "layers=4", "--mesh", "stage=2,data=4", "--pipeline",
            "stack0:stage:4", "--simulations", "3", "--out", str(out), "--json"]
    assert main(argv) == 0
    plan = partex.Plan.load(out)
    assert plan.pipeline == {"stack": "stack0", "axis": "stage", "microbatches": 4, "schedule": "gpipe",
                             "recompute": None, "repeats": 1}
    session = tmp_path / "plan.session.json"
    s = partex.Session.load(session)
    assert s.pipeline == partex.Pipeline("stack0", "stage", 4)
    capsys.readouterr()
    # a resumed search keeps its pipeline; another one is a new search
    assert main(["search", "transformer-scan", "--config", "layers=4", "--resume", str(session), "--pipeline",
                 "stack0:stage:2", "--simulations", "1", "--out", str(out)]) == 2
    assert "searched with --pipeline stack0:stage:4" in capsys.readouterr().err
    assert main(["search", "transformer-scan", "--config", "layers=4", "--mesh", "stage=2,data=4", "--pipeline",
                 "stack0:stage:3", "--simulations", "1", "--out", str(out)]) == 2
    assert "a batch of 8 does not split into 3 microbatches" in capsys.readouterr().err
    # bench's rows name the pipeline in their plans' labels
    assert main(["bench", "transformer-scan", "--config", "layers=4", "--mesh", "stage=2,data=4", "--pipeline",
                 "stack0:stage:4:circular2", "--simulations", "2", "--ilp-time", "2", "--exhaustive", "0",
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["pipeline"]["repeats"] == 2 and d["bubble"] == pytest.approx(1 / 9)
    planned = [r for r in d["rows"] if r["step_time_s"] is not None]
    assert planned and all(r["plan"][0] == "pipeline:stack0:stage:4:circular2" for r in planned)


# ---------------------------------------------------------------- pipelines as mesh candidates

def test_the_mesh_search_tries_pipelines_over_the_slices(capsys):
    """On slices joined by a slow network, the candidates include the scanned stack pipelined
    over them (a stage per slice: microbatches 2S and 4S, saving or recomputing); each is a
    session on its pipelined step, in the same halving; ``use_mesh`` continues on one, and
    its plan runs the user's step with the user's numerics."""
    topo = Topology.parse("2x4@25", 8)
    got = candidate_pipelines([("stack0", 4, 16)], 8, topo, 3, link_bandwidth=100e9)
    assert {(m.text(), p.text()) for m, p in got} == {
        (mesh, f"stack0:stage:{m}{rc}") for mesh in ("stage=2,fsdp=4", "stage=2,fsdp=2,tensor=2")
        for m in (4, 8) for rc in ("", ":full")}
    assert all(m.bandwidth == (25e9,) + (100e9,) * (len(m.axes) - 1) for m, _ in got)
    assert candidate_pipelines([("stack0", 3, 16)], 8, topo) == []  # 3 layers do not split into 2 stages
    assert candidate_pipelines([("stack0", 4, 16)], 8, Topology(1, 8), 2) == []  # on one slice: when asked
    within = candidate_pipelines([("stack0", 4, 16)], 8, Topology(1, 8), 2, within=True)
    assert {m.text() for m, _ in within} == {"stage=2,fsdp=4", "stage=4,fsdp=2"}

    s = partex.Session.from_spec("transformer-scan", preset="tiny", overrides=["layers=4"], mesh="data=8")
    found = s.mesh_searcher(8, topology=topo, max_axes=3, effort=2).run(600)
    piped = [t for t in found.trials if t.pipeline is not None]
    assert len(piped) == len(got) and len(found.trials) == len(got) + 4
    assert all(t.tier == 1 for t in piped) and all(t.tier == 0 for t in found.trials if t.pipeline is None)
    assert all(t.bubble == pytest.approx(1 / (t.pipeline.microbatches + 1)) for t in piped)
    tried = [t for t in piped if t.status != "left out"]  # the effort reaches half of them, nearest the best meshes
    assert found.converged and len(tried) == len(piped) // 2
    assert all(t.note == "" and t.step_time is not None for t in tried)
    piped = tried
    lines = found.table().splitlines()
    assert "pipeline" in lines[0] and "bubble" in lines[0]
    assert any("stack0:stage:8:full" in ln and "11%" in ln for ln in lines)
    js = found.to_json()
    assert {m["pipeline"]["microbatches"] for m in js["meshes"] if m["pipeline"]} == {4, 8}
    # on one slice, only when asked
    assert all(t.pipeline is None for t in s.search_meshes(8, seconds=1, max_axes=1).trials)
    pick = min(piped, key=lambda t: t.step_time)
    s.use_mesh(pick)
    assert s.pipeline == pick.pipeline and s.mesh == pick.mesh
    plan = s.plan(strategy="zero3")
    assert plan.pipeline == pick.pipeline.to_json()
    model = s.model.base.model
    want = jax.jit(model.fn)(*model.args)
    got_out = partex.apply_plan(plan, model.fn)(*model.args)
    assert _compare(want, got_out)["ok"]
    # back to the step as written
    s.reconfigure(mesh="data=8", pipeline=None)
    assert s.pipeline is None and s.model.pipeline is None


# ---------------------------------------------------------------- the pipeline among the search's decisions

def test_the_pipeline_is_a_decision_of_the_search_on_a_mesh():
    """``search_pipelines``: the step as written and each pipeline of its stack over an axis
    of the mesh whose size divides the layers (``pipelines_over``) are the root's children,
    one tree each; UCT spends the simulations on the program that pays (under a budget the
    step as written fits only with its slow plans, a stage recomputing over `model`), the
    session's own tree is its program's, and the search resumes; ``use_mesh`` continues on the
    chosen program, whose plan records its pipeline."""
    from partex._meshes import pipelines_over

    mesh = partex.MeshSpec.create(("data", "model"), (4, 2))
    assert [p.text() for p in pipelines_over(mesh, [("stack0", 2, 16)])] == [
        "stack0:model:4", "stack0:model:4:full", "stack0:model:8", "stack0:model:8:full"]
    assert [p.text() for p in pipelines_over(mesh, [("stack0", 4, 16)])][:2] == ["stack0:data:8", "stack0:data:8:full"]
    assert pipelines_over(mesh, [("stack0", 3, 16)]) == []  # 3 layers split over neither axis

    s = partex.Session.from_spec("transformer-scan", preset="tiny", mesh="data=4,model=2", memory="2.5MiB")
    found = s.search_pipelines(simulations=240)
    r = found.result()
    assert {t.pipeline.text() if t.pipeline else None for t in r.trials} == {None, "stack0:model:4", "stack0:model:4:full",
                                                                         "stack0:model:8", "stack0:model:8:full"}
    assert sum(t.simulations for t in r.trials) == 240
    assert next(t for t in r.trials if t.pipeline is None).session is s  # this session's tree is its program's
    best = r.best
    assert best is not None and best.pipeline is not None and best.pipeline.recompute == "full"
    assert best.step_time == min(t.step_time for t in r.trials if t.step_time is not None)
    assert best.simulations == max(t.simulations for t in r.trials)  # UCT gave the leader the most
    assert found.best_at is not None and 0 <= found.best_at <= found.seconds
    assert r.to_json()["chosen_pipeline"] == best.pipeline.text()
    found.step(16)
    assert sum(t.simulations for t in found.result().trials) == 256
    found.run(600, callback=lambda trials: found.request_stop())  # Ctrl-C: back after the visit in hand
    assert sum(t.simulations for t in found.result().trials) == 256 + found.chunk
    s.use_mesh(best)
    assert s.pipeline == best.pipeline and s.best().report.step_time == best.step_time
    assert s.best_plan().pipeline == best.pipeline.to_json()


def test_the_pipelines_searched_keep_the_pins_and_skip_those_they_rule_out():
    """A pin (``ffn`` on `model`) carries into every pipelined program by what it decides
    (each program numbers its groups its own way); a pipeline whose stages take the pinned
    axis is not tried, its row saying why; ``use_mesh`` onto a pipelined program keeps it."""
    s = partex.Session.from_spec("transformer-scan", preset="tiny", overrides=["layers=4"], mesh="data=4,model=2")
    s.pin("ffn", "model")
    found = s.search_pipelines(simulations=48)
    rows = {t.pipeline.text() if t.pipeline else None: t for t in found.result().trials}
    over_model = [t for p, t in rows.items() if p and ":model:" in p]
    over_data = [t for p, t in rows.items() if p and ":data:" in p]
    assert over_model and all(t.session is None and "holds the pipeline's stages alone" in t.note for t in over_model)
    assert over_data and all(t.session is not None and [t.session.label(d) for d in t.session.pins] == ["ffn->model"]
                             for t in over_data)
    s.use_mesh(over_data[0])
    assert s.pipeline == over_data[0].pipeline and [s.label(d) for d in s.pins] == ["ffn->model"]


def test_a_step_without_scanned_stacks_searches_as_one_program():
    """Where nothing may be pipelined (the unrolled transformer), the root has one child, this
    session's own tree, and the search finds what the session alone finds with as many
    simulations."""
    s = partex.Session.from_spec("transformer", preset="tiny", mesh="data=4,model=2", memory="2MiB")
    found = s.search_pipelines(simulations=60)
    assert [t.session for t in found.result().trials] == [s]
    alone = partex.Session.from_spec("transformer", preset="tiny", mesh="data=4,model=2", memory="2MiB").step(60)
    assert s.best().decisions == alone.best().decisions


def test_the_cli_searches_the_pipeline_on_a_mesh(tmp_path, capsys):
    from partex.cli import main

    out = tmp_path / "plan.json"
    argv = ["search", "transformer-scan", "--mesh", "data=4,model=2", "--memory", "2.5MiB", "--pipelines", "on",
            "--simulations", "240", "--out", str(out), "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    chosen = d["meshes"]["chosen_pipeline"]
    assert chosen is not None and len(d["meshes"]["meshes"]) == 5
    assert partex.Plan.load(out).pipeline == partex.Pipeline.parse(chosen).to_json()
    assert partex.Session.load(tmp_path / "plan.session.json").pipeline == partex.Pipeline.parse(chosen)
    for extra, why in ((["--pipeline", "stack0:model:4"], "give it without --pipeline"),
                       (["--resume", str(tmp_path / "plan.session.json")], "give it without --resume")):
        assert main(argv[:-1] + extra) == 2
        assert why in capsys.readouterr().err
