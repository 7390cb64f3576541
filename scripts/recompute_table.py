"""Recompute against XLA: each hand strategy with each recompute kind on every layer stack,
compiled by XLA (compile-only, in one fresh process per model) beside the prediction.

    python scripts/recompute_table.py                                  # the tiny demo models
    python scripts/recompute_table.py --models transformer --preset t48 --mesh data=16,model=8 \
        --strategies zero3                                             # full-size T48, zero3

Prints, per plan: predicted step time, predicted and XLA per-device memory and their ratio,
and predicted / XLA collective bytes per kind.
"""

from __future__ import annotations

import argparse

import partex


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="transformer,moe,gns,unet,transformer-scan,llama")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--config", default="", help="overrides, e.g. seq=2048,layers=4")
    ap.add_argument("--mesh", default="data=4,model=2")
    ap.add_argument("--strategies", default="dp,megatron,zero3")
    ap.add_argument("--kinds", default=",".join(partex.RECOMPUTE_KINDS))
    args = ap.parse_args()
    overrides = [c for c in args.config.split(",") if c] or None
    kinds = [None] + [k for k in args.kinds.split(",") if k]
    print(f"{'model':<12} {'strategy':<9} {'recompute':<9} {'step':>10} {'predicted':>11} {'XLA':>11} "
          f"{'pred/XLA':>8}  collectives pred/XLA")
    for model in args.models.split(","):
        s = partex.Session.from_spec(model, preset=args.preset, overrides=overrides, mesh=args.mesh,
                                     hardware="tpu-v4")
        if not s.units:
            print(f"{model:<12} no layer stack to recompute")
            continue
        plans = []
        for strat in args.strategies.split(","):
            base = s.strategy(strat)
            for kind in kinds:
                if kind and not all(kind in u.kinds for u in s.units):
                    continue  # re-gather under scan: no decision (every iteration gathers anew)
                extra = [(u.label, "recompute:" + kind) for u in s.units] if kind else []
                plans.append((strat, kind, s.plan(base + extra, strategy=strat)))
        for (strat, kind, plan), out in zip(plans, s.verify_all([p for *_, p in plans])):
            m = out.memory
            colls = ", ".join(f"{k} {v.ratio:.2f}" for k, v in out.collectives.items()
                              if v.ratio is not None)
            print(f"{model:<12} {strat:<9} {kind or 'save':<9} {plan.predicted['step_time_s'] * 1e3:>7.3f} ms "
                  f"{partex.format_bytes(m.predicted):>11} {partex.format_bytes(m.xla):>11} "
                  f"{m.ratio:>8.3f}  {colls}", flush=True)


if __name__ == "__main__":
    main()
