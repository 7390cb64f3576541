"""Pipelined plans against XLA: the prediction of each beside what XLA compiles of it.

    JAX_NUM_CPU_DEVICES=8 .venv/bin/python scripts/pipeline_accuracy.py [--json out.json]

The tiny transformer-scan and llama demos (4 layers), their layer stack pipelined over a
``stage`` axis (``partex.Pipeline``), a hand plan on the other axes: compiled on 8 simulated
CPU devices in a fresh process (``verify``, compile-only), each figure as predicted / XLA:
peak memory, the collective bytes of each kind (the stages' collective-permutes among them)
and the per-device FLOPs. The same cases as ``tests/test_pipeline.py``.
"""

from __future__ import annotations

import argparse
import json
import os

from _checkout import use_checkout_from_env

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
use_checkout_from_env()

import partex  # noqa: E402

CASES = [("transformer-scan", "stage=2,data=2,model=2", 4, "zero3"),
         ("transformer-scan", "stage=4,data=2", 8, "dp"),
         ("llama", "stage=4,data=2", 4, "zero3"),
         ("llama", "stage=2,data=2,model=2", 8, "megatron")]
KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args()
    rows = []
    print("| model | mesh | microbatches | plan | memory | " + " | ".join(KINDS) + " | FLOPs |")
    print("|---|---|---|---|---|" + "---|" * len(KINDS) + "---|")
    for model, mesh, m, strategy in CASES:
        s = partex.Session.from_spec(model, preset="tiny", overrides=["layers=4"], mesh=mesh,
                                     pipeline=f"stack0:stage:{m}")
        (r,) = s.verify_all([s.plan(strategy=strategy)])  # compile-only, in a fresh process
        coll = {k: r.collectives[k].ratio for k in KINDS}
        print(f"| {model} | {mesh} | {m} | {strategy} | {_ratio(r.memory.ratio)} | "
              + " | ".join(_ratio(coll[k]) for k in KINDS) + f" | {_ratio(r.flops.ratio)} |", flush=True)
        rows.append({"model": model, "mesh": mesh, "microbatches": m, "plan": strategy,
                     "memory": r.memory.ratio, "collectives": coll, "flops": r.flops.ratio,
                     "arguments": r.arguments.ratio})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
