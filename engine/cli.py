"""The ``partex`` command line (also ``python -m partex``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import re
import sys
import time
from typing import Sequence, overload

from ._decisions import STATE_LABELS, STATES
from ._errors import PartexError
from ._loader import analyze_model, demo_names, load_model
from ._mesh import Hardware, format_bytes, get_hardware, parse_bytes
from ._checks import verify_plan
from ._loader import ModelSpec, analyze_spec, model_spec
from ._meshes import effort_of
from ._session import Session, mesh_searcher
from .plan._explain import explain_table
from .plan._measure import measure
from .plan._export import comparison_table, export_text
from .plan._plan import Plan
from .plan._specs import check_divisible
from .plan._verify import KINDS
from .planner._scorers import default_processes


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help=f"demo model name ({', '.join(demo_names())}) "
                                 "or module:attr / path/file.py:attr returning (fn, example_args)")
    p.add_argument("--preset", help="demo model preset: tiny (default), full, t32, t48, ...")
    p.add_argument("--config", action="append", default=[], metavar="K=V",
                   help="override one demo config field, e.g. --config layers=12 (repeatable; "
                        "comma-separated pairs also work)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def _overrides(items: list[str]) -> list[str]:
    out = []
    for it in items:
        out += [s for s in it.split(",") if s.strip()]
    return out


def _add_mesh_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--mesh", required=required, help="mesh axes as name=size pairs, e.g. data=4,model=2 "
                                                     "(optionally name=size@GB/s per axis); 'step': the mesh "
                                                     "the step's own shardings name")
    p.add_argument("--hardware",
                   help="hardware preset: tpu-v4 (default), tpu-v5e, tpu-v5p, tpu-v6e, a100-40gb, h100-80gb, cpu; "
                        "or a profile file measured on your devices (`partex calibrate --out PROFILE.json`)")
    p.add_argument("--memory", help="per-device memory budget, e.g. 16GiB (default: the preset's HBM)")
    p.add_argument("--margin", type=float, default=None,
                   help="share of the budget a plan keeps free by the cost model's count "
                        "(default 0.1: the memory model is an estimate, the budget a promise)")
    p.add_argument("--pipeline", metavar="STACK:AXIS:MICROBATCHES[:SCHEDULE][:RECOMPUTE]",
                   help="run a scanned layer stack as a pipeline over a mesh axis (its stages), e.g. "
                        "stack0:stage:8 (fill and drain: GPipe), stack0:stage:8:circular2 (the circular "
                        "schedule, 2 rounds), stack0:stage:8:full (each stage recomputing its layers: full "
                        "or dots); `partex analyze` lists the stacks")
    p.add_argument("--user-shardings", choices=("keep", "replace"), default=None,
                   help="the step's own sharding constraints: keep them as fixed decisions (default), or "
                        "replace them with the plan's")
    p.add_argument("--overlap", choices=("on", "off"), default=None,
                   help="collectives overlap independent compute, as XLA schedules them on TPU and GPU "
                        "(default: the preset's; off on cpu)")
    for flag, what in (("--peak-flops", "peak FLOP/s per device"), ("--hbm-bandwidth", "HBM bytes/s"),
                       ("--link-bandwidth", "link bytes/s per mesh axis"), ("--link-latency", "seconds per collective step"),
                       ("--hbm", "HBM bytes per device"),
                       ("--host-bandwidth", "bytes/s between a device and host memory (offloaded values)"),
                       ("--host-memory", "host memory per device for offloaded values (e.g. 100GiB; 0: "
                                         "keep nothing in host memory)")):
        p.add_argument(flag, type=str, help=f"override the preset's {what}")


def _number(flag: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        raise PartexError(f"{flag} must be a number, got {text!r}") from None


@overload
def _hardware(args, base: None = None) -> Hardware: ...
@overload
def _hardware(args, base: Hardware) -> Hardware | None: ...
def _host_memory(text: str | None) -> float | None:
    """--host-memory's bytes: a size, or 0 for none (plans keep nothing in host memory)."""
    if not text:
        return None
    return 0.0 if _SIZE_ZERO.match(text) else parse_bytes(text)


SEARCH_SECONDS = 60.0  # a search's budget where --budget is not given (the mesh search: none)
_SIZE_ZERO = re.compile(r"^\s*0*\.?0*\s*([KMGT]i?B|B)?\s*$")


def _hardware(args, base: Hardware | None = None) -> Hardware | None:
    """The --hardware preset (default tpu-v4) with the figures overridden on the command
    line. Resuming (``base``: the session's hardware), flags not given change nothing:
    None when no hardware flag is given at all."""
    overrides = dict(
        peak_flops=_number("--peak-flops", args.peak_flops),
        hbm_bandwidth=_number("--hbm-bandwidth", args.hbm_bandwidth),
        link_bandwidth=_number("--link-bandwidth", args.link_bandwidth),
        link_latency=_number("--link-latency", args.link_latency),
        host_bandwidth=_number("--host-bandwidth", getattr(args, "host_bandwidth", None)),
        hbm_bytes=parse_bytes(args.hbm) if args.hbm else None,
        host_memory_bytes=_host_memory(getattr(args, "host_memory", None)),
        memory_budget=parse_bytes(args.memory) if args.memory else None,
        memory_margin=args.margin,
        overlap=None if getattr(args, "overlap", None) is None else args.overlap == "on",
    )
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if base is not None and args.hardware is None:
        return base.replace(**overrides) if overrides else None
    return get_hardware(args.hardware or "tpu-v4", **overrides)


def _model_output():
    """While a user's model is imported, built and traced, its own prints go to stderr:
    stdout is partex's (``--json`` must parse)."""
    return contextlib.redirect_stdout(sys.stderr)


def _session(args):
    """A Session on the command line's model, mesh and hardware."""
    with _model_output():
        return Session.from_spec(args.model, preset=args.preset or "tiny", overrides=_overrides(args.config),
                                 mesh=args.mesh, hardware=_hardware(args), seed=getattr(args, "seed", 0),
                                 warm_start=not getattr(args, "cold", False),
                                 user_shardings=getattr(args, "user_shardings", None) or "keep",
                                 pipeline=getattr(args, "pipeline", None))


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

    _search_parser(sub)
    _bench_parser(sub)
    # no abbreviations: --insecure must be written out to count
    sv = sub.add_parser("serve", help="serve the explorer web app (panel) on 127.0.0.1:5006", allow_abbrev=False)
    sv.add_argument("--port", type=int, default=5006)
    sv.add_argument("--address", default="127.0.0.1",
                    help="where to listen (default 127.0.0.1: this machine only); any other address needs "
                         "--auth-file (or PARTEX_PASSWORD) or --insecure")
    sv.add_argument("--show", action="store_true", help="open a browser")
    sv.add_argument("--hardware-profile", action="append", default=[], metavar="FILE",
                    help="offer a hardware profile (`partex calibrate --out FILE`) in the hardware field beside the "
                         "presets (repeatable)")
    sv.add_argument("--auth-file", metavar="FILE",
                    help='ask for a password: FILE holds a JSON object {"user": "password", ...} or one line with '
                         "a password (any user name); without it, the password in PARTEX_PASSWORD, if set")
    sv.add_argument("--insecure", action="store_true",
                    help="serve on an address other machines reach with no password (anyone reaching it runs "
                         "work on this machine)")
    sv.add_argument("--models-dir", metavar="DIR",
                    help="let the page load models of your users' own: FILE.py:function inside DIR only "
                         "(default: none, the demo models only)")
    sv.add_argument("--max-upload", default="4MiB", metavar="SIZE",
                    help="the largest plan file the page takes (default 4MiB)")
    sv.add_argument("--allow-origin", action="append", default=[], metavar="HOST[:PORT]",
                    help="a name or address browsers reach the server by (its websocket origin), beside "
                         "--address and localhost (repeatable)")
    sv.add_argument("--search-workers", metavar="N",
                    help="how many pages' searches run at once; the others wait in a queue, each page told its "
                         "place, and take turns (default: PARTEX_SEARCH_WORKERS, else one fewer than this "
                         "machine's cores, at least 1)")
    sv.add_argument("--max-pages", metavar="N",
                    help="how many pages may be open at once; one more is told the server is full (default: "
                         "PARTEX_MAX_PAGES, else as many as three quarters of this machine's memory holds at "
                         "512 MiB a page)")

    v = sub.add_parser("verify", help="compile a plan with XLA on simulated devices; compare with the prediction")
    _add_model_args(v)
    v.add_argument("plan", help="plan JSON written by `partex plan` or `partex search`")
    v.add_argument("--run", action="store_true", help="also run it (small configs) and compare numerics "
                                                      "with the unsharded function")
    v.add_argument("--inputs-only", action="store_true",
                   help="apply the input/output shardings alone, without intermediate constraints "
                        "(to see what XLA's own propagation does)")
    v.add_argument("--explain", action="store_true",
                   help="list XLA's collectives by source line, each matched to the predicted collective and "
                        "the decision that causes it")
    v.add_argument("--export", choices=("specs", "flax-rules"),
                   help="also compile that export of the plan alone and show XLA's figures side by side")
    v.add_argument("--time", action="store_true",
                   help="also run the plan on this machine's devices for a few steps (the accelerators JAX finds; "
                        "on the CPU, simulated devices) and report the measured step time and peak memory beside "
                        "the prediction")
    v.add_argument("--steps", type=int, default=5, help="with --time: steps timed, after 2 warm-up steps (default 5)")

    c = sub.add_parser("calibrate", help="measure this machine's devices (matmuls, memory bandwidth, kernel floor, "
                                         "host copies, collectives) into a hardware profile for --hardware")
    c.add_argument("--out", "-o", default="partex-profile.json",
                   help="where to write the profile JSON (default partex-profile.json)")
    c.add_argument("--measurements", metavar="FILE",
                   help="build the profile from measurements taken elsewhere (a JSON list of rows, each with a "
                        "\"kind\": the format `--save-measurements` writes) instead of measuring here")
    c.add_argument("--save-measurements", metavar="FILE", help="also write the raw measurement rows here")
    c.add_argument("--quick", action="store_true", help="fewer shapes and repetitions: a check, not a profile to trust")
    c.add_argument("--no-collectives", action="store_true", help="skip the collectives (measured over 2+ devices)")
    c.add_argument("--hbm", help="the device's memory where the measurements do not say (e.g. 141GB)")
    c.add_argument("--memory-limit", help="what a program may take of it, where the measurements do not say "
                                          "(default: the allocator's limit; on a GPU without it, 75%% of --hbm)")
    c.add_argument("--json", action="store_true", help="print the profile's summary as JSON")

    _export_parser(sub)
    return ap


def _search_parser(sub) -> None:
    se = sub.add_parser("search", help="search for the fastest plan that fits (MCTS)")
    _add_model_args(se)
    _add_mesh_args(se, required=False)
    se.add_argument("--devices", type=int,
                    help="instead of --mesh: search the mesh too, every factorisation of this many devices into "
                         "up to --max-axes axes, by successive halving within --budget")
    se.add_argument("--topology", metavar="SLICESxDEVICES[@GB/s]",
                    help="with --devices: the devices as slices (or hosts) joined by a slower network, e.g. "
                         "4x64@6.25 (4 slices of 64, 6.25 GB/s per device between them): one axis crosses it")
    se.add_argument("--max-axes", type=int, default=4, help="with --devices: the most mesh axes (default 4)")
    se.add_argument("--pipelines", choices=("auto", "on", "off"), default="auto",
                    help="with --devices: also try the scanned layer stacks as pipelines: over the slices of a "
                         "--topology of several (auto, the default), within a slice too (on), or never (off); "
                         "with --mesh, on: the pipeline is one of the search's decisions (the step as written "
                         "and each stack pipelined over each axis of the mesh, one search tree each)")
    se.add_argument("--budget", type=float,
                    help=f"search seconds (default {SEARCH_SECONDS:g}; with --devices, none: the mesh search runs "
                         "its schedule to the end)")
    se.add_argument("--simulations", type=int, help="run exactly this many simulations instead of --budget seconds "
                                                    "(reproducible with --seed)")
    se.add_argument("--seed", type=int, help="RNG seed (default 0)")
    se.add_argument("--pin", action="append", default=[], metavar="LABEL=AXIS",
                    help="fix a decision, e.g. --pin ffn=model (repeatable)")
    se.add_argument("--forbid", action="append", default=[], metavar="LABEL=AXIS",
                    help="never take a decision, e.g. --forbid batch=model (repeatable)")
    se.add_argument("--resume", metavar="SESSION",
                    help="continue a saved session (written by `partex search` or saved in the explorer); "
                         "--mesh, --hardware, --memory and --seed, when given, reconfigure it (pins kept)")
    se.add_argument("--cold", action="store_true", help="do not warm-start from the hand strategies")
    se.add_argument("--state", help="where to save the resumable session (default: the --resume file, else "
                                    "OUT.session.json)")
    se.add_argument("--out", required=True, help="where to write the best plan JSON")
    se.add_argument("--verify", action="store_true",
                    help="compile the best plan with XLA on simulated devices (compile-only) and, where XLA "
                         "says it does not fit the budget, fall back to the next best plan (up to 5 times)")
    se.add_argument("--measure-top", type=int, default=0, metavar="K",
                    help="run the K fastest distinct plans found on this machine's devices for a few steps and "
                         "write the one measured fastest (with --mesh; on the CPU, simulated devices)")
    se.add_argument("--steps", type=int, default=5, help="with --measure-top: steps timed per plan, after 2 "
                                                         "warm-up steps (default 5)")


def _bench_parser(sub) -> None:
    b = sub.add_parser("bench", help="hand plans, the ILP and the MCTS search side by side")
    _add_model_args(b)
    _add_mesh_args(b)
    b.add_argument("--budget", type=float, default=60.0, help="MCTS search seconds (default 60)")
    b.add_argument("--simulations", type=int, help="run exactly this many simulations instead of --budget seconds")
    b.add_argument("--ilp-time", type=float, default=30.0, help="ILP solver time limit in seconds (default 30)")
    b.add_argument("--seed", type=int, default=0, help="RNG seed of the search (default 0)")
    b.add_argument("--cold", action="store_true", help="do not warm-start the search from the hand strategies")
    b.add_argument("--out-dir", help="also write each row's plan JSON here")
    b.add_argument("--exhaustive", type=int, default=3, metavar="K",
                   help="also score every plan of at most K decisions per mesh axis, where there are at most "
                        "--exhaustive-limit of them (default 3; 0: skip)")
    b.add_argument("--exhaustive-limit", type=int, default=200_000, metavar="N",
                   help="the most plans the exhaustive row scores (default 200000)")
    b.add_argument("--exhaustive-time", type=float, default=120.0, metavar="S",
                   help="skip the exhaustive row when its first plans project the space past S seconds "
                        "(default 120)")
    b.add_argument("--verify", action="store_true",
                   help="check the mcts plan with XLA (compile-only); over the budget, take the next best")


def _export_parser(sub) -> None:
    ex = sub.add_parser("export", help="write a plan as a file a training job uses without partex: specs "
                                       "(mesh and in/out PartitionSpecs), flax-rules (logical axis rules) or "
                                       "explicit (explicit sharding mode: the mesh, the inputs' shardings and the "
                                       "out_sharding= / reshard annotations to write)")
    ex.add_argument("plan", help="plan JSON written by `partex plan` or `partex search`")
    ex.add_argument("--format", required=True, choices=("specs", "flax-rules", "explicit"))
    ex.add_argument("--out", "-o", help="file to write: .py (standalone Python, the default) or .json; "
                                        "default: stdout")
    ex.add_argument("--model", help="the plan's MODEL (default: the demo model the plan names); flax-rules needs "
                                    "it for the logical axis names; with it, the export alone and the full plan "
                                    "are compiled on simulated devices and compared")
    ex.add_argument("--preset", help="the MODEL's preset (default: the plan's, else tiny)")
    ex.add_argument("--config", action="append", default=[], metavar="K=V", help="override one demo config field")
    ex.add_argument("--no-compare", action="store_true", help="do not compile and compare (faster)")
    ex.add_argument("--run", action="store_true", help="also run both (small configs) and compare numerics")
    ex.add_argument("--json", action="store_true", help="write JSON (to --out or stdout)")


def cmd_analyze(args) -> int:
    with _model_output():
        res = analyze_model(args.model, preset=args.preset or "tiny", overrides=_overrides(args.config))
    an = res.analysis
    if args.json:
        out = an.to_json()
        out["model"] = res.model.name
        out["preset"] = res.model.preset
        out["trace_seconds"] = round(res.trace_seconds, 3)
        out["kernels"] = an.kernels()
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
        print(f"  {g.label:<18} {g.size:>8} {len(g.named_dims):>10} {format_bytes(g.bytes):>12}")
    if an.conflicts:
        print("\nconflicts:")
        for c in an.conflicts[: args.top]:
            d = an.describe_conflict(c)
            print(f"  [{d['group']}] {d['value']} {tuple(d['shape'])} dims {d['dims'][0]} and {d['dims'][1]}"
                  f" ({d['values']} tensors), made by {d['producer']} at {d['source']}")
    if an.units:
        print("\nlayer stacks a recompute decision covers (--pin LABEL=recompute:KIND):")
        for u in an.units:
            print(f"  {u.description}; kinds {', '.join(u.kinds)}")
    if an.movable_states():
        print("\nstate a memory decision keeps in host memory between steps (--pin SET=memory:host):")
        vals = an.program.values
        for st in an.movable_states():
            ins = an.state_inputs(st)
            print(f"  {STATES[st]}: {STATE_LABELS[STATES[st]]}, {len(ins)} arrays, "
                  f"{format_bytes(sum(vals[v].nbytes for v in ins))}")
    if an.user_shardings:
        print(f"\nthe step's own shardings ({len(an.user_shardings)}; kept as fixed decisions by default):")
        for us in an.user_shardings[: args.top]:
            print(f"  {us.kind} {us.spec_text()} over mesh {us.mesh_text() or '-'} at {us.source}")
    if an.static_inputs():
        print("\nstatic arguments (not arrays: closed over when traced, left out of the plan): "
              + ", ".join(f"{p} ({v})" for p, v in an.static_inputs()))
    kernels = an.kernels()
    if kernels:
        print("\nkernels and custom-partitioned ops:")
        for k in kernels[: args.top]:
            print(f"  {k['kind']} {k['name']} x{k['count']} at {k['source']}: {k['sharding']}; "
                  f"priced by {k['cost']}")
    if an.unknown_primitives:
        print("\nprimitives with no factor rule (treated conservatively): "
              + ", ".join(f"{k} x{v}" for k, v in sorted(an.unknown_primitives.items())))
    return 0


def _margin_text(hw) -> str:
    return f", {hw.memory_margin:.0%} kept free" if hw.memory_margin else ""


def _print_decisions(plan) -> None:
    if plan.fixed:
        print("the step's own shardings (kept): " + ", ".join(
            f"{f['group']}->{f['axis'] or 'unsharded'}" for f in plan.fixed))
    print("decisions: " + (", ".join(f"{d.group}->{d.axis}{' (pinned)' if d.pinned else ''}"
                                      for d in plan.decisions) or "none" + ("" if plan.fixed else " (replicated)")))


def cmd_plan(args) -> int:
    s = _session(args)
    plan = s.plan(strategy=args.strategy)
    check_divisible(plan, s.program)
    plan.save(args.out)
    pr = plan.predicted
    if args.json:
        print(json.dumps({"out": args.out, "strategy": args.strategy, "predicted": pr,
                          "decisions": [d.to_json() for d in plan.decisions]}))
        return 0
    print(f"{args.strategy} on {s.mesh.text()} ({s.hardware.name}): step {pr['step_time_s'] * 1e3:.3f} ms, "
          f"MFU {pr['mfu']:.1%}, peak memory {format_bytes(pr['memory']['peak'])} per device "
          f"(budget {format_bytes(s.hardware.budget)}{_margin_text(s.hardware)}: "
          f"{'fits' if pr['fits'] else 'DOES NOT FIT'})")
    print(f"priced by {s.hardware.priced_by()}")
    _print_decisions(plan)
    print(f"wrote {args.out}")
    return 0


def cmd_verify(args) -> int:
    plan = Plan.load(args.plan)
    spec = ModelSpec(args.model, args.preset or "tiny", tuple(_overrides(args.config)))
    if args.time and args.steps < 1:
        raise PartexError(f"--steps must be at least 1, got {args.steps}")
    out = verify_plan(plan, spec=spec, run=args.run, constrain=not args.inputs_only, export=args.export,
                      explain=args.explain)
    measured = measure(spec.spec, [plan], preset=spec.preset, overrides=list(spec.overrides), steps=args.steps,
                       labels=[plan.strategy or "plan"])[0] if args.time else None
    if args.json:
        print(json.dumps({**out.to_json(), **({"measured": measured.to_json()} if measured is not None else {})}))
        return 0
    m = out.memory
    print(f"{out.model} {out.strategy or ''} on {out.mesh}: compiled in {out.compile_seconds} s")
    print(f"  memory per device: predicted {format_bytes(m.predicted)}, XLA {format_bytes(m.xla)}"
          f" (ratio {m.ratio:.2f})" if m.ratio else "")
    a = out.arguments
    print(f"  arguments: predicted {format_bytes(a.predicted)}, XLA {format_bytes(a.xla)}")
    print("\n".join(f"  {line}" for line in device_lines(out)))
    for k in KINDS:
        c = out.collectives[k]
        if c.predicted_bytes or c.xla_bytes:
            r = f"{c.ratio:.2f}" if c.ratio else "-"
            print(f"  {k:<19} predicted {format_bytes(c.predicted_bytes)}, XLA {format_bytes(c.xla_bytes)} "
                  f"(ratio {r})")
    if out.numerics is not None:
        n = out.numerics
        print(f"  numerics: {'ok' if n.ok else 'MISMATCH'}: {n.worst_output or 'the output'} relative error "
              f"{n.max_rel_err:.2e}, tolerance {n.tolerance:.1e} ({n.basis()})"
              + (f"; computed in {n.computed_in}" if n.computed_in else ""))
        if n.largest_output is not None and n.largest_output != n.worst_output:
            print(f"    largest error: {n.largest_output} {n.largest_rel_err:.2e}, within its own tolerance")
    if out.explain is not None:
        print("\n".join(explain_table(out.explain)))
    if out.comparison is not None:
        print(f"XLA's figures, the full plan beside the {args.export} export alone:")
        print("\n".join(comparison_table(out.comparison)))
    if measured is not None:
        print("\n".join(_measured_lines(measured)))
    return 0


def _measured_lines(m) -> list[str]:
    """A measured plan beside its prediction, for people."""
    where = f"{m.devices} x {m.device}" + (" (simulated on the CPU: its times are the host's)"
                                           if m.platform == "cpu" else "")
    if m.error is not None:
        return [f"measured on {where}: {m.error}"]
    pred = f"predicted {m.predicted_step_time * 1e3:.3f} ms" if m.predicted_step_time is not None else "no prediction"
    ratio = f" (predicted / measured {m.time_ratio:.2f})" if m.time_ratio is not None else ""
    lines = [f"measured on {where}: step {m.step_time * 1e3:.3f} ms (median of {len(m.step_times)}), {pred}{ratio}"]
    peak = format_bytes(m.peak_bytes) if m.peak_bytes is not None else "not reported by this backend"
    lines.append(f"  peak memory per device: {peak}; XLA's compiled figure {format_bytes(m.xla_bytes)}"
                 + (f", predicted {format_bytes(m.predicted_peak)}" if m.predicted_peak is not None else ""))
    lines.append(f"  priced by {m.priced_by}")
    return lines


def _measure_table(rows) -> list[str]:
    """``search --measure-top``'s plans, fastest measured first, and where the prediction's
    order differs."""
    lines = [f"{'plan':<10} {'predicted':>12} {'measured':>12} {'pred/meas':>9} {'peak (meas)':>12} "
             f"{'XLA peak':>11} {'predicted':>11}"]
    for _, m in rows:
        meas = f"{m.step_time * 1e3:.3f} ms" if m.step_time is not None else "-"
        pred = f"{m.predicted_step_time * 1e3:.3f} ms" if m.predicted_step_time is not None else "-"
        lines.append(f"{m.label:<10} {pred:>12} {meas:>12} "
                     f"{(f'{m.time_ratio:.2f}' if m.time_ratio is not None else '-'):>9} "
                     f"{format_bytes(m.peak_bytes):>12} {format_bytes(m.xla_bytes):>11} "
                     f"{format_bytes(m.predicted_peak):>11}" + (f"  {m.error}" if m.error else ""))
    ran = [(p, m) for p, m in rows if m.step_time is not None]
    if ran:
        by_pred = min(ran, key=lambda r: r[1].predicted_step_time or 0.0)
        first = ran[0]
        if by_pred[1].label != first[1].label:
            lines.append(f"measurement and prediction disagree: predicted fastest {by_pred[1].label}, measured "
                         f"fastest {first[1].label} ({1 - first[1].step_time / by_pred[1].step_time:.0%} faster)")
        else:
            lines.append(f"measurement agrees with the prediction: {first[1].label} is fastest")
    return lines


def cmd_calibrate(args) -> int:
    from ._profile import from_measurements, load_measurements

    hbm = parse_bytes(args.hbm) if args.hbm else None
    limit = parse_bytes(args.memory_limit) if args.memory_limit else None
    if args.measurements:
        rows = load_measurements(args.measurements)
        source = f"measurements {os.path.basename(args.measurements)}"
    else:
        from ._calibrate import calibrate

        tty = sys.stderr.isatty()
        t0 = time.perf_counter()
        shown = [-1.0]

        def report(what: str, frac: float) -> None:
            # on a terminal one line redrawn; elsewhere (a log) a line per tenth of the work
            if tty:
                sys.stderr.write(f"\r[{'#' * int(frac * 20):<20}] {time.perf_counter() - t0:5.1f}s  {what[:60]:<60}")
                sys.stderr.flush()
            elif frac >= shown[0] + 0.1 or frac >= 1.0:
                shown[0] = frac
                sys.stderr.write(f"partex calibrate: {frac:4.0%} {time.perf_counter() - t0:6.1f}s  {what}\n")

        try:
            rows = calibrate(quick=args.quick, collectives=not args.no_collectives, progress=report)
        finally:
            if tty:
                sys.stderr.write("\n")
        source = "partex calibrate" + (" --quick" if args.quick else "")
    if args.save_measurements:
        with open(args.save_measurements, "w") as f:
            json.dump(rows, f, indent=1)
    profile = from_measurements(rows, source=source, where=args.measurements or "measurements", hbm_bytes=hbm,
                                memory_bytes=limit)
    profile.save(args.out)
    hw = Hardware.from_profile(profile)
    summary = {"out": args.out, "device": profile.device, "platform": profile.platform, "jax": profile.jax,
               "date": profile.date, "matmuls": len(profile.gemm), "memory_kernels": len(profile.memory),
               "collectives": len(profile.collectives), "best_matmul_flops": profile.peak_gemm_rate,
               "peak_flops": hw.peak_flops, "best_bandwidth": profile.peak_bandwidth,
               "kernel_floor_s": profile.kernel_floor, "host_bandwidth": profile.host_bandwidth,
               "memory_bytes": profile.memory_bytes, "notes": list(profile.notes)}
    if args.json:
        print(json.dumps(summary))
        return 0
    rates = sorted(2.0 * b * m * n * k / t for _, b, m, n, k, t in profile.gemm)
    print(f"{profile.device} ({profile.platform}, JAX {profile.jax}): wrote {args.out}")
    print(f"  matmuls: {len(profile.gemm)} shapes, {rates[0] / 1e12:.1f} to {rates[-1] / 1e12:.1f} TFLOP/s "
          f"(peak counted for MFU: {hw.peak_flops / 1e12:.1f})")
    bws = [b / t for b, t in profile.memory]
    print(f"  memory-bound kernels: {min(bws) / 1e9:.0f} to {max(bws) / 1e9:.0f} GB/s; a kernel's floor inside a "
          f"step {profile.kernel_floor * 1e6:.2f} us")
    if profile.host_bandwidth is not None:
        print(f"  host copies: up to {profile.host_bandwidth / 1e9:.1f} GB/s")
    if profile.collectives:
        kinds = sorted({r[0] for r in profile.collectives})
        print(f"  collectives over up to {max(r[1] for r in profile.collectives)} devices: {', '.join(kinds)}")
    print(f"  device memory a program may take: {format_bytes(profile.memory_bytes)}")
    for n in profile.notes:
        print(f"  note: {n}")
    print(f"use it with --hardware {args.out}")
    return 0


def cmd_export(args) -> int:
    plan = Plan.load(args.plan)
    m = plan.model or {}
    spec = None
    if args.model:
        spec = ModelSpec(args.model, args.preset or "tiny", tuple(_overrides(args.config)))
    elif m.get("spec") or m.get("name") in demo_names():  # the MODEL spec the plan was made from
        spec = ModelSpec(m.get("spec") or m["name"], args.preset or m.get("preset") or "tiny",
                         tuple(_overrides(args.config)) or tuple(m.get("overrides") or ()))
    comparison = None
    if spec and not args.no_compare and args.format != "explicit":  # the explicit export changes the user's code
        comparison = verify_plan(plan, spec=spec, run=args.run, export=args.format).comparison
        assert comparison is not None  # verify with an export compares
        sys.stderr.write(f"XLA's figures ({comparison['devices']} simulated devices), the full plan beside "
                         f"the {args.format} export alone:\n" + "\n".join(comparison_table(comparison)) + "\n")
    model = None
    if args.format in ("flax-rules", "explicit") and spec:
        with _model_output():
            model = load_model(spec.spec, spec.preset, list(spec.overrides))
    as_json = args.json or (args.out or "").endswith(".json")
    text = export_text(plan, args.format, model, comparison, as_json=as_json)
    if args.out:
        tmp = f"{args.out}.tmp"
        try:
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, args.out)
        except OSError as e:
            raise PartexError(f"cannot write {args.out}: {e.strerror}") from None
        sys.stderr.write(f"wrote {args.out} ({args.format})\n")
    else:
        sys.stdout.write(text)
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

    def __call__(self, session) -> None:
        now = time.perf_counter()
        if not self.enabled or now - self.last < 0.25:
            return
        self.last = now
        st = session.stats()
        b = st.best_step_time
        best = f"best {b * 1e3:.3f} ms" if b is not None else f"no fit yet (min {format_bytes(st.smallest_memory)})"
        frac = min(1.0, (now - self.t0) / self.total) if self.total > 0 else 1.0
        bar = "#" * int(frac * 20)
        sys.stderr.write(f"\r[{bar:<20}] {now - self.t0:5.1f}/{self.total:.0f}s  sims {st.simulations}"
                         f"  {st.sims_per_s:.0f}/s  {best}   ")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


@contextlib.contextmanager
def _stop_on_signals(session):
    """SIGTERM and Ctrl-C ask the search to stop after the simulation in hand (a flag only:
    an exception raised in a signal handler can be swallowed inside a GC callback)."""
    old = {sig: signal.signal(sig, lambda signum, frame: session.request_stop())
           for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def device_lines(out) -> list[str]:
    """verify's verdict on the device's memory, and what this backend could not check."""
    x = out.xla_memory
    taken = [f"{format_bytes(v)} {what}" for v, what in ((x.get("host_resident", 0), "of arguments and results in "
                                                          "host memory"),
                                                         (x.get("offloaded", 0), "of offloaded intermediates "
                                                          "(predicted)")) if v]
    lines = [f"device memory per XLA: {format_bytes(x.get('device', out.memory.xla))}"
             + (f" (XLA's {format_bytes(out.memory.xla)} less {' and '.join(taken)})" if taken else "")
             + f", budget {format_bytes(out.budget)}: {'fits' if out.fits else 'OVER the budget'}"]
    if out.host_unchecked is not None:
        lines.append(f"host memory: {format_bytes(out.host_unchecked)} per device predicted, not checked: XLA on "
                     "this backend ignores memory spaces (run verify on a GPU or TPU to check it)")
    return lines + list(out.notes)


def _reject_note(best, out) -> None:
    sys.stderr.write(f"partex: XLA puts the best plan at {format_bytes(out.xla_memory.get('device', out.memory.xla))} "
                     f"of device memory (predicted {format_bytes(best.report.memory.peak)}), over the budget: trying "
                     "the next best\n")


def _default_state(out: str) -> str:
    return f"{os.path.splitext(out)[0]}.session.json"


def _search_session(args) -> tuple[Session, list[str]]:
    """The session ``partex search`` runs: the one ``--resume`` names, reconfigured by the
    options given (and notes of the pins that no longer apply), or a new one."""
    if not args.resume:
        if not args.mesh:
            raise PartexError("give --mesh, e.g. --mesh data=4,model=2, or --devices N to search the mesh too "
                              "(or --resume a saved session)")
        args.seed = args.seed or 0
        return _session(args), []
    with _model_output():
        s = Session.load(args.resume)
    ms = s.spec
    assert ms is not None  # Session.load without fn= loads MODEL-spec sessions only
    if (args.model != ms.spec or (args.preset and args.preset != ms.preset)
            or (args.config and sorted(_overrides(args.config)) != sorted(ms.overrides))):
        raise PartexError(f"{args.resume} is a session of {ms.title}, not of the model given here: "
                          f"run `partex search {ms.spec} --resume {args.resume}` without other model options")
    if args.user_shardings and args.user_shardings != s.user_shardings:
        raise PartexError(f"{args.resume} was searched with --user-shardings {s.user_shardings}: "
                          "start a new search to change it")
    was = s.pipeline.text() if s.pipeline is not None else None
    if args.pipeline and args.pipeline != was:
        raise PartexError(f"{args.resume} was searched {'with --pipeline ' + was if was else 'without --pipeline'}: "
                          "start a new search to change it")
    before = (s.mesh, s.hardware, s.seed)
    notes = s.reconfigure(mesh=args.mesh, hardware=_hardware(args, base=s.hardware), seed=args.seed)
    if (s.mesh, s.hardware, s.seed) != before:
        notes.insert(0, "the mesh, hardware, budget or seed changed: the search starts again, with its pins")
    return s, notes


def _run_search(s: Session, args, state_path: str) -> None:
    """``--simulations`` simulations or ``--budget`` seconds, with a progress line on a
    terminal, the session saved every 10 s and at the end, and Ctrl-C / SIGTERM stopping
    after the simulation in hand."""
    s.save(state_path)  # a folder that is not there fails now, not after the search
    budget = SEARCH_SECONDS if args.budget is None else args.budget
    progress = _Progress(budget, enabled=not args.json and sys.stderr.isatty())
    saved = [time.perf_counter() - 9.0]

    def tick(session) -> None:
        progress(session)
        now = time.perf_counter()
        if now - saved[0] >= 10.0:  # autosave: even a kill -9 loses at most 10 s
            session.save(state_path)
            saved[0] = now

    try:
        with _stop_on_signals(s):
            if args.simulations is not None:
                s.step(args.simulations)
            else:
                s.run(budget, callback=tick)
    finally:
        progress.close()
        s.save(state_path)  # nothing lost: the search resumes from here


def _trials_progress(enabled: bool, what: str, name):
    """A progress line (on a terminal) for a search over candidates (``MeshTrial``s): how
    many ``what``, and the best so far by ``name(trial)``."""
    def progress(trials) -> None:
        if enabled:
            done = [t for t in trials if t.step_time is not None]
            best = min(done, key=lambda t: t.step_time) if done else None
            still = sum(t.status in ("open", "scored", "searching") for t in trials)
            sys.stderr.write(f"\rpartex: {len(trials)} {what}" + (f", {still} open" if still else "")
                             + (f", best so far {name(best)} {best.step_time * 1e3:.3f} ms" if best else "") + "\033[K")
            sys.stderr.flush()
    return progress


def _mesh_search(args):
    """``partex search --devices``: the meshes searched with the plan; the best one's session."""
    if args.mesh or args.resume:
        raise PartexError("--devices searches the mesh: give it without --mesh and --resume")
    if args.pipeline:
        raise PartexError("--devices searches the mesh, and a pipeline names one of its axes: give --mesh with "
                          "--pipeline")
    if args.simulations is not None:
        raise PartexError("--devices shares --budget seconds between the meshes: give --budget, not --simulations")
    if args.topology is None and args.devices is None:
        raise PartexError("--topology needs --devices")
    with _model_output():
        ma = analyze_spec(model_spec(args.model, args.preset or "tiny", _overrides(args.config)))
    hw = _hardware(args)
    tty = not args.json and sys.stderr.isatty()
    progress = _trials_progress(tty, "meshes", lambda t: t.text())
    searcher = mesh_searcher(ma, args.devices, topology=args.topology, hardware=hw, max_axes=args.max_axes,
                             seed=args.seed or 0, warm_start=not args.cold,
                             spec=model_spec(args.model, args.preset or "tiny", _overrides(args.config)),
                             user_shardings=args.user_shardings or "keep", effort=effort_of(args.budget),
                             pipelines={"auto": None, "on": True, "off": False}[args.pipelines])
    with _stop_on_signals(searcher):  # Ctrl-C: the best so far
        found = searcher.run(args.budget, callback=progress)
    if tty:
        sys.stderr.write("\n")
    return found


def _pipeline_search(args, pins, forbids):
    """``partex search --mesh M --pipelines on``: the pipeline among the decisions on M
    (``Session.search_pipelines``); the best program's session and the search."""
    if args.resume:
        raise PartexError("--pipelines on starts a search of the pipelines: give it without --resume (a saved "
                          "session is one program: --resume it alone)")
    if args.pipeline:
        raise PartexError("--pipelines on searches the pipeline: give it without --pipeline (or --pipeline alone "
                          "to search that one)")
    args.seed = args.seed or 0
    s = _session(args)
    for label, axis in pins:  # pins name the step's own groups: every program keeps them where they apply
        s.pin(label, axis)
    for label, axis in forbids:
        s.forbid(label, axis)
    tty = not args.json and sys.stderr.isatty()
    progress = _trials_progress(tty, "programs", lambda t: t.pipeline.text() if t.pipeline else "as written")
    found = s.search_pipelines(None)  # the programs built, their hand plans scored
    with _stop_on_signals(found):
        if args.simulations is not None:
            found.step(args.simulations)
        else:
            found.run(SEARCH_SECONDS if args.budget is None else args.budget, callback=progress)
    if tty:
        sys.stderr.write("\n")
    result = found.result()
    if result.best is not None and result.best.session is not s:
        s.use_mesh(result.best)
    return s, result


def cmd_search(args) -> int:
    pins = [_decision_arg("--pin", p) for p in args.pin]
    forbids = [_decision_arg("--forbid", p) for p in args.forbid]
    state_path = args.state or (args.resume if args.resume else _default_state(args.out))
    meshes = None
    if args.mesh and args.pipelines == "on" and args.devices is None and args.topology is None:
        s, meshes = _pipeline_search(args, pins, forbids)
        pins = forbids = []
        notes = []
        if not args.json:
            print(f"pipelines on {s.mesh.text()}, {meshes.seconds:.1f} s; chosen: "
                  + (s.pipeline.text() if s.pipeline is not None else "none (the step as written)"))
            print(meshes.table())
    elif args.devices is not None or args.topology is not None:
        meshes = _mesh_search(args)
        s = meshes.session
        assert s is None or isinstance(s, Session)  # the candidates' searches are sessions
        if s is None:
            hw = _hardware(args)
            raise PartexError(f"no plan fits the {format_bytes(hw.budget)} per-device budget on any of the "
                              f"{len(meshes.trials)} meshes of {args.devices} devices tried; raise --memory or "
                              "use more devices")
        notes = []
        if not args.json:
            print(f"meshes of {args.devices} devices"
                  + (f" ({meshes.topology.text()})" if meshes.topology else "")
                  + f", {meshes.seconds:.1f} s ({meshes.how()}); chosen: {s.mesh.text()}"
                  + (f", pipeline {s.pipeline.text()}" if s.pipeline is not None else ""))
            print(meshes.table())
    else:
        s, notes = _search_session(args)
    for label, axis in pins:
        s.pin(label, axis)
    for label, axis in forbids:
        s.forbid(label, axis)
    for n in notes:
        sys.stderr.write(f"partex: {n}\n")
    if meshes is None:
        _run_search(s, args, state_path)
    else:
        s.save(state_path)
    interrupted = s.stop_requested or (meshes is not None and meshes.stopped)
    best = s.best()
    hw = s.hardware
    if best is None:
        what = f" with pins {', '.join(s.label(p) for p in s.pins)}" if s.pins else ""
        no_fit = s.stats().no_fit
        raise PartexError(
            f"no plan fits{what}: {no_fit} (session saved to {state_path}; "
            + ("raise --host-memory or --memory" if "host memory" in no_fit else "raise --memory")
            + ", use a larger mesh" + (", or unpin)" if s.pins else ")"))
    xla, out = None, None
    if args.verify:
        try:
            best, out = s.verified_best(on_reject=_reject_note)
        finally:
            s.save(state_path)  # with the plans XLA rejected marked
        xla = out.xla_memory.get("device", out.memory.xla)
    measured, ran = None, []
    if args.measure_top:
        if args.measure_top < 1 or args.steps < 1:
            raise PartexError("--measure-top and --steps must be at least 1")
        try:
            measured = s.measure_top(args.measure_top, steps=args.steps)
        finally:
            s.save(state_path)  # with the plans the devices could not hold marked
        ran = [(p, m) for p, m in measured if m.step_time is not None]
        if not ran:
            raise PartexError(f"none of the {len(measured)} plans measured ran on this machine's devices: "
                              + "; ".join(f"{m.label}: {m.error}" for _, m in measured))
    plan = ran[0][0] if measured else s.best_plan()
    assert plan is not None  # best is not None: a plan fits
    plan.save(args.out)
    st = s.stats()
    r = best.report
    if args.json:
        print(json.dumps({"out": args.out, "state": state_path, "interrupted": interrupted,
                          "step_time_s": r.step_time, "mfu": r.mfu, "memory_bytes": r.memory.peak,
                          "priced_by": hw.priced_by(),
                          "fits": r.fits, "search_s": best.seconds, "simulations": st.simulations,
                          "xla_memory_bytes": xla, "memory_ratio": r.memory.peak / xla if xla else None,
                          "decisions": [d.to_json() for d in plan.decisions],
                          **({"measured": [m.to_json() for _, m in measured]} if measured else {}),
                          **({"mesh": s.mesh.text(), "meshes": meshes.to_json()} if meshes is not None else {})}))
        return 0
    print(f"{'interrupted: ' if interrupted else ''}best plan after {st.simulations} simulations "
          f"({st.seconds:.1f} s, found at {best.seconds:.1f} s): step {r.step_time * 1e3:.3f} ms, "
          f"MFU {r.mfu:.1%}, peak memory {format_bytes(r.memory.peak)} (budget {format_bytes(hw.budget)})")
    print(f"priced by {hw.priced_by()}")
    _print_decisions(plan)
    if out is not None:
        print(f"XLA (compile-only, {s.mesh.size} simulated devices): " + "; ".join(device_lines(out)))
    if measured:
        m0 = measured[0][1]
        print(f"measured on {m0.devices} x {m0.device}" + (" (simulated on the CPU)" if m0.platform == "cpu" else "")
              + f", {args.steps} steps each; wrote the fastest measured, {plan.strategy}:")
        print("\n".join(_measure_table(measured)))
    print(f"wrote {args.out} and the resumable session {state_path}")
    return 0


def _bubble(s: Session) -> float | None:
    p = s.pipeline
    return p.bubble(s.mesh.sizes[s.mesh.index(p.axis)]) if p is not None else None


def cmd_bench(args) -> int:
    if args.exhaustive < 0 or args.exhaustive_limit < 0 or not args.exhaustive_time > 0:
        raise PartexError("--exhaustive and --exhaustive-limit must be >= 0 (0 skips the exhaustive row) and "
                          "--exhaustive-time > 0")
    s = _session(args)
    progress = _Progress(args.budget, enabled=not args.json and sys.stderr.isatty())
    try:
        with _stop_on_signals(s):  # Ctrl-C ends the search early, the table still prints
            rows = s.bench(args.budget, ilp_time=args.ilp_time, simulations=args.simulations, callback=progress,
                           verify=args.verify, exhaustive=args.exhaustive, exhaustive_limit=args.exhaustive_limit,
                           exhaustive_seconds=args.exhaustive_time)
    finally:
        progress.close()
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        for r in rows:
            if r.step_time_s is not None:
                s.plan(list(r.decisions), strategy=r.strategy).save(os.path.join(args.out_dir, f"{r.strategy}.json"))
    hw = s.hardware
    if args.json:
        # a pipelined step's plans are its pipeline and their decisions: the label says both
        piped = [f"pipeline:{s.pipeline.text()}"] if s.pipeline is not None else []
        print(json.dumps({"model": s.model.model.name, "preset": s.model.model.preset, "mesh": s.mesh.text(),
                          "pipeline": s.pipeline.to_json() if s.pipeline is not None else None,
                          "bubble": _bubble(s), "hardware": hw.name, "priced_by": hw.priced_by(),
                          "budget_bytes": hw.budget, "rows": [{**r.to_json(), "plan": piped + [s.label(d) for d in r.decisions]}
                                   for r in rows]}))
        return 0
    piped = f", pipeline {s.pipeline.text()} (bubble {_bubble(s):.0%})" if s.pipeline is not None else ""
    print(f"{s.title} on {s.mesh.text()}{piped}, {hw.name}, budget {format_bytes(hw.budget)}{_margin_text(hw)}")
    print(f"  priced by {hw.priced_by()}")
    xla_cols = f" {'XLA':>11} {'pred/XLA':>8}" if args.verify else ""
    hosted = any(r.host_bytes for r in rows)  # a column for host memory where a plan keeps values there
    host_col = f" {'host':>11}" if hosted else ""
    print(f"  {'strategy':<14} {'step time':>12} {'MFU':>7} {'memory':>11}{host_col} {'fits':>5} {'search s':>9}"
          f"{xla_cols}")
    for r in rows:
        t = f"{r.step_time_s * 1e3:.3f} ms" if r.step_time_s is not None else "-"
        mfu = f"{r.mfu:.1%}" if r.mfu is not None else "-"
        mem = format_bytes(r.memory_bytes)
        ss = f"{r.search_s:.1f}" if r.search_s is not None else "-"
        xla = ""
        if args.verify:
            ratio = f"{r.memory_ratio:.2f}" if r.memory_ratio else "-"
            xla = f" {format_bytes(r.xla_memory_bytes):>11} {ratio:>8}"
        fits = "-" if r.complete is False else "yes" if r.fits else "NO"  # a skipped exhaustive row
        host = f" {format_bytes(r.host_bytes) if r.host_bytes else '-':>11}" if hosted else ""
        print(f"  {r.strategy:<14} {t:>12} {mfu:>7} {mem:>11}{host} {fits:>5} {ss:>9}{xla}")
    hand = [r.step_time_s for r in rows if r.fits and r.step_time_s is not None
            and r.strategy not in ("mcts", "mcts-no-remat", "ilp", "exhaustive", "replicated")]
    mc = next(r for r in rows if r.strategy == "mcts")
    ex = next((r for r in rows if r.strategy == "exhaustive"), None)
    if ex is not None and not ex.complete and ex.plans == 0:
        print(f"exhaustive: skipped, {ex.space} plans of at most {ex.per_axis} decisions per axis "
              f"(over --exhaustive-limit {args.exhaustive_limit})")
    elif ex is not None and not ex.complete:
        print(f"exhaustive: skipped, {ex.space} plans of at most {ex.per_axis} decisions per axis would take "
              f"about {ex.projected_s or 0:.0f} s (over --exhaustive-time {args.exhaustive_time:g})")
    elif ex is not None and ex.fits and mc.fits and mc.step_time_s and ex.step_time_s:
        print(f"mcts / exhaustive optimum ({ex.plans} plans of at most {ex.per_axis} decisions per axis): "
              f"{mc.step_time_s / ex.step_time_s:.3f}x")
    if mc.fits and mc.step_time_s and hand:
        print(f"mcts / best hand plan: {mc.step_time_s / min(hand):.3f}x")
    ilp = next((r for r in rows if r.strategy == "ilp"), None)
    if mc.fits and mc.step_time_s and ilp is not None and ilp.fits and ilp.step_time_s:
        print(f"mcts / ilp: {mc.step_time_s / ilp.step_time_s:.3f}x")
    nr = next((r for r in rows if r.strategy == "mcts-no-remat"), None)
    if nr is not None:
        t_nr, t_mc = nr.step_time_s, mc.step_time_s
        print("best plan without recompute: " + (f"{t_nr * 1e3:.3f} ms (mcts with recompute {t_mc / t_nr:.3f}x)"
                                                 if nr.fits and mc.fits and t_nr and t_mc else "none fits"))
    if mc.xla_memory_bytes:
        print(f"mcts plan per XLA (compile-only): {format_bytes(mc.xla_memory_bytes)} per device, "
              f"predicted / XLA {mc.memory_ratio:.2f}")
    return 0


def cmd_serve(args) -> int:
    try:
        from . import explorer  # Panel: the engine loads it only for `partex serve`
    except ImportError:
        raise PartexError("the explorer is not installed next to the engine (explorer/ package missing)") from None
    for path in args.hardware_profile:  # a bad file: one line here, before the server starts
        Hardware.load(path)
    try:
        max_upload = int(parse_bytes(args.max_upload))
    except PartexError:
        raise PartexError(f"--max-upload {args.max_upload!r} is not a positive size: write e.g. 4MiB or 500KiB") \
            from None
    return explorer.serve(port=args.port, address=args.address, show=args.show, profiles=args.hardware_profile,
                          auth_file=args.auth_file, insecure=args.insecure, models_dir=args.models_dir,
                          max_upload=max_upload, origins=args.allow_origin, search_workers=args.search_workers, max_pages=args.max_pages)


COMMANDS = {"analyze": cmd_analyze, "plan": cmd_plan, "verify": cmd_verify, "search": cmd_search,
            "bench": cmd_bench, "serve": cmd_serve, "export": cmd_export, "calibrate": cmd_calibrate}


def main(argv: Sequence[str] | None = None) -> int:
    # partex's own process traces and prices; a plan it measures runs in a fresh process that
    # must find the device's memory free: JAX takes 75% of a GPU up front unless told not to
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command in ("search", "bench"):
            default_processes()  # a bad PARTEX_PROCESSES is said before the model is traced
        return COMMANDS[args.command](args)
    except PartexError as e:
        print(f"partex: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("partex: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
