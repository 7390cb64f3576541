"""Explain XLA's collectives: each collective of the compiled plan, with the source line and
op it comes from (the HLO's metadata), matched to the collective partex predicted for that
line and to the decision that causes it.

The compiled HLO names, on every instruction, an ``op_name`` and a ``stack_frame_id`` into
tables printed before the module (``FileNames``, ``FunctionNames``, ``FileLocations``,
``StackFrames``: a frame is a file location and its caller's frame); older XLA prints
``source_file=`` / ``source_line=`` instead. A collective the partitioner made from a
parameter's sharding (a ZeRO weight gathered where it is read) carries only the parameter's
path as its op name (``args[0]['layers'][1]['wq']``). XLA combines independent all-reduces
into one tuple all-reduce: its operands are attributed one by one, each to the line of the
instruction that produced it.

A collective matches a predicted one of the same kind when a line of its call stack is the
predicted op's source line (or, for a collective written in a shard_map body, that of the op
that made its operand), or when it moves a parameter the predicted collective reshards.

Some collectives are XLA's own choice, made where no plan decides: a Pallas kernel run
interpreted (``pallas_call(..., interpret=...)``, as off TPU and GPU) is lowered to a loop
over the kernel's grid, which the partitioner partitions like any loop, gathering the
kernel's sharded operands and writing its result block by block on every grid step; TPU and
GPU run the kernel as one custom call with its operands whole. Such a collective (one that
runs inside the loop of a kernel's source line) is shown as XLA's choice, with that reason,
not as a miss; ``backend_notes`` says the same on the verify report.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import re
from typing import Any, Mapping

from .._mesh import format_bytes
from ._hlo import _OPCODE_KIND, _call_edges, _Instr, _Module, _multipliers, _parse_module, shape_bytes

_TABLE = re.compile(r"^(FileNames|FunctionNames|FileLocations|StackFrames)\s*$")
_ROW = re.compile(r"^(\d+)\s+(.*)$")
_KV = re.compile(r"(\w+)=(\d+)")
_META = re.compile(r"metadata=\{([^{}]*)\}")
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_FRAME_ID = re.compile(r"stack_frame_id=(\d+)")
_SRC_FILE = re.compile(r'source_file="((?:[^"\\]|\\.)*)"')
_SRC_LINE = re.compile(r"source_line=(\d+)")
_ARG_PATH = re.compile(r"^args\[(\d+)\]((?:\[[^\]]*\])*)$")

Frame = tuple[str, int, str]  # file, line, function


@dataclasses.dataclass(frozen=True)
class XlaCollective:
    """One collective of the compiled HLO (or one operand of a combined one)."""

    kind: str
    bytes: float  # per device, all executions per step
    name: str  # HLO instruction
    op_name: str
    stack: tuple[Frame, ...]  # innermost first
    param: str | None  # the parameter it moves, as partex's input path, if the HLO says so
    # the call stacks of the while loops it runs inside, innermost loop first
    loops: tuple[tuple[Frame, ...], ...] = ()

    @property
    def where(self) -> str:
        user = next((f for f in self.stack if not _internal(f[0])), None)
        if user:
            return f"{user[0]}:{user[1]} ({user[2]})"
        # a parameter's path, or JAX's name for an op traced with no user line (as partex
        # names such ops: <gather>)
        return self.param or (f"<{self.op_name.rsplit('/', 1)[-1]}>" if self.op_name else "-")


_HERE = os.path.dirname(os.path.abspath(__file__))


def _internal(path: str) -> bool:
    """partex's own engine files and JAX's: frames that are not the user's code."""
    return path.startswith(_HERE) or "/jax/_src/" in path or ("/jax/" in path and "site-packages" in path)


def _tables(text: str) -> dict[int, tuple[Frame, ...]]:
    """Stack frame id -> its frames, innermost first (from the tables before the module)."""
    files: dict[int, str] = {}
    funcs: dict[int, str] = {}
    locs: dict[int, tuple[int, int, int]] = {}
    frames: dict[int, tuple[int, int]] = {}
    table = None
    for line in text.splitlines():
        s = line.strip()
        m = _TABLE.match(s)
        if m:
            table = m.group(1)
            continue
        if not s:
            continue
        if s.startswith(("HloModule", "ENTRY", "%")) or s.endswith("{"):  # the module: the tables are over
            table = None
            continue
        r = _ROW.match(s)
        if table is None or not r:
            continue
        i, rest = int(r.group(1)), r.group(2)
        if table == "FileNames":
            files[i] = rest.strip().strip('"')
        elif table == "FunctionNames":
            funcs[i] = rest.strip().strip('"')
        elif table == "FileLocations":
            kv = dict((k, int(v)) for k, v in _KV.findall(rest))
            locs[i] = (kv.get("file_name_id", 0), kv.get("function_name_id", 0), kv.get("line", 0))
        elif table == "StackFrames":
            kv = dict((k, int(v)) for k, v in _KV.findall(rest))
            frames[i] = (kv.get("file_location_id", 0), kv.get("parent_frame_id", 0))
    out: dict[int, tuple[Frame, ...]] = {}
    for fid in frames:
        chain, seen, f = [], set(), fid
        while f in frames and f not in seen:
            seen.add(f)
            loc, parent = frames[f]
            if loc in locs:
                fi, fu, ln = locs[loc]
                chain.append((files.get(fi, "?"), ln, funcs.get(fu, "?")))
            f = parent
        out[fid] = tuple(chain)
    return out


def _metadata(raw: str, frames: dict[int, tuple[Frame, ...]]) -> tuple[str, tuple[Frame, ...]]:
    m = _META.search(raw.replace("\\'", "'"))
    if not m:
        return "", ()
    meta = m.group(1)
    name = _OP_NAME.search(meta)
    op_name = name.group(1) if name else ""
    fid = _FRAME_ID.search(meta)
    if fid:
        return op_name, frames.get(int(fid.group(1)), ())
    f, ln = _SRC_FILE.search(meta), _SRC_LINE.search(meta)
    if f and ln:
        return op_name, ((f.group(1), int(ln.group(1)), ""),)
    return op_name, ()


def param_path(op_name: str, arg_names) -> str | None:
    """``args[0]['layers'][1]['wq']`` -> ``params/layers/1/wq`` (partex's input path)."""
    m = _ARG_PATH.match(op_name.strip())
    if not m:
        return None
    i = int(m.group(1))
    keys = re.findall(r"\[([^\]]*)\]", m.group(2))
    head = arg_names[i] if i < len(arg_names) else f"arg{i}"
    return "/".join([head] + [k.strip("'\"") for k in keys])


def _enclosing_loops(mod: _Module) -> dict[str, tuple[_Instr, ...]]:
    """Per computation, the while instructions it runs inside, innermost first (through
    every call: a loop body's called computations run inside the loop too)."""
    parent: dict[str, tuple[str, _Instr]] = {}
    for comp, instrs in mod.computations.items():
        for ins in instrs:
            for _, callee in _call_edges(ins):
                if callee != comp:
                    parent.setdefault(callee, (comp, ins))
    out: dict[str, tuple[_Instr, ...]] = {}
    for comp in mod.computations:
        loops, seen, c = [], set(), comp
        while c in parent and c not in seen:
            seen.add(c)
            c, ins = parent[c]
            if ins.opcode == "while":
                loops.append(ins)
        out[comp] = tuple(loops)
    return out


def xla_collectives(text: str, arg_names=()) -> list[XlaCollective]:
    """The compiled module's collectives, trip-count weighted, each with its op name and call
    stack; a combined (tuple) collective split into its operands, each attributed to the
    instruction that produced it."""
    frames = _tables(text)
    mod = _parse_module(text)
    mults = _multipliers(mod)
    enclosing = _enclosing_loops(mod)
    out = []
    for comp, instrs in mod.computations.items():
        by_name = {ins.name: ins for ins in instrs}
        loops = tuple(_metadata(w.raw, frames)[1] for w in enclosing.get(comp, ()))
        for ins in instrs:
            kind = _OPCODE_KIND.get(ins.opcode)
            if kind is None:
                continue
            trips = mults.get(comp, 1)
            own = _metadata(ins.raw, frames)
            shapes = [s or (by_name[n].shape if n in by_name else "") for n, s in zip(ins.operands, ins.operand_shapes)]
            pieces = []
            if len(ins.operands) > 1:  # combined: per operand, from its producer
                for n, sh in zip(ins.operands, shapes):
                    src = _metadata(by_name[n].raw, frames) if n in by_name else ("", ())
                    pieces.append((n, shape_bytes(sh), src if (src[0] or src[1]) else own))
            else:
                total = max(sum(shape_bytes(s) for s in shapes), shape_bytes(ins.shape)) if not \
                    ins.opcode.endswith("-start") else sum(shape_bytes(s) for s in shapes)
                src = own
                if not own[1] and not param_path(own[0], arg_names) and ins.operands and ins.operands[0] in by_name:
                    prod = _metadata(by_name[ins.operands[0]].raw, frames)
                    src = prod if (prod[0] or prod[1]) else own
                pieces.append((ins.name, total, src))
            for name, nbytes, (op_name, stack) in pieces:
                out.append(XlaCollective(kind, float(nbytes) * trips, name, op_name, stack,
                                         param_path(op_name, arg_names), loops))
    return out


@dataclasses.dataclass(frozen=True)
class Predicted:
    kind: str
    bytes: float  # all executions per step
    source: str
    key: tuple[str, int] | None  # (file, line) of the op
    keys: tuple[tuple[str, int], ...]  # ... and of the op that made the operand it reshards
    param: str | None  # the input it reshards, if an input
    primitive: str
    cause: str
    decision: str


def _line_key(source: str) -> tuple[str, int] | None:
    m = re.match(r"^(.*?):(\d+)(?::\d+)?(?:\s|$)", source or "")
    return (m.group(1), int(m.group(2))) if m else None


def predicted_collectives(cm, report, decisions_by_group: dict[str, str]) -> list[Predicted]:
    """The cost model's collectives, one per op of each pattern (its bytes spread over the
    ops by their trips)."""
    program = cm.program
    inputs = dict(zip(program.inputs, program.input_paths))
    out = []
    for c in report.collectives:
        ops = c.ops or (c.op,)
        trips = sum(program.ops[o].trip for o in ops) or 1
        for o in ops:
            op = program.ops[o]
            share = c.bytes * c.count * op.trip / trips
            param, keys = None, [_line_key(op.source)]
            if 0 <= c.operand < len(op.inputs):
                v = op.inputs[c.operand]
                param = inputs.get(v)
                producer = program.values[v].producer
                if producer >= 0:  # the reshard may sit where the value is made (a loop's slice: the loop)
                    keys.append(_line_key(program.ops[producer].source))
            elif any(v in program.manual_values for v in op.inputs):
                # a collective written in a shard_map body (a transposed psum carries the region's
                # call line): XLA names the instruction that made what it reduces
                keys += [_line_key(program.ops[program.values[v].producer].source) for v in op.inputs
                         if program.values[v].producer >= 0]
            keys = tuple(k for k in dict.fromkeys(keys) if k)
            out.append(Predicted(c.kind, share, op.source, keys[0] if keys else None, keys, param, op.primitive,
                                 c.cause, decisions_by_group.get(c.cause, "-")))
    return out


def explain(text: str, cm, report, plan, arg_names=()) -> dict:
    """XLA's collectives matched to partex's predictions: ``matched_fraction`` (the share of
    XLA's collective bytes matched), ``xla_choice_bytes`` (those XLA makes where no plan
    decides, each such row's ``xla_choice`` giving the reason), and every collective of both
    sides."""
    by_group = collections.defaultdict(list)
    for d in plan.decisions:
        by_group[d.group].append(f"{d.group}->{d.axis}")
    decisions = {g: ", ".join(v) for g, v in by_group.items()}
    pipe = plan.pipeline
    if pipe is not None:  # the stage dims are the pipeline's (fixed on its axis): its stages' values, its rotation
        named = ":".join(str(x) for x in (pipe["stack"], pipe["axis"], pipe["microbatches"]))
        for d in cm.fixed.decisions:
            if d.axis == pipe["axis"]:
                label = cm.analysis.groups[d.group].label
                decisions[label] = f"{label}->{d.axis}: the pipeline {named}"
    xla = xla_collectives(text, arg_names)
    pred = predicted_collectives(cm, report, decisions)
    kernels = {k: op.source for op in interpreted_kernels(cm.program) if (k := _line_key(op.source))}
    by_line: dict[tuple[str, tuple[str, int]], list[int]] = collections.defaultdict(list)
    by_param: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
    by_prim: dict[tuple[str, str], list[int]] = collections.defaultdict(list)  # ops with no source line
    for i, p in enumerate(pred):
        for k in p.keys:
            by_line[(p.kind, k)].append(i)
        if not p.keys:
            by_prim[(p.kind, p.primitive)].append(i)
        if p.param:
            by_param[(p.kind, p.param)].append(i)
    used = set()
    rows = []
    matched_bytes = choice_bytes = 0.0
    for x in sorted(xla, key=lambda x: -x.bytes):
        cands = set(by_param.get((x.kind, x.param), ())) if x.param else set()
        for f in x.stack:
            cands.update(by_line.get((x.kind, (f[0], f[1])), ()))
        if not cands and not any(not _internal(f[0]) for f in x.stack):
            # traced with no line of the user's (JAX's own indexing, say): by its primitive
            cands.update(by_prim.get((x.kind, x.op_name.rsplit("/", 1)[-1]), ()))
        # the closest in bytes, one not matched yet first
        hit = min(cands, key=lambda i: (i in used, abs(math.log((pred[i].bytes + 1) / (x.bytes + 1))), i),
                  default=None)
        row = {"kind": x.kind, "bytes": x.bytes, "where": x.where, "op_name": x.op_name, "hlo": x.name,
               "matched": hit is not None}
        if hit is not None:
            used.add(hit)
            p = pred[hit]
            matched_bytes += x.bytes
            row.update(predicted_bytes=p.bytes, cause=p.cause, decision=p.decision, predicted_source=p.source)
        else:
            kernel = next((kernels[(f[0], f[1])] for stack in x.loops for f in stack if (f[0], f[1]) in kernels),
                          None)
            if kernel is not None:
                choice_bytes += x.bytes
                row.update(where=x.where if x.where != "-" else kernel, xla_choice=INTERPRETED_KERNEL)
        rows.append(row)
    total = sum(x.bytes for x in xla)
    unmatched = [{"kind": p.kind, "bytes": p.bytes, "where": p.source, "param": p.param, "cause": p.cause,
                  "decision": p.decision} for i, p in enumerate(pred) if i not in used and p.bytes > 0]
    return {"matched_fraction": matched_bytes / total if total else 1.0, "xla_bytes": total,
            "matched_bytes": matched_bytes, "xla_choice_bytes": choice_bytes, "collectives": rows,
            "unmatched_predicted": sorted(unmatched, key=lambda r: -r["bytes"])}


INTERPRETED_KERNEL = ("inside a Pallas kernel run interpreted on this backend: XLA lowers it to a loop over the "
                      "kernel's grid and partitions the loop, moving the kernel's sharded operands and result on "
                      "every grid step; TPU and GPU run the kernel as one custom call, its operands gathered once")


def interpreted_kernels(program) -> list:
    """The step's Pallas kernels that run interpreted (``pallas_call(..., interpret=...)``, as
    kernels are off TPU and GPU): XLA sees each as a loop over its grid, not one custom call."""
    return [op for op in program.ops if op.primitive == "pallas_call" and op.params.get("interpret")]


def backend_notes(program) -> tuple[str, ...]:
    """What this backend's figures for ``program`` cannot say, one line each (a verify
    report's ``notes``): its interpreted Pallas kernels."""
    n = len(interpreted_kernels(program))
    if not n:
        return ()
    kernels = "a Pallas kernel" if n == 1 else f"{n} Pallas kernels"
    return (f"the step holds {kernels} run interpreted on this backend (pallas_call(interpret=...)): XLA lowers "
            "each to a loop over its grid, moving the kernel's sharded operands and result on every grid step, so "
            "XLA's collective and memory figures around them are not what TPU or GPU run (the kernel as one custom "
            "call); verify there to check them (scripts/accelerator_check.py)",)


def explain_table(ex: Mapping[str, Any], top: int = 25) -> list[str]:
    lines = [f"XLA's collectives by source line: {ex['matched_fraction']:.0%} of "
             f"{format_bytes(ex['xla_bytes'])} matched to a predicted collective",
             f"  {'kind':<18} {'bytes':>10}  {'source':<48} {'decision (predicted)':<28}"]
    reasons: dict[str, int] = {}  # XLA's reasons for its own choices, numbered in order
    for r in ex["collectives"]:
        if not r["matched"] and r.get("xla_choice"):
            reasons.setdefault(r["xla_choice"], len(reasons) + 1)
    for r in ex["collectives"][:top]:
        if r["matched"]:
            dec = f"{r['decision']} ({format_bytes(r['predicted_bytes'])})"
        elif r.get("xla_choice"):
            dec = f"XLA's choice [{reasons[r['xla_choice']]}]"
        else:
            dec = "UNMATCHED"
        lines.append(f"  {r['kind']:<18} {format_bytes(r['bytes']):>10}  {_short(r['where']):<48} {dec:<28}")
    if len(ex["collectives"]) > top:
        lines.append(f"  ... {len(ex['collectives']) - top} more (--json lists every one)")
    if ex.get("xla_choice_bytes"):
        lines.append(f"XLA's choice, no plan's: {format_bytes(ex['xla_choice_bytes'])}")
        lines += [f"  [{i}] {reason}" for reason, i in reasons.items()]
    if ex["unmatched_predicted"]:
        lines.append("predicted, not found in XLA's program:")
        for r in ex["unmatched_predicted"][:10]:
            lines.append(f"  {r['kind']:<18} {format_bytes(r['bytes']):>10}  {_short(r['where']):<48} {r['decision']}")
    return lines


def _short(where: str, width: int = 48) -> str:
    return where if len(where) <= width else "..." + where[-(width - 3):]


__all__ = ["backend_notes", "explain", "explain_table", "interpreted_kernels", "xla_collectives"]
