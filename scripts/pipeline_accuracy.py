"""Pipelined plans against XLA: the prediction of each beside what XLA compiles of it.

    JAX_NUM_CPU_DEVICES=8 .venv/bin/python scripts/pipeline_accuracy.py [--json out.json]

The tiny transformer-scan and llama demos (4 layers; 8 where the circular schedule needs
them), their layer stack pipelined over a ``stage`` axis (``partex.Pipeline``: GPipe or the
circular schedule, saving or recomputing), a hand plan on the other axes (and Llama on its flash
kernels, ``custom_partitioning`` around Pallas, at 128 tokens and a batch of 32): compiled on 8
simulated CPU devices in a fresh process (``verify``, compile-only), each figure as
predicted / XLA: peak memory, the collective bytes of each kind (the stages'
collective-permutes among them) and the per-device FLOPs. The first four are the cases of
``tests/test_pipeline.py``.
"""

from __future__ import annotations

import argparse
import json
import os

from _checkout import use_checkout_from_env

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
use_checkout_from_env()

import partex  # noqa: E402

# (model, layers, mesh, pipeline, plan[, overrides])
FLASH = ["attention=flash", "seq=128", "batch=32"]
CASES = [("transformer-scan", 4, "stage=2,data=2,model=2", "stack0:stage:4", "zero3"),
         ("transformer-scan", 4, "stage=4,data=2", "stack0:stage:8", "dp"),
         ("llama", 4, "stage=4,data=2", "stack0:stage:4", "zero3"),
         ("llama", 4, "stage=2,data=2,model=2", "stack0:stage:8", "megatron"),
         ("transformer-scan", 4, "stage=2,data=2,model=2", "stack0:stage:4:circular2", "zero3"),
         ("transformer-scan", 4, "stage=2,data=4", "stack0:stage:8:full", "dp"),
         ("llama", 8, "stage=4,data=2", "stack0:stage:4:circular2:full", "zero3"),
         ("llama", 8, "stage=4,data=2", "stack0:stage:8:dots", "dp"),
         ("llama", 4, "stage=2,data=4", "stack0:stage:4", "zero3", FLASH),
         ("llama", 4, "stage=2,data=2,model=2", "stack0:stage:4", "megatron", FLASH)]
KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args()
    rows = []
    print("| model | layers | mesh | pipeline | plan | memory | " + " | ".join(KINDS) + " | FLOPs |")
    print("|---|---|---|---|---|---|" + "---|" * len(KINDS) + "---|")
    for model, layers, mesh, pipe, strategy, *extra in CASES:
        over = [f"layers={layers}", *(extra[0] if extra else [])]
        s = partex.Session.from_spec(model, preset="tiny", overrides=over, mesh=mesh, pipeline=pipe)
        (r,) = s.verify_all([s.plan(strategy=strategy)])  # compile-only, in a fresh process
        coll = {k: r.collectives[k].ratio for k in KINDS}
        name = model + (" (flash)" if extra else "")
        print(f"| {name} | {layers} | {mesh} | {pipe} | {strategy} | {_ratio(r.memory.ratio)} | "
              + " | ".join(_ratio(coll[k]) for k in KINDS) + f" | {_ratio(r.flops.ratio)} |", flush=True)
        rows.append({"model": model, "overrides": over, "layers": layers, "mesh": mesh, "pipeline": pipe, "plan": strategy,
                     "memory": r.memory.ratio, "collectives": coll, "flops": r.flops.ratio,
                     "arguments": r.arguments.ratio})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
