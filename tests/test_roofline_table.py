"""scripts/roofline_table.py: partex's per-device FLOPs and collective bytes beside
``jax.experimental.roofline``'s, on one layer under one hand plan with collectives."""

from __future__ import annotations

import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import roofline_table  # noqa: E402

MESH = "data=4,model=2"


def test_megatron_mlp_block_against_roofline():
    """The transformer's MLP block under Megatron (dp on data, the FFN on model): the
    per-device program roofline reads computes the global step (tiny size, on the 8
    simulated devices), and at the comparison size (traced only) both sides count the same
    FLOPs and see collectives on both mesh axes."""
    [tiny] = roofline_table.make_layers("transformer MLP", tiny=True)
    assert roofline_table.check(tiny, "megatron", MESH) < 1e-4

    [layer] = roofline_table.make_layers("transformer MLP")
    row = roofline_table.compare(layer, "megatron", MESH)
    assert {"data", "model"} <= {d.split("->")[1] for d in row["decisions"]}
    px, rl = row["partex"], row["roofline"]
    assert rl["flops"] > 0 and 0.9 <= px["flops"] / rl["flops"] <= 1.1, (px["flops"], rl["flops"])
    assert px["ici"] > 0 and rl["ici"] > 0, (px["ici"], rl["ici"])
    # the gradients' all-reduce over data and the row-parallel all-reduce over model, each side
    for axis in ("data", "model"):
        assert px["ici_by_axis"].get(axis, 0) > 0 and rl["ici_by_axis"].get(axis, 0) > 0, axis
    assert 0.9 <= px["ici"] / rl["ici"] <= 1.1, (px["ici"], rl["ici"])
