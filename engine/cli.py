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


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="partex", description="Automatic partitioner for JAX programs.")
    sub = ap.add_subparsers(dest="command", required=True)
    a = sub.add_parser("analyze", help="named-dimension analysis of a model's training step")
    _add_model_args(a)
    a.add_argument("--top", type=int, default=12, help="named dims / groups to list (default 12)")
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


COMMANDS = {"analyze": cmd_analyze}


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
