"""One prepared run on a machine with an accelerator: calibrate it, then predict and measure
the reference steps with that profile.

    OUT=/tmp/out python scripts/device_check.py [--quick] [--set seq=1024 ...] [--steps 5]

1. ``partex calibrate`` on the local devices: ``$OUT/profile.json`` and the raw rows
   ``$OUT/measurements.json`` (under two minutes on one GPU; ``--quick`` for a check).
2. The llama demo at 1B widths (``--set`` changes it) under ``remat`` full and none, and the
   step without remat with partex's ``recompute:dots`` and ``recompute:full``: each predicted
   with the new profile and run for ``--steps`` steps (``Session.measure``: a fresh process
   per plan, its peak its own), written to ``$OUT/steps.json`` and printed as a table.

Needs partex installed beside a JAX that sees the accelerator (a wheel of the checkout:
``pip wheel --no-deps -w DIR .``; ``pip install --no-deps DIR/partex-*.whl``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

BIG = dict(layers=16, d_model=2048, heads=16, kv_heads=8, d_ff=5632, vocab=32000, seq=2048, batch=8,
           dtype="bfloat16")
CASES = [("remat full", "full", None), ("remat none", "none", None), ("recompute:dots", "none", "dots"),
         ("recompute:full", "none", "full")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--set", action="append", default=[], metavar="K=V")
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args(argv)
    out = pathlib.Path(os.environ.get("OUT", "/tmp"))
    out.mkdir(parents=True, exist_ok=True)
    import partex
    from partex import Hardware, Recompute

    t0 = time.time()
    rows = partex.measure_devices(quick=args.quick,
                                  progress=lambda w, f: print(f"calibrate {f:4.0%} {w}", file=sys.stderr))
    (out / "measurements.json").write_text(json.dumps(rows, indent=1))
    profile = partex.Profile.from_measurements(rows, source="partex calibrate")
    profile.save(out / "profile.json")
    print(f"calibrated in {time.time() - t0:.0f} s: {profile.describe()}", flush=True)
    hw = Hardware.from_profile(profile)
    config = dict(BIG)
    for kv in args.set:
        k, v = kv.split("=", 1)
        config[k] = int(v) if v.isdigit() else v
    results = []
    print("| case | predicted step | measured step | pred / meas | predicted peak | XLA peak | allocator peak | "
          "pred / XLA |")
    print("|---|---|---|---|---|---|---|---|")
    for name, remat, kind in CASES:
        s = partex.Session.from_spec("llama", preset="7b", overrides={**config, "remat": remat}, mesh="data=1",
                                     hardware=hw)
        plan = s.plan([Recompute(0, kind)] if kind else [], strategy=name)
        try:
            (m,) = s.measure([plan], steps=args.steps, labels=[name], timeout=600)
        except Exception as e:
            results.append({"case": name, "error": repr(e)[:500]})
            print(f"| {name} | - | {repr(e)[:80]} | | | | | |", flush=True)
            continue
        row = {"case": name, **m.to_json()}
        results.append(row)
        (out / "steps.json").write_text(json.dumps({"config": config, "profile": profile.describe(),
                                                   "cases": results}, indent=1))
        gib = 2**30
        pred_peak = m.predicted_peak / gib if m.predicted_peak is not None else float("nan")
        print(f"| {name} | {m.predicted_step_time:.3f} s | "
              + (f"{m.step_time:.3f} s | {m.time_ratio:.2f}" if m.step_time else f"{m.error} | -")
              + f" | {pred_peak:.1f} GiB | "
              + (f"{m.xla_bytes / gib:.1f} GiB" if m.xla_bytes else "-") + " | "
              + (f"{m.peak_bytes / gib:.1f} GiB" if m.peak_bytes else "-") + " | "
              + (f"{m.memory_ratio:.3f}" if m.memory_ratio else "-") + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
