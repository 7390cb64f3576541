"""The ``partex`` command line (also ``python -m engine``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from ._errors import PartexError


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="demo model name (mlp, transformer, transformer-scan, unet, gns, moe) "
                                 "or module:attr / path/file.py:attr returning (fn, example_args)")
    p.add_argument("--preset", default="tiny", help="demo model preset: tiny (default), full, t32, t48")
    p.add_argument("--config", action="append", default=[], metavar="K=V",
                   help="override one demo config field, e.g. --config layers=12 (repeatable; "
                        "comma-separated pairs also work)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def _overrides(items: list[str]) -> list[str]:
    out = []
    for it in items:
        out += [s for s in it.split(",") if s.strip()]
    return out


def _add_mesh_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mesh", required=True, help="mesh axes as name=size pairs, e.g. data=4,model=2 "
                                                 "(optionally name=size@GB/s per axis)")
    p.add_argument("--hardware", default="tpu-v4",
                   help="hardware preset: tpu-v4 (default), tpu-v5e, tpu-v5p, a100-40gb, h100-80gb, cpu")
    p.add_argument("--memory", help="per-device memory budget, e.g. 16GiB (default: the preset's HBM)")
    for flag, what in (("--peak-flops", "peak FLOP/s per device"), ("--hbm-bandwidth", "HBM bytes/s"),
                       ("--link-bandwidth", "link bytes/s per mesh axis"), ("--link-latency", "seconds per collective step"),
                       ("--hbm", "HBM bytes per device")):
        p.add_argument(flag, type=str, help=f"override the preset's {what}")


def _number(flag: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        raise PartexError(f"{flag} must be a number, got {text!r}") from None


def mesh_and_hardware(args):
    from ._mesh import MeshSpec, get_hardware, parse_bytes

    mesh = MeshSpec.parse(args.mesh)
    hw = get_hardware(
        args.hardware,
        peak_flops=_number("--peak-flops", args.peak_flops),
        hbm_bandwidth=_number("--hbm-bandwidth", args.hbm_bandwidth),
        link_bandwidth=_number("--link-bandwidth", args.link_bandwidth),
        link_latency=_number("--link-latency", args.link_latency),
        hbm_bytes=parse_bytes(args.hbm) if args.hbm else None,
        memory_budget=parse_bytes(args.memory) if args.memory else None,
    )
    return mesh, hw


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="partex", description="Automatic partitioner for JAX programs.")
    sub = ap.add_subparsers(dest="command", required=True)
    a = sub.add_parser("analyze", help="named-dimension analysis of a model's training step")
    _add_model_args(a)
    a.add_argument("--top", type=int, default=12, help="named dims / groups to list (default 12)")

    pl = sub.add_parser("plan", help="write the plan of a hand-written strategy")
    _add_model_args(pl)
    _add_mesh_args(pl)
    pl.add_argument("--strategy", required=True, help="replicated, dp, megatron, zero3, expert (MoE)")
    pl.add_argument("--out", required=True, help="where to write the plan JSON")

    v = sub.add_parser("verify", help="compile a plan with XLA on simulated devices; compare with the prediction")
    _add_model_args(v)
    v.add_argument("plan", help="plan JSON written by `partex plan` or `partex search`")
    v.add_argument("--run", action="store_true", help="also run it (small configs) and compare numerics "
                                                      "with the unsharded function")
    return ap


def cmd_analyze(args) -> int:
    from . import analyze_model

    res = analyze_model(args.model, preset=args.preset, overrides=_overrides(args.config))
    an = res.analysis
    if args.json:
        out = an.to_json()
        out["model"] = res.model.name
        out["preset"] = res.model.preset
        out["trace_seconds"] = round(res.trace_seconds, 3)
        out["decision_space"] = an.decision_space(2)
        print(json.dumps(out))
        return 0
    s = an.summary()
    ds = an.decision_space(2)
    print(f"{res.model.name} ({res.model.preset}): {s['ops']} ops, {s['values']} values, "
          f"{s['dims']} dims -> {s['named_dims']} named dims in {s['groups']} decision groups, "
          f"{s['conflicts']} conflicts  [trace {res.trace_seconds:.2f}s, analysis {s['seconds']:.2f}s]")
    print(f"decision space on a 2-axis mesh: {ds['decisions']} (groups x axes) "
          f"vs {ds['raw_decisions']} (tensor dims x axes)")
    print("\ndecision groups (by bytes touched):")
    print(f"  {'label':<18} {'size':>8} {'named dims':>10} {'bytes':>12}")
    for g in an.decision_groups[: args.top]:
        print(f"  {g.label:<18} {g.size:>8} {len(g.named_dims):>10} {_fmt_bytes(g.bytes):>12}")
    if an.conflicts:
        print("\nconflicts:")
        for c in an.conflicts[: args.top]:
            d = an.describe_conflict(c)
            print(f"  [{d['group']}] {d['value']} {tuple(d['shape'])} dims {d['dims'][0]} and {d['dims'][1]}"
                  f" ({d['values']} tensors), made by {d['producer']} at {d['source']}")
    if an.unknown_primitives:
        print("\nprimitives with no factor rule (treated conservatively): "
              + ", ".join(f"{k} x{v}" for k, v in sorted(an.unknown_primitives.items())))
    return 0


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def cmd_plan(args) -> int:
    from . import analyze_model
    from ._cost import CostModel
    from ._plan import default_donate, make_plan
    from ._strategies import strategy_decisions

    mesh, hw = mesh_and_hardware(args)
    res = analyze_model(args.model, preset=args.preset, overrides=_overrides(args.config))
    decisions = strategy_decisions(args.strategy, res.analysis, mesh)
    donate = default_donate(res.program)
    cm = CostModel(res.analysis, mesh, hw, donate=donate)
    plan = make_plan(res, mesh, hw, decisions, strategy=args.strategy, donate=donate, cost_model=cm)
    check_mesh_divides(plan, res.program)
    plan.save(args.out)
    pr = plan.predicted
    if args.json:
        print(json.dumps({"out": args.out, "strategy": args.strategy, "predicted": pr,
                          "decisions": [d.to_json() for d in plan.decisions]}))
        return 0
    print(f"{args.strategy} on {mesh.text()} ({hw.name}): step {pr['step_time_s'] * 1e3:.3f} ms, "
          f"MFU {pr['mfu']:.1%}, peak memory {_fmt_bytes(pr['memory']['peak'])} per device "
          f"(budget {_fmt_bytes(hw.budget)}: {'fits' if pr['fits'] else 'DOES NOT FIT'})")
    print("decisions: " + (", ".join(f"{d.group}->{d.axis}" for d in plan.decisions) or "none (replicated)"))
    print(f"wrote {args.out}")
    return 0


def check_mesh_divides(plan, program) -> None:
    from ._plan import check_divisible

    check_divisible(plan, program)


def cmd_verify(args) -> int:
    from ._verify import KINDS, verify

    out = verify(args.model, args.plan, preset=args.preset, overrides=_overrides(args.config), run=args.run)
    if args.json:
        print(json.dumps(out))
        return 0
    m = out["memory"]
    print(f"{out['model']} {out.get('strategy') or ''} on {out['mesh']}: compiled in {out['compile_seconds']} s")
    print(f"  memory per device: predicted {_fmt_bytes(m['predicted'])}, XLA {_fmt_bytes(m['xla'])}"
          f" (ratio {m['ratio']:.2f})" if m["ratio"] else "")
    a = out["arguments"]
    print(f"  arguments: predicted {_fmt_bytes(a['predicted'])}, XLA {_fmt_bytes(a['xla'])}")
    for k in KINDS:
        c = out["collectives"][k]
        if c["predicted_bytes"] or c["xla_bytes"]:
            r = f"{c['ratio']:.2f}" if c["ratio"] else "-"
            print(f"  {k:<19} predicted {_fmt_bytes(c['predicted_bytes'])}, XLA {_fmt_bytes(c['xla_bytes'])} (ratio {r})")
    if "numerics" in out:
        n = out["numerics"]
        print(f"  numerics: max relative error {n['max_rel_err']:.2e} ({'ok' if n['ok'] else 'MISMATCH'})")
    return 0


COMMANDS = {"analyze": cmd_analyze, "plan": cmd_plan, "verify": cmd_verify}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except PartexError as e:
        print(f"partex: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("partex: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
