"""Predicted vs XLA for every demo model x hand strategy x mesh (tiny configs).

    python scripts/accuracy_table.py [--models a,b] [--meshes data=4,model=2;data=8] [--run] [--json out.json]

Prints a markdown table of ratios predicted/XLA: per-device argument bytes, peak memory,
collective bytes per kind, FLOPs and bytes accessed (XLA's cost_analysis; verify's "flops"
and "bytes_accessed"), plus the numerics check with --run.
"""

from __future__ import annotations

import argparse
import json
import time

from partex import COLLECTIVE_KINDS as KINDS
from partex import ModelSpec, Session, analyze_model, demo_models


# Plans beyond the hand strategies, by group label: a U-Net's image rows sharded (halo
# exchanges: collective-permutes), alone and beside data parallelism.
# A transformer's sequence sharded beside the batch (sequence parallelism), with each
# resolution of the attention conflict (module docstring of _analysis: RESOLVE).
_SP = [("batch", "data"), ("seq", "model")]
EXTRA = {"unet": {"rows": [("height", "model")], "dp+rows": [("batch", "data"), ("height", "model")],
                  "rows-8": [("height", "data")]},
         "transformer": {"dp+seq": _SP, "dp+seq, resolve:second": _SP + [("seq", "resolve:second")],
                         "dp+seq, resolve:neither": _SP + [("seq", "resolve:neither")]}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(demo_models.MODELS))
    ap.add_argument("--strategies", default="replicated,dp,megatron,zero3")
    ap.add_argument("--meshes", default="data=4,model=2;data=8")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--config", action="append", default=[])
    ap.add_argument("--hardware", default="tpu-v4")
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    print("| model | mesh | strategy | args | memory | " + " | ".join(KINDS) + " | FLOPs | bytes accessed | numerics | compile s |")
    print("|---|---|---|---|---|" + "---|" * len(KINDS) + "---|---|---|---|")
    for model in args.models.split(","):
        res = analyze_model(model, args.preset, args.config)
        spec = ModelSpec(model, args.preset, tuple(args.config))
        for mtext in args.meshes.split(";"):
            s = Session.from_analysis(res, mesh=mtext, hardware=args.hardware, spec=spec)
            extra = {name: decs for name, decs in EXTRA.get(model, {}).items()
                     if all(axis in s.mesh.axes or ":" in axis for _, axis in decs)}
            for strat in args.strategies.split(",") + list(extra):
                plan = s.plan(extra[strat], strategy=strat) if strat in extra else s.plan(strategy=strat)
                t = time.time()
                try:
                    out = s.verify(plan, run=args.run, mark=False)
                except Exception as e:  # keep the table going; report the failure in its row
                    print(f"| {model} | {mtext} | {strat} | FAILED: {e} |")
                    rows.append({"model": model, "mesh": mtext, "strategy": strat, "error": str(e)})
                    continue
                r = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
                cells = []
                for k in KINDS:
                    c = out.collectives[k]
                    if c.predicted_bytes or c.xla_bytes:
                        cells.append(r(c.ratio) if c.xla_bytes else f"pred {c.predicted_bytes:.0f} / 0")
                    else:
                        cells.append("")
                ntext = f"{out.numerics.max_rel_err:.1e}" if out.numerics is not None else ""
                work = f"{r(out.flops.ratio)} | {r(out.bytes_accessed.ratio)}"
                print(f"| {model} | {mtext} | {strat} | {r(out.arguments.ratio)} | {r(out.memory.ratio)} | "
                      + " | ".join(cells) + f" | {work} | {ntext} | {out.compile_seconds} |", flush=True)
                rows.append({"model": model, "mesh": mtext, "strategy": strat, **out.to_json(),
                             "wall_s": time.time() - t})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
