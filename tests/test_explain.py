"""verify --explain: XLA's collectives by the source line and op their HLO metadata names,
matched to partex's predicted collectives and the decisions behind them."""

import functools
import json
import subprocess
import sys

import jax
import pytest

import partex
from partex import demo_models
from partex.analysis._analysis import analyze
from partex.cost import CostModel
from partex.plan._explain import explain, xla_collectives
from partex._loader import axis_names_by_value
from partex.plan._planned import resolve_decisions
from partex.tracing._program import abstract

MESH = "data=4,model=2"


@functools.lru_cache(maxsize=None)
def plans(model: str) -> dict[str, partex.Plan]:
    s = partex.Session.from_spec(model, mesh=MESH, memory="1MiB", seed=0)
    s.step(300)
    assert s.best_plan() is not None
    return {"zero3": s.plan(strategy="zero3"), "searched": s.best_plan(), "dp": s.plan(strategy="dp")}


@pytest.mark.parametrize("model,name", [
    ("transformer", "zero3"),
    ("transformer", "searched"),
    ("transformer-scan", "zero3"),
    ("transformer-scan", "searched"),
])
def test_xla_collective_bytes_are_matched_to_predicted_ones_by_source_line(model, name):
    """At least 90% of XLA's collective bytes matched to a predicted collective
    of the same kind and source line (or the same parameter), for zero3 and a searched plan."""
    m = demo_models.build(model, "tiny")
    for plan in [plans(model)[name]]:
        out = partex.verify(plan, m.fn, m.args, axis_names=m.axis_names, explain=True)
        ex = out.explain
        assert ex["xla_bytes"] == pytest.approx(sum(c.xla_bytes for c in out.collectives.values()))
        assert ex["matched_fraction"] >= 0.9, (model, name, ex["matched_fraction"])
        for row in ex["collectives"]:
            if row["matched"]:
                assert row["decision"] != "-" or row["cause"] == "-", row
                # the line XLA names is the user's model code, or a parameter path
                assert "demo_models" in row["where"] or row["where"].startswith(("params/", "opt_state/", "<")), row


def _compiled(plan, m):
    pf = partex.apply_plan(plan, m.fn, axis_names=m.axis_names)
    from jax._src import config as jax_config

    with jax_config.compilation_cache_include_metadata_in_key(True):
        text = pf.lower(*jax.tree_util.tree_map(abstract, m.args)).compile().as_text()
    an = analyze(pf.program, axis_names_by_value(pf.program, m.axis_names))
    return text, an, pf.program


def test_another_plans_prediction_does_not_explain_xla_program():
    """A negative control: zero3's compiled program explained with the data-parallel plan's
    prediction leaves the weight gathers and the tensor-parallel reductions unmatched."""
    m = demo_models.build("transformer", "tiny")
    p = plans("transformer")
    text, an, program = _compiled(p["zero3"], m)
    for name, want in (("zero3", 0.9), ("dp", None)):
        plan = p[name]
        cm = CostModel(an, plan.mesh, plan.hardware, donate=plan.donate, lowering="cpu")
        rep = cm.evaluate(resolve_decisions(plan, an), detail=True)
        ex = explain(text, cm, rep, plan, program.arg_names)
        if want:
            assert ex["matched_fraction"] >= want
        else:
            assert ex["matched_fraction"] < 0.7, ex["matched_fraction"]
            unmatched = [r for r in ex["collectives"] if not r["matched"]]
            assert any(r["kind"] == "all-gather" for r in unmatched)


HLO = """HloModule m, is_scheduled=true

FileNames
1 "/u/model.py"
2 "/u/other.py"

FunctionNames
1 "attn"
2 "mlp"

FileLocations
1 {file_name_id=1 function_name_id=1 line=10 end_line=10 column=1 end_column=1}
2 {file_name_id=2 function_name_id=2 line=20 end_line=20 column=1 end_column=1}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=1}

ENTRY %main (p0: f32[8,4], p1: f32[16]) -> (f32[8,4], f32[16], f32[32,4]) {
  %p0 = f32[8,4]{1,0} parameter(0), metadata={op_name="args[0]['w']"}
  %p1 = f32[16]{0} parameter(1)
  %a = f32[8,4]{1,0} add(%p0, %p0), metadata={op_name="jit(f)/add" stack_frame_id=1}
  %b = f32[16]{0} multiply(%p1, %p1), metadata={op_name="jit(f)/mul" stack_frame_id=2}
  %ar = (f32[8,4]{1,0}, f32[16]{0}) all-reduce(%a, %b), replica_groups={{0,1}}, to_apply=%sum, metadata={op_name="jit(f)/add" stack_frame_id=1}
  %ag = f32[32,4]{1,0} all-gather(%p0), replica_groups={{0,1,2,3}}, dimensions={0}, metadata={op_name="args[0]['w']"}
  %old = f32[16]{0} all-reduce(%p1), replica_groups={{0,1}}, to_apply=%sum, metadata={op_name="x" source_file="/u/legacy.py" source_line=7}
}
"""


def test_metadata_gives_each_operand_of_a_combined_collective_its_own_line():
    got = {(c.name, c.kind): c for c in xla_collectives(HLO, arg_names=("params",))}
    a, b = got[("a", "all-reduce")], got[("b", "all-reduce")]
    assert a.stack[0][:2] == ("/u/model.py", 10) and a.bytes == 8 * 4 * 4
    assert b.stack[0][:2] == ("/u/other.py", 20) and b.stack[1][:2] == ("/u/model.py", 10) and b.bytes == 64
    ag = got[("ag", "all-gather")]
    assert ag.param == "params/w" and ag.bytes == 32 * 4 * 4
    assert got[("old", "all-reduce")].stack[0][:2] == ("/u/legacy.py", 7)


def test_cli_verify_explain_json(tmp_path):
    plan = tmp_path / "plan.json"
    r = subprocess.run([sys.executable, "-m", "partex", "plan", "transformer", "--strategy", "zero3", "--mesh", MESH,
                        "--out", str(plan)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "partex", "verify", "transformer", str(plan), "--explain", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    ex = json.loads(r.stdout)["explain"]
    assert ex["matched_fraction"] >= 0.9 and ex["collectives"]
    row = ex["collectives"][0]
    assert {"kind", "bytes", "where", "op_name", "matched", "decision"} <= set(row)
    r = subprocess.run([sys.executable, "-m", "partex", "verify", "transformer", str(plan), "--explain"],
                       capture_output=True, text=True, timeout=600)
    assert "matched to a predicted collective" in r.stdout and "d_model->data" in r.stdout
