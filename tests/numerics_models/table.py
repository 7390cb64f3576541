"""verify's numerics on steps that amplify rounding: correct plans and wrong ones, judged by
the fixed tolerance (``noise=None``: every leaf within ``NUMERICS_RTOL`` of its scale) and by
the calibrated one (``partex.plan._numerics``), from the same runs.

    JAX_NUM_CPU_DEVICES=8 JAX_PLATFORMS=cpu .venv/bin/python tests/numerics_models/table.py [--libs | --only-libs]

Per case: the correct plan; the plan's outputs with the two halves of one parameter swapped (a
shard in the wrong place); and a data-parallel ``shard_map`` of the step that never averages its
gradients over the batch shards (each device steps on its own shard: a missing all-reduce).
``--libs`` adds keras-hub's GPT-2 (scripts/libmodels/keras_hub.py) under dp on data=8 and dp and
megatron on data=4,model=2 (``--only-libs``: those alone).
"""

from __future__ import annotations

import os
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: numerics_models, _libcheck

import jax  # noqa: E402
import numpy as np  # noqa: E402

import partex  # noqa: E402
from partex.plan._promote import is_low  # noqa: E402
from partex.plan._numerics import calibrate, compare_outputs  # noqa: E402

from numerics_models.wrong import swapped, unreduced  # noqa: E402

MEGATRON_INT8 = [("*/w1[1]", "model"), ("*/w1[0]", "data"), ("b/x[0]", "data")]


def row(case: str, plan: str, old: dict, new: dict) -> str:
    def verdict(d):
        return "ok" if d["ok"] else "MISMATCH"

    noise = new.get("noise")
    return (f"| {case} | {plan} | {old['max_rel_err']:.2e} / {old['tolerance']:.0e} {verdict(old)} "
            f"(`{old['worst_output']}`) | {new['max_rel_err']:.2e} / {new['tolerance']:.2e} {verdict(new)} "
            f"(`{new['worst_output']}`, noise {noise if noise is None else f'{noise:.1e}'}) |")


def cases(libs: bool):
    from numerics_models import attention, quant, vit

    yield "int8 matmul, STE, Adam", quant.make("int8", blocks=3, seed=1), "data=4,model=2", MEGATRON_INT8, \
        "out/0/blocks/0/w1", 1
    yield "fp8 matmul, STE, Adam", quant.make("fp8", blocks=3, seed=1), "data=4,model=2", MEGATRON_INT8, \
        "out/0/blocks/0/w1", 1
    yield "key-bias attention, Adam", attention.make(), "data=4,model=2", "megatron", "out/0/wq", 1
    yield "key-bias attention, Adam, bf16", attention.bfloat16(), "data=4,model=2", "megatron", "out/0/wq", 1
    yield "flax linen ViT, optax Adam", vit.make(), "data=8", "dp", \
        "out/0/params/block_0/MultiHeadDotProductAttention_0/query/kernel", 1
    if libs:
        import _libcheck as lc

        made = lc.load("keras_hub").make(arch="gpt2")[:2]
        for mesh, strategy in (("data=8", "dp"), ("data=4,model=2", "dp"), ("data=4,model=2", "megatron")):
            yield "keras-hub GPT-2, Keras AdamW", made, mesh, strategy, None, 2


def main() -> None:
    libs = "--libs" in sys.argv
    print("| case | plan | before: max rel err / tolerance | after: max rel err / tolerance |")
    print("|---|---|---|---|")
    only_libs = "--only-libs" in sys.argv
    for case, (step, args), mesh, strategy, swap, batch_args in cases(libs or only_libs):
        if only_libs and not case.startswith("keras"):
            continue
        t0 = time.perf_counter()
        s = partex.Session(step, args, mesh=mesh)
        plan = s.plan(strategy=strategy) if isinstance(strategy, str) else s.plan(strategy)
        cal, run_planned = calibrate(types.SimpleNamespace(fn=step, args=args), partex.apply_plan(plan, step))
        got = run_planned()
        name = strategy if isinstance(strategy, str) else "hidden->model, d_model->data, batch->data"
        print(row(case, f"{name} on {mesh} (correct)", compare_outputs(cal.paths, cal.ref, got), cal.compare(got)))
        if swap is None:  # the library's own leaves: the largest parameter
            params = [(np.size(x), p) for p, x in zip(cal.paths, cal.ref) if p.startswith("out/0/")]
            swap = max(params)[1]
        wrong = swapped(cal.paths, got, swap)
        print(row(case, f"halves of `{swap}` swapped", compare_outputs(cal.paths, cal.ref, wrong), cal.compare(wrong)))
        # a 16-bit step's shard_map runs in float32, as verify compares it (its inputs widened)
        wide = jax.tree.map(lambda x: x.astype(np.float32) if is_low(getattr(x, "dtype", None)) else x, args)
        bad = unreduced(step, wide, batch_args)
        print(row(case, "shard_map dp without the gradient all-reduce",
                  compare_outputs(cal.paths, cal.ref, bad), cal.compare(bad)))
        print(f"<!-- {case}: {time.perf_counter() - t0:.1f} s -->", flush=True)


if __name__ == "__main__":
    main()
