"""The bounds partex's predictions are held to against XLA (``tests/test_verify.py``: every
demo model's hand plans; ``tests/test_pipeline.py``: pipelined plans): argument bytes within
1%, peak memory within 35%, collective bytes per kind within 25%, per-device FLOPs within 10%
of XLA's cost analysis (the U-Net's 16%), loss and outputs within 1e-4 relative."""

from __future__ import annotations

from partex import COLLECTIVE_KINDS as KINDS
from partex import VerifyReport


def check_report(row: VerifyReport) -> list[str]:
    bad = []
    where = f"{row.model} {row.strategy} {row.mesh}"
    if row.arguments.ratio is None or abs(row.arguments.ratio - 1) > 0.01:
        bad.append(f"{where}: argument bytes ratio {row.arguments.ratio}")
    if row.memory.ratio is None or abs(row.memory.ratio - 1) > 0.35:
        bad.append(f"{where}: peak memory ratio {row.memory.ratio}")
    for k in KINDS:
        c = row.collectives[k]
        pred, xla = c.predicted_bytes, c.xla_bytes
        if (pred == 0) != (xla == 0) or (xla and abs(pred / xla - 1) > 0.25):
            bad.append(f"{where}: {k} predicted {pred:.0f} B vs XLA {xla:.0f} B")
    f = row.flops  # per device; XLA's HloCostAnalysis (loop bodies once, both sides)
    # the U-Net's whole step XLA counts 5-16% above its ops one by one (which match exactly,
    # tests/test_rules.py): XLA:CPU's fusion copies cheap elementwise producers into every
    # consumer fusion and counts each copy (5.8% replicated, 12-13% at per-device batch 1-2;
    # with XLA's fusion pass off partex is within 1%), and the rows plans' halo masks
    # (docs/results.md, "FLOPs and bytes accessed"): a counting effect, bounded, not hidden
    bound = 0.16 if row.model == "unet" else 0.10
    if not (f.xla > 0 and f.ratio is not None and abs(f.ratio - 1) <= bound):
        bad.append(f"{where}: FLOPs predicted {f.predicted:.3g} vs XLA {f.xla:.3g}")
    if not row.bytes_accessed.predicted > 0:
        bad.append(f"{where}: no bytes accessed predicted")
    n = row.numerics
    if n is None or not (n.ok and n.max_rel_err <= 1e-4):
        bad.append(f"{where}: numerics {n}")
    return bad
