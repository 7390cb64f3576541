"""The per-library table on the tiny configs (8 simulated CPU devices, mesh
data=4,model=2): ops, decision groups at 2 and 4 layers, the hand plans' shardings, their
predicted/XLA memory and collective-byte ratios, and the searched plan (budget 0.5x the
replicated plan's memory): its numerics against the unsharded step and whether it fits per XLA.

    JAX_NUM_CPU_DEVICES=8 .venv/bin/python scripts/library_table.py [LIB ...] > table.md

LIB: the modules in scripts/libmodels (flax_linen flax_nnx equinox_gpt gemma keras_hub
maxtext_llama maxtext_moe maxtext_explicit); default all.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("KERAS_BACKEND", "jax")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import _libcheck as lc  # noqa: E402
import partex  # noqa: E402

LIBS = ["flax_linen", "flax_nnx", "equinox_gpt", "gemma", "keras_hub", "maxtext_llama", "maxtext_moe", "maxtext_explicit"]


def ratio_text(out) -> str:
    parts = [f"mem {out.memory.ratio:.2f}"]
    for kind, c in out.collectives.items():
        if c.xla_bytes or c.predicted_bytes:
            parts.append(f"{kind} {c.ratio:.2f}" if c.ratio is not None else f"{kind} -")
    return ", ".join(parts)


def row(lib: str) -> list[str]:
    mod = lc.load(lib)
    t0 = time.perf_counter()
    made = mod.make()
    fn, args, names = lc.unpack(made)
    ops = len(partex.analyze(fn, *args, axis_names=names).program.ops)
    groups = [lc.decision_groups(mod.make(layers=n)) for n in (2, 4)]
    s = lc.session(made)
    lines = [f"### {lib}", "",
             f"ops {ops}; decision groups at 2 / 4 layers: {groups[0]} / {groups[1]}; "
             f"user shardings kept: {len(s.fixed)} fixed groups", "",
             "| plan | shardings | predicted / XLA |", "|---|---|---|"]
    for name in ("dp", "megatron", "zero3"):
        shard = lc.sharded_groups(s, name)
        out = s.verify(s.plan(strategy=name), mark=False)
        lines.append(f"| {name} | {', '.join(f'{g}→{a}' for g, a in shard.items())} | {ratio_text(out)} |")
    try:
        out = lc.check_search_fits(mod, simulations=200)
        n = out.numerics
        verdict = (f"fits per XLA ({partex.format_bytes(out.memory.xla)} ≤ "
                   f"{partex.format_bytes(out.budget)}), numerics max rel err {n.max_rel_err:.1e} (ok"
                   + (f", computed in {n.computed_in}" if n.computed_in else "") + ")")
    except AssertionError as e:
        verdict = f"FAILS: {str(e).splitlines()[0]}"
    lines += ["", f"searched plan (budget 0.5x replicated, 200 simulations): {verdict}",
              f"({time.perf_counter() - t0:.0f} s)", ""]
    return lines


def main(argv: list[str]) -> None:
    for lib in argv or LIBS:
        print("\n".join(row(lib)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
