"""Plans on the accelerator this process has (a GPU or TPU, where a machine has one): apply
and run plans with recompute decisions on its first device and compare with the unsharded
step, then compile a wider transformer under each recompute kind and put XLA's memory for
this backend beside partex's prediction (XLA:CPU, where everything else is checked, schedules
and realises recomputation differently).

    python scripts/accelerator_check.py --out result.json          # on the accelerator machine
    JAX_PLATFORMS=cpu python scripts/accelerator_check.py --quick  # the same steps, tiny, here
"""

import argparse
import json
import time
import traceback


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the results here (JSON)")
    ap.add_argument("--quick", action="store_true", help="the tiny model only")
    ap.add_argument("--config", default="layers=4,seq=2048,batch=4",
                    help="overrides of the T32 transformer compiled per recompute kind")
    args = ap.parse_args()

    import jax

    result = {"jax": jax.__version__, "devices": [str(d) for d in jax.devices()],
              "platform": jax.devices()[0].platform, "rows": []}

    def save():
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1, default=str)

    try:
        import partex
        from partex import demo_models
    except Exception:
        result["import_error"] = traceback.format_exc()
        save()
        print(result["import_error"])
        return
    hardware = {"gpu": "h100-80gb", "tpu": "tpu-v5p"}.get(result["platform"], "cpu")
    cases = [("tiny", [], True)]
    if not args.quick:
        cases.append(("t32", [c for c in args.config.split(",") if c], False))
    for preset, overrides, run in cases:
        model = demo_models.build("transformer", preset, demo_models.parse_overrides(overrides))
        s = partex.Session.from_spec("transformer", preset=preset, overrides=overrides, mesh="data=1",
                                     hardware=hardware)
        for kind in (None, "dots", "full"):
            decisions = [(u.label, "recompute:" + kind) for u in s.units] if kind else []
            plan = s.plan(decisions, strategy=f"recompute:{kind or 'none'}")
            row = {"preset": preset, "config": overrides, "recompute": kind or "none"}
            t0 = time.perf_counter()
            try:
                out = partex.verify(plan, model.fn, model.args, run=run, axis_names=model.axis_names)
                row.update(predicted=out.memory.predicted, xla=out.memory.xla,
                           ratio=out.memory.ratio, xla_memory=out.xla_memory,
                           compile_s=out.compile_seconds, numerics=out.numerics and out.numerics.to_json())
            except Exception:
                row["error"] = traceback.format_exc()[-3000:]
            row["seconds"] = round(time.perf_counter() - t0, 1)
            result["rows"].append(row)
            save()
            print(json.dumps({k: v for k, v in row.items() if k != "xla_memory"}, default=str), flush=True)


if __name__ == "__main__":
    main()
