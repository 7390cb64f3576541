"""Where pipelining pays and where it does not: for each problem, the search over every mesh
of its chips without pipelines beside the same search with pipelined candidates allowed
(``Session.search_meshes(pipelines=...)``: a layer stack pipelined over the slices, or within
one slice), the ILP on each winner's mesh, and the hand pipeline plan (MaxText's recipe:
stages over the slow axis, FSDP inside, 4S microbatches), on one cost model.

    JAX_NUM_CPU_DEVICES=8 .venv/bin/python scripts/pipeline_study.py [--budget S] [--only t48-4x64] [--json out.json]

Prints one Markdown row per problem and search (best mesh, pipeline, bubble, predicted step,
MFU, memory; ILP on that mesh; the hand pipeline plan), the ``partex bench`` command that
scores the chosen pipelined candidate (its ``--json`` rows name the pipeline in their plan
labels), and the candidates tried.
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

# name: (model, preset, overrides, chip, topology, pipelines within a slice too)
PROBLEMS = {
    "t48-4x64": ("transformer-scan", "t48", [], "tpu-v4", "4x64@6.25", False),
    "t48-1x256": ("transformer-scan", "t48", [], "tpu-v4", "256", True),
    "llama2-70b-4x64": ("llama", "llama2-70b", ["batch=1024", "attention=dot"], "tpu-v5p", "4x64@6.25", False),
    # (128 layers, not 126: four stages of 32; the preset's flash kernels, a batch of 256 sequences of 8192)
    "llama3.1-405b-4x64": ("llama", "llama3.1-405b", ["batch=256", "layers=128"], "tpu-v5p", "4x64@6.25", False),
}


def _cell(t) -> str:
    if t is None or t.step_time is None:
        return "none fits | - | - | -"
    return f"{t.step_time:.3f} s | {t.mfu:.1%} | {partex.format_bytes(t.memory)} | {t.bubble:.0%}" \
        if t.bubble is not None else f"{t.step_time:.3f} s | {t.mfu:.1%} | {partex.format_bytes(t.memory)} | -"


def _ilp(session, seconds: float) -> str:
    r = session.ilp(seconds)
    return f"{r.report.step_time:.3f} s" if r.report is not None and r.report.fits else "none fits"


def _hand_pipeline(model, preset, overrides, hw, topo: partex.Topology, stack: str) -> tuple[str, str]:
    """MaxText's recipe: a stage per slice, FSDP over each slice, 4S microbatches (or the
    most that divide the batch), ZeRO-3 inside the stages."""
    s0 = partex.Session.from_spec(model, preset=preset, overrides=overrides, mesh="data=1")
    st = s0.pipeline_stacks()[stack]
    if st.layers % topo.granules:
        return "-", f"{st.layers} layers do not split into {topo.granules} stages"
    batch = st.batch
    m = next((k for k in (4 * topo.granules, 2 * topo.granules, topo.granules) if batch % k == 0), topo.granules)
    bw = topo.dcn_bandwidth / 1e9
    mesh = f"stage={topo.granules}@{bw:g},fsdp={topo.per}@{hw.link_bandwidth / 1e9:g}"
    pipe = f"{stack}:stage:{m}"
    s = partex.Session.from_spec(model, preset=preset, overrides=overrides, mesh=mesh, hardware=hw, pipeline=pipe)
    c = s.baselines().get("zero3")
    cell = f"{c.report.step_time:.3f} s" + ("" if c.report.fits else " (does not fit)") if c else "-"
    return f"{mesh} \\| {pipe}", cell


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float,
                    help="seconds per mesh search (default: none, the search's schedule to its end)")
    ap.add_argument("--ilp-time", type=float, default=30.0)
    ap.add_argument("--only", help="problems, comma-separated (default: all of " + ", ".join(PROBLEMS) + ")")
    ap.add_argument("--json")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(PROBLEMS)
    print("| problem | search | best candidate | step | MFU | memory | bubble | ILP on its mesh | hand pipeline plan "
          "(zero3) | search s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    out = []
    for name in names:
        model, preset, overrides, chip, topo_text, within = PROBLEMS[name]
        hw = partex.get_hardware(chip, overlap=True, memory_margin=0.1)
        topo = partex.Topology.parse(topo_text)
        s = partex.Session.from_spec(model, preset=preset, overrides=overrides, mesh=f"data={topo.devices}",
                                     hardware=hw)
        stacks = [label for label, st in s.pipeline_stacks().items() if not isinstance(st, str)]
        hand = _hand_pipeline(model, preset, overrides, hw, topo, stacks[0]) \
            if topo.granules > 1 and stacks else ("-", "-")
        rows = {}
        for label, pipelines in (("without pipelines", False), ("pipelines allowed", True if within else None)):
            t0 = time.perf_counter()
            found = s.search_meshes(topo.devices, topology=topo, seconds=args.budget, pipelines=pipelines)
            wall = time.perf_counter() - t0
            best = found.best
            ilp = _ilp(best.session, args.ilp_time) if best is not None and best.session is not None else "-"
            cand = best.text().replace("|", "\\|") if best is not None else "-"
            print(f"| {name} | {label} | {cand} | {_cell(best)} | {ilp} | "
                  f"{hand[0] + ': ' + hand[1] if pipelines is not False else '-'} | {wall:.0f} |", flush=True)
            rows[label] = {"search": found.to_json(), "ilp": ilp, "wall_s": wall, "table": found.table()}
        for label, r in rows.items():
            print(f"\n{name}, {label}:\n{r['table']}", flush=True)
        piped = rows["pipelines allowed"]["search"]
        if piped["chosen_pipeline"]:
            bw = ",".join(f"{a}={n}@{b / 1e9:g}" for a, n, b in zip(*(piped["meshes"][0]["mesh_json"][k] for k in
                                                                        ("axes", "sizes", "bandwidth"))))
            print(f"\n  partex bench {model} --preset {preset} "
                  + "".join(f"--config {o} " for o in overrides)
                  + f"--mesh {bw} --pipeline {piped['chosen_pipeline']} --hardware {chip} --overlap on --json",
                  flush=True)
        out.append({"problem": name, "hand_pipeline": hand, **rows})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
