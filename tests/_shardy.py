"""Shardy's factor rule of an op, read from jaxlib's own OpenXLA Shardy, and partex's rule of
the same op, both in one canonical form so that they compare factor by factor.

Shardy: the function is lowered to StableHLO (``jax.jit(f).lower``) and the pass
``sdy-populate-op-sharding-rules`` attaches ``#sdy.op_sharding_rule<([i, k], [k, j])->([i, j])
{i=8, j=16, k=8} reduction={k}>`` to every op: each operand/result dim lists its factors
(several for a compound dim: ``[ij]``, major first), with their sizes and kinds.

The canonical form, over dims of size > 1 and factors of size > 1:
- ``ties``: the tying factors (pass-through and reduction), each as (kind, its dims), a dim
  being (side, tensor index, dim, part of a compound dim);
- ``kinds``: each dim's kind ("P", "R", "N", "M"), one per part of a compound dim.
Need-replication and permutation factors tie nothing (partex never ties across them), so
only their kind per dim counts.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Sequence

import jax

from partex.tracing._program import trace
from partex.analysis._rules import FactorKind, PSEUDO_OPS, factors_of

_KIND = {FactorKind.PASS: "P", FactorKind.REDUCTION: "R", FactorKind.REPLICATE: "N", FactorKind.PERMUTE: "M"}
_RULE = re.compile(r"#sdy\.op_sharding_rule<\((.*?)\)->\((.*?)\)(?: \{([^}]*)\})?(.*?)>")


@dataclasses.dataclass(frozen=True)
class Canonical:
    ties: frozenset  # (kind, frozenset of (side, tensor, dim, part))
    kinds: tuple  # ((side, tensor, dim), tuple of kinds of its parts), sorted

    def describe(self) -> str:
        by_dim = dict(self.kinds)
        out = []
        for side in ("in", "out"):
            dims = sorted({(t, d) for s, t, d in by_dim if s == side})
            tensors = sorted({t for t, _ in dims})
            out.append(side + " " + " ".join(
                f"#{t}[" + ",".join("".join(by_dim[(side, t, d)]) for tt, d in dims if tt == t) + "]"
                for t in tensors))
        ties = sorted(f"{k}:" + "=".join(f"{s}{t}.{d}" + (f"'{p}" if p else "") for s, t, d, p in sorted(m))
                      for k, m in self.ties if len(m) > 1)
        return "; ".join(out) + ("; ties " + " ".join(ties) if ties else "")


def _split_tensors(text: str) -> list[list[str]]:
    """``[i, k], [k, j]`` -> [["i", "k"], ["k", "j"]] (each dim's factor string)."""
    return [[d.strip() for d in t.split(",") if d.strip()] if t.strip() else []
            for t in re.findall(r"\[([^\]]*)\]", text)]


def _factors(dim: str) -> list[str]:
    """A dim's factors, major first: ``ij`` -> ["i", "j"]; ``z_1z_2`` -> ["z_1", "z_2"]."""
    return re.findall(r"[a-z](?:_\d+)?", dim)


def parse_rule(text: str) -> dict:
    m = _RULE.search(text)
    if m is None:
        raise ValueError(f"no sharding rule in {text!r}")
    operands, results = _split_tensors(m.group(1)), _split_tensors(m.group(2))
    sizes = {k.strip(): int(v) for k, v in (kv.split("=") for kv in (m.group(3) or "").split(",") if "=" in kv)}
    sets = {}
    for name in ("reduction", "need_replication", "permutation", "blocked_propagation"):
        sm = re.search(name + r"=\{([^}]*)\}", m.group(4) or "")
        sets[name] = {f.strip() for f in sm.group(1).split(",")} if sm else set()
    return {"operands": operands, "results": results, "sizes": sizes, **sets}


def canonical_shardy(rule: dict, operand_map: Sequence[int | None], result_map: Sequence[int | None]) -> Canonical:
    """``operand_map[i]``: the jaxpr operand the StableHLO operand ``i`` stands for (None:
    an operand the jaxpr eqn does not have, e.g. a reduce's init value); likewise results."""
    members: dict[str, set] = {}
    kinds = {}

    def kind(f: str) -> str:
        if f in rule["reduction"]:
            return "R"
        if f in rule["need_replication"]:
            return "N"
        if f in rule["permutation"]:
            return "M"
        return "P"

    for side, tensors, mapping in (("in", rule["operands"], operand_map), ("out", rule["results"], result_map)):
        for t, dims in enumerate(tensors):
            if t >= len(mapping) or mapping[t] is None:
                continue
            for d, dim in enumerate(dims):
                parts = [f for f in _factors(dim) if rule["sizes"].get(f, 1) > 1]
                if not parts:
                    continue
                kinds[(side, mapping[t], d)] = tuple(kind(f) for f in parts)
                for p, f in enumerate(parts):
                    members.setdefault(f, set()).add((side, mapping[t], d, p if len(parts) > 1 else 0))
    ties = frozenset((kind(f), frozenset(m)) for f, m in members.items() if kind(f) in ("P", "R"))
    return Canonical(ties, tuple(sorted(kinds.items())))


def canonical_partex(primitive: str, params: dict, ins, outs) -> Canonical:
    """A reshape's merged dim holds its major factor and then its minor ones (``minor_of``):
    its parts, major first, as Shardy's compound dims."""
    kinds: dict[tuple, list[str]] = {}
    factors = factors_of(primitive, params, ins, outs)
    spans = []
    for f in factors:
        dims = [("in", i, d) for i, d in f.operands] + [("out", j, d) for j, d in f.results]
        spans.append([(dim, len(kinds.setdefault(dim, []))) for dim in dims])
        for dim in dims:
            kinds[dim].append(_KIND[f.kind])
    ties = set()
    for f, dims in zip(factors, spans):
        k = _KIND[f.kind]
        if k in ("P", "R") and (f.ties or f.minor_of):
            ties.add((k, frozenset(dim + (part if len(kinds[dim]) > 1 else 0,) for dim, part in dims)))
    sizes = {("in", i, d): s for i, sh in enumerate(ins) for d, s in enumerate(sh)}
    sizes.update({("out", j, d): s for j, sh in enumerate(outs) for d, s in enumerate(sh)})
    return Canonical(frozenset(ties), tuple(sorted((dim, tuple(k)) for dim, k in kinds.items() if sizes[dim] > 1)))


def lowered_ops(fn: Callable, args: Sequence[Any]) -> list[tuple[str, str, list[tuple], list[tuple]]]:
    """(StableHLO op name, its sharding rule, operand shapes, result shapes) of every op of
    ``jit(fn)`` that Shardy has a rule for, in program order (ops nested in regions too)."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir, passmanager

    text = jax.jit(fn).lower(*args).as_text()
    out = []

    def shape(t) -> tuple:
        try:
            return tuple(ir.RankedTensorType(t).shape)
        except (ValueError, TypeError):
            return ()

    def walk(op):
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    attrs = inner.operation.attributes
                    if "sdy.sharding_rule" in attrs:
                        out.append((inner.operation.name, str(attrs["sdy.sharding_rule"]),
                                    [shape(v.type) for v in inner.operation.operands],
                                    [shape(r.type) for r in inner.operation.results]))
                    walk(inner.operation)

    with mlir.make_ir_context():
        module = ir.Module.parse(text)
        passmanager.PassManager.parse("builtin.module(func.func(sdy-populate-op-sharding-rules))").run(module.operation)
        walk(module.operation)
    return out


@dataclasses.dataclass
class Case:
    fn: Callable
    shapes: Sequence[tuple]
    hlo: str  # the StableHLO op that the primitive lowers to (``stablehlo.dot_general``)
    primitive: str | None = None  # the jaxpr primitive (default: the first non-pseudo op)
    operand_map: Sequence[int | None] | None = None  # default: by position, scalars dropped
    result_map: Sequence[int | None] | None = None
    dtypes: Sequence[Any] | None = None


def compare(case: Case) -> tuple[Canonical, Canonical]:
    """(partex's canonical rule, Shardy's) of the case's op."""
    import jax.numpy as jnp

    dtypes = case.dtypes or [jnp.float32] * len(case.shapes)
    args = [jax.ShapeDtypeStruct(s, dt) for s, dt in zip(case.shapes, dtypes)]
    prog = trace(case.fn, args)
    ops = [op for op in prog.ops if op.primitive not in PSEUDO_OPS
           and (case.primitive is None or op.primitive == case.primitive)]
    if not ops:
        raise AssertionError(f"no {case.primitive} op in the traced function")
    op = ops[0]
    ins = [prog.values[i].shape for i in op.inputs]
    outs = [prog.values[o].shape for o in op.outputs]
    mine = canonical_partex(op.primitive, op.params, ins, outs)
    lowered = lowered_ops(case.fn, args)
    found = [(rule, hlo_ins) for name, rule, hlo_ins, _ in lowered if name == case.hlo]
    if not found:
        raise AssertionError(f"{op.primitive} did not lower to {case.hlo}: {sorted({n for n, *_ in lowered})}")
    text, hlo_ins = found[0]
    rule = parse_rule(text)
    if case.operand_map is not None:
        omap = list(case.operand_map)
    else:  # by position over the operands of rank > 0 (scalar inits / padding values dropped)
        omap, k = [], 0
        for shape in hlo_ins[: len(rule["operands"])]:
            while k < len(ins) and not ins[k] and shape:
                k += 1
            omap.append(k if shape and k < len(ins) else None)
            k += 1 if shape else 0
    rmap = list(case.result_map) if case.result_map is not None else list(range(len(rule["results"])))
    return mine, canonical_shardy(rule, omap, rmap)
