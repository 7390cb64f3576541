"""The cost model against XLA: every demo model x hand strategy on two 8-device meshes.

Each (model, mesh) compiles its four plans in one fresh process with 8 simulated CPU
devices (``verify_many``), runs them and compares with the unsharded function. Bounds
(issue 3): argument bytes within 1%, peak memory within 35%, collective bytes per kind
within 25%, loss and outputs within 1e-4 relative.
"""

from __future__ import annotations

import pytest

from partex import demo_models
from partex import analyze_model
from partex._cost import CostModel
from partex import MeshSpec, get_hardware
from partex._plan import default_donate, make_plan
from partex._strategies import strategy_decisions
from partex import COLLECTIVE_KINDS as KINDS
from partex._verify import verify_many

STRATEGIES = ("replicated", "dp", "megatron", "zero3")


def _check(row: dict) -> list[str]:
    bad = []
    where = f"{row['model']} {row['strategy']} {row['mesh']}"
    if abs(row["arguments"]["ratio"] - 1) > 0.01:
        bad.append(f"{where}: argument bytes ratio {row['arguments']['ratio']:.3f}")
    if abs(row["memory"]["ratio"] - 1) > 0.35:
        bad.append(f"{where}: peak memory ratio {row['memory']['ratio']:.3f}")
    for k in KINDS:
        c = row["collectives"][k]
        pred, xla = c["predicted_bytes"], c["xla_bytes"]
        if (pred == 0) != (xla == 0) or (xla and abs(pred / xla - 1) > 0.25):
            bad.append(f"{where}: {k} predicted {pred:.0f} B vs XLA {xla:.0f} B")
    n = row["numerics"]
    if not (n["ok"] and n["max_rel_err"] <= 1e-4):
        bad.append(f"{where}: numerics max relative error {n['max_rel_err']:.2e} at {n['worst_output']}")
    return bad


@pytest.mark.parametrize("mesh_text", ["data=4,model=2", "data=8"])
@pytest.mark.parametrize("model", list(demo_models.MODELS))
def test_predictions_match_xla(tmp_path, model, mesh_text):
    res = analyze_model(model)
    mesh = MeshSpec.parse(mesh_text)
    hw = get_hardware("tpu-v4")
    donate = default_donate(res.program)
    cm = CostModel(res.analysis, mesh, hw, donate=donate)
    paths = []
    for s in STRATEGIES:
        plan = make_plan(res, mesh, hw, strategy_decisions(s, res.analysis, mesh), strategy=s,
                         donate=donate, cost_model=cm)
        paths.append(str(tmp_path / f"{s}.json"))
        plan.save(paths[-1])
    rows = verify_many(model, paths, run=True, timeout=900)
    assert [r["strategy"] for r in rows] == list(STRATEGIES)
    problems = [p for r in rows for p in _check(r)]
    assert problems == []
