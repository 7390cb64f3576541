"""More choices never make a worse plan: the mesh search without pipelines beside the same
search with them allowed (same budget, same seed), and the search with them given ``--scale``
times the effort and the time, per problem: the step times, with / without, default / longer,
and the time-to-best of each (``MeshSearch.best_at``).

    JAX_NUM_CPU_DEVICES=8 .venv/bin/python scripts/mesh_monotone.py [--budget S] [--scale 10]
        [--only t48-4x64@1.25,t48-1x256] [--longer-only] [--json out.json]

Without ``--budget`` each search runs its schedule (effort 1) to the end, as ``partex search
--devices`` does by default; the longer search has ``--scale`` times the effort and at most
``--scale`` times the seconds the default search with pipelines took. With ``--budget S`` each
search is capped at S seconds at effort S / 60 (``effort_of``), and the longer one has
``--scale`` times both.

The problems: T48 (``transformer-scan --preset t48``) on TPU v4 as four slices of 64 joined by
1.25 or 6.25 GB/s per chip, and on one slice of 256 with stages within it allowed; Llama-2-70B
and Llama-3.1-405B on four slices of 64 TPU v5p (the pipelining study's problems,
``scripts/pipeline_study.py``; the presets as they are: overlap on, 10% margin). ``--scale 0``
skips the longer runs.
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

# name: (model, preset, overrides, chip preset, topology, pipelines when allowed)
PROBLEMS = {
    "t48-4x64@1.25": ("transformer-scan", "t48", [], "tpu-v4", "4x64@1.25", None),
    "t48-4x64@6.25": ("transformer-scan", "t48", [], "tpu-v4", "4x64@6.25", None),
    "t48-1x256": ("transformer-scan", "t48", [], "tpu-v4", "256", True),
    "llama2-70b-4x64": ("llama", "llama2-70b", ["batch=1024", "attention=dot"], "tpu-v5p", "4x64@6.25", None),
    "llama3.1-405b-4x64": ("llama", "llama3.1-405b", ["batch=256", "layers=128"], "tpu-v5p", "4x64@6.25", None),
}


def _search(model: str, spec: dict, topo, effort: float, seconds: float | None, pipelines) -> dict:
    """One mesh search on a fresh session: ``effort`` (``effort_of``), at most ``seconds``."""
    session = partex.Session.from_spec(model, **spec)
    t0 = time.perf_counter()
    found = session.mesh_searcher(topo.devices, topology=topo, pipelines=pipelines, effort=effort).run(seconds)
    wall = time.perf_counter() - t0
    b = found.best
    return {"step_s": b.step_time if b else None, "candidate": b.text() if b else None, "wall_s": wall,
            "best_at_s": found.best_at, "converged": found.converged, "how": found.how(), "effort": effort,
            "cap_s": seconds, "search": found.to_json()}


def _cell(r: dict) -> str:
    if r["how"] == "-":
        return "-"
    if r["step_s"] is None:
        return "none fits"
    at = f", best at {r['best_at_s']:.0f} s" if r["best_at_s"] is not None else ""
    return f"{r['step_s']:.4f} s ({r['candidate'].replace('|', '/')}{at}, {r['wall_s']:.0f} s{'' if r['converged'] else ', cut'})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, help="seconds per search (default: none, the schedule to its end)")
    ap.add_argument("--scale", type=float, default=10.0,
                    help="the longer search's effort and time over the default's (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", help="problems, comma-separated (default: all of " + ", ".join(PROBLEMS) + ")")
    ap.add_argument("--longer-only", action="store_true", help="only the longer search (with pipelines)")
    ap.add_argument("--json")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(PROBLEMS)
    print("| problem | without pipelines | with pipelines | with / without | with, "
          f"{args.scale:g}x the time | default / {args.scale:g}x |")
    print("|---|---|---|---|---|---|")
    out = []
    for name in names:
        model, preset, overrides, hw, topo_text, wide = PROBLEMS[name]
        topo = partex.Topology.parse(topo_text)

        spec = dict(preset=preset, overrides=overrides, mesh=f"data={topo.devices}", hardware=hw, seed=args.seed)
        skip = {"step_s": None, "candidate": None, "wall_s": 0.0, "best_at_s": None, "converged": False, "how": "-"}
        effort = partex.effort_of(args.budget)
        narrow = skip if args.longer_only else _search(model, spec, topo, effort, args.budget, False)
        broad = skip if args.longer_only else _search(model, spec, topo, effort, args.budget, wide)
        cap = args.budget * args.scale if args.budget is not None else \
            broad["wall_s"] * args.scale if broad["how"] != "-" else None
        longer = _search(model, spec, topo, effort * args.scale, cap, wide) if args.scale > 0 else None
        ratio = broad["step_s"] / narrow["step_s"] if broad["step_s"] and narrow["step_s"] else None
        conv = broad["step_s"] / longer["step_s"] if longer and longer["step_s"] and broad["step_s"] else None
        print(f"| {name} | {_cell(narrow)} | {_cell(broad)} | {f'{ratio:.3f}' if ratio else '-'} | "
              f"{_cell(longer) if longer else '-'} | {f'{conv:.3f}' if conv else '-'} |", flush=True)
        out.append({"problem": name, "without": narrow, "with": broad, "longer": longer,
                    "with_over_without": ratio, "default_over_longer": conv})
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
