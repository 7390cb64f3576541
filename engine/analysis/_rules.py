"""Factor rules: for each primitive, which operand dims and result dims move together.

Modelled on Shardy's ``OpShardingRule`` (see ../shared/RULES.md for the table). A rule is a
list of *factors*; each factor names the operand dims and result dims it spans, its size and
its kind. Dims of size 1 are never sharded and are left out. A primitive with no rule gets
the conservative rule (every dim need-replication) and is reported once by the analysis.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Callable, Sequence

Shape = tuple[int, ...]
DimRef = tuple[int, int]  # (operand or result index, dim)


class FactorKind(enum.IntEnum):
    """How sharding a factor over a mesh axis is carried out (each kind's reason below)."""

    # Sharding it shards operands and results alike: each device computes its own slice,
    # no communication.
    PASS = 0
    # Spans operand dims only (contracting dims, reduced axes). Sharding it leaves each
    # device a partial result: the partitioner adds an all-reduce (or a reduce-scatter when
    # the consumer wants the result sharded).
    REDUCTION = 1
    # May not be sharded in place (the axis of a sort or cumsum, an indexed axis): an
    # operand sharded there is all-gathered first. Dims it spans are not tied together.
    REPLICATE = 2
    # Shardable only with halo exchange / collective-permute (pad, concatenate, conv
    # spatial dims). One with a ``Halo`` ties its dims and is priced as that exchange; one
    # without is treated like REPLICATE: coarser, on the safe side.
    PERMUTE = 3


@dataclasses.dataclass(frozen=True, slots=True)
class Halo:
    """The rows of one operand dim that each device reads beyond its own block when a conv's
    spatial factor, or a slice's or pad's cut dim, is sharded n ways (XLA sends them with
    collective-permutes).

    The sharded iterator i (a block of ``iters`` per device) and a whole window w read operand
    row ``(i * step + w * wstep - lo) / dilation`` (where integral and in range), for
    w < ``window``: a forward conv (i the output, w the kernel), a transposed one (dilation
    the lhs dilation), a weight gradient (i the cotangent as the kernel, w the output), and a
    slice or pad (a 1-wide window; lo the pad, or minus the slice's start). A ``cyclic`` one
    is a rotation (``roll`` by ``lo``): rows wrap around, so every device reads alike.
    """

    operand: int
    dim: int
    size: int
    iters: int
    step: int
    window: int
    wstep: int
    lo: int
    dilation: int
    cyclic: bool = False

    def rows(self, n: int) -> tuple[int, int]:
        """(rows from the left, rows from the right): the most any device reads before its
        own block's first row and after its last. XLA sends them as collective-permutes, one
        per neighbour's worth of rows (a slice shifted by more than a block reaches further).
        A rotation's device receives the rows that rotate into its block, at most a block
        (from two devices where the shift exceeds a block), from the nearer side."""
        if self.cyclic:
            if n <= 1:
                return 0, 0
            s = self.lo % self.size
            own = self.size // n
            return (min(s, own), 0) if s <= self.size - s else (0, min(self.size - s, own))
        left = right = 0
        own, blk = self.size // n, self.iters // n
        for d in range(n):
            pmin = d * blk * self.step - self.lo
            pmax = ((d + 1) * blk - 1) * self.step + (self.window - 1) * self.wstep - self.lo
            first = max(0, -(-pmin // self.dilation))
            last = min(self.size - 1, pmax // self.dilation)
            if first <= last:
                left = max(left, d * own - first)
                right = max(right, last - ((d + 1) * own - 1))
        return left, right


@dataclasses.dataclass(frozen=True, slots=True)
class Factor:
    """One factor of an op's rule (Shardy's): its ``size``, its ``kind``, and the operand and
    result dims it spans (``DimRef``: (operand or result index, dim)); the fields below
    say what a reduction, a halo or a reshape's minor part adds."""

    size: int
    kind: FactorKind
    operands: tuple[DimRef, ...] = ()
    results: tuple[DimRef, ...] = ()
    # For REDUCTION factors: the all-reduce operator ("sum", "max", "min", "prod", ...);
    # "index" for argmax/argmin, whose partial (value, index) pairs XLA all-gathers.
    reduce: str = "sum"
    # For a conv's spatial factor or a slice's or pad's cut dim: the halo its operand needs
    # when sharded (a PERMUTE factor with a halo ties its dims; a REDUCTION one, a weight
    # gradient's, also sums over them).
    halo: Halo | None = None
    # A minor part of a reshape's merged dim (Shardy's compound factor): "result" for a merge
    # (the operand dim it spans is a minor dim merged into the result dim), "operand" for a
    # split. Sharded by its split-side dim's decisions; on the merged dim its axes follow the
    # major factor's (and any earlier minor's). It ties nothing: the merged dim's named
    # dimension is the major's.
    minor_of: str = ""

    @property
    def ties(self) -> bool:
        """Whether the dims it spans must be sharded alike (an edge in the graph)."""
        if self.minor_of:
            return False
        return self.kind in (FactorKind.PASS, FactorKind.REDUCTION) or self.halo is not None


RuleFn = Callable[[dict, Sequence[Shape], Sequence[Shape]], list[Factor]]
factor_rules: dict[str, RuleFn] = {}

P, R, N, M = FactorKind.PASS, FactorKind.REDUCTION, FactorKind.REPLICATE, FactorKind.PERMUTE


def _f(size: int, kind: FactorKind, operands=(), results=(), reduce: str = "sum") -> Factor | None:
    if size <= 1:
        return None
    return Factor(int(size), kind, tuple(operands), tuple(results), reduce)


def _keep(factors) -> list[Factor]:
    return [f for f in factors if f is not None]


# --------------------------------------------------------------------------- conservative

def conservative_rule(params, ins, outs) -> list[Factor]:
    """Every dim of every operand and result is its own need-replication factor."""
    fs = [_f(s, N, operands=[(i, d)]) for i, sh in enumerate(ins) for d, s in enumerate(sh)]
    fs += [_f(s, N, results=[(j, d)]) for j, sh in enumerate(outs) for d, s in enumerate(sh)]
    return _keep(fs)


# Primitives that deliberately get the conservative rule (no silent gaps: the registry test
# checks every lax primitive is either here or has a rule).
CONSERVATIVE = frozenset({
    # collectives / shard_map internals: already explicitly partitioned code (those with a
    # rule below are read through, so a partially manual region's body is one with its operands)
    "all_gather_done", "all_gather_reduced",
    "all_gather_reduced_start", "all_gather_start", "all_to_all_done",
    "all_to_all_start", "axis_index", "pbroadcast_done", "pbroadcast_start",
    "ppermute_done", "ppermute_start", "precv", "psend",
    "preduced", "psum_done", "psum_invariant_start", "psum_start",
    "ragged_all_to_all", "reduce_scatter_done", "reduce_scatter_start",
    "unreduced_psum", "unreduced_psum_start", "unreduced_reduce_scatter",
    "unreduced_reduce_scatter_start", "vary_unreduced_cast_p", "vary_unreduced_cast", "reduced_vary_cast",
    "pbroadcast_dynamic", "unreduced_pmax", "unreduced_pmin",
    # tokens, effects, platform queries: scalars or no data
    "after_all", "create_token", "platform_index", "unreachable", "dce_sink",
    # data-dependent or irregular
    "ragged_dot_general", "custom_linear_solve", "linear_call", "call_hi_primitive",
    "eig", "schur", "hessenberg", "tridiagonal", "tridiagonal_solve", "geqp3", "lu_pivots_to_permutation",
    "select_and_gather_add", "select_and_scatter", "from_edtype", "to_edtype", "stage",
    "random_gamma",
    # a Pallas kernel is one custom call to XLA's partitioner, which cannot see inside it: it
    # gathers the kernel's operands and runs it whole on every device (shard it with
    # shard_map, or custom_partitioning with a sharding_rule, which partex reads)
    "pallas_call",
})


def register(*names: str):
    def deco(fn: RuleFn) -> RuleFn:
        for n in names:
            factor_rules[n] = fn
        return fn
    return deco


# --------------------------------------------------------------------------- elementwise

def pointwise_rule(params, ins, outs) -> list[Factor]:
    """Operands of the result's rank tie dim d with result dim d (rank-0 take no part)."""
    fs = []
    for out in outs[:1]:
        for d, s in enumerate(out):
            ops = [(i, d) for i, sh in enumerate(ins) if len(sh) == len(out) and sh[d] == s]
            res = [(j, d) for j, o in enumerate(outs) if len(o) == len(out) and o[d] == s]
            fs.append(_f(s, P, ops, res))
    return _keep(fs)


def defpointwise(*names: str) -> None:
    for n in names:
        factor_rules[n] = pointwise_rule


defpointwise(
    # n-ary
    "add", "sub", "mul", "div", "max", "min", "pow", "atan2", "rem", "and", "or", "xor",
    "eq", "ne", "lt", "le", "gt", "ge", "select_n", "clamp", "nextafter", "add_any",
    "shift_left", "shift_right_arithmetic", "shift_right_logical", "complex", "mulhi",
    "igamma", "igammac", "igamma_grad_a", "random_gamma_grad", "polygamma", "zeta",
    "regularized_incomplete_beta", "eq_to", "le_to", "lt_to", "polynomial", "fma", "fmuladd",
    # unary
    "neg", "exp", "exp2", "log", "log1p", "log2", "one_minus_square", "expm1", "tanh", "logistic", "sin", "cos", "tan",
    "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "sqrt", "rsqrt",
    "cbrt", "abs", "sign", "floor", "ceil", "round", "is_finite", "not", "erf", "erfc",
    "erf_inv", "lgamma", "digamma", "bessel_i0e", "bessel_i1e", "integer_pow", "square",
    "convert_element_type", "reduce_precision", "copy", "copy_p", "stop_gradient", "real",
    "imag", "conj", "population_count", "clz", "sharding_constraint", "reshard",
    "layout_constraint", "relayout", "random_clone", "name", "tie", "device_put_single",
)


@register("bitcast_convert_type")
def _bitcast(params, ins, outs):
    if len(ins[0]) == len(outs[0]):
        return pointwise_rule(params, ins, outs)
    # A bitcast between widths adds or drops a minor dim: tie the shared leading dims.
    k = min(len(ins[0]), len(outs[0]))
    fs = [_f(outs[0][d], P, [(0, d)], [(0, d)]) for d in range(k) if ins[0][d] == outs[0][d]]
    fs += [_f(s, N, operands=[(0, d)]) for d, s in enumerate(ins[0]) if d >= k]
    fs += [_f(s, N, results=[(0, d)]) for d, s in enumerate(outs[0]) if d >= k]
    return _keep(fs)


@register("optimization_barrier", "device_put")
def _pairwise(params, ins, outs):
    """Operand i <-> result i, every dim."""
    return _keep(
        _f(s, P, [(i, d)], [(i, d)]) for i, sh in enumerate(outs) for d, s in enumerate(sh)
    )


# --------------------------------------------------------------------------- contraction

@register("dot_general")
def _dot_general(params, ins, outs):
    (lc, rc), (lb, rb) = params["dimension_numbers"]
    lhs, rhs = ins[0], ins[1]
    fs = []
    for i, (a, b) in enumerate(zip(lb, rb)):
        fs.append(_f(lhs[a], P, [(0, a), (1, b)], [(0, i)]))
    for a, b in zip(lc, rc):
        fs.append(_f(lhs[a], R, [(0, a), (1, b)]))
    o = len(lb)
    for a in range(len(lhs)):
        if a not in lc and a not in lb:
            fs.append(_f(lhs[a], P, [(0, a)], [(0, o)]))
            o += 1
    for b in range(len(rhs)):
        if b not in rc and b not in rb:
            fs.append(_f(rhs[b], P, [(1, b)], [(0, o)]))
            o += 1
    return _keep(fs)


@register("conv_general_dilated")
def _conv(params, ins, outs):
    dn = params["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    lhs, rhs, out = ins[0], ins[1], outs[0]
    fgc, bgc = params["feature_group_count"], params["batch_group_count"]
    fs = []
    lb, lf, *lsp = lhs_spec
    ro, ri, *rsp = rhs_spec
    ob, of, *osp = out_spec
    # A depthwise conv's weight gradient (jax's transpose rule): batch_group_count = the
    # channels, the lhs "batch" dim is the channel dim and the lhs "feature" dim the batch
    wgrad = bgc > 1 and lhs[lb] == bgc and rhs[ro] == out[of] == bgc and out[ob] == 1
    if bgc == 1:
        fs.append(_f(lhs[lb], P, [(0, lb)], [(0, ob)]))
    elif not wgrad:
        fs += [_f(lhs[lb], N, [(0, lb)]), _f(out[ob], N, results=[(0, ob)])]
    if wgrad:
        # each channel its own group (Shardy: pass-through); the batch is contracted
        # (reduction: a batch-sharded step all-reduces the small filter gradient)
        fs.append(_f(bgc, P, [(0, lb), (1, ro)], [(0, of)]))
        fs.append(_f(lhs[lf], R, [(0, lf), (1, ri)]))
    elif fgc == 1 and bgc == 1:
        fs.append(_f(lhs[lf], R, [(0, lf), (1, ri)]))
        fs.append(_f(rhs[ro], P, [(1, ro)], [(0, of)]))
    elif (fgc == lhs[lf] and rhs[ri] == 1 and rhs[ro] == out[of] == lhs[lf]
          and any(out[o] > 1 for o in osp) and any(rhs[r] > 1 for r in rsp)):
        # depthwise: each group's one feature maps straight through. (Not where every window
        # is the whole image, a 1-wide output, nor with a one-tap kernel: XLA's partitioner
        # crashes on such a conv with channels sharded over part of the mesh, "free():
        # invalid pointer", jax 0.12.)
        fs.append(_f(lhs[lf], P, [(0, lf), (1, ro)], [(0, of)]))
    else:
        # grouped (not depthwise): Shardy has the groups as the major part of each feature
        # dim, but XLA does not partition the conv along them: with the groups sharded it
        # all-gathers the image and the kernel (tests/test_shardy_rules.py): need-replication
        fs += [_f(lhs[lf], N, [(0, lf)]), _f(rhs[ri], N, [(1, ri)]),
               _f(rhs[ro], N, [(1, ro)]), _f(out[of], N, results=[(0, of)])]
    fs += _conv_spatial(params, lsp, rsp, osp, lhs, rhs, out)
    return _keep(fs)


def _conv_spatial(params, lsp, rsp, osp, lhs, rhs, out) -> list[Factor | None]:
    """A conv's spatial dims (Shardy: permutation factors), shardable with a halo exchange:
    - the image's rows map onto the output's at the stride (lhs size x lhs dilation = output
      size x stride: a "same" conv, strided or transposed): lhs and output dims tie, the
      kernel's window stays whole;
    - the kernel's window covers the image (kernel size x rhs dilation = lhs size x lhs
      dilation: a weight gradient, the cotangent as kernel): lhs and kernel dims tie as a
      reduction (partial filter gradients are all-reduced), the small output stays whole.
    Either way each device reads the rows next to its block: the lhs's halo. Other spatial
    dims (a "valid" conv that shrinks the image) keep Shardy's permutation kinds, unsharded."""
    fs: list[Factor | None] = []
    pads, strides = params["padding"], params["window_strides"]
    ldil, rdil = params["lhs_dilation"], params["rhs_dilation"]
    for s, (a, k, o) in enumerate(zip(lsp, rsp, osp)):
        n_l, n_k, n_o = lhs[a], rhs[k], out[o]  # the lhs's, kernel's and output's sizes
        lo, st, ld, rd = int(pads[s][0]), int(strides[s]), int(ldil[s]), int(rdil[s])
        if min(n_l, n_k, n_o) > 1 and n_k * rd == n_l * ld and n_o < n_k:
            halo = Halo(0, a, n_l, n_k, rd, n_o, st, lo, ld)
            fs += [Factor(min(n_l, n_k), R, ((0, a), (1, k)), halo=halo), _f(n_o, M, results=[(0, o)])]
        elif min(n_l, n_o) > 1 and n_l * ld == n_o * st and n_k < n_l:
            halo = Halo(0, a, n_l, n_o, st, n_k, rd, lo, ld)
            fs += [Factor(min(n_l, n_o), M, ((0, a),), ((0, o),), halo=halo), _f(n_k, M, [(1, k)])]
        else:
            fs += [_f(n_l, M, [(0, a)]), _f(n_o, M, results=[(0, o)]), _f(n_k, M, [(1, k)])]
    return fs


# --------------------------------------------------------------------------- shape ops

@register("broadcast_in_dim")
def _broadcast_in_dim(params, ins, outs):
    bd = params["broadcast_dimensions"]
    out = outs[0]
    fs, used = [], set()
    for i, o in enumerate(bd):
        if ins[0][i] == out[o]:
            fs.append(_f(out[o], P, [(0, i)], [(0, o)]))
            used.add(o)
    # new dims: result-only factors, free to shard (each device builds its slice)
    fs += [_f(s, P, results=[(0, d)]) for d, s in enumerate(out) if d not in used]
    return _keep(fs)


@register("transpose")
def _transpose(params, ins, outs):
    perm = params["permutation"]
    return _keep(_f(outs[0][i], P, [(0, p)], [(0, i)]) for i, p in enumerate(perm))


@register("squeeze")
def _squeeze(params, ins, outs):
    dims = {d % max(len(ins[0]), 1) for d in params["dimensions"]}
    kept = [d for d in range(len(ins[0])) if d not in dims]
    return _keep(_f(ins[0][a], P, [(0, a)], [(0, j)]) for j, a in enumerate(kept))


@register("expand_dims")
def _expand_dims(params, ins, outs):
    dims = set(params["dimensions"])
    kept = [d for d in range(len(outs[0])) if d not in dims]
    return _keep(_f(outs[0][j], P, [(0, i)], [(0, j)]) for i, j in enumerate(kept))


def reshape_blocks(a: Shape, b: Shape) -> list[tuple[list[int], list[int]]]:
    """Split two shapes of equal size into the smallest blocks whose products match."""
    blocks, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        bi, bj = [], []
        pa = pb = 1
        while True:
            if pa == pb and (bi or bj) and pa != 0:
                # absorb trailing size-1 dims into this block
                break
            if (pa <= pb and i < len(a)) or j >= len(b):
                pa *= a[i]
                bi.append(i)
                i += 1
            else:
                pb *= b[j]
                bj.append(j)
                j += 1
            if i >= len(a) and j >= len(b):
                break
        blocks.append((bi, bj))
    return blocks


@register("reshape")
def _reshape(params, ins, outs):
    a, b = ins[0], outs[0]
    fs = []
    for bi, bj in reshape_blocks(a, b):
        ri = [d for d in bi if a[d] > 1]
        rj = [d for d in bj if b[d] > 1]
        if ri and rj:
            fs += _compound(a, b, ri, rj)
    return _keep(fs)


def _compound(a: Shape, b: Shape, ri: list[int], rj: list[int]) -> list[Factor]:
    """Shardy's compound factors of one reshape block: walking both sides major to minor,
    each factor is the smaller of the two dims' remaining parts while one divides the other.
    A factor that starts a dim on both sides ties them; one that starts a dim on one side only
    is a minor part of the other side's dim (``minor_of``), sharded by the dim it starts. Where
    neither remainder divides the other, a gcd part major on both sides still ties (a block's
    rows stay its rows); everything after it needs a reshape-reshard (need-replication)."""
    fs: list[Factor] = []
    i = j = 0
    ra, rb = a[ri[0]], b[rj[0]]
    while i < len(ri) and j < len(rj):
        da, db = ri[i], rj[j]
        major_a, major_b = ra == a[da], rb == b[db]
        if ra % rb and rb % ra:
            g = math.gcd(ra, rb)
            if major_a and major_b and g > 1:
                fs.append(Factor(g, P, ((0, da),), ((0, db),)))
            fs += [Factor(a[d], N, ((0, d),)) for d in ri[i + (not major_a):]]
            fs += [Factor(b[d], N, results=((0, d),)) for d in rj[j + (not major_b):]]
            break
        s = min(ra, rb)
        minor = "" if major_a and major_b else ("result" if major_a else "operand")
        fs.append(Factor(s, P, ((0, da),), ((0, db),), minor_of=minor))
        ra, rb = ra // s, rb // s
        if ra == 1:
            i += 1
            ra = a[ri[i]] if i < len(ri) else 1
        if rb == 1:
            j += 1
            rb = b[rj[j]] if j < len(rj) else 1
    return fs


def _axis_rule(axis_key: str, kind: FactorKind):
    """All operands and results share a shape; one axis gets ``kind``, the rest PASS."""
    def rule(params, ins, outs):
        ref = outs[0]
        axes = params[axis_key]
        axes = {a % len(ref) for a in (axes if isinstance(axes, (tuple, list)) else (axes,))}
        fs = []
        for d, s in enumerate(ref):
            ops = [(i, d) for i, sh in enumerate(ins) if len(sh) == len(ref)]
            res = [(j, d) for j, sh in enumerate(outs) if len(sh) == len(ref)]
            if d in axes:
                fs += [_f(s, kind, [o]) for o in ops] + [_f(s, kind, results=[r]) for r in res]
            else:
                fs.append(_f(s, P, ops, res))
        return _keep(fs)
    return rule


register("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp")(_axis_rule("axis", N))
register("sort")(_axis_rule("dimension", N))
register("rev")(_axis_rule("dimensions", M))


def _reduce_rule(op: str):
    def rule(params, ins, outs):
        axes = set(params["axes"] if "axes" in params else params["dimensions"])
        x = ins[0]
        fs, o = [], 0
        for d, s in enumerate(x):
            # variadic reduce: the init values are scalars and take no part
            ops = [(i, d) for i in range(len(ins)) if len(ins[i]) == len(x)]
            if d in axes:
                fs.append(_f(s, R, ops, reduce=op))
            else:
                fs.append(_f(s, P, ops, [(j, o) for j in range(len(outs))]))
                o += 1
        return _keep(fs)
    return rule


for _name, _op in [("reduce_sum", "sum"), ("reduce_max", "max"), ("reduce_min", "min"),
                   ("reduce_prod", "prod"), ("reduce_and", "and"), ("reduce_or", "or"),
                   ("reduce_xor", "xor"), ("reduce", "sum")]:
    factor_rules[_name] = _reduce_rule(_op)


@register("argmax", "argmin")
def _argminmax(params, ins, outs):
    axes = set(params["axes"])
    fs, o = [], 0
    for d, s in enumerate(ins[0]):
        if d in axes:
            # a reduction (Shardy's rule): each device finds its slice's (value, index) and XLA
            # combines the partial pairs (an all-gather of them, then a local arg-reduce)
            fs.append(_f(s, R, [(0, d)], reduce="index"))
        else:
            fs.append(_f(s, P, [(0, d)], [(0, o)]))
            o += 1
    return _keep(fs)


@register("top_k", "approx_top_k")
def _top_k(params, ins, outs):
    x = ins[0]
    axis = params.get("reduction_dimension", -1) % len(x)
    fs = []
    for d, s in enumerate(x):
        if d == axis:
            fs.append(_f(s, N, [(0, d)]))
            fs += [_f(outs[j][d], N, results=[(j, d)]) for j in range(len(outs))]
        else:
            fs.append(_f(s, P, [(0, d)], [(j, d) for j in range(len(outs))]))
    return _keep(fs)


@register("concatenate")
def _concatenate(params, ins, outs):
    axis = params["dimension"]
    out = outs[0]
    fs = []
    for d, s in enumerate(out):
        if d == axis:  # need-replication, as Shardy's rule
            fs += [_f(sh[d], N, [(i, d)]) for i, sh in enumerate(ins)]
            fs.append(_f(s, N, results=[(0, d)]))
        else:
            fs.append(_f(s, P, [(i, d) for i in range(len(ins))], [(0, d)]))
    return _keep(fs)


def _shifted(x: int, out: int, d: int, step: int, lo: int) -> Factor | None:
    """A slice's or pad's cut dim (out[i] = x[i * step - lo]): operand and result rows tie, a
    permutation whose halo is the rows a device's output block reads beyond its own input
    block (XLA: collective-permutes). Shardable where the shard count divides both sizes."""
    if min(x, out) <= 1:
        return None
    return Factor(math.gcd(x, out), M, ((0, d),), ((0, d),), halo=Halo(0, d, x, out, step, 1, 1, lo, 1))


@register("roll")
def _roll(params, ins, outs):
    """A rotation (partex's ``roll``, recognised from ``jnp.roll``'s slices and concatenate):
    operand and result rows tie, a permutation whose halo is the rows rotating in."""
    axis, n = params["axis"], ins[0][params["axis"]]
    fs = [_f(s, P, [(0, d)], [(0, d)]) for d, s in enumerate(ins[0]) if d != axis]
    if n > 1:
        fs.append(Factor(n, M, ((0, axis),), ((0, axis),), halo=Halo(0, axis, n, n, 1, 1, 1, int(params["shift"]), 1, True)))
    return _keep(fs)


@register("pad")
def _pad(params, ins, outs):
    fs = []
    for d, (lo, hi, interior) in enumerate(params["padding_config"]):
        if lo == hi == interior == 0:
            fs.append(_f(ins[0][d], P, [(0, d)], [(0, d)]))
        elif interior == 0:
            fs.append(_shifted(ins[0][d], outs[0][d], d, 1, int(lo)))
        else:  # XLA's partitioner gets a sharded interior pad wrong (see cost._facts): unshardable
            fs += [_f(ins[0][d], M, [(0, d)]), _f(outs[0][d], M, results=[(0, d)])]
    return _keep(fs)


def _kept_or_cut(x: Shape, out: Shape, operand: int = 0) -> list[Factor]:
    """Dims whose size is kept are PASS; dims that are cut are N on both sides."""
    fs = []
    for d, (s, t) in enumerate(zip(x, out)):
        if s == t:
            fs.append(_f(s, P, [(operand, d)], [(0, d)]))
        else:
            fs += [_f(s, N, [(operand, d)]), _f(t, N, results=[(0, d)])]
    return fs


@register("slice")
def _slice(params, ins, outs):
    x, out = ins[0], outs[0]
    strides = params.get("strides") or (1,) * len(x)
    fs = []
    for d, (s, t) in enumerate(zip(x, out)):
        if s == t:
            fs.append(_f(s, P, [(0, d)], [(0, d)]))
        else:
            fs.append(_shifted(s, t, d, int(strides[d]), -int(params["start_indices"][d])))
    return _keep(fs)


@register("dynamic_slice")
def _dynamic_slice(params, ins, outs):
    return _keep(_kept_or_cut(ins[0], outs[0]))


@register("dynamic_update_slice")
def _dynamic_update_slice(params, ins, outs):
    x, upd = ins[0], ins[1]
    fs = []
    for d, s in enumerate(x):
        if upd[d] == s:
            fs.append(_f(s, P, [(0, d), (1, d)], [(0, d)]))
        elif upd[d] == 1:
            # a one-element write (a decode step's cache row): each device writes it only
            # if it falls in its rows -- XLA emits no collective (Shardy: permutation)
            fs.append(_f(s, P, [(0, d)], [(0, d)]))
        else:
            # a wider window may straddle two devices' rows: XLA gathers the operand
            fs += [_f(s, N, [(0, d)]), _f(s, N, results=[(0, d)]), _f(upd[d], N, [(1, d)])]
    return _keep(fs)


@register("split")
def _split(params, ins, outs):
    axis = params["axis"] % len(ins[0])
    fs = []
    for d, s in enumerate(ins[0]):
        if d == axis:
            fs.append(_f(s, M, [(0, d)]))
            fs += [_f(o[d], M, results=[(j, d)]) for j, o in enumerate(outs)]
        else:
            fs.append(_f(s, P, [(0, d)], [(j, d) for j in range(len(outs))]))
    return _keep(fs)


@register("stack")
def _stack(params, ins, outs):
    axis = params["axis"] % len(outs[0])
    fs = [_f(outs[0][axis], M, results=[(0, axis)])]
    for d, s in enumerate(ins[0]):
        o = d if d < axis else d + 1
        fs.append(_f(s, P, [(i, d) for i in range(len(ins))], [(0, o)]))
    return _keep(fs)


@register("unstack")
def _unstack(params, ins, outs):
    axis = params["axis"] % len(ins[0])
    fs = [_f(ins[0][axis], M, [(0, axis)])]
    for d, s in enumerate(outs[0]):
        a = d if d < axis else d + 1
        fs.append(_f(s, P, [(0, a)], [(j, d) for j in range(len(outs))]))
    return _keep(fs)


@register("tile")
def _tile(params, ins, outs):
    fs = []
    for d, r in enumerate(params["reps"]):
        if r == 1:
            fs.append(_f(ins[0][d], P, [(0, d)], [(0, d)]))
        else:
            fs += [_f(ins[0][d], N, [(0, d)]), _f(outs[0][d], N, results=[(0, d)])]
    return _keep(fs)


# --------------------------------------------------------------------------- gather/scatter

@register("gather")
def _gather(params, ins, outs):
    dn = params["dimension_numbers"]
    ss = params["slice_sizes"]
    x, idx, out = ins[0], ins[1], outs[0]
    offset = list(dn.offset_dims)
    batch_out = [d for d in range(len(out)) if d not in offset]
    idx_batch = list(range(len(idx) - 1))  # the last indices dim is the index vector
    fs = []
    for o, i in zip(batch_out, idx_batch):
        ops = [(1, i)]
        if i in dn.start_indices_batching_dims:
            k = list(dn.start_indices_batching_dims).index(i)
            ops.append((0, dn.operand_batching_dims[k]))
        fs.append(_f(out[o], P, ops, [(0, o)]))
    skipped = set(dn.collapsed_slice_dims) | set(dn.operand_batching_dims)
    window = [d for d in range(len(x)) if d not in skipped]
    for o, d in zip(offset, window):
        if ss[d] == x[d]:
            fs.append(_f(x[d], P, [(0, d)], [(0, o)]))
        else:
            fs += [_f(x[d], N, [(0, d)]), _f(out[o], N, results=[(0, o)])]
    # Indexed operand dims (an embedding's vocab): sharded, each device gathers the rows
    # it holds (masked) and the partial results are summed: a reduction factor.
    fs += [_f(x[d], R, [(0, d)]) for d in dn.collapsed_slice_dims]
    if len(idx) and idx[-1] > 1:
        fs.append(_f(idx[-1], N, [(1, len(idx) - 1)]))
    return _keep(fs)


_SCATTER_REDUCE = {"scatter-add": "sum", "scatter_add": "sum", "scatter-sub": "sum", "scatter_sub": "sum",
                   "scatter-mul": "prod", "scatter_mul": "prod", "scatter-min": "min", "scatter_min": "min",
                   "scatter-max": "max", "scatter_max": "max"}


def _scatter_rule(primitive: str):
    return lambda params, ins, outs: _scatter(primitive, params, ins, outs)


def _scatter(primitive, params, ins, outs):
    dn = params["dimension_numbers"]
    x, idx, upd = ins[0], ins[1], ins[2]
    window = list(dn.update_window_dims)
    indexed = set(dn.inserted_window_dims) | set(dn.scatter_dims_to_operand_dims)
    skipped = set(dn.inserted_window_dims) | set(dn.operand_batching_dims)
    op_window = [d for d in range(len(x)) if d not in skipped]
    tied_op = {}
    wide = set()  # indexed operand dims an update window spans more than one element of
    for u, d in zip(window, op_window):
        if upd[u] == x[d] and d not in indexed:
            tied_op[d] = u
        elif d in indexed and upd[u] > 1:
            wide.add(d)
    scatter_dims = [u for u in range(len(upd)) if u not in window]
    upd_of_idx = dict(zip(range(len(idx) - 1), scatter_dims))  # index batch dim -> update dim
    fs = []
    merged = set()
    for d, s in enumerate(x):
        if d in tied_op:
            fs.append(_f(s, P, [(0, d), (2, tied_op[d])], [(0, d)]))
        elif d in dn.operand_batching_dims:
            # batched scatter (take_along_axis' transpose): one factor with the indices'
            # batch dim and the update dim that index dim addresses
            k = list(dn.operand_batching_dims).index(d)
            i = dn.scatter_indices_batching_dims[k]
            ops = [(0, d), (1, i)]
            if i in upd_of_idx:
                ops.append((2, upd_of_idx[i]))
                merged.add(i)
            fs.append(_f(s, P, ops, [(0, d)]))
        elif d in indexed and d in wide:
            # a window wider than one element may straddle two devices' rows: XLA gathers
            # the operand along it (Shardy: need-replication)
            fs += [_f(s, N, [(0, d)]), _f(s, N, results=[(0, d)])]
        elif d in indexed:
            # The operand and result are one buffer: sharding an indexed dim is fine when
            # each device applies only the updates that land in its rows (masked).
            fs.append(_f(s, P, [(0, d)], [(0, d)]))
        else:
            fs.append(_f(s, P, [(0, d)], [(0, d)]))
    # Updates spread over the scatter dims land anywhere in the operand: sharding them
    # leaves each device a partial result (combined by the scatter's own operator); an
    # overwriting scatter cannot be split that way.
    reduce = _SCATTER_REDUCE.get(primitive)
    for i, u in upd_of_idx.items():
        if i not in merged:
            if reduce is None:
                fs.append(_f(upd[u], N, [(2, u), (1, i)]))
            else:
                fs.append(_f(upd[u], R, [(2, u), (1, i)], reduce=reduce))
    for u in window:
        if u not in tied_op.values():
            fs.append(_f(upd[u], N, [(2, u)]))
    if len(idx) and idx[-1] > 1:
        fs.append(_f(idx[-1], N, [(1, len(idx) - 1)]))
    return _keep(fs)


for _name in ("scatter", *_SCATTER_REDUCE):
    factor_rules[_name] = _scatter_rule(_name)


# --------------------------------------------------------------------------- windows

@register("select_and_scatter_add")
def _select_and_scatter_add(params, ins, outs):
    """As a window op; its source (operand 0) holds one value per window: need-replication
    there (Shardy's rule), where the windowed operand and the result permute."""
    return [dataclasses.replace(f, kind=N) if f.kind == M and all(i == 0 for i, _ in f.operands) and f.operands
            else f for f in _window(params, ins, outs)]


@register("reduce_window_sum", "reduce_window_max", "reduce_window_min", "reduce_window")
def _window(params, ins, outs):
    wd = params["window_dimensions"]
    st = params["window_strides"]
    pad = params.get("padding", ((0, 0),) * len(wd))
    bd = params.get("base_dilation", (1,) * len(wd))
    wdl = params.get("window_dilation", (1,) * len(wd))
    fs = []
    for d in range(len(wd)):
        simple = wd[d] == 1 and st[d] == 1 and tuple(pad[d]) == (0, 0) and bd[d] == 1 and wdl[d] == 1
        ops = [(i, d) for i, sh in enumerate(ins) if len(sh) == len(wd)]
        res = [(j, d) for j, sh in enumerate(outs) if len(sh) == len(wd)]
        if simple:
            fs.append(_f(outs[0][d], P, ops, res))
        else:
            fs += [_f(ins[i][d], M, [(i, d)]) for i, _ in ops]
            fs += [_f(outs[j][d], M, results=[(j, d)]) for j, _ in res]
    return _keep(fs)


# --------------------------------------------------------------------------- linear algebra

@register("cholesky", "cholesky_update", "triangular_solve", "qr", "eigh", "svd", "lu",
          "householder_product", "geqrf", "ormqr", "symmetric_product")
def _batched_matrix(params, ins, outs):
    """Leading (batch) dims shared by all operands and results PASS; the matrix dims N. The
    batch dims are the first operand's (always a matrix) but its last two: a vector operand
    or result (eigh's eigenvalues, svd's singular values, lu's pivots) has them too."""
    nb = max(len(ins[0]) - 2, 0) if ins else 0
    fs = []
    for d in range(nb):
        s = ins[0][d]
        ops = [(i, d) for i, sh in enumerate(ins) if len(sh) > d and sh[d] == s]
        res = [(j, d) for j, sh in enumerate(outs) if len(sh) > d and sh[d] == s]
        fs.append(_f(s, P, ops, res))
    fs += [_f(s, N, [(i, d)]) for i, sh in enumerate(ins) for d, s in enumerate(sh) if d >= nb]
    fs += [_f(s, N, results=[(j, d)]) for j, sh in enumerate(outs) for d, s in enumerate(sh) if d >= nb]
    return _keep(fs)


@register("fft")
def _fft(params, ins, outs):
    k = len(params["fft_lengths"])
    x = ins[0]
    fs = []
    for d, s in enumerate(x):
        if d < len(x) - k:
            fs.append(_f(s, P, [(0, d)], [(0, d)]))
        else:
            fs += [_f(s, N, [(0, d)]), _f(outs[0][d], N, results=[(0, d)])]
    return _keep(fs)


# --------------------------------------------------------------------------- creation, rng

@register("rng_bit_generator")
def _rng_bit_generator(params, ins, outs):
    """The generator's state is one value (need-replication, in and out); the bits are built
    on each device."""
    fs = [_f(s, N, [(0, d)]) for d, s in enumerate(ins[0])]
    fs += [_f(s, N, results=[(0, d)]) for d, s in enumerate(outs[0])]
    fs += [_f(s, P, results=[(j, d)]) for j, sh in enumerate(outs) if j for d, s in enumerate(sh)]
    return _keep(fs)


@register("iota", "rng_uniform", "random_bits", "random_seed", "random_split", "random_fold_in",
          "empty", "empty2")
def _result_only(params, ins, outs):
    """Results are built on each device: every result dim a free, result-only factor."""
    return _keep(_f(s, P, results=[(j, d)]) for j, sh in enumerate(outs) for d, s in enumerate(sh))


@register("random_wrap", "random_unwrap", "threefry2x32")
def _leading_tie(params, ins, outs):
    """Key arrays: the leading dims shared by operands and results tie; key data dims N."""
    k = min(len(s) for s in list(ins) + list(outs))
    fs = []
    for d in range(k):
        s = outs[0][d]
        fs.append(_f(s, P, [(i, d) for i in range(len(ins))], [(j, d) for j in range(len(outs))]))
    fs += [_f(s, N, [(i, d)]) for i, sh in enumerate(ins) for d, s in enumerate(sh) if d >= k]
    fs += [_f(s, N, results=[(j, d)]) for j, sh in enumerate(outs) for d, s in enumerate(sh) if d >= k]
    return _keep(fs)


# --------------------------------------------------------------------------- collectives

# A collective over a shard_map region's manual axes moves whole per-device buffers: the
# tensor dims it does not cut or grow are each device's own, shardable over the axes the
# region leaves to the partitioner (a partially manual region) as an elementwise op's are.

@register("psum", "psum_invariant", "pmax", "pmin", "pxor", "pvary", "pbroadcast", "ppermute")
def _per_device(params, ins, outs):
    """Operand i's dim d is result i's."""
    return _keep(_f(s, P, [(i, d)], [(i, d)]) for i, sh in enumerate(ins) for d, s in enumerate(sh))


def _cut(ins, outs, changed_in: dict[int, int | None], changed_out: set[int]) -> list[Factor]:
    """One operand, one result: operand dim d is result dim ``changed_in.get(d, d)`` (None:
    it has none), the dims in ``changed_out`` are the result's own."""
    fs, tied = [], set()
    for d, s in enumerate(ins[0]):
        r = changed_in.get(d, d)
        if r is None or r in changed_out:
            fs.append(_f(s, N, operands=[(0, d)]))
        else:
            fs.append(_f(s, P, [(0, d)], [(0, r)]))
            tied.add(r)
    fs += [_f(s, N, results=[(0, r)]) for r, s in enumerate(outs[0]) if r not in tied]
    return _keep(fs)


@register("all_gather", "all_gather_invariant")
def _all_gather(params, ins, outs):
    """The gathered dim grows (tiled) or is a new dim (untiled); the others pass."""
    gd = params["all_gather_dimension"]
    if params.get("tiled"):
        return _cut(ins, outs, {gd: None}, {gd})
    return _cut(ins, outs, {d: d + (d >= gd) for d in range(len(ins[0]))}, {gd})


@register("reduce_scatter", "psum_scatter", "pmax_scatter", "pmin_scatter")
def _reduce_scatter(params, ins, outs):
    """The scattered dim shrinks (tiled) or goes (untiled); the others pass."""
    sd = params["scatter_dimension"]
    if params.get("tiled"):
        return _cut(ins, outs, {sd: None}, {sd})
    return _cut(ins, outs, {d: (None if d == sd else d - (d > sd)) for d in range(len(ins[0]))}, set())


@register("all_to_all")
def _all_to_all(params, ins, outs):
    """The split and concatenated dims change size; the others pass."""
    cut = {params["split_axis"], params["concat_axis"]}
    return _cut(ins, outs, {d: None for d in cut}, cut)


# --------------------------------------------------------------------------- loop pseudo-ops
# Emitted by the tracer around kept bodies (see _program.py).

@register("scan_enter")
def _scan_enter(params, ins, outs):
    """[carry..., xs...] -> [body carry..., body x...]; xs lose their leading loop axis."""
    nc = params["num_carry"]
    fs = []
    for j, out in enumerate(outs):
        lead = 0 if j < nc else 1
        fs += [_f(s, P, [(j, d + lead)], [(j, d)]) for d, s in enumerate(out)]
        if lead:
            fs.append(_f(ins[j][0], N, [(j, 0)]))
    return _keep(fs)


@register("scan_exit")
def _scan_exit(params, ins, outs):
    """[body carry out..., body ys..., body carry in...] -> [carry..., ys...]."""
    nc = params["num_carry"]
    ny = len(outs) - nc
    fs = []
    for j, out in enumerate(outs):
        if j < nc:
            fs += [_f(s, P, [(j, d), (nc + ny + j, d)], [(j, d)]) for d, s in enumerate(out)]
        else:
            fs += [_f(s, P, [(j, d - 1)], [(j, d)]) for d, s in enumerate(out) if d > 0]
            # the stacked loop axis: result-only, free to shard (Shardy's rule; XLA keeps ys
            # sharded along it with no collective, each device storing its iterations' rows)
            fs.append(_f(out[0], P, results=[(j, 0)]))
    return _keep(fs)


@register("while_enter")
def _while_enter(params, ins, outs):
    return _pairwise(params, ins, outs)


@register("while_exit")
def _while_exit(params, ins, outs):
    """[body carry out..., body carry in...] -> [carry...]."""
    n = len(outs)
    return _keep(
        _f(s, P, [(j, d), (n + j, d)], [(j, d)]) for j, sh in enumerate(outs) for d, s in enumerate(sh)
    )


@register("cond_enter")
def _cond_enter(params, ins, outs):
    return []


@register("cond_exit")
def _cond_exit(params, ins, outs):
    """[branch 0 outs..., branch 1 outs..., ...] -> [results...]."""
    n = len(outs)
    b = params["branches"]
    return _keep(
        _f(s, P, [(k * n + j, d) for k in range(b)], [(j, d)])
        for j, sh in enumerate(outs) for d, s in enumerate(sh)
    )


@register("shard_map_enter")
def _shard_map_enter(params, ins, outs):
    """[operands (global)...] -> [body inputs (per device)...]. An operand dim the region's
    in_specs shard is read as it is sharded (no collective: each device takes its block). One
    they leave whole is read whole over the region's manual axes: in a fully manual region
    the body's dims are the region's own (need-replication, never tied to a plan's), and a
    plan that shards the operand there gathers it; in a partially manual region the operand
    dim and the body's are one (the partitioner keeps the body sharded over the axes the
    region leaves to it), and the body's values drop the manual axes (``_tables``), so a plan
    that shards the operand over one gathers it there."""
    return _region_boundary(params, params["in_specs"], ins, outs)


@register("shard_map_exit")
def _shard_map_exit(params, ins, outs):
    """[body outputs (per device)...] -> [results (global)...]: in_specs' rule, mirrored."""
    mirrored = _region_boundary(params, params["out_specs"], outs, ins)
    return [Factor(f.size, f.kind, f.results, f.operands, f.reduce) for f in mirrored]


def _region_boundary(params, specs, outer, inner) -> list[Factor]:
    free = len(params["manual"]) < len(params["mesh"])  # axes the region leaves to the partitioner
    tied = {(i, d) for i, spec in enumerate(specs) for d in range(len(outer[i])) if free and not spec[d]}
    fs = [_f(s, P, operands=[(i, d)], results=[(i, d)]) if (i, d) in tied else _f(s, P if spec[d] else N,
                                                                                  operands=[(i, d)])
          for i, (spec, sh) in enumerate(zip(specs, outer)) for d, s in enumerate(sh)]
    fs += [_f(s, N, results=[(j, d)]) for j, sh in enumerate(inner) for d, s in enumerate(sh) if (j, d) not in tied]
    return _keep(fs)


# --------------------------------------------------------------------------- kernels

def _sdy_dims(mapping, rank: int) -> list:
    """One sharding rule operand's or result's factor per dim: a name, or None for a dim
    it does not map to one factor alone (a compound factor). A leading ``…`` (JAX's
    ``BATCHING``) stands for the dims the others leave, right-aligned across operands."""
    from ..tracing._jax import SDY_BATCHING as BATCHING

    dims: list = []
    rest = sum(1 for m in mapping if not (isinstance(m, str) and m.startswith(BATCHING)))
    for m in mapping:
        if isinstance(m, str) and m.startswith(BATCHING):
            n = rank - rest
            dims += [f"{m}:{n - k}" for k in range(n)]
        else:
            dims.append(m if isinstance(m, str) else None)
    return dims


def custom_partitioning_rule(params, ins, outs) -> list[Factor]:
    """A ``custom_partitioning`` op's own rule (its ``sharding_rule``, Shardy's notation:
    ``'b h q d, b h k d -> b h q d'``): a factor on results and operands is one named
    dimension (PASS), a ``reduction_factors`` one a REDUCTION, ``need_replication`` and
    ``permutation`` factors and dims under a compound factor are not sharded. A rule given
    as a function (of the mesh and the MLIR types) is not read: the op keeps every dim."""
    rule = params.get("sharding_rule")
    if rule is None or callable(rule) or not hasattr(rule, "operand_mappings"):
        return conservative_rule(params, ins, outs)
    if len(rule.operand_mappings) != len(ins) or len(rule.result_mappings) != len(outs):
        return conservative_rule(params, ins, outs)
    where: dict[str, tuple[list, list]] = {}
    fs: list[Factor | None] = []
    for side, mappings, shapes in ((0, rule.operand_mappings, ins), (1, rule.result_mappings, outs)):
        for i, (mapping, shape) in enumerate(zip(mappings, shapes)):
            dims = _sdy_dims(mapping, len(shape))
            if len(dims) != len(shape):
                return conservative_rule(params, ins, outs)
            for d, name in enumerate(dims):
                if name is None:
                    fs.append(_f(shape[d], N, operands=[(i, d)]) if side == 0 else _f(shape[d], N, results=[(i, d)]))
                else:
                    where.setdefault(name, ([], []))[side].append((i, d))
    held = set(rule.need_replication_factors) | set(rule.permutation_factors)
    reduced = set(rule.reduction_factors)
    for name, (operands, results) in where.items():
        size = (ins[operands[0][0]][operands[0][1]] if operands else outs[results[0][0]][results[0][1]])
        if name in held or (name in reduced and results) or (not results and name not in reduced):
            fs += [_f(size, N, operands=[r]) for r in operands] + [_f(size, N, results=[r]) for r in results]
        elif name in reduced:
            fs.append(_f(size, FactorKind.REDUCTION, operands=operands))
        else:
            fs.append(_f(size, P, operands=operands, results=results))
    return _keep(fs)


factor_rules["custom_partitioning"] = custom_partitioning_rule


PSEUDO_OPS = frozenset({"scan_enter", "scan_exit", "while_enter", "while_exit", "cond_enter", "cond_exit",
                        "shard_map_enter", "shard_map_exit"})


def rule_for(primitive: str) -> tuple[RuleFn, bool]:
    """The rule for a primitive and whether it is a known one (not the conservative default)."""
    rule = factor_rules.get(primitive)
    if rule is None:
        return conservative_rule, primitive in CONSERVATIVE
    return rule, True


def factors_of(primitive: str, params: dict, ins: Sequence[Shape], outs: Sequence[Shape]) -> list[Factor]:
    rule, _ = rule_for(primitive)
    return rule(params, ins, outs)


# Ops that only move or view data: XLA's HloCostAnalysis counts no FLOPs for them.
_MOVES = frozenset({"reshape", "squeeze", "expand_dims", "broadcast_in_dim", "transpose", "concatenate", "split",
                    "rev", "slice", "dynamic_slice", "dynamic_update_slice", "pad", "copy", "copy_p",
                    "stop_gradient", "iota"})
_REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
                         "reduce_xor", "argmax", "argmin"})


def _conv_taps(params: dict, ins: Sequence[Shape], outs: Sequence[Shape], d: int, padding_counts: bool) -> int:
    """A conv's (output position, kernel tap) pairs along spatial dim d that land on its
    input, not on the holes of a dilated input; on the SAME padding too if padding_counts."""
    lhs, rhs, out = ins[0], ins[1], outs[0]
    dn = params["dimension_numbers"]
    n = len(dn.lhs_spec) - 2
    stride = (params.get("window_strides") or (1,) * n)[d]
    lo = (params.get("padding") or ((0, 0),) * n)[d][0]
    base = (params.get("lhs_dilation") or (1,) * n)[d]
    rd = (params.get("rhs_dilation") or (1,) * n)[d]
    size, kernel, width = lhs[dn.lhs_spec[2 + d]], rhs[dn.rhs_spec[2 + d]], out[dn.out_spec[2 + d]]
    valid = 0
    for k in range(kernel):
        for o in range(width):
            i = o * stride - lo + k * rd  # in the dilated, padded input
            if i % base == 0 and (padding_counts or 0 <= i // base < size):
                valid += 1
    return valid


def _conv_flops(params: dict, ins: Sequence[Shape], outs: Sequence[Shape]) -> float:
    """A convolution's FLOPs as XLA's HloCostAnalysis counts them: 2 per multiply-add that
    lands on the input, not on its padding or the holes of a dilated input (a 3x3 SAME conv
    on a 16x16 image does 8.3 of its 9 taps per output on average; the backward pass's
    input-dilated convs fewer)."""
    rhs, out = ins[1], outs[0]
    dn = params["dimension_numbers"]
    taps = math.prod(_conv_taps(params, ins, outs, d, False) for d in range(len(dn.lhs_spec) - 2))
    # per (output batch, output feature): the input features each reads, times the taps
    return 2.0 * out[dn.out_spec[0]] * out[dn.out_spec[1]] * rhs[dn.rhs_spec[1]] * taps


def conv_halo_ratios(params: dict, ins: Sequence[Shape], outs: Sequence[Shape]) -> dict[int, float]:
    """Per spatial dim of a conv's lhs (its dim index in the lhs): the factor its FLOPs per
    device grow by when that dim is sharded with a halo exchange. XLA's SPMD partitioner
    computes each device's conv on its block extended by the neighbours' halo rows (zeros
    past the image edge, no padding left in that dim), one program for every device, so
    the taps that land on the SAME padding along that dim are computed and counted too:
    FLOPs per device = its FLOPs x prod(ratio of each halo-sharded dim) / shards (exact
    against XLA on the U-Net's rows plans: fwd, stride-2, input-dilated and filter-gradient
    convs). 3x3 SAME along 16 rows: 48/46; along 8: 24/22; along 4: 12/10."""
    dn = params["dimension_numbers"]
    out = {}
    for d in range(len(dn.lhs_spec) - 2):
        on = _conv_taps(params, ins, outs, d, False)
        out[dn.lhs_spec[2 + d]] = _conv_taps(params, ins, outs, d, True) / on if on else 1.0
    return out
