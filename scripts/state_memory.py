"""Where the step's state lives, as a decision and as the step's own code (docs/results.md,
"State in host memory").

For a published MaxText run the llama demo mirrors (its own sharding, as
``scripts/published_mfu.py`` scores it), the plan with a ``memory:host`` decision on the
optimizer state or on the parameters beside the same step written with MaxText's
``optimizer_memory_host_offload`` / ``parameter_memory_host_offload`` (the step's own
``device_put``s): step time, device peak, host memory and the host transfers, by partex's cost
model on the run's chip.

    JAX_NUM_CPU_DEVICES=8 .venv/bin/python scripts/state_memory.py [RUN ...]
"""

from __future__ import annotations

import sys

import partex
from partex import Memory
from partex.demo_models import PUBLISHED_RUNS

FLAGS = {"optimizer": "optimizer_memory_host_offload", "parameters": "parameter_memory_host_offload"}


def published_plan(s: partex.Session, mesh: dict) -> list:
    """The run's own sharding: zero3 on fsdp (x tensor), MaxText's activation_embed rule."""
    axes = list(mesh)
    dec = s.strategy("zero3")
    if mesh.get("tensor", 1) > 1:
        batch = set(s.analysis.roles.batch_groups)
        dec += [partex.Shard(d.group, "tensor") for d in list(dec)
                if isinstance(d, partex.Shard) and d.axis == axes[0] and d.group not in batch]
    return dec


def compare(name: str) -> None:
    pub = PUBLISHED_RUNS[name]
    mesh = dict(pub["mesh"])
    if len(mesh) == 1:
        mesh["tensor"] = 1
    text = ",".join(f"{a}={n}" for a, n in mesh.items())
    hw = partex.get_hardware(pub["chip"], memory_margin=0.1)
    base = partex.Session.from_spec("llama", preset=name, mesh=text, hardware=hw)
    plan = published_plan(base, mesh)
    rows = [("on the device", base.evaluate(plan))]
    for st, role in enumerate(partex.STATES):
        own = partex.Session.from_spec("llama", preset=name, mesh=text, hardware=hw, overrides=[f"{FLAGS[role]}=true"])
        rows.append((f"{role}: `memory:host` decision", base.evaluate([*plan, Memory(st, "host")])))
        rows.append((f"{role}: the step's own `{FLAGS[role]}`", own.evaluate(published_plan(own, mesh))))
    gib = 2**30
    print(f"\n{name} ({pub['chips']} x {pub['chip']}, {text})\n")
    print("| state | step | device peak | host | host transfers (hidden) |")
    print("|---|---|---|---|---|")
    for label, r in rows:
        moved = [c for c in r.collectives if c.kind == "host-transfer"]
        print(f"| {label} | {r.step_time:.3f} s | {r.memory.peak / gib:.2f} GiB | {r.memory.host / gib:.2f} GiB | "
              f"{sum(c.time for c in moved):.3f} s ({sum(c.hidden for c in moved):.3f} s) |")


if __name__ == "__main__":
    for run in sys.argv[1:] or ["llama3.1-8b-v6e", "llama2-70b-v6e"]:
        compare(run)
