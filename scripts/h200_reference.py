"""The H200 reference re-predicted: a profile fitted from micro-benchmarks alone, and the
whole training steps measured on the same GPU.

    python scripts/h200_reference.py [--micro tests/fixtures/h200/micro.json]
                                     [--steps tests/fixtures/h200/steps.json] [--set seq=1024 ...]
                                     [--budget 48.2GiB] [--seconds 20] [--json out.json]

``--micro``: the micro-benchmarks (``partex calibrate``'s measurement format; the reference's
are one jitted call per kernel, timed from Python). ``--steps``: whole steps of the llama
demo at 1B widths, each with its measured step time and XLA GPU's compiled peak (the cases
are matched by name: ``remat full``, ``qkv_proj_offloaded``, ``searched at half memory`` =
the step without remat with the search's ``recompute:dots``, ``remat none``). For each case
the table gives partex's prediction with the profile, the measurement, and their ratios;
then whether the step without remat fits, and the plan a search under ``--budget`` picks
among those that fit (with the next best, the candidates ``partex search --measure-top``
would run). ``--set`` changes the model (another size: the cases then have no measurement).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import partex
from partex import Hardware, Recompute

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIG = dict(layers=16, d_model=2048, heads=16, kv_heads=8, d_ff=5632, vocab=32000, seq=2048, batch=8,
           dtype="bfloat16")
# the reference's cases: (name in steps.json, the model's remat, partex's decisions on it)
CASES = [("remat full", "full", ()), ("qkv_proj_offloaded", "qkv_proj_offloaded", ()),
         ("searched at half memory", "none", ("dots",)), ("remat none", "none", ())]
GiB = 2**30


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--micro", default=str(ROOT / "tests/fixtures/h200/micro.json"))
    ap.add_argument("--steps", default=str(ROOT / "tests/fixtures/h200/steps.json"))
    ap.add_argument("--set", action="append", default=[], metavar="K=V", help="change the model's config")
    ap.add_argument("--budget", default="48.2GiB", help="the search's per-device budget (default 48.2GiB)")
    ap.add_argument("--seconds", type=float, default=20.0, help="search seconds (default 20)")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    profile = partex.Profile.from_measurements(partex.Profile.read_measurements(args.micro),
                                               source=f"measurements {pathlib.Path(args.micro).name}")
    hw = Hardware.from_profile(profile)
    config = dict(BIG)
    for kv in args.set:
        k, v = kv.split("=", 1)
        config[k] = int(v) if v.isdigit() else v
    measured = {c["case"]: c for c in json.loads(pathlib.Path(args.steps).read_text())["cases"]} if not args.set else {}
    print(f"priced by {hw.priced_by()}; device memory a program may take: {partex.format_bytes(hw.hbm_bytes)}")
    for note in profile.notes:
        print(f"  note: {note}")
    print()
    print("| case | predicted step | measured step | predicted / measured | predicted peak | XLA GPU peak | "
          "predicted / XLA | fits |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for name, remat, kinds in CASES:
        s = partex.Session.from_spec("llama", preset="7b", overrides={**config, "remat": remat}, mesh="data=1",
                                     hardware=hw)
        rep = s.evaluate([Recompute(0, k) for k in kinds])
        m = measured.get(name, {})
        t, x = m.get("measured_step_s"), m.get("xla_peak_gib")
        row = {"case": name, "predicted_step_s": rep.step_time, "measured_step_s": t,
               "predicted_peak_gib": rep.memory.peak / GiB, "predicted_host_gib": rep.memory.host / GiB,
               "xla_peak_gib": x, "fits": rep.fits}
        rows.append(row)
        host = f" + {rep.memory.host / GiB:.1f} host" if rep.memory.host else ""
        print(f"| {name} | {rep.step_time:.3f} s | {f'{t:.3f} s' if t else '-'} | "
              f"{f'{rep.step_time / t:.2f}' if t else '-'} | {rep.memory.peak / GiB:.1f} GiB{host} | "
              f"{f'{x:.1f} GiB' if x else m.get('error', '-')[:60]} | "
              f"{f'{rep.memory.peak / GiB / x:.3f}' if x else '-'} | {'yes' if rep.fits else 'no'} |")
    search_hw = hw.replace(memory_budget=partex.parse_bytes(args.budget), memory_margin=0.1)
    s = partex.Session.from_spec("llama", preset="7b", overrides={**config, "remat": "none"}, mesh="data=1",
                                 hardware=search_hw)
    s.run(args.seconds)
    top = s.top_plans(4)
    print(f"\nsearch under {args.budget} (10% kept free), {args.seconds:g} s: the fastest distinct plans that fit")
    picks = []
    for p in top:
        labels = ", ".join(f"{d.group}->{d.axis}" for d in p.decisions) or "nothing"
        pr = p.predicted
        picks.append({"plan": p.strategy, "decisions": labels, "step_s": pr["step_time_s"],
                      "peak_gib": pr["memory"]["peak"] / GiB})
        print(f"  {p.strategy}: {labels}: step {pr['step_time_s']:.3f} s, peak {pr['memory']['peak'] / GiB:.1f} GiB")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"config": config, "rows": rows, "search": picks}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
