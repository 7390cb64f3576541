"""The search against the true optimum of a space small enough to enumerate: for each demo
model (tiny) on one mesh, under budgets tight enough to need several decisions, every plan of
at most K decisions per mesh axis is scored (``Session.exhaustive``) beside the ILP and MCTS.

    python scripts/search_optimum.py [--models a,b@data=8] [--mesh data=4,model=2] [--seconds 30]
                                     [--per-axis 3] [--limit 1000000] [--budgets 1.0,1.2]

A budget factor f sets the memory budget to f x the smallest peak among the hand plans that
shard something (zero3's, mostly), over the margin: 1.0 makes the leanest hand plan just fit.
Prints a markdown table: the optimum, ILP and MCTS step times, MCTS / optimum, MCTS's time
to best, and the plans.
"""

from __future__ import annotations

import argparse
import math
import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import partex  # noqa: E402


DEFAULT_MODELS = "mlp,transformer,transformer-scan,unet@data=8,gns,moe,llama"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=DEFAULT_MODELS, help="name or name@mesh, comma-separated")
    ap.add_argument("--mesh", default="data=4,model=2", help="for models given without @mesh")
    ap.add_argument("--seconds", type=float, default=30.0, help="MCTS seconds per problem")
    ap.add_argument("--per-axis", type=int, default=3)
    ap.add_argument("--limit", type=int, default=2_000_000, help="skip a space of more plans")
    ap.add_argument("--budgets", default="1.0,1.2")
    args = ap.parse_args()
    print("| model | mesh | budget | plans | optimum ms | ILP ms | MCTS ms | MCTS / optimum | MCTS / ILP | "
          "MCTS time-to-best s | optimum plan | MCTS plan |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for item in args.models.split(","):
        model, _, mesh = item.partition("@")
        mesh = mesh or args.mesh
        probe = partex.Session.from_spec(model, mesh=mesh)
        hand = [c.report.memory.peak for name, c in probe.baselines().items() if name != "replicated" and c.report]
        margin = probe.hardware.memory_margin
        factors = [float(x) for x in args.budgets.split(",")]
        budgets = [f * min(hand) / (1 - margin) for f in factors]
        size = probe.exhaustive_size(args.per_axis)
        if size > args.limit:
            print(f"| {model} | {mesh} | | {size} (over the limit) | | | | | | | | |", flush=True)
            continue
        optima = probe.exhaustive(args.per_axis, budgets=budgets)  # one pass: each plan scored once
        for f, budget, ex in zip(factors, budgets, optima):
            s = partex.Session.from_spec(model, mesh=mesh, memory=budget)
            ilp = s.ilp(30)
            s.run(args.seconds)
            best = s.best()

            def label(ds, s=s):
                return ", ".join(s.label(d) for d in ds)

            def ms(r):
                return r.step_time * 1e3 if r is not None and r.fits else float("nan")

            opt, il, mc = (ex.report.step_time * 1e3 if ex.report and ex.report.fits else float("nan"),
                           ms(ilp.report), ms(best.report if best else None))

            def num(x, fmt=".4f"):
                return "none fits" if math.isnan(x) else f"{x:{fmt}}"

            print(f"| {model} | {mesh} | {f:.2f}x ({budget / 1024:.0f} KiB) | {ex.plans} | {num(opt)} | {num(il)} | "
                  f"{num(mc)} | {num(mc / opt, '.3f')} | {num(mc / il, '.3f')} | "
                  f"{best.seconds if best else float('nan'):.1f} | "
                  f"{label(ex.decisions) if ex.report and ex.report.fits else '-'} | "
                  f"{label(best.decisions) if best else '-'} |", flush=True)


if __name__ == "__main__":
    main()
