"""XLA's compile-only memory of the plan partex chooses for Llama 3.1 405B on 8192 TPU v5p
chips, beside the prediction.

    python scripts/llama405b_xla_memory.py [--plan plan.json | --search [--seconds 90]] \
        [--shrink data=8] [--layers 2,8,126] [--scheduler default|memory|both] [--json out.json]

The plan: by default ``CHOSEN`` below, the decisions of the plan that
``Session.search_meshes(8192, seconds=90, max_axes=4)`` chose (docs/results.md, "Choosing the
mesh": data=32,fsdp=32,tensor=4,seq=2, 17.69 s, 34.6 GiB), made on that mesh; ``--plan``: a
plan of the ``llama3.1-405b`` preset on 8192 chips; ``--search``: a new mesh search (a
time-budgeted search: on another machine, or a busy one, it may choose another mesh and
plan; saved as ``llama405b_plan.json``). XLA:CPU compiles for at most 2048 simulated devices here (4096 and
8192 fail with "Multiprocess computations aren't implemented on the CPU backend"), so the
plan is compiled on a smaller mesh: ``--shrink AXIS=N`` sets one mesh axis to N and divides the
global batch by the same factor. That axis must shard the batch (so each device keeps its
sequences); any other dim it shards keeps its global size, so those shards grow by the
factor (printed: the leaves whose per-device shape changes). The plan's decisions, by anchor
and in their order, are replayed on the smaller mesh at each ``--layers`` depth; each row is
partex's prediction (TPU pricing, and XLA:CPU's lowering, the one verify compares: there a
reduce-scatter is an all-reduce and a slice) and XLA's compile-only figures, per device.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

from _checkout import use_checkout_from_env

use_checkout_from_env()

import partex  # noqa: E402
from partex.cost import CostModel  # noqa: E402
from partex.demo_models import build  # noqa: E402

GiB = 2**30
SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"  # XLA:CPU's memory scheduler

# the mesh search's plan for llama3.1-405b on 8192 tpu-v5p chips: (anchor, mesh axis), in order
# (ffn, batch, d_model, batch, seq, head_dim, d_model, vocab, heads, vocab, batch)
CHOSEN_MESH = "data=32,fsdp=32,tensor=4,seq=2"
CHOSEN = [("params/layers/w_down:1", "seq"), ("batch/targets:0", "fsdp"), ("params/layers/w_down:2", "fsdp"),
          ("batch/targets:0", "data"), ("batch/targets:1", "tensor"), ("params/layers/wq:3", "data"),
          ("params/layers/w_down:2", "tensor"), ("params/lm_head:1", "tensor"), ("params/layers/wo:1", "tensor"),
          ("params/lm_head:1", "fsdp"), ("batch/targets:0", "seq")]


def per_device(spec, shape, sizes) -> tuple[int, ...]:
    """A leaf's per-device shape under a PartitionSpec (a list of axis names or lists)."""
    out = []
    for dim, entry in zip(shape, list(spec) + [None] * (len(shape) - len(spec))):
        axes = [] if entry is None else [entry] if isinstance(entry, str) else list(entry)
        out.append(dim // math.prod(sizes[a] for a in axes))
    return tuple(out)


def leaf_shapes(overrides: list[str]) -> dict[str, tuple[int, ...]]:
    import jax

    model = build("llama", "llama3.1-405b", dict(o.split("=", 1) for o in overrides))
    flat = jax.tree_util.tree_flatten_with_path(model.args)[0]
    names = ["params", "opt_state", "batch"]
    out = {}
    for path, leaf in flat:
        keys = [getattr(k, "key", getattr(k, "idx", getattr(k, "name", None))) for k in path]
        keys[0] = names[keys[0]] if isinstance(keys[0], int) else keys[0]
        out["/".join(str(k) for k in keys)] = tuple(leaf.shape)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", help="a plan of llama3.1-405b on 8192 chips (default: CHOSEN)")
    ap.add_argument("--search", action="store_true", help="search the meshes for a plan instead")
    ap.add_argument("--seconds", type=float, default=90.0, help="the mesh search's budget")
    ap.add_argument("--shrink", default="data=8", help="AXIS=N: the smaller mesh")
    ap.add_argument("--layers", default="2,8,126")
    ap.add_argument("--scheduler", default="default", choices=["default", "memory", "both"])
    ap.add_argument("--json")
    args = ap.parse_args()
    hw = partex.get_hardware("tpu-v5p", memory_margin=0.1)

    if args.plan:
        plan = partex.Plan.load(args.plan)
    elif args.search:
        s = partex.Session.from_spec("llama", preset="llama3.1-405b", mesh="fsdp=8192", hardware=hw)
        found = s.search_meshes(8192, seconds=args.seconds, max_axes=4)
        plan = found.session.best_plan()
        plan.save("llama405b_plan.json")
    else:
        s = partex.Session.from_spec("llama", preset="llama3.1-405b", mesh=CHOSEN_MESH, hardware=hw)
        plan = s.plan(s.decisions(CHOSEN))
    full = plan.to_json()
    sizes = dict(zip(full["mesh"]["axes"], full["mesh"]["sizes"]))
    pairs = [(d["anchor"], d["axis"]) for d in full["decisions"]]
    print("plan:", plan.mesh.text(), [f"{d['group']}->{d['axis']}" for d in full["decisions"]])
    print(f"predicted on {plan.mesh.text()}: step {full['predicted']['step_time_s']:.2f} s, "
          f"peak {full['predicted']['memory']['peak'] / GiB:.2f} GiB")

    axis, n = args.shrink.split("=")
    factor = sizes[axis] // int(n)
    batch_axes = full["inputs"]["batch/tokens"][0]
    if axis not in ([batch_axes] if isinstance(batch_axes, str) else batch_axes or []):
        raise SystemExit(f"{axis} does not shard the batch: the smaller mesh would change every activation")
    small = dict(sizes, **{axis: int(n)})
    mesh = ",".join(f"{a}={k}" for a, k in small.items())
    batch = 2048 // factor

    # the leaves whose per-device shape changes on the smaller mesh (the full depth)
    big, little = leaf_shapes([]), leaf_shapes([f"batch={batch}"])
    changed = {k: (per_device(full["inputs"][k], big[k], sizes), per_device(full["inputs"][k], little[k], small))
               for k in full["inputs"] if k in big}
    changed = {k: v for k, v in changed.items() if v[0] != v[1]}
    print(f"smaller problem: mesh {mesh}, batch {batch}; leaves whose per-device shape changes:",
          {k: f"{a} -> {b}" for k, (a, b) in changed.items()} or "none")

    flags = {"default": [""], "memory": [SCHEDULER_FLAG], "both": ["", SCHEDULER_FLAG]}[args.scheduler]
    print("| layers | XLA:CPU scheduler | predicted GiB (TPU; XLA:CPU lowering) | XLA GiB | predicted / XLA "
          "| arguments GiB predicted / XLA | XLA temp GiB | compile s |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for layers in [int(x) for x in args.layers.split(",")]:
        overrides = [f"batch={batch}", f"layers={layers}"]
        s2 = partex.Session.from_spec("llama", preset="llama3.1-405b", mesh=mesh, overrides=overrides, hardware=hw)
        dec = s2.decisions(pairs)
        p2 = s2.plan(dec)
        if p2.to_json()["inputs"] != full["inputs"]:
            raise SystemExit(f"at {layers} layers the decisions give other PartitionSpecs than the plan's")
        tpu = s2.evaluate(dec).memory.peak
        cpu = CostModel(s2.analysis, s2.mesh, s2.hardware, donate=s2.donate, lowering="cpu").evaluate(dec).memory.peak
        for flag in flags:
            old = os.environ.get("XLA_FLAGS")
            os.environ["XLA_FLAGS"] = f"{old or ''} {flag}".strip()
            t0 = time.perf_counter()
            try:
                v = s2.verify(p2, mark=False)
            finally:
                if old is None:
                    del os.environ["XLA_FLAGS"]
                else:
                    os.environ["XLA_FLAGS"] = old
            wall = time.perf_counter() - t0
            x = v.xla_memory
            print(f"| {layers} | {v.xla_cpu_scheduler} | {tpu / GiB:.2f}; {cpu / GiB:.2f} | {x['total'] / GiB:.2f} "
                  f"| {tpu / x['total']:.2f}; {cpu / x['total']:.2f} | {v.arguments.predicted / GiB:.3f} / "
                  f"{x['argument'] / GiB:.3f} | {x['temp'] / GiB:.2f} | {v.compile_seconds:.1f} ({wall:.0f} in all) |",
                  flush=True)
            rows.append({"layers": layers, "scheduler": v.xla_cpu_scheduler, "predicted_tpu": tpu, "predicted_cpu": cpu,
                         "xla": dict(x), "compile_s": v.compile_seconds, "wall_s": wall})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"plan": full, "mesh": mesh, "batch": batch, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
