"""How long the cost model takes to score a plan (``CostModel.evaluate``).

    python scripts/evaluate_speed.py [--setups tiny,t32] [--rounds 5] [--reference FILE]

On each setup -- the tiny transformer on ``data=4,model=2`` (tpu-v4) and T32 on
``data=8,model=4`` (tpu-v4) -- it times, per plan (the hand strategies, ``zero3`` minus its
last decision, ``zero3+remat`` where the model has layer stacks):

- ``build``: constructing a CostModel from the session's analysis (tables, liveness);
- ``cold``: the first ``evaluate`` of each plan on a fresh CostModel (nothing memoised);
- ``near``: on a CostModel that has scored ``zero3``, each plan ``zero3`` minus one of its
  decisions (what the search asks for: partly memoised);
- ``hot``: ``evaluate`` of plans already scored (memoised), ``detail`` False and True.

Each figure is the best (minimum) over ``--rounds`` rounds, in microseconds (ms for build),
of the process's CPU time (``--clock wall``: elapsed time): on a loaded machine the least
disturbed round is the most repeatable figure. ``PARTEX_CHECKOUT=<dir>`` times that
checkout's partex instead (``scripts/_checkout.py``): run it on two checkouts in turn to
compare versions.
``--reference FILE`` also loads the CostModel of another cost-model module file (e.g. a
copy of the old ``engine/_cost.py``, imported as a partex submodule) and times it in the
same rounds, interleaved with the current one, so that a loaded machine slows both alike;
it also checks that both give the same step time, communication and peak memory.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time

from _checkout import use_checkout_from_env

SETUPS = {
    "tiny": dict(spec="transformer", preset="tiny", mesh="data=4,model=2", hardware="tpu-v4"),
    "t32": dict(spec="transformer", preset="t32", mesh="data=8,model=4", hardware="tpu-v4"),
}
STRATEGIES = ("replicated", "dp", "megatron", "zero3")


def load_reference(path: str):
    """The CostModel class of a cost-model module file, imported as ``partex._cost_reference``."""
    import partex  # noqa: F401  (the package its relative imports resolve against)

    spec = importlib.util.spec_from_file_location("partex._cost_reference", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod.CostModel


def plans(s) -> dict[str, list]:
    out = {name: list(s.strategy(name)) for name in STRATEGIES}
    out["zero3-1"] = out["zero3"][:-1]
    if s.analysis.units:
        out["zero3+remat"] = list(s.strategy("zero3+remat"))
    return out


def fresh(cls, s):
    cm = s.cost_model
    return cls(s.analysis, s.mesh, s.hardware, donate=s.donate, user_shardings=cm.user_shardings)


CLOCK = time.process_time


def timed(fn) -> float:
    t = CLOCK()
    fn()
    return CLOCK() - t


def one_round(cls, s, ps: dict[str, list], hot_reps: int) -> dict[str, float]:
    """Seconds per call of each measurement, for one CostModel class."""
    out: dict[str, float] = {}
    cm = None

    def build():
        nonlocal cm
        cm = fresh(cls, s)

    out["build"] = timed(build)
    for name, dec in ps.items():
        out[f"cold {name}"] = timed(lambda dec=dec: cm.evaluate(dec))
    near = fresh(cls, s)
    z3 = ps["zero3"]
    near.evaluate(z3)
    variants = [z3[:k] + z3[k + 1:] for k in range(len(z3))]
    out["near zero3-1 (each)"] = timed(lambda: [near.evaluate(d) for d in variants]) / max(1, len(variants))
    for detail in (False, True):
        for name, dec in ps.items():
            cm.evaluate(dec, detail=detail)
            out[f"hot {name}{' detail' if detail else ''}"] = timed(
                lambda dec=dec, detail=detail: [cm.evaluate(dec, detail=detail) for _ in range(hot_reps)]) / hot_reps
    return out


def same_reports(classes: dict, s, ps: dict[str, list]) -> list[str]:
    """Plans on which the CostModel classes disagree (step, comm, hidden, peak memory)."""
    bad = []
    for name, dec in ps.items():
        figs = {}
        for label, cls in classes.items():
            r = fresh(cls, s).evaluate(dec, detail=True)
            figs[label] = (r.step_time, r.comm_time, r.hidden_time, r.memory.peak, len(r.collectives))
        vals = list(figs.values())
        if any(abs(a - b) > 1e-9 * max(abs(a), abs(b), 1e-30) for v in vals[1:] for a, b in zip(vals[0], v)):
            bad.append(f"{name}: {figs}")
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setups", default="tiny,t32", help=f"comma-separated, of {', '.join(SETUPS)}")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hot-reps", type=int, default=200, help="repeated calls per hot measurement")
    ap.add_argument("--reference", help="a cost-model module file to time beside the current one")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter

    use_checkout_from_env()
    import partex

    print(f"partex from {partex.__file__}", flush=True)
    for setup in args.setups.split(","):
        cfg = dict(SETUPS[setup])
        t0 = time.perf_counter()
        s = partex.Session.from_spec(cfg.pop("spec"), warm_start=False, **cfg)
        ps = plans(s)
        classes = {"current": type(s.cost_model)}
        if args.reference:
            classes["reference"] = load_reference(args.reference)
        print(f"== {setup} ({SETUPS[setup]['preset']}, {SETUPS[setup]['mesh']}): {len(s.program.ops)} ops, "
              f"session {time.perf_counter() - t0:.1f} s; plans: "
              + ", ".join(f"{k} ({len(v)})" for k, v in ps.items()), flush=True)
        if len(classes) > 1:
            bad = same_reports(classes, s, ps)
            print("reports agree" if not bad else "REPORTS DIFFER:\n  " + "\n  ".join(bad), flush=True)
        samples: dict[str, dict[str, list[float]]] = {label: {} for label in classes}
        for r in range(args.rounds):
            order = list(classes.items())
            if r % 2:
                order.reverse()  # alternate which goes first
            for label, cls in order:
                for k, v in one_round(cls, s, ps, args.hot_reps).items():
                    samples[label].setdefault(k, []).append(v)
        labels = list(classes)
        print(f"{'measurement':32}" + "".join(f"{lab:>14}" for lab in labels)
              + ("      ratio" if len(labels) > 1 else ""))
        for k in samples[labels[0]]:
            meds = [min(samples[lab][k]) for lab in labels]
            unit, scale = ("ms", 1e3) if k == "build" else ("us", 1e6)
            row = f"{k:32}" + "".join(f"{m * scale:11.1f} {unit}" for m in meds)
            if len(meds) > 1:
                row += f"  {meds[0] / meds[1]:9.2f}"
            print(row, flush=True)


if __name__ == "__main__":
    main()
