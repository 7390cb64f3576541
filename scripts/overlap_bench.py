"""The five-problem bench with and without overlap (docs/results.md, "Overlap").

For each problem, ``Session.bench`` runs twice on the same cost model but for
``Hardware.overlap``: off (every collective charged in full, as if XLA ran them in line)
and on (collectives overlap independent compute as XLA's scheduler runs them
on TPU and GPU). Printed per problem: each plan's step time both ways, its exposed share of
communication, its rank both ways; the plans whose rank changes are marked, and the MCTS
plan of each run is scored under the other model too (is the overlap-aware search finding a
different plan, and is that plan better under overlap?).

    JAX_NUM_CPU_DEVICES=32 .venv/bin/python scripts/overlap_bench.py --budget 30 [--only T32] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import partex

PROBLEMS = {  # name -> (model, preset, mesh)
    "T32": ("transformer", "t32", "data=8,model=4"),
    "T48": ("transformer", "t48", "data=16,model=8"),
    "MoE": ("moe", "full", "data=8,model=4"),
    "U-Net": ("unet", "full", "data=8,model=4"),
    "GNS": ("gns", "full", "data=8,model=4"),
}


def run(name: str, budget: float, ilp_time: float, hardware: str) -> dict:
    model, preset, mesh = PROBLEMS[name]
    out = {"problem": name, "model": model, "preset": preset, "mesh": mesh, "hardware": hardware}
    sessions = {}
    for mode in ("off", "on"):
        hw = partex.get_hardware(hardware, overlap=mode == "on", memory_margin=0.1)
        s = partex.Session.from_spec(model, preset=preset, mesh=mesh, hardware=hw)
        t0 = time.perf_counter()
        rows = s.bench(budget, ilp_time=ilp_time)
        print(f"  {name} overlap {mode}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        out[mode] = rows
        sessions[mode] = s
    # every plan found either way, scored both ways
    plans = {}
    for mode in ("off", "on"):
        for r in out[mode]:
            if r.step_time_s is None:
                continue
            label = r.strategy if r.strategy not in ("ilp", "mcts", "mcts-no-remat") else f"{r.strategy} ({mode})"
            plans.setdefault(label, list(r.decisions))
    table = []
    for label, dec in plans.items():
        rep = {m: sessions[m].evaluate(dec) for m in ("off", "on")}
        table.append({"plan": label, "fits": rep["on"].fits,
                      "off_s": rep["off"].step_time, "on_s": rep["on"].step_time,
                      "comm_s": rep["on"].comm_time, "hidden_s": rep["on"].hidden_time,
                      "mfu_off": rep["off"].mfu, "mfu_on": rep["on"].mfu})
    fitting = [r for r in table if r["fits"]]
    for m in ("off", "on"):
        for k, r in enumerate(sorted(fitting, key=lambda r: r[f"{m}_s"])):
            r[f"rank_{m}"] = k + 1
    out["table"] = table
    out["mcts_seconds"] = {m: next((r.search_s for r in out[m] if r.strategy == "mcts"), None) for m in ("off", "on")}
    out["simulations"] = {m: next((r.simulations for r in out[m] if r.strategy == "mcts"), None) for m in ("off", "on")}
    for mode in ("off", "on"):  # as JSON: the rows with their plans' labels
        out[mode] = [{**r.to_json(), "plan": [sessions[mode].label(d) for d in r.decisions]} for r in out[mode]]
    return out


def show(res: dict) -> None:
    print(f"\n{res['problem']}: {res['model']} {res['preset']} on {res['mesh']}, {res['hardware']} "
          f"(MCTS simulations off/on: {res['simulations']['off']}/{res['simulations']['on']})")
    print("| plan | no overlap | overlap | comm hidden | MFU off -> on | rank off -> on |")
    print("|---|---|---|---|---|---|")
    for r in sorted(res["table"], key=lambda r: r["on_s"]):
        hid = f"{r['hidden_s'] / r['comm_s']:.0%} of {r['comm_s'] * 1e3:.1f} ms" if r["comm_s"] else "-"
        rank = f"{r.get('rank_off', '-')} -> {r.get('rank_on', '-')}" if r["fits"] else "does not fit"
        mark = " **" if r["fits"] and r.get("rank_off") != r.get("rank_on") else ""
        print(f"| {r['plan']} | {r['off_s'] * 1e3:.1f} ms | {r['on_s'] * 1e3:.1f} ms | {hid} | "
              f"{r['mfu_off']:.1%} -> {r['mfu_on']:.1%} | {rank}{mark} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=30.0, help="MCTS seconds per run (default 30)")
    ap.add_argument("--ilp-time", type=float, default=30.0)
    ap.add_argument("--hardware", default="tpu-v4")
    ap.add_argument("--only", action="append", choices=list(PROBLEMS), help="problems to run (default all five)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    results = []
    for name in args.only or list(PROBLEMS):
        res = run(name, args.budget, args.ilp_time, args.hardware)
        show(res)
        results.append(res)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
