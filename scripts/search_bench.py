"""The five-problem bench: hand plans, the ILP and the MCTS search on T32, T48, MoE, U-Net and
GNS at full size (TPU v4, overlap on, 10% margin), with the search's simulation count and
time-to-best.

    python scripts/search_bench.py [--budget 60] [--ilp-time 30] [--only T32,MoE] [--pipelined] [--pipelines]
                                   [--json out.json]

``--pipelined`` adds the scanned T32 and T48 with their layer stack pipelined over a ``stage``
axis (the search plans the pipelined step). ``--pipelines`` puts the pipeline among the
search's decisions (``Session.search_pipelines``: the step as written and every pipeline of its
scanned stacks over an axis of the problem's mesh, one tree each under UCT at the root), on the
five problems and on the scanned T32 and T48 on the same meshes (the five's T32 and T48 unroll
their layers, which partex pipelines only under ``scan``); the ILP then solves every program and
the best is its row, and the best hand plan is the best of every program's.

``PARTEX_CHECKOUT=<dir>`` runs another checkout's partex (``scripts/_checkout.py``): run it on
two checkouts in turn, on an idle machine, to compare the searches' simulation counts.
Prints a markdown table: the best hand plan, the ILP, MCTS, MCTS / the best of the others,
MCTS's time-to-best and its simulations.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from _checkout import use_checkout_from_env

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
use_checkout_from_env()

import partex  # noqa: E402
from overlap_bench import PROBLEMS  # noqa: E402  (the same five problems)

# name -> (model, preset, mesh, pipeline): the same chips as the unpipelined T32 and T48
PIPELINED = {"T32 pipelined": ("transformer-scan", "t32", "stage=2,data=4,model=4", "stack0:stage:8"),
             "T48 pipelined": ("transformer-scan", "t48", "stage=4,data=4,model=8", "stack0:stage:16")}
# with --pipelines: the scanned T32 and T48 on the five's meshes, their pipelines searched
SCANNED = {"T32 scan": ("transformer-scan", "t32", "data=8,model=4"),
           "T48 scan": ("transformer-scan", "t48", "data=16,model=8")}


def _ms(r) -> str:
    return f"{r.step_time_s * 1e3:.1f} ms" if r is not None and r.step_time_s is not None and r.fits else "-"


def searched_pipelines(name: str, model: str, preset: str, mesh: str, budget: float, ilp_time: float) -> dict:
    """One problem with the pipeline among the decisions: its row, printed, and its JSON."""
    hw = partex.get_hardware("tpu-v4", memory_margin=0.1)
    s = partex.Session.from_spec(model, preset=preset, mesh=mesh, hardware=hw)
    found = s.search_pipelines(budget)
    programs = [t for t in found.result().trials if t.session is not None]
    hand, ilps = [], []
    for t in programs:
        label = t.pipeline.text() if t.pipeline else "as written"
        hand += [(label, c) for c in t.session.baselines().values() if c.report.fits]
        ilp = t.session.ilp(ilp_time)
        if ilp.report is not None and ilp.report.fits:
            ilps.append((label, ilp))
    best = found.result().best
    best_hand = min(hand, key=lambda x: x[1].report.step_time, default=None)
    best_ilp = min(ilps, key=lambda x: x[1].report.step_time, default=None)
    others = [x[1].report.step_time for x in (best_hand, best_ilp) if x is not None]
    step = best.step_time if best is not None else None
    ratio = step / min(others) if others and step else None
    sims = sum(t.simulations for t in programs)
    chosen = best.pipeline.text() if best is not None and best.pipeline else "none"
    print(f"| {name} | {mesh} | {len(programs)} | "
          f"{f'{best_hand[1].name} ({best_hand[0]}) {best_hand[1].report.step_time * 1e3:.1f} ms' if best_hand else '-'} | "
          f"{f'{best_ilp[1].report.step_time * 1e3:.1f} ms ({best_ilp[0]})' if best_ilp else '-'} | "
          f"{f'{step * 1e3:.1f} ms' if step else '-'} | {chosen} | {f'{ratio:.3f}' if ratio else '-'} | "
          f"{found.best_at:.1f} | {found.setup_s:.1f} | {sims} |" if found.best_at is not None else
          f"| {name} | {mesh} | {len(programs)} | - | - | - | none fits | - | - | {found.setup_s:.1f} | {sims} |", flush=True)
    return {"problem": name, "mesh": mesh, "programs": len(programs), "search": found.result().to_json(),
            "best_hand": {"program": best_hand[0], "strategy": best_hand[1].name,
                          "step_time_s": best_hand[1].report.step_time} if best_hand else None,
            "ilp": {"program": best_ilp[0], "step_time_s": best_ilp[1].report.step_time} if best_ilp else None,
            "mcts": {"pipeline": chosen, "step_time_s": step, "best_at_s": found.best_at,
                     "setup_s": found.setup_s, "simulations": sims}}

def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=60.0)
    ap.add_argument("--ilp-time", type=float, default=30.0)
    ap.add_argument("--only", help="problems, comma-separated (default: all five)")
    ap.add_argument("--pipelined", action="store_true", help="add the pipelined T32 and T48")
    ap.add_argument("--pipelines", action="store_true",
                    help="the pipeline among the search's decisions, on the five and the scanned T32 and T48")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    if args.pipelines:
        names = args.only.split(",") if args.only else list(PROBLEMS) + list(SCANNED)
        print("| problem | mesh | programs | best hand plan (program) | ILP (program) | MCTS | pipeline chosen | "
              "MCTS / best other | time-to-best s | setup s | simulations |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        out = [searched_pipelines(name, *({**PROBLEMS, **SCANNED}[name]), args.budget, args.ilp_time) for name in names]
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        return
    names = args.only.split(",") if args.only else list(PROBLEMS) + (list(PIPELINED) if args.pipelined else [])
    print("| problem | mesh | best hand plan | ILP | MCTS | MCTS / best other | time-to-best s | simulations |")
    print("|---|---|---|---|---|---|---|---|")
    out = []
    for name in names:
        model, preset, mesh, pipeline = PIPELINED[name] if name in PIPELINED else (*PROBLEMS[name], None)
        hw = partex.get_hardware("tpu-v4", memory_margin=0.1)
        t0 = time.perf_counter()
        s = partex.Session.from_spec(model, preset=preset, mesh=mesh, hardware=hw, pipeline=pipeline)
        setup = time.perf_counter() - t0
        rows = {r.strategy: r for r in s.bench(args.budget, ilp_time=args.ilp_time, exhaustive=0)}
        hand = [r for k, r in rows.items() if k not in ("ilp", "mcts", "mcts-no-remat") and r.fits]
        best_hand = min(hand, key=lambda r: r.step_time_s) if hand else None
        ilp, mcts = rows["ilp"], rows["mcts"]
        others = [r.step_time_s for r in (best_hand, ilp) if r is not None and r.fits]
        ratio = mcts.step_time_s / min(others) if others and mcts.step_time_s else None
        sims = mcts.simulations

        ms = _ms
        print(f"| {name} | {mesh} | {best_hand.strategy + ' ' if best_hand else ''}{ms(best_hand)} | {ms(ilp)} | "
              f"{ms(mcts)} | {ratio:.3f} | {mcts.search_s:.1f} | {sims} |" if ratio is not None else
              f"| {name} | {mesh} | {ms(best_hand)} | {ms(ilp)} | {ms(mcts)} | - | - | {sims} |", flush=True)
        out.append({"problem": name, "mesh": mesh, "pipeline": pipeline, "setup_s": setup,
                    "rows": [{**r.to_json(), "plan": [s.label(d) for d in r.decisions]} for r in rows.values()]})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
