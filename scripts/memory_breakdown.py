"""What the predicted peak holds, beside XLA's: the op where the cost model's per-device peak
falls, the intermediates and extra buffers (reshard copies, partial results, recomputed
copies, a region's own arrays) live there, largest first; then, with ``--xla``, XLA's own
temporary buffers from its buffer assignment (the memory-usage report of the compiled plan).
A debugging aid for the memory model: run it on a plan whose predicted / XLA ratio is off and
compare the two lists.

    JAX_NUM_CPU_DEVICES=8 .venv/bin/python scripts/memory_breakdown.py MODEL --mesh data=4,model=2 \\
        --strategy zero3 [--shard 'GROUP=AXIS' ...] [--recompute KIND] [--top 20] [--xla]

MODEL: a demo model name, ``path/file.py:attr`` or ``module:attr`` (as ``partex analyze``
takes it), or a production form's name from ``scripts/forms`` (its own mesh unless --mesh).
``--shard`` adds decisions by group label (``*/w_in[1]=model``); ``--recompute`` adds a
recompute decision on the first layer stack. The prediction is the one verify compares with
XLA's (``lowering="cpu"``).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
HERE = os.path.dirname(os.path.abspath(__file__))
FORMS = os.path.join(HERE, "forms")


def _model(spec: str):
    """(fn, args, mesh or None) of MODEL."""
    import importlib.util

    import partex

    form = os.path.join(FORMS, f"{spec}.py")
    if os.path.exists(form):
        s = importlib.util.spec_from_file_location(f"partex_form_{spec}", form)
        mod = importlib.util.module_from_spec(s)
        s.loader.exec_module(mod)
        fn, args = mod.make()
        return fn, args, mod.MESH
    m = partex.load_model(spec)
    return m.fn, m.args, None


def _peak(cm, decisions, top: int) -> None:
    """Run the cost model on ``decisions`` and print what its peak holds."""
    program = cm.program
    m = cm.evaluate(decisions, detail=True).memory
    t = m.peak_op
    where = program.ops[t] if 0 <= t < len(program.ops) else None
    print(f"predicted peak {m.peak:,.0f} B: arguments {m.arguments:,.0f}, outputs {m.outputs:,.0f}, "
          f"temporaries {m.temporaries:,.0f}, aliased {m.alias:,.0f}")
    print(f"the temporaries' peak is at op {t}" + (f" ({where.primitive}, {where.source})" if where else ""))
    for h in m.held[:top]:
        made = program.ops[h.start] if h.start < len(program.ops) else None
        shape = ""
        if h.value >= 0:
            val = program.values[h.value]
            shape = f" {h.value} {tuple(val.shape)} {val.dtype}"
        src = f", made by {made.primitive} at {made.source}" if made is not None else ""
        print(f"  {h.bytes:>12,.0f} B  ops {h.start}-{h.stop}  {h.kind}{shape}{src}")
    if len(m.held) > top:
        print(f"  ... {len(m.held) - top} more ({sum(h.bytes for h in m.held[top:]):,.0f} B)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--mesh", default=None)
    ap.add_argument("--strategy", default=None, help="a hand plan: dp, megatron, zero3, ...")
    ap.add_argument("--shard", action="append", default=[], help="GROUP=AXIS, by group label")
    ap.add_argument("--recompute", default=None, help="a recompute kind on the first layer stack")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--xla", action="store_true", help="also compile the plan and print XLA's buffers")
    args = ap.parse_args()
    if args.xla:  # before the backend starts: XLA reads its flags once
        dump = tempfile.mkdtemp(prefix="partex-xla-")
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump} "
                                   "--xla_dump_hlo_as_text --xla_dump_hlo_pass_re=^$").strip()
    import partex
    from partex.cost import CostModel

    fn, fargs, form_mesh = _model(args.model)
    s = partex.Session(fn, fargs, mesh=args.mesh or form_mesh or "data=4,model=2")
    decisions = list(s.strategy(args.strategy)) if args.strategy else []
    for item in args.shard:
        group, _, axis = item.rpartition("=")
        if not group:
            sys.exit(f"--shard wants GROUP=AXIS, got {item!r}")
        decisions.append(partex.Shard(s.group(group).id, axis))
    if args.recompute:
        if not s.units:
            sys.exit("--recompute: the model has no layer stack to recompute")
        decisions.append(partex.Recompute(s.units[0].id, args.recompute))
    cm = CostModel(s.analysis, s.cost_model.mesh, s.cost_model.hw, donate=s.donate, lowering="cpu")
    _peak(cm, decisions, args.top)
    if args.xla:
        out = s.verify(s.plan(decisions), mark=False)
        print(f"XLA: {out.xla_memory}  predicted / XLA {out.memory.ratio:.3f}")
        reports = [r for r in glob.glob(os.path.join(dump, "*memory-usage-report.txt")) if "partex" in r]
        if reports:
            with open(max(reports, key=os.path.getsize)) as f:
                lines = f.read().splitlines()
            print(f"XLA's buffers ({dump}):")
            for line in lines[:args.top + 4]:
                print("  " + line)


if __name__ == "__main__":
    main()
