"""Rotations (``jnp.roll``) recognised in a traced step and kept as one op.

``jnp.roll`` by a static shift traces to two slices and a concatenate, and its VJP to a split,
two pads and an ``add_any``. Op by op, the pieces rarely divide by the shard count and the
cut dim could not be sharded; as one rotation it can: each device receives the rows that
rotate into its block from its neighbour (XLA: one collective-permute). ``rotations``
rewrites both patterns into one ``roll`` eqn, a primitive of partex's that lowers to the same
slices and concatenate, so the analysis sees one op and ``apply`` binds it with its operand
and result constrained alike and its pieces left to XLA (the VJP's pads and add, left as
they are, make XLA gather and send pieces several times over).
"""

from __future__ import annotations

import collections
import dataclasses

from jax import lax

from ._jax import ClosedJaxpr, ad, batching, input_dtype, jcore, mlir, standard_primitive


def _shape_rule(x, *, axis, shift):
    if not 0 <= axis < x.ndim:
        raise TypeError(f"roll axis {axis} out of range for an operand of rank {x.ndim}")
    return x.shape


def _sharding_rule(x, *, axis, shift):
    return x.sharding


def _impl(x, *, axis: int, shift: int):
    """``x`` rotated by ``shift`` along ``axis``: row i of the result is row i - shift."""
    n = x.shape[axis]
    s = shift % n if n else 0
    if s == 0:
        return x
    return lax.concatenate([lax.slice_in_dim(x, n - s, n, axis=axis), lax.slice_in_dim(x, 0, n - s, axis=axis)], axis)


def _batch(args, dims, *, axis, shift):
    (x,), (b,) = args, dims
    return roll_p.bind(x, axis=axis + (b <= axis), shift=shift), b


# roll_p is built as lax's own primitives are (``tracing._jax``)
roll_p = standard_primitive(
    _shape_rule, input_dtype, "roll",
    sharding_rule=_sharding_rule, vma_rule=lambda x, **_: jcore.standard_vma_rule("roll", x))
ad.deflinear2(roll_p, lambda ct, x, *, axis, shift: [roll_p.bind(ct, axis=axis, shift=-shift)])
batching.primitive_batchers[roll_p] = _batch
mlir.register_lowering(roll_p, mlir.lower_fun(_impl, multiple_results=False))


def map_jaxprs(p, on_closed, on_jaxpr):
    """An eqn param with each jaxpr in it (a closed one, an open one, or a tuple of them:
    cond's branches) mapped by ``on_closed`` / ``on_jaxpr``; any other param as it is."""
    if isinstance(p, ClosedJaxpr):
        return on_closed(p)
    if isinstance(p, jcore.Jaxpr):
        return on_jaxpr(p)
    if isinstance(p, tuple) and any(isinstance(x, (ClosedJaxpr, jcore.Jaxpr)) for x in p):
        return tuple(map_jaxprs(x, on_closed, on_jaxpr) for x in p)
    return p


# Ops whose jaxpr params are a kernel's body or the function a custom partitioner wraps:
# XLA runs them as given, so no rewrite reaches inside.
OPAQUE_CALLS = frozenset({"pallas_call", "custom_partitioning"})


@dataclasses.dataclass(frozen=True)
class _Piece:
    """Rows [start, stop) of ``src`` along the rotation's axis, made by eqns ``made_by``."""

    src: object
    start: int
    stop: int
    made_by: tuple[int, ...]


def _full_but(shape, start, limit, strides, axis) -> bool:
    return (all(s in (None, 1) for s in (strides or ()))
            and all(start[d] == 0 and limit[d] == n for d, n in enumerate(shape) if d != axis))


class _Rewriter:
    def __init__(self):
        self.memo: dict[int, jcore.Jaxpr] = {}

    def closed(self, cj):
        new = self.jaxpr(cj.jaxpr)
        return cj if new is cj.jaxpr else ClosedJaxpr(new, cj.consts)

    def param(self, p):
        return map_jaxprs(p, self.closed, self.jaxpr)

    def jaxpr(self, jaxpr):
        key = id(jaxpr)
        if key not in self.memo:  # one result per jaxpr object: a shared body stays shared
            self.memo[key] = self._rewrite(jaxpr)
        return self.memo[key]

    def _rewrite(self, jaxpr):
        eqns = []
        for e in jaxpr.eqns:
            if e.primitive.name in OPAQUE_CALLS:  # a kernel's body is the kernel's own
                eqns.append(e)
                continue
            params = {k: self.param(p) for k, p in e.params.items()}
            changed = any(params[k] is not e.params[k] for k in params)
            eqns.append(e.replace(params=params) if changed else e)
        uses = collections.Counter(a for e in eqns for a in e.invars if isinstance(a, jcore.Var))
        uses.update(a for a in jaxpr.outvars if isinstance(a, jcore.Var))
        made = {v: i for i, e in enumerate(eqns) for v in e.outvars if isinstance(v, jcore.Var)}
        drop: set[int] = set()
        out = list(eqns)
        for i, e in enumerate(eqns):
            found = self._rotation(e, eqns, made, uses)
            if found is None or drop & set(found[2]):
                continue
            src, (axis, shift), dead = found
            out[i] = e.replace(primitive=roll_p, invars=[src], params={"axis": axis, "shift": shift})
            drop.update(dead)
        if not drop and all(a is b for a, b in zip(out, jaxpr.eqns)):
            return jaxpr
        return jaxpr.replace(eqns=[e for i, e in enumerate(out) if i not in drop])

    # ---------------------------------------------------------------- patterns
    def _piece(self, v, eqns, made, uses, axis) -> _Piece | None:
        """A single-use piece of another value along ``axis``: a slice, or one result of a
        split whose results are all used once."""
        if not isinstance(v, jcore.Var) or uses[v] != 1 or v not in made:
            return None
        k = made[v]
        e = eqns[k]
        src = e.invars[0]
        if not isinstance(src, jcore.Var) or not isinstance(src.aval, jcore.ShapedArray):  # slices of arrays only
            return None
        shape = src.aval.shape
        if e.primitive.name == "slice":
            start, limit = e.params["start_indices"], e.params["limit_indices"]
            if not _full_but(shape, start, limit, e.params.get("strides"), axis):
                return None
            return _Piece(src, int(start[axis]), int(limit[axis]), (k,))
        if e.primitive.name == "split" and e.params["axis"] % len(shape) == axis and len(e.outvars) == 2:
            if any(uses[o] != 1 for o in e.outvars if isinstance(o, jcore.Var)):
                return None
            j = e.outvars.index(v)
            offset = sum(int(s) for s in e.params["sizes"][:j])
            return _Piece(src, offset, offset + int(e.params["sizes"][j]), (k,))
        return None

    def _rotation(self, e, eqns, made, uses):
        """(source, (axis, shift), eqns to drop) where ``e`` completes a rotation: a
        concatenate of two pieces of one value, or the sum of two zero-padded pieces, each
        placed ``shift`` rows (cyclically) after where it was cut, together covering every row."""
        name = e.primitive.name
        out_shape = e.outvars[0].aval.shape
        if name == "concatenate" and len(e.invars) == 2:
            axis = int(e.params["dimension"])
            placed, dead, offset = [], [], 0
            for v in e.invars:
                p = self._piece(v, eqns, made, uses, axis)
                if p is None:
                    return None
                placed.append((p, offset))
                offset += p.stop - p.start
        elif name == "add_any" and len(e.invars) == 2:
            placed, dead, axis = [], [], None
            for v in e.invars:
                if not isinstance(v, jcore.Var) or uses[v] != 1 or v not in made:
                    return None
                k = made[v]
                pad = eqns[k]
                if pad.primitive.name != "pad" or not _is_zero(pad.invars[1]):
                    return None
                cut = [d for d, (lo, hi, mid) in enumerate(pad.params["padding_config"]) if (lo, hi, mid) != (0, 0, 0)]
                if len(cut) != 1 or pad.params["padding_config"][cut[0]][2] != 0 or axis not in (None, cut[0]):
                    return None
                axis = cut[0]
                p = self._piece(pad.invars[0], eqns, made, uses, axis)
                if p is None:
                    return None
                placed.append((p, int(pad.params["padding_config"][axis][0])))
                dead.append(k)
        else:
            return None
        srcs = {id(p.src) for p, _ in placed}
        n = out_shape[axis]
        if len(srcs) != 1 or placed[0][0].src.aval.shape != out_shape:
            return None
        shifts = {(at - p.start) % n for p, at in placed}
        rows = sorted((p.start, p.stop) for p, _ in placed)
        if len(shifts) != 1 or rows[0][0] != 0 or rows[0][1] != rows[1][0] or rows[1][1] != n:
            return None
        (shift,) = shifts
        if shift == 0:
            return None
        dead += sorted({k for p, _ in placed for k in p.made_by})
        return placed[0][0].src, (axis, int(shift)), dead


def _is_zero(atom) -> bool:
    return isinstance(atom, jcore.Literal) and atom.val == 0


def rotations(closed):
    """``closed`` with every rotation (``jnp.roll``'s slices and concatenate, or its VJP's
    split, pads and sum) replaced by one ``roll`` eqn, in nested jaxprs too."""
    return _Rewriter().closed(closed)
