"""What a plan's exports carry: XLA's per-device memory and collective bytes of the full plan,
of its flax logical-axis rules alone and of its input/output specs alone, for the flax linen
LM (scripts/libmodels/flax_linen.py, which names its params' and activations' dims), on
simulated devices; with --run (tiny only), the numerics of a training step under each.

    python scripts/export_table.py --size tiny --run
    python scripts/export_table.py --size full --layers 4 --memory 16GiB
"""

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="tiny", choices=("tiny", "full"))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--mesh", default="data=4,model=2")
    ap.add_argument("--hardware", default="tpu-v4")
    ap.add_argument("--memory", help="budget of the searched plan (default: the leanest hand plan's x 1.2)")
    ap.add_argument("--seconds", type=float, default=20.0, help="search seconds")
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()

    import jax

    n = 1
    for part in args.mesh.split(","):
        n *= int(part.split("=")[1].split("@")[0])
    jax.config.update("jax_num_cpu_devices", n)
    jax.config.update("jax_compilation_cache_dir", os.path.join(ROOT, ".jax_cache"))
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import _libcheck as lc

    import partex

    mod = lc.load("flax_linen")
    fn, fargs, names = mod.make(args.layers, args.size)
    s = partex.Session(fn, fargs, mesh=args.mesh, hardware=args.hardware, axis_names=names, memory=args.memory)
    plans = {name: s.plan(strategy=name) for name in ("dp", "megatron", "zero3")}
    if args.memory is None:
        lean = min(p.predicted["memory"]["peak"] for p in plans.values())
        s.reconfigure(memory=1.2 * lean)
    s.run(args.seconds)
    if s.best_plan() is not None:
        plans["searched"] = s.best_plan()
    rows = []
    for name, plan in plans.items():
        row = {"plan": name, "decisions": [f"{d.group}->{d.axis}" for d in plan.decisions]}
        for fmt in ("flax-rules", "specs"):
            t0 = time.perf_counter()
            out = partex.verify(plan, fn, fargs, axis_names=names, run=args.run, export=fmt)
            c = out.comparison
            row["plan_xla"] = c["plan"]
            row[fmt] = c["export"]
            row[f"{fmt}_seconds"] = round(time.perf_counter() - t0, 1)
            if fmt == "flax-rules":
                row["rules"] = c["export"]["rules"]["rules"]
                row["matched"] = c["export"]["rules"]["matched_fraction"]
            print(f"\n{name} ({', '.join(row['decisions'])}) -- {fmt}:\n{partex.export_table(out)}", flush=True)
        rows.append(row)
    print_table(rows, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)


def print_table(rows, args) -> None:
    from partex import format_bytes

    print(f"\nflax_linen {args.size} ({args.layers} layers) on {args.mesh}: XLA per device "
          "(memory; all-gather / all-reduce / all-to-all bytes)")
    print("| plan | rules match | full plan | rules alone | specs alone | numerics (plan / rules / specs) |")
    print("|---|---|---|---|---|---|")

    def cell(x):
        c = x["collectives"]
        return (f"{format_bytes(x['memory'])}; {format_bytes(c['all-gather'])} / {format_bytes(c['all-reduce'])}"
                f" / {format_bytes(c['all-to-all'])}")

    def num(x):
        return f"{x['numerics']['max_rel_err']:.1e}" if "numerics" in x else "-"

    for r in rows:
        print(f"| {r['plan']} | {r['matched']:.0%} | {cell(r['plan_xla'])} | {cell(r['flax-rules'])} | "
              f"{cell(r['specs'])} | {num(r['plan_xla'])} / {num(r['flax-rules'])} / {num(r['specs'])} |")


if __name__ == "__main__":
    main()
