"""Kernels, fused attention and offload on the tiny forms (8 simulated CPU devices): for each
form in ``KERNEL_FORMS`` (``scripts/forms/<form>.py``), how ``partex analyze`` sees its
kernels, then each hand plan compiled and run against the unsharded step: numerics, predicted
/ XLA memory, FLOPs per device and collective bytes (pred / XLA per kind XLA or partex
moves). For a form that offloads to host memory, the same plan on tpu-v5p beside it: device
and host memory and the host transfers, which XLA:CPU does not make.

    JAX_NUM_CPU_DEVICES=8 .venv/bin/python scripts/kernels_table.py [FORM ...] > kernels.md
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import partex  # noqa: E402
from forms_table import attempt, load  # noqa: E402

KERNEL_FORMS = ["pallas_matmul", "pallas_matmul_no_estimate", "flash_attention", "dot_product_attention",
                "ragged_dot_moe", "offload_remat"]
HAND = ("dp", "megatron", "zero3")


def _ratio(c) -> str:
    return f"{c.ratio:.2f}" if c.ratio is not None else f"{partex.format_bytes(c.predicted_bytes)} / 0"


def plan_row(s, strategy: str) -> str:
    dec = s.strategy(strategy)
    v = s.verify(s.plan(dec), run=True)
    colls = ", ".join(f"{k} {_ratio(c)}" for k, c in v.collectives.items() if c.xla_bytes or c.predicted_bytes)
    n = v.numerics
    return (f"{n.max_rel_err:.1e} {'ok' if n.ok else 'MISMATCH'}; memory {v.memory.ratio:.2f} "
            f"({partex.format_bytes(v.memory.xla)}); FLOPs {v.flops.ratio:.2f}; {colls or 'no collectives'}")


def host_row(fn, args, mesh: str) -> str:
    s = partex.Session(fn, args, mesh=mesh, hardware="tpu-v5p")
    r = s.evaluate(s.strategy("dp"), detail=True)
    moved = [c for c in r.collectives if c.kind == "host-transfer"]
    return (f"tpu-v5p dp: device {partex.format_bytes(r.memory.peak)}, host {partex.format_bytes(r.memory.host)}, "
            f"{sum(c.count for c in moved)} host transfers, {sum(c.time for c in moved) * 1e6:.1f} us "
            f"({sum(c.hidden for c in moved) * 1e6:.1f} us hidden)")


def main(forms: list[str]) -> None:
    print("| form | kernels (analyze) | " + " | ".join(HAND) + " |")
    print("|---|---|" + "---|" * len(HAND))
    for form in forms:
        t0 = time.perf_counter()
        m = load(form)
        fn, args = m.make()[:2]
        s = partex.Session(fn, args, mesh=m.MESH, hardware="cpu")
        kernels = "; ".join(f"{k['kind']} x{k['count']}: {k['sharding'].split(':')[0]}, priced by {k['cost']}"
                            for k in s.analysis.kernels()) or "none"
        if any(v.host for v in s.program.values):
            kernels += "; " + attempt(lambda: host_row(fn, args, m.MESH))
        cells = [attempt(lambda st=st: plan_row(s, st)) for st in HAND]
        print(f"| {form} | {kernels} | " + " | ".join(cells) + " |", flush=True)
        print(f"  {form}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:] or KERNEL_FORMS)
