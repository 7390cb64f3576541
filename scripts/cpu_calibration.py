"""partex calibrated on XLA:CPU's simulated devices and checked against them: the demo
models' hand plans predicted with the profile ``partex calibrate`` measures here, beside
the step times ``Session.measure`` (``partex verify --time``) runs on the same devices.

    JAX_NUM_CPU_DEVICES=8 python scripts/cpu_calibration.py [--profile out.json] [--quick]
        [--models mlp,transformer,...] [--mesh data=4,model=2] [--steps 5] [--json out.json]

The devices are XLA:CPU's, all on this host's cores: the figures say how well the tables
price what XLA:CPU runs (its kernels, its collectives in one process), not an accelerator.
A profile given with ``--profile`` that exists is read, not measured again.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax

jax.config.update("jax_num_cpu_devices", int(os.environ["JAX_NUM_CPU_DEVICES"]))

import partex  # noqa: E402
from partex import Hardware, Profile  # noqa: E402

MODELS = ["mlp", "transformer", "transformer-scan", "llama", "moe", "unet", "gns"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="cpu-profile.json", help="where the profile is (read) or goes (written)")
    ap.add_argument("--quick", action="store_true", help="calibrate quickly (fewer shapes)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--mesh", default="data=4,model=2")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    path = pathlib.Path(args.profile)
    if path.exists():
        profile = Profile.load(path)
    else:
        t0 = time.perf_counter()
        rows = partex.measure_devices(quick=args.quick)
        profile = Profile.from_measurements(rows, source="partex calibrate" + (" --quick" if args.quick else ""))
        profile.save(path)
        print(f"calibrated in {time.perf_counter() - t0:.0f} s: {profile.describe()}", file=sys.stderr)
    hw = Hardware.from_profile(profile)
    print(f"priced by {hw.priced_by()}\n")
    print("| model | plan | predicted step | measured step | predicted / measured | datasheet preset (cpu) / measured |")
    print("|---|---|---|---|---|---|")
    out, ratios, preset_ratios = [], [], []
    for model in args.models.split(","):
        s = partex.Session.from_spec(model, mesh=args.mesh, hardware=hw)
        preset = partex.Session.from_spec(model, mesh=args.mesh, hardware="cpu")
        names = [n for n, c in s.baselines().items() if c.report is not None and c.report.fits]
        plans = [s.plan(strategy=n) for n in names]
        measured = s.measure(plans, steps=args.steps, labels=names)
        for n, p, m in zip(names, plans, measured):
            if m.step_time is None:
                print(f"| {model} | {n} | - | {m.error} | - | - |")
                continue
            sheet = preset.evaluate(preset.strategy(n)).step_time
            r = p.predicted["step_time_s"] / m.step_time
            ratios.append(r)
            preset_ratios.append(sheet / m.step_time)
            out.append({"model": model, "plan": n, "predicted_s": p.predicted["step_time_s"], "measured_s": m.step_time,
                        "ratio": r, "preset_s": sheet})
            print(f"| {model} | {n} | {p.predicted['step_time_s'] * 1e3:.2f} ms | {m.step_time * 1e3:.2f} ms | "
                  f"{r:.2f} | {sheet / m.step_time:.2f} |")
    if ratios:
        print(f"\npredicted / measured: median {statistics.median(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f} "
              f"over {len(ratios)} plans (datasheet preset: median {statistics.median(preset_ratios):.2f}, "
              f"range {min(preset_ratios):.2f}-{max(preset_ratios):.2f})")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"profile": profile.describe(), "rows": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
