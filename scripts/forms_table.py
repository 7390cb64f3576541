"""The production-forms table on the tiny configs (8 simulated CPU devices): for each form a
training step is written in (``scripts/forms/<form>.py``), whether partex analyses it, its
ops, decision groups at 2 and 4 layers and layer stacks, each hand plan's numerics against
the unsharded step (run on the devices), predicted/XLA memory and collective-byte ratios, and
the searched plan under a budget of 0.5x the replicated plan's memory, or, where no hand plan
meets that per XLA, the budget at which the smallest hand plan's XLA peak keeps the default
memory margin free: whether it fits per XLA. ``dropout_typed_keys``, ``moe_all_to_all`` and ``ring_attention``
(whose layers hold a shard_map region) add a row per recompute kind of their layer stack (on zero3).
Each form also shows verify's calibrated numerics on a deliberately wrong run: zero3's
outputs with its largest parameter's two halves swapped (a shard in the wrong place), and
how far beyond its tolerance the comparison puts it.
Every failure is caught and shown as its first line with the partex function it came from,
so the table is always whole.

    JAX_NUM_CPU_DEVICES=8 .venv/bin/python scripts/forms_table.py [FORM ...] > table.md

FORM: the modules in scripts/forms (``FORMS``); default all. Each gives ``make(layers=2,
size="tiny")`` returning ``(fn, args)`` (or ``(fn, args, axis_names)``) and ``MESH``, the mesh
it is written for. ``PARTEX_CHECKOUT=<dir>`` measures the partex of another checkout
(``scripts/_checkout.py``), e.g. a commit unpacked with ``git archive``.

A hand plan's shardings column lists the plan's own decisions; the step's own shardings
(typed inputs, a region's specs), which every plan keeps, are listed above the table.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Callable

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMS_DIR = os.path.join(ROOT, "scripts", "forms")
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from _checkout import use_checkout_from_env  # noqa: E402

use_checkout_from_env()

import _libcheck as lc  # noqa: E402
import numpy as np  # noqa: E402
import partex  # noqa: E402
from numerics_models.wrong import swapped  # noqa: E402

FORMS = sorted(f[:-3] for f in os.listdir(FORMS_DIR) if f.endswith(".py") and not f.startswith("_"))
HAND = ("dp", "megatron", "zero3", "expert")
RECOMPUTE_FORMS = {"dropout_typed_keys", "moe_all_to_all", "ring_attention"}  # forms whose layer stack gets a row per recompute kind
FRACTION = 0.5  # the searched plan's budget: this share of the replicated plan's memory
SIMULATIONS = 200
ENGINE = os.path.dirname(os.path.abspath(partex.__file__))


load = lc.load_form  # scripts/forms/<form>.py as a module


def failure(e: BaseException) -> str:
    """The error's first line and the innermost partex function it passed through."""
    line = (str(e).strip().splitlines() or [""])[0]
    where = [f for f in traceback.extract_tb(e.__traceback__) if f.filename.startswith(ENGINE)]
    at = f" (at {os.path.relpath(where[-1].filename, os.path.dirname(ENGINE))}:{where[-1].name})" if where else ""
    return f"FAILS: {type(e).__name__}: {line}{at}".replace("|", "\\|")


def attempt(what: Callable[[], str]) -> str:
    try:
        return what()
    except Exception as e:  # the table reports every failure and goes on
        return failure(e)


def ratio_text(out) -> str:
    """Predicted / XLA: memory (and XLA's figure) and each collective kind's bytes."""
    mem = f"{out.memory.ratio:.2f}" if out.memory.ratio is not None else "-"
    parts = [f"mem {mem} (XLA {partex.format_bytes(out.memory.xla)})"]
    for kind, c in out.collectives.items():
        if c.xla_bytes or c.predicted_bytes:
            parts.append(f"{kind} {c.ratio:.2f}" if c.ratio is not None else
                         f"{kind} - (predicted {partex.format_bytes(c.predicted_bytes)}, XLA 0)")
    return ", ".join(parts)


TOLERANCE = 0.25  # a collective kind priced within +-25% of XLA's bytes
SHARE = 0.02  # ... where it carries at least this share of XLA's collective bytes


def mispriced(out) -> list[str]:
    """The collective kinds carrying >= SHARE of XLA's collective bytes (or predicted as
    much where XLA has none) whose predicted bytes are off by more than TOLERANCE; none
    where verify's notes say this backend's figures are not what TPU/GPU run (interpreted
    Pallas kernels)."""
    total = sum(c.xla_bytes for c in out.collectives.values())
    bad = []
    for kind, c in out.collectives.items():
        carried = max(c.xla_bytes, c.predicted_bytes)
        if not carried or carried < SHARE * total:
            continue
        if not c.xla_bytes or abs(c.predicted_bytes / c.xla_bytes - 1) > TOLERANCE:
            bad.append(f"{kind} {partex.format_bytes(c.predicted_bytes)} of {partex.format_bytes(c.xla_bytes)}")
    return bad


def numerics_text(out) -> str:
    n = out.numerics
    return f"{n.max_rel_err:.1e} ({'ok' if n.ok else 'NOT ok'})"


def own_shardings(s: partex.Session, decisions) -> str:
    """The plan's own Shard decisions as ``group→axis``."""
    return ", ".join(f"{s.group(d.group).label}→{d.axis}" for d in decisions if isinstance(d, partex.Shard)) or "nothing"


def fixed_text(s: partex.Session) -> str:
    """The step's own shardings by group: ``group→axes (kind)``."""
    by_group: dict[str, list[str]] = {}
    for f in s.fixed:
        by_group.setdefault(f"{f['group']}", []).append(f"{f['axis'] or 'unsharded'} ({f['kind']})")
    return "; ".join(f"{g}→{', '.join(a)}" for g, a in by_group.items()) or "none"


def plan_row(s: partex.Session, name: str, decisions, shardings: str) -> tuple[str, float | None, list[str]]:
    """| plan | shardings | numerics | predicted / XLA |: the plan verified with a run; its
    XLA device peak (None: no figure); its mispriced collective kinds."""
    try:
        out = s.verify(s.plan(decisions, strategy=name if decisions is None else None), run=True, mark=False)
    except Exception as e:
        return f"| {name} | {shardings} | {failure(e)} | |", None, []
    # XLA:CPU runs a Pallas kernel interpreted: its collectives around it are not TPU's or GPU's
    interpreted = any("Pallas kernel" in n for n in out.notes)
    bad = [] if interpreted else mispriced(out)
    notes = "".join(f"; {n}" for n in out.notes)
    return (f"| {name} | {shardings} | {numerics_text(out)} | {ratio_text(out)}{notes} |",
            out.xla_memory["device"], bad)


def wrong_shard(s: partex.Session, made, name: str) -> str:
    """verify's calibrated numerics on a deliberately wrong run: the plan's outputs with the
    two halves of its largest parameter swapped (a shard in the wrong place), judged with the
    tolerances calibrated on the unsharded step; what the comparison says."""
    fn, args, names = lc.unpack(made)
    cal, run = partex.calibrate_numerics(partex.apply_plan(s.plan(strategy=name), fn, axis_names=names), fn, args)
    got = run()
    def moved(x: np.ndarray) -> bool:  # swapping its halves changes it (a zero init's do not)
        return bool(x.ndim and x.shape[0] >= 2 and np.issubdtype(x.dtype, np.floating)
                    and not np.array_equal(x[: x.shape[0] // 2], x[x.shape[0] - x.shape[0] // 2:]))

    params = [(np.asarray(r).size, p) for p, r in zip(cal.paths, cal.ref)
              if p.startswith("out/0/") and moved(np.asarray(r))]
    if not params:
        return "no parameter to swap"
    path = max(params)[1]
    bad = cal.compare(swapped(cal.paths, got, path))
    if bad["ok"]:
        return f"MISSED: {path} swapped passes ({bad['max_rel_err']:.1e} within {bad['tolerance']:.1e})"
    return f"caught: {bad['worst_output']} at {bad['max_rel_err'] / bad['tolerance']:.0f}x its tolerance"


def search_budget(made, mesh: str, hand_xla: list[float]) -> tuple[float, str]:
    """FRACTION x the replicated plan's predicted memory; where every hand plan's XLA peak is
    above that, the budget at which the smallest of them keeps the default memory margin free
    (its XLA peak / (1 - margin)): the budget a user who runs that hand plan has."""
    s = lc.session(made, mesh=mesh)
    half = FRACTION * lc.replicated_bytes(s)
    if hand_xla and min(hand_xla) > half:
        margin = s.hardware.memory_margin
        return min(hand_xla) / (1 - margin), (
            f"the smallest hand plan's XLA peak {partex.format_bytes(min(hand_xla))} with the {margin:.0%} "
            f"margin free: no hand plan meets {FRACTION}x replicated ({partex.format_bytes(half)})")
    return half, f"{FRACTION}x replicated"


def places_in_host(d: partex.Decision) -> bool:
    """A decision that puts values in host memory: state kept there, residuals offloaded."""
    return isinstance(d, partex.Memory) or (isinstance(d, partex.Recompute) and "offload" in d.kind)


def searched(made, mesh: str, budget: float, host: bool = True) -> str:
    """The search's plan under ``budget`` (``host``: with the decisions that put values in
    host memory, else without them), checked by XLA."""
    s = lc.session(made, mesh=mesh, memory=budget)
    if not host:
        for d in s.actions:
            if places_in_host(d):
                s.forbid(d.id, d.slot)
    s.step(SIMULATIONS)
    if s.best_plan() is None:
        return f"no plan: {s.stats().no_fit}"
    try:
        s.verified_best()
    except partex.PartexError as e:
        return failure(e)
    plan = s.best_plan()
    shards = ", ".join(f"{d.group}→{d.axis}" for d in plan.decisions)
    out = s.verify(plan, run=True, mark=False)
    verdict = "fits" if out.fits and out.numerics.ok else "DOES NOT FIT" if not out.fits else "WRONG NUMERICS"
    host_part = (f", {partex.format_bytes(out.host_unchecked)} in host memory unchecked"
                 if out.host_unchecked is not None else "")
    return (f"{verdict} per XLA: device {partex.format_bytes(out.xla_memory['device'])}{host_part} vs budget "
            f"{partex.format_bytes(budget)} (predicted {partex.format_bytes(s.best().report.memory.peak)}); "
            f"numerics {numerics_text(out)}; {ratio_text(out)}; decisions: {shards or 'none'}")


def form_section(form: str) -> tuple[list[str], dict[str, str]]:
    """The form's markdown section and its summary cells."""
    t0 = time.perf_counter()
    lines = [f"### {form}", ""]
    summary = {"form": form}
    try:
        mod = load(form)
        made = mod.make()
        fn, args, names = lc.unpack(made)
        an = partex.analyze(fn, *args, axis_names=names)
    except Exception as e:
        summary["analyze"] = failure(e)
        return lines + [f"analyze: {summary['analyze']}", ""], summary
    groups = [str(len(an.analysis.decision_groups)),
              attempt(lambda: str(lc.decision_groups(mod.make(layers=4))))]
    units = an.analysis.units
    summary["analyze"] = "ok"
    summary["groups"] = " / ".join(groups)
    summary["stacks"] = str(len(units))
    lines.append(f"mesh {mod.MESH}; analyze ok: ops {len(an.program.ops)}; decision groups at 2 / 4 layers: "
                 f"{groups[0]} / {groups[1]}; layer stacks (recompute units): "
                 f"{', '.join(u.description for u in units) or 'none'}")
    try:
        s = lc.session(made, mesh=mod.MESH)
    except Exception as e:
        summary["session"] = failure(e)
        return lines + ["", f"session: {summary['session']}", ""], summary
    lines += [f"the step's own shardings (kept in every plan): {fixed_text(s)}", "",
              "| plan | shardings | numerics (max rel err) | predicted / XLA |", "|---|---|---|---|"]
    offered = attempt(lambda: ",".join(s.baselines()))
    hand_xla: list[float] = []
    bad: list[str] = []
    for name in HAND:
        if name == "expert" and "expert" not in offered.split(","):
            continue
        try:
            shard = own_shardings(s, s.strategy(name))
        except Exception as e:
            lines.append(f"| {name} | {failure(e)} | | |")
            summary[name] = "FAIL"
            continue
        row, xla, off = plan_row(s, name, None, shard)
        lines.append(row)
        hand_xla += [xla] if xla is not None else []
        bad += [f"{name}: {k}" for k in off]
        summary[name] = "ok" if "(ok)" in row else "FAIL"
    if form in RECOMPUTE_FORMS:
        base = attempt(lambda: "ok" if s.strategy("zero3") is not None else "")
        for u in units:
            for kind in u.kinds:
                name = f"zero3 + {u.label}->recompute:{kind}"
                if base != "ok":
                    lines.append(f"| {name} | | {base} | |")
                    continue
                decisions = [*s.strategy("zero3"), partex.Recompute(u.id, kind)]
                row, _, off = plan_row(s, name, decisions, "zero3's")
                bad += [f"{name}: {k}" for k in off]
                lines.append(row)
                summary[f"recompute:{kind}"] = "ok" if "(ok)" in row else "FAIL"
    caught = attempt(lambda: wrong_shard(s, made, "zero3"))
    summary["wrong shard"] = "caught" if caught.startswith("caught") else "FAIL"
    lines += ["", f"zero3's outputs with a shard in the wrong place: {caught}"]
    summary["mispriced"] = str(len(bad))
    lines += ["", f"collective kinds off by more than {TOLERANCE:.0%}: {'; '.join(bad) or 'none'}"]
    budget, rule = search_budget(made, mod.MESH, hand_xla)
    lines += ["", f"searched plans (budget {partex.format_bytes(budget)}: {rule}; {SIMULATIONS} simulations):"]
    for host, col in ((True, "searched"), (False, "searched, no host")):
        verdict = attempt(lambda: searched(made, mod.MESH, budget, host))
        summary[col] = ("fits" if verdict.startswith("fits") else
                        "FAIL" if verdict.startswith(("FAILS", "DOES", "WRONG", "no plan")) else "?")
        lines += [f"- {'host memory allowed' if host else 'nothing new in host memory'}: {verdict}"]
    lines += ["", f"({time.perf_counter() - t0:.0f} s)", ""]
    return lines, summary


def summary_table(rows: list[dict[str, str]]) -> list[str]:
    cols = ["form", "analyze", "groups", "stacks", *HAND, "mispriced", "wrong shard", "searched", "searched, no host"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [r.get(c, "FAIL (no session)" if "session" in r else "-") for c in cols]
        cells[1] = "ok" if cells[1] == "ok" else "FAIL"
        out.append("| " + " | ".join(cells) + " |")
    return out


def main(argv: list[str]) -> None:
    unknown = [f for f in argv if f not in FORMS]
    if unknown:
        sys.exit(f"unknown form(s) {', '.join(unknown)}; known: {' '.join(FORMS)}")
    rows = []
    for form in argv or FORMS:
        lines, summary = form_section(form)
        rows.append(summary)
        print("\n".join(lines), flush=True)
    print("\n".join(["### summary", "", *summary_table(rows), ""]), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
