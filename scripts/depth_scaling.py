"""How the search scales with depth: an unrolled transformer at growing layer counts.

    python scripts/depth_scaling.py [--layers 8,32,96,126] [--seconds 20] [--evals 20]

For each depth L: ``partex.Session.from_spec("transformer", preset="t32",
overrides=["layers=L"], mesh="data=8,model=4", hardware="tpu-v4")``; prints the program's op
count, the analysis time, one evaluation (the mean of ``CostModel.evaluate`` over ``zero3``
minus each one of its decisions, on a cost model that has scored ``zero3``), the simulations
of ``run(seconds)``, when the best was found (seconds into the run) and the best step time
against the warm start's (the best hand plan the search starts from).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import partex


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="8,32,96,126")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--preset", default="t32")
    ap.add_argument("--mesh", default="data=8,model=4")
    ap.add_argument("--hardware", default="tpu-v4")
    args = ap.parse_args()
    print("| layers | ops | analyze s | one evaluation ms | simulations | best found at s | best ms | warm start ms |")
    print("|---|---|---|---|---|---|---|---|")
    for n in [int(x) for x in args.layers.split(",")]:
        t0 = time.perf_counter()
        s = partex.Session.from_spec("transformer", preset=args.preset, overrides=[f"layers={n}"],
                                     mesh=args.mesh, hardware=args.hardware)
        analyse = time.perf_counter() - t0
        cm = s.cost_model
        z = list(s.strategy("zero3"))
        cm.evaluate(z)
        t0 = time.perf_counter()
        for i in range(len(z)):
            cm.evaluate(z[:i] + z[i + 1:])
        one = (time.perf_counter() - t0) / len(z)
        warm = s.best()
        warm_ms = warm.report.step_time * 1e3 if warm else float("nan")
        s.run(args.seconds)
        st = s.stats()
        hist = st.best_history
        at = hist[-1][1] if hist else 0.0
        print(f"| {n} | {len(s.program.ops)} | {analyse:.1f} | {one * 1e3:.1f} | {st.simulations} | {at:.1f} | "
              f"{st.best_step_time * 1e3:.2f} | {warm_ms:.2f} |", flush=True)


if __name__ == "__main__":
    main()
