"""Published MaxText runs reproduced on partex's cost model (docs/results.md, "Published MFU").

Each run is a `llama` demo preset that mirrors a published MaxText configuration (model dims,
chips and mesh, per-device batch x chips, sequence, bf16 compute over float32 weights, the
published remat policy as user code; see demo_models/_llama.py, PUBLISHED_RUNS, for the
sources and what is not mirrored). For each:

- **published**: the MFU MaxText reports;
- **partex, published sharding**: the predicted step time of the run's own sharding (MaxText's
  FSDP: the batch and every weight's embed dim over the fsdp axis; tensor parallelism: the
  attention heads, the MLP dim and the vocabulary over the tensor axis, and the activations'
  embed dim between layers, MaxText's `activation_embed` rule) and the MFU that gives
  by MaxText's own FLOP count (maxtext_utils.calculate_tflops_training_per_device: the
  matmuls' 6·tokens·params plus non-causal attention, no recompute; the 2023 22B run counted
  6·params·tokens alone, and so does its row here);
- **attention, remat**: the run's attention (``flash``: JAX's Pallas flash-attention kernels,
  priced by their cost estimates and bodies, the scores never in memory; ``dot``: einsums) and
  its remat policy, whose offloaded residuals live in host memory;
- **memory**: the device peak by partex's count against the chip's HBM, and the host memory
  the offloaded residuals take; **host transfers**: their seconds over the host link per step
  and how much of it runs under compute;
- **partex, searched**: the plan the MCTS search finds in ``--budget`` seconds (it keeps the
  remat the model's code applies, and may add its own), its predicted step and MFU;
- **partex, searched, its own remat**: the same run with no remat and no optimizer or
  parameter host offload in the model's code, the search choosing the sharding, each layer
  stack's recompute or offload (``recompute`` ``dots``, ``full``, ``offload``: the matmul
  outputs in host memory) and where the optimizer state and the parameters live
  (``memory:host``) in ``--budget`` seconds.

    JAX_NUM_CPU_DEVICES=8 .venv/bin/python scripts/published_mfu.py [--budget 30] [--overlap off] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import partex
from partex.demo_models import PUBLISHED_RUNS


def maxtext_flops_per_device(c, chips: int, six_n: bool = False) -> float:
    """MaxText's training FLOPs per device per step (non-causal attention, as the published
    figures were counted), or 6 x params x tokens (the 2023 count) with ``six_n``."""
    b, s, e, hd, layers = c.batch, c.seq, c.d_model, c.head_dim, c.layers
    if six_n:
        params = (c.vocab * e * 2 + e + layers * (2 * e + e * hd * (c.heads + 2 * c.kv_heads)
                                                   + c.heads * hd * e + 3 * e * c.d_ff))
        return 6 * params * b * s / chips
    ffn = 2 * b * s * c.d_ff * e * 3  # SwiGLU: gate, up, down
    qkv = 2 * b * s * e * (c.heads + 2 * c.kv_heads) * hd
    proj = 2 * b * s * e * c.heads * hd
    attn = 4 * b * s * s * c.heads * hd
    logits = 2 * b * s * e * c.vocab
    return (3 * ((ffn + qkv + proj) * layers + logits) + 3 * attn * layers) / chips


def run(name: str, budget: float, overlap: bool) -> dict:
    pub = PUBLISHED_RUNS[name]
    mesh = dict(pub["mesh"])
    axes = list(mesh)
    # every published run is FSDP (+ tensor parallelism): a one-axis mesh gets a size-1
    # tensor axis, so that partex's zero3 (batch and the weights' largest free dim over the
    # first axis, heads / MLP dim / vocabulary over the last) is MaxText's sharding
    if len(axes) == 1:
        mesh["tensor"] = 1
    mesh_text = ",".join(f"{a}={n}" for a, n in mesh.items())
    hw = partex.get_hardware(pub["chip"], overlap=overlap, memory_margin=0.1)
    t0 = time.perf_counter()
    s = partex.Session.from_spec("llama", preset=name, mesh=mesh_text, hardware=hw)
    traced = time.perf_counter() - t0
    c = s.model.model.config
    model_flops = maxtext_flops_per_device(c, pub["chips"], six_n=name == "maxtext-22b")
    dec = s.strategy("zero3")
    if mesh["tensor"] > 1:  # MaxText's activation_embed -> tensor: the embed dim of the
        # activations (the weights' FSDP dim) over the tensor axis between the layers
        batch = set(s.analysis.roles.batch_groups)
        dec += [partex.Shard(d.group, "tensor") for d in list(dec)
                if isinstance(d, partex.Shard) and d.axis == axes[0] and d.group not in batch]
    r = s.cost_model.evaluate(dec, detail=True)
    moved = [x for x in r.collectives if x.kind == "host-transfer"]
    out = {"run": name, "chip": pub["chip"], "chips": pub["chips"], "mesh": mesh_text,
           "attention": c.attention, "remat": c.remat,
           "published_mfu": pub["mfu"], "model_tflops_per_device": model_flops / 1e12,
           "trace_s": traced, "overlap": overlap,
           "published_plan": {"plan": [s.label(d) for d in dec], "step_s": r.step_time,
                              "compute_s": r.compute_time, "comm_s": r.comm_time, "hidden_s": r.hidden_time,
                              "mfu": model_flops / (r.step_time * hw.peak_flops),
                              "partex_mfu": r.mfu, "peak_bytes": r.memory.peak, "host_bytes": r.memory.host,
                              "hbm_bytes": hw.hbm_bytes, "fits": r.fits,
                              "host_transfer_s": sum(x.time for x in moved),
                              "host_transfer_hidden_s": sum(x.hidden for x in moved)}}
    s.run(budget)
    best = s.best()
    if best is not None:
        b = best.report
        out["searched"] = {"plan": [s.label(d) for d in best.decisions], "step_s": b.step_time,
                           "compute_s": b.compute_time, "comm_s": b.comm_time, "hidden_s": b.hidden_time,
                           "mfu": model_flops / (b.step_time * hw.peak_flops), "partex_mfu": b.mfu,
                           "peak_bytes": b.memory.peak, "host_bytes": b.memory.host, "found_s": best.seconds}
    else:
        out["searched"] = None
    # the same run without the model's own remat and state offload: the search chooses
    # recompute / offload and where the state lives
    own = partex.Session.from_spec("llama", preset=name, mesh=mesh_text, hardware=hw,
                                   overrides=["remat=none", "optimizer_memory_host_offload=false",
                                              "parameter_memory_host_offload=false"])
    own.run(budget)
    best = own.best()
    out["searched_own_remat"] = None if best is None else {
        "plan": [own.label(d) for d in best.decisions], "step_s": best.report.step_time,
        "mfu": model_flops / (best.report.step_time * hw.peak_flops), "peak_bytes": best.report.memory.peak,
        "host_bytes": best.report.memory.host, "found_s": best.seconds,
        "remat": [own.label(d) for d in best.decisions if isinstance(d, (partex.Recompute, partex.Memory))]}
    return out


def show(rows: list[dict]) -> None:
    print("| run | chips, mesh | attention, remat | published MFU | partex: published sharding (step, MFU, ratio) | "
          "memory: device (HBM) / host | host transfers (hidden) | partex: searched plan (step, MFU, memory) | "
          "partex: searched, its own remat and state placement (step, MFU, memory / host, decisions) |")
    print("|---|---|---|---|---|---|---|---|---|")
    fmt = partex.format_bytes
    for o in rows:
        p = o["published_plan"]
        srch = o["searched"]
        found = (f"{srch['step_s']:.2f} s, {srch['mfu']:.1%}, {fmt(srch['peak_bytes'])}" if srch else "none fits")
        own = o["searched_own_remat"]
        chosen = (f"{own['step_s']:.2f} s, {own['mfu']:.1%}, {fmt(own['peak_bytes'])} / {fmt(own['host_bytes'])}, "
                  f"{', '.join(own['remat']) or 'none'}" if own else "none fits")
        moved = (f"{p['host_transfer_s']:.2f} s ({p['host_transfer_hidden_s']:.2f} s)"
                 if p["host_transfer_s"] else "-")
        print(f"| {o['run']} | {o['chips']} x {o['chip']}, {o['mesh']} | {o['attention']}, {o['remat']} | "
              f"{o['published_mfu']:.1%} | "
              f"{p['step_s']:.2f} s, {p['mfu']:.1%} ({p['mfu'] / o['published_mfu']:.2f}; compute "
              f"{p['compute_s']:.2f} s, comm {p['comm_s']:.2f} s, {p['hidden_s']:.2f} s hidden) | "
              f"{fmt(p['peak_bytes'])} ({fmt(p['hbm_bytes'])}){'' if p['fits'] else ': does not fit'}"
              f" / {fmt(p['host_bytes'])} | {moved} | {found} | {chosen} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=30.0, help="MCTS seconds per run (default 30)")
    ap.add_argument("--overlap", choices=("on", "off"), default="on")
    ap.add_argument("--only", action="append", choices=list(PUBLISHED_RUNS))
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for name in args.only or list(PUBLISHED_RUNS):
        rows.append(run(name, args.budget, args.overlap == "on"))
        print(f"  {name}: done", file=sys.stderr)
    show(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
