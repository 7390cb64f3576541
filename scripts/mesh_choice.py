"""The mesh partex chooses against the one people chose: for each published MaxText run the
llama demo mirrors (``PUBLISHED_RUNS``), the search on the published mesh beside the search
over every mesh of the same chips (``Session.search_meshes``), on one cost model.

    JAX_NUM_CPU_DEVICES=8 .venv/bin/python scripts/mesh_choice.py [--budget 60] [--only maxtext-32b] [--json out.json]

Each run: the published mesh searched for ``--budget`` seconds (MCTS from the hand plans),
then every factorisation of its chips into up to four axes searched by successive halving in
``--budget`` seconds in all. Prints the published mesh and its best plan's predicted step and
MFU, the chosen mesh and its, the published run's MFU (MaxText's count, ``PUBLISHED_RUNS``),
and the meshes tried.
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
from partex.demo_models import PUBLISHED_RUNS  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=60.0)
    ap.add_argument("--only", help="runs, comma-separated (default: every published run)")
    ap.add_argument("--max-axes", type=int, default=4)
    ap.add_argument("--json")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(PUBLISHED_RUNS)
    print("| run | chips | published mesh | its search: step, MFU | chosen mesh | step, MFU | chosen / published "
          "| published MFU |")
    print("|---|---|---|---|---|---|---|---|")
    out = []
    for name in names:
        pub = PUBLISHED_RUNS[name]
        mesh = ",".join(f"{a}={n}" for a, n in pub["mesh"].items())
        hw = partex.get_hardware(pub["chip"], memory_margin=0.1)
        t0 = time.perf_counter()
        s = partex.Session.from_spec("llama", preset=name, mesh=mesh, hardware=hw)
        s.run(args.budget)
        mine = s.best()
        found = s.search_meshes(pub["chips"], seconds=args.budget, max_axes=args.max_axes)
        chosen = found.best

        def cell(r):
            return f"{r.step_time:.3f} s, {r.mfu:.1%}" if r is not None else "none fits"

        ratio = (f"{chosen.step_time / mine.report.step_time:.3f}" if chosen is not None and mine is not None
                 else "-")
        print(f"| {name} | {pub['chips']} {pub['chip']} | {mesh} | {cell(mine.report if mine else None)} | "
              f"{chosen.mesh.text() if chosen else '-'} | {cell(chosen)} | {ratio} | {pub['mfu']:.1%} |", flush=True)
        print(found.table(), flush=True)
        out.append({"run": name, "published_mesh": mesh, "published_mfu": pub["mfu"],
                    "seconds": time.perf_counter() - t0,
                    "published": None if mine is None else {"step_time_s": mine.report.step_time,
                                                             "mfu": mine.report.mfu,
                                                             "plan": [s.label(d) for d in mine.decisions]},
                    "meshes": found.to_json()})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
