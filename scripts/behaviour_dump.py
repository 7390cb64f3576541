"""Every prediction partex makes for its demo models, as one JSON file to diff.

    python scripts/behaviour_dump.py out.json [--models a,b] [--presets tiny,full]
        [--simulations 60] [--no-bench]
    python scripts/behaviour_dump.py --diff before.json after.json [--rtol 1e-9]

For every demo model and preset, on a two-axis and a one-axis mesh, it writes each hand
plan's prediction (step, compute, communication and hidden time, FLOPs, the memory
report with its breakdown, and every collective: kind, axes, bytes, count, time, cause,
source line) and the plan file's decisions; on the tiny presets also ``bench`` with a
fixed simulation count and seed 0 (the MCTS, no-recompute and exhaustive rows' plans and
figures; the ILP's plan only where it proved optimality, as a time-limited solve depends
on the machine's speed). ``--diff`` compares two dumps: numbers to ``--rtol`` relative
(``--atol`` absolute near zero), everything else exactly, and exits 1 on any difference.
Run it with two checkouts' partex (two virtualenvs, or ``PARTEX_CHECKOUT=<dir>``, which
imports partex from that checkout's folders) to show a change keeps every prediction.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from _checkout import use_checkout_from_env

MESHES = {"tiny": ["data=4,model=2", "data=8"]}
LARGE_MESHES = ["data=8,model=4", "data=32"]


def _where(source: str) -> str:
    """A source line without the checkout's own path (two checkouts compare equal)."""
    return "/".join(source.split("/")[-2:])


def report_json(r) -> dict:
    out = r.to_json()
    out["collectives"] = sorted(
        [c.kind, list(c.axes), c.bytes, c.count, c.time, c.cause, _where(c.source), c.hidden]
        for c in r.collectives)
    return out


def dump_session(s, simulations: int | None) -> dict:
    out: dict = {"hand": {}}
    for name, cand in s.baselines().items():
        plan = s.plan(cand.decisions, strategy=name)
        out["hand"][name] = {"decisions": plan.to_json()["decisions"], "report": report_json(cand.report)}
    if simulations:
        rows = s.bench(simulations=simulations, ilp_time=60.0, exhaustive=3, exhaustive_limit=20_000)
        bench = {}
        for row in rows:
            if row.strategy in out["hand"]:
                continue
            r = {"strategy": row.strategy, **row.to_json()}
            r["decisions"] = s.plan(list(row.decisions)).to_json()["decisions"] if row.decisions else []
            for k in ("search_s", "total_s", "build_s", "seconds", "projected_s"):
                r.pop(k, None)
            if r["strategy"] == "ilp" and r.get("status") != "optimal":
                r = {"strategy": "ilp", "status": "not optimal: not compared"}
            bench[r["strategy"]] = r
        out["bench"] = bench
    return out


def dump(models: list[str], presets: list[str] | None, simulations: int | None) -> dict:
    from partex import Session, demo_models

    out = {}
    for model in models:
        for preset in demo_models.MODELS[model].presets:
            if presets and preset not in presets:
                continue
            for mesh in MESHES.get(preset, LARGE_MESHES):
                t = time.time()
                s = Session.from_spec(model, preset=preset, mesh=mesh, hardware="tpu-v4")
                out[f"{model}/{preset}/{mesh}"] = dump_session(s, simulations if preset == "tiny" else None)
                print(f"{model}/{preset}/{mesh}: {time.time() - t:.1f} s", file=sys.stderr, flush=True)
    return out


def diff(a, b, rtol: float, atol: float = 0.0, path: str = "") -> list[str]:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None or isinstance(a, str):
        return [] if a == b else [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if a == b or (math.isfinite(a) and math.isfinite(b) and abs(a - b) <= max(atol, rtol * max(abs(a), abs(b)))):
            return []
        return [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}/{k}: only in the {'first' if k in a else 'second'}" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += diff(a[k], b[k], rtol, atol, f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, rtol, atol, f"{path}[{i}]")]
    return [f"{path}: {type(a).__name__} != {type(b).__name__}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--diff", nargs=2, metavar=("BEFORE", "AFTER"))
    ap.add_argument("--rtol", type=float, default=1e-9)
    ap.add_argument("--atol", type=float, default=1e-15,
                    help="absolute tolerance: rounding noise around zero (1e-19 s hidden vs 0)")
    ap.add_argument("--models")
    ap.add_argument("--presets")
    ap.add_argument("--simulations", type=int, default=60)
    ap.add_argument("--no-bench", action="store_true")
    args = ap.parse_args()
    if args.diff:
        with open(args.diff[0]) as f, open(args.diff[1]) as g:
            found = diff(json.load(f), json.load(g), args.rtol, args.atol)
        print("\n".join(found[:200]))
        print(f"{len(found)} differences")
        sys.exit(1 if found else 0)
    if not args.out:
        ap.error("give an output file, or --diff BEFORE AFTER")
    use_checkout_from_env()
    from partex import demo_models

    print(f"partex from {os.path.dirname(demo_models.__file__)}", file=sys.stderr)
    models = args.models.split(",") if args.models else list(demo_models.MODELS)
    presets = args.presets.split(",") if args.presets else None
    data = dump(models, presets, None if args.no_bench else args.simulations)
    with open(args.out, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    print(f"{len(data)} model/preset/mesh entries written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
