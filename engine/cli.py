"""The ``partex`` command line (also ``python -m partex``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
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

    se = sub.add_parser("search", help="search for the fastest plan that fits (MCTS)")
    _add_model_args(se)
    _add_mesh_args(se)
    se.add_argument("--budget", type=float, default=60.0, help="search seconds (default 60)")
    se.add_argument("--seed", type=int, default=0, help="RNG seed (default 0)")
    se.add_argument("--pin", action="append", default=[], metavar="LABEL=AXIS",
                    help="fix a decision, e.g. --pin ffn=model (repeatable)")
    se.add_argument("--forbid", action="append", default=[], metavar="LABEL=AXIS",
                    help="never take a decision, e.g. --forbid batch=model (repeatable)")
    se.add_argument("--resume", help="continue a saved search (its state file)")
    se.add_argument("--cold", action="store_true", help="do not warm-start from the hand strategies")
    se.add_argument("--state", help="where to save the resumable search state (default: OUT.search)")
    se.add_argument("--out", required=True, help="where to write the best plan JSON")
    se.add_argument("--verify", action="store_true",
                    help="compile the best plan with XLA on simulated devices (compile-only) and, where XLA "
                         "says it does not fit the budget, fall back to the next best plan (up to 5 times)")

    b = sub.add_parser("bench", help="hand plans, the ILP and the MCTS search side by side")
    _add_model_args(b)
    _add_mesh_args(b)
    b.add_argument("--budget", type=float, default=60.0, help="MCTS search seconds (default 60)")
    b.add_argument("--ilp-time", type=float, default=30.0, help="ILP solver time limit in seconds (default 30)")
    b.add_argument("--seed", type=int, default=0, help="RNG seed of the search (default 0)")
    b.add_argument("--cold", action="store_true", help="do not warm-start the search from the hand strategies")
    b.add_argument("--out-dir", help="also write each row's plan JSON here")
    b.add_argument("--verify", action="store_true",
                   help="check the mcts plan with XLA (compile-only); over the budget, take the next best")

    sv = sub.add_parser("serve", help="serve the explorer web app (panel) on 127.0.0.1:5006")
    sv.add_argument("--port", type=int, default=5006)
    sv.add_argument("--address", default="127.0.0.1")
    sv.add_argument("--show", action="store_true", help="open a browser")

    v = sub.add_parser("verify", help="compile a plan with XLA on simulated devices; compare with the prediction")
    _add_model_args(v)
    v.add_argument("plan", help="plan JSON written by `partex plan` or `partex search`")
    v.add_argument("--run", action="store_true", help="also run it (small configs) and compare numerics "
                                                      "with the unsharded function")
    v.add_argument("--inputs-only", action="store_true",
                   help="apply the input/output shardings alone, without intermediate constraints "
                        "(to see what XLA's own propagation does)")
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
    from ._plan import check_divisible, default_donate, make_plan
    from ._strategies import strategy_decisions

    mesh, hw = mesh_and_hardware(args)
    res = analyze_model(args.model, preset=args.preset, overrides=_overrides(args.config))
    decisions = strategy_decisions(args.strategy, res.analysis, mesh)
    donate = default_donate(res.program)
    cm = CostModel(res.analysis, mesh, hw, donate=donate)
    plan = make_plan(res, mesh, hw, decisions, strategy=args.strategy, donate=donate, cost_model=cm)
    check_divisible(plan, res.program)
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


def cmd_verify(args) -> int:
    from ._verify import KINDS, verify

    out = verify(args.model, args.plan, preset=args.preset, overrides=_overrides(args.config), run=args.run,
                 constrain=not args.inputs_only)
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


def _decision_arg(flag: str, text: str) -> tuple[str, str]:
    if text.count("=") != 1 or not all(text.split("=")):
        raise PartexError(f"{flag} {text!r}: write LABEL=AXIS, e.g. {flag} ffn=model")
    label, axis = text.split("=")
    return label.strip(), axis.strip()


class _Progress:
    """One-line progress on stderr: simulations, speed, best step time and memory."""

    def __init__(self, total: float, enabled: bool):
        self.total = total
        self.enabled = enabled
        self.t0 = time.perf_counter()
        self.last = 0.0

    def __call__(self, search) -> None:
        now = time.perf_counter()
        if not self.enabled or now - self.last < 0.25:
            return
        self.last = now
        st = search.stats()
        b = search._best
        best = f"best {b[0] * 1e3:.3f} ms" if b else f"no fit yet (min {_fmt_bytes(st['smallest_memory'])})"
        frac = min(1.0, (now - self.t0) / self.total) if self.total > 0 else 1.0
        bar = "#" * int(frac * 20)
        sys.stderr.write(f"\r[{bar:<20}] {now - self.t0:5.1f}/{self.total:.0f}s  sims {st['simulations']}"
                         f"  {st['sims_per_s']:.0f}/s  {best}   ")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def cmd_search(args) -> int:
    import signal

    from . import analyze_model
    from ._search import Search

    mesh, hw = mesh_and_hardware(args)
    pins = [_decision_arg("--pin", p) for p in args.pin]
    forbids = [_decision_arg("--forbid", p) for p in args.forbid]
    state_path = args.state or f"{args.out}.search"
    if args.resume:
        search = Search.load(args.resume)
        if search.mesh != mesh:
            raise PartexError(f"{args.resume} was searched on mesh {search.mesh.text()}, not {mesh.text()}")
        search.hw = hw
    else:
        res = analyze_model(args.model, preset=args.preset, overrides=_overrides(args.config))
        search = Search(res, mesh, hw, seed=args.seed, warm_start=not args.cold)
    for label, axis in pins:
        search.pin(label, axis)
    for label, axis in forbids:
        search.forbid(label, axis)

    def _stop(signum, frame):
        search.request_stop()  # a flag only: the search returns after the simulation in hand

    old = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    progress = _Progress(args.budget, enabled=not args.json and sys.stderr.isatty())
    interrupted = False
    saved = [time.perf_counter() - 9.0]

    def tick(s) -> None:
        progress(s)
        now = time.perf_counter()
        if now - saved[0] >= 10.0:  # autosave: even a kill -9 loses at most 10 s
            s.save(state_path)
            saved[0] = now

    try:
        search.run(args.budget, callback=tick)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        progress.close()
        search.save(state_path)  # nothing lost: the search resumes from here
    interrupted = interrupted or search.stop_requested
    best = search.best()
    if best is None:
        what = f" with pins {', '.join(search.label(p) for p in search.pins)}" if search.pins else ""
        raise PartexError(
            f"no plan fits the {_fmt_bytes(hw.budget)} per-device budget{what}: the smallest memory found is "
            f"{_fmt_bytes(search.smallest_memory[0])} (search state saved to {state_path}; raise --memory, "
            "use a larger mesh, or unpin)")
    xla = None
    if args.verify:
        best, xla = _verified_best(search, args, state_path)
    plan = search.best_plan()
    plan.save(args.out)
    st = search.stats()
    r = best.report
    if args.json:
        print(json.dumps({"out": args.out, "state": state_path, "interrupted": interrupted,
                          "step_time_s": r.step_time, "mfu": r.mfu, "memory_bytes": r.memory.peak,
                          "fits": r.fits, "search_s": best.seconds, "simulations": st["simulations"],
                          "xla_memory_bytes": xla, "decisions": [d.to_json() for d in plan.decisions]}))
        return 0
    print(f"{'interrupted: ' if interrupted else ''}best plan after {st['simulations']} simulations "
          f"({st['seconds']:.1f} s, found at {best.seconds:.1f} s): step {r.step_time * 1e3:.3f} ms, "
          f"MFU {r.mfu:.1%}, peak memory {_fmt_bytes(r.memory.peak)} (budget {_fmt_bytes(hw.budget)})")
    print("decisions: " + (", ".join(f"{d.group}->{d.axis}{' (pinned)' if d.pinned else ''}"
                                      for d in plan.decisions) or "none (replicated)"))
    if xla is not None:
        print(f"XLA (compile-only, {mesh.size} simulated devices): {_fmt_bytes(xla)} per device")
    print(f"wrote {args.out} and the resumable search state {state_path}")
    return 0


def _verified_best(search, args, state_path, tries: int = 5):
    """Check the best plan with XLA; a plan XLA puts over the budget is marked infeasible
    and the next best is checked. Returns (best, XLA's per-device bytes)."""
    import os
    import tempfile

    from ._verify import verify

    budget = search.hw.budget
    for _ in range(tries):
        best = search.best()
        if best is None:
            break
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "candidate.json")
            search.best_plan().save(path)
            out = verify(args.model, path, preset=args.preset, overrides=_overrides(args.config))
        xla = out["memory"]["xla"]
        if xla <= budget:
            return best, xla
        sys.stderr.write(f"partex: XLA puts the best plan at {_fmt_bytes(xla)} per device (predicted "
                         f"{_fmt_bytes(best.report.memory.peak)}), over the budget: trying the next best\n")
        search.mark_infeasible(best.decisions, xla)
        if state_path:
            search.save(state_path)
    raise PartexError(f"no plan checked by XLA fits the {_fmt_bytes(budget)} budget after {tries} tries; "
                      "search longer, raise --memory or use a larger mesh"
                      + (f" (state saved to {state_path})" if state_path else ""))


def cmd_bench(args) -> int:
    import os

    from . import analyze_model
    from ._ilp import solve_ilp
    from ._plan import make_plan
    from ._search import Search
    from ._strategies import baseline_names, strategy_decisions

    mesh, hw = mesh_and_hardware(args)
    res = analyze_model(args.model, preset=args.preset, overrides=_overrides(args.config))
    search = Search(res, mesh, hw, seed=args.seed, warm_start=not args.cold)
    cm = search.cm
    rows, plans = [], {}

    def row(name, decisions, report, search_s, **extra):
        rows.append({"strategy": name, "step_time_s": report.step_time if report else None,
                     "mfu": report.mfu if report else None,
                     "memory_bytes": report.memory.peak if report else None,
                     "fits": bool(report.fits) if report else False, "search_s": search_s, **extra})
        if report is not None:
            plans[name] = decisions

    for name in baseline_names(res.analysis):
        dec = strategy_decisions(name, res.analysis, mesh)
        row(name, dec, cm.evaluate(dec), 0.0)
    ilp = solve_ilp(cm, time_limit=args.ilp_time)
    row("ilp", list(ilp.decisions), ilp.report, ilp.solve_seconds, status=ilp.status,
        build_s=ilp.build_seconds)
    import signal

    progress = _Progress(args.budget, enabled=not args.json and sys.stderr.isatty())
    old = {sig: signal.signal(sig, lambda signum, frame: search.request_stop())
           for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        search.run(args.budget, callback=progress)  # Ctrl-C ends the search early, the table still prints
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        progress.close()
    xla = None
    if args.verify and search.best() is not None:
        _, xla = _verified_best(search, args, None)
    best = search.best()
    st = search.stats()
    row("mcts", list(best.decisions) if best else [], best.report if best else None,
        best.seconds if best else None, simulations=st["simulations"], total_s=st["seconds"],
        smallest_memory=st["smallest_memory"], xla_memory_bytes=xla)
    hand = [r["step_time_s"] for r in rows if r["fits"] and r["strategy"] not in ("mcts", "ilp", "replicated")]
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        for name, dec in plans.items():
            make_plan(res, mesh, hw, dec, strategy=name, donate=search.donate, cost_model=cm).save(
                os.path.join(args.out_dir, f"{name}.json"))
    if args.json:
        print(json.dumps({"model": res.model.name, "preset": res.model.preset, "mesh": mesh.text(),
                          "hardware": hw.name, "budget_bytes": hw.budget, "rows": rows}))
        return 0
    print(f"{res.model.name} ({res.model.preset}) on {mesh.text()}, {hw.name}, budget {_fmt_bytes(hw.budget)}")
    print(f"  {'strategy':<11} {'step time':>12} {'MFU':>7} {'memory':>11} {'fits':>5} {'search s':>9}")
    for r in rows:
        t = f"{r['step_time_s'] * 1e3:.3f} ms" if r["step_time_s"] is not None else "-"
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
        mem = _fmt_bytes(r["memory_bytes"]) if r["memory_bytes"] is not None else "-"
        ss = f"{r['search_s']:.1f}" if r["search_s"] is not None else "-"
        print(f"  {r['strategy']:<11} {t:>12} {mfu:>7} {mem:>11} {('yes' if r['fits'] else 'NO'):>5} {ss:>9}")
    mc = rows[-1]
    if mc["fits"] and hand:
        print(f"mcts / best hand plan: {mc['step_time_s'] / min(hand):.3f}x")
    return 0


def cmd_serve(args) -> int:
    try:
        from . import explorer
    except ImportError:
        raise PartexError("the explorer is not installed next to the engine (explorer/ package missing)") from None
    return explorer.serve(port=args.port, address=args.address, show=args.show)


COMMANDS = {"analyze": cmd_analyze, "plan": cmd_plan, "verify": cmd_verify, "search": cmd_search,
            "bench": cmd_bench, "serve": cmd_serve}


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
