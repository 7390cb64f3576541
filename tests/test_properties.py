"""Property tests over randomly generated JAX programs (hypothesis).

A strategy builds small random programs -- a DAG of 2-8 ops over 1-3 float inputs (plus int
index inputs for gathers) mixing dot_general/einsum, elementwise ops, reshape, transpose,
broadcast, reductions, concatenate, slicing, gather and ``lax.scan``, sometimes wrapped in
``jax.value_and_grad`` (training steps are gradients). Dims are drawn from
{1, 2, 3, 4, 6, 8, 16}, so mesh axes of size 2/4/8 sometimes divide them and sometimes not.
Each program is generated as Python *source*, so a failing example prints as a
copy-pasteable repro.

Properties:
  1. trace + analyze never raise, know every primitive, and every factor's tied dims have
     consistent sizes;
  2. a random ordered set of decisions over (decision group x mesh axis) gives a plan that
     applies, compiles on the 8 simulated devices and computes what the unsharded function
     computes (non-dividing decisions included: partex must skip them);
  3. the same for the search's own best plan.

``pytest --hypothesis-large`` (tests/conftest.py) runs 10x the examples.
"""

from __future__ import annotations

import dataclasses
import math
import os
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from partex import FactorKind, ModelAnalysis, trace
from partex.analysis._analysis import analyze
from partex import LoadedModel, MeshSpec, Shard, get_hardware
from partex.plan._planning import make_plan
from partex.planner._pins import Pins
from partex.planner._search import Search, search_inputs

SCALE = 10 if os.environ.get("PARTEX_HYPOTHESIS_LARGE") else 1
SIZES = (1, 2, 3, 4, 6, 8, 16)
MAX_ELEMS = 2048
MAX_RANK = 4
MESHES = ("data=8", "data=4,model=2", "data=2,model=4", "a=2,b=2,c=2")
RTOL, ATOL = 1e-4, 1e-5  # atol is relative to each output's largest magnitude


def _settings(n: int):
    return settings(
        max_examples=n * SCALE,
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.large_base_example, HealthCheck.filter_too_much],
    )


# --------------------------------------------------------------------------- programs

@dataclasses.dataclass
class _Node:
    name: str
    shape: tuple[int, ...]
    exact: bool  # only data movement from an input: bitwise equal under any sharding


@dataclasses.dataclass
class GenProgram:
    """A generated program: Python source defining ``f`` plus its example arguments."""

    source: str
    arg_specs: tuple  # (name, shape, dtype, index bound or None)
    seed: int

    def build(self):
        ns = {"jax": jax, "jnp": jnp, "lax": jax.lax, "np": np}
        exec(compile(self.source, "<generated>", "exec"), ns)  # noqa: S102 -- our own source
        rng = np.random.default_rng(self.seed)
        args = []
        for _, shape, dtype, bound in self.arg_specs:
            if dtype == "int32":
                args.append(rng.integers(0, bound, size=shape).astype(np.int32))
            else:
                args.append(rng.standard_normal(shape).astype(np.float32))
        return ns["f"], tuple(args)

    def _repr_pretty_(self, p, cycle) -> None:  # hypothesis's printer: the source, readable
        p.text(repr(self))

    def __repr__(self) -> str:
        specs = ", ".join(
            f"{n}: {dt}{list(s)}" + (f" in [0, {b})" if b is not None else "")
            for n, s, dt, b in self.arg_specs)
        return f"\n# args ({specs}), numpy seed {self.seed}\n{self.source}"


class _Builder:
    """Draws ops one at a time, tracking shapes so that the program is valid by construction."""

    def __init__(self, draw):
        self.draw = draw
        self.lines: list[str] = []  # body of the (loss) function, 4-space indented later
        self.nodes: list[_Node] = []
        self.consumed: set[str] = set()
        self.floats: list[tuple[str, tuple[int, ...]]] = []
        self.indices: list[tuple[str, tuple[int, ...], int]] = []
        self.count = 0

    # ---- helpers
    def dim(self) -> int:
        return self.draw(st.sampled_from(SIZES))

    def shape(self, min_rank=1, max_rank=3) -> tuple[int, ...]:
        r = self.draw(st.integers(min_rank, max_rank))
        return tuple(self.dim() for _ in range(r))

    def pick(self, nodes=None) -> _Node:
        nodes = self.nodes if nodes is None else nodes
        # recent nodes first (index 0 = newest), so that programs tend to chain
        return nodes[len(nodes) - 1 - self.draw(st.integers(0, len(nodes) - 1))]

    def emit(self, expr: str, shape, exact=False, uses=()) -> _Node | None:
        shape = tuple(int(s) for s in shape)
        if len(shape) > MAX_RANK or math.prod(shape) > MAX_ELEMS:
            return None
        name = f"v{self.count}"
        self.count += 1
        self.lines.append(f"{name} = {expr}")
        self.consumed.update(n.name for n in uses)
        node = _Node(name, shape, exact)
        self.nodes.append(node)
        return node

    def index_input(self, bound: int) -> str:
        shape = self.draw(st.sampled_from([(2,), (3,), (4,), (8,), (2, 3)]))
        name = f"i{len(self.indices)}"
        self.indices.append((name, shape, bound))
        return name

    # ---- ops
    def op_dot(self):
        a, b = self.pick(), self.pick()
        pairs = [(i, j) for i, sa in enumerate(a.shape) for j, sb in enumerate(b.shape) if sa == sb]
        if not pairs:
            return None
        k = self.draw(st.integers(0, len(pairs) - 1))
        contract = [pairs[k]]
        batch = []
        rest = [(i, j) for i, j in pairs if i != pairs[k][0] and j != pairs[k][1]]
        if rest and self.draw(st.booleans()):
            batch.append(rest[self.draw(st.integers(0, len(rest) - 1))])
        ca, cb = [i for i, _ in contract], [j for _, j in contract]
        ba, bb = [i for i, _ in batch], [j for _, j in batch]
        fa = [i for i in range(len(a.shape)) if i not in ca + ba]
        fb = [j for j in range(len(b.shape)) if j not in cb + bb]
        out = [a.shape[i] for i in ba] + [a.shape[i] for i in fa] + [b.shape[j] for j in fb]
        if self.draw(st.booleans()):
            dn = f"(({tuple(ca)}, {tuple(cb)}), ({tuple(ba)}, {tuple(bb)}))"
            return self.emit(f"lax.dot_general({a.name}, {b.name}, {dn})", out, uses=(a, b))
        # the same contraction as an einsum, with a random output order
        letters = iter("abcdefghijklmnop")
        la = [next(letters) for _ in a.shape]
        lb = [None] * len(b.shape)
        for i, j in contract + batch:
            lb[j] = la[i]
        lb = [x or next(letters) for x in lb]
        out_l = [la[i] for i in ba] + [la[i] for i in fa] + [lb[j] for j in fb]
        perm = self.draw(st.permutations(range(len(out_l))))
        spec = f"{''.join(la)},{''.join(lb)}->{''.join(out_l[p] for p in perm)}"
        return self.emit(f"jnp.einsum('{spec}', {a.name}, {b.name})", [out[p] for p in perm],
                         uses=(a, b))

    def op_elementwise(self):
        a = self.pick()
        kind = self.draw(st.sampled_from(["binary", "unary", "where"]))
        others = [n for n in self.nodes if _broadcasts(n.shape, a.shape)]
        if kind == "binary":
            b = self.pick(others)  # a itself is always a candidate
            op = self.draw(st.sampled_from(["+", "*", "-"]))
            if self.draw(st.booleans()) and op == "+":
                return self.emit(f"jnp.maximum({a.name}, {b.name})", a.shape, uses=(a, b))
            return self.emit(f"{a.name} {op} {b.name}", a.shape, uses=(a, b))
        if kind == "unary":
            f = self.draw(st.sampled_from(["jnp.tanh({})", "jnp.exp(jnp.tanh({}))", "jnp.sin({})",
                                           "0.5 * {}", "-{}"]))
            return self.emit(f.format(a.name), a.shape, uses=(a,))
        # where: the condition only on exact values (inputs moved around), so that rounding
        # differences of a sharded computation can never flip it
        conds = [n for n in others if n.exact]
        if not conds:
            return None
        c = self.pick(conds)
        b = self.pick(others)
        return self.emit(f"jnp.where({c.name} > 0, {a.name}, {b.name})", a.shape, uses=(a, b, c))

    def op_reshape(self):
        a = self.pick()
        s = list(a.shape)
        kind = self.draw(st.sampled_from(["merge", "split", "flatten", "regroup"]))
        if kind == "merge" and len(s) >= 2:
            i = self.draw(st.integers(0, len(s) - 2))
            new = s[:i] + [s[i] * s[i + 1]] + s[i + 2:]
        elif kind == "split" and s:
            i = self.draw(st.integers(0, len(s) - 1))
            divs = [d for d in range(2, s[i]) if s[i] % d == 0]
            if not divs:
                return None
            d = self.draw(st.sampled_from(divs))
            new = s[:i] + [d, s[i] // d] + s[i + 1:]
        elif kind == "flatten" and len(s) >= 2:
            new = [math.prod(s)]
        elif kind == "regroup" and len(s) >= 2:
            # two adjacent dims re-split at another divisor of their product: (8, 6) -> (4, 12),
            # (6, 4) -> (4, 6) (compound factors on both sides, or a gcd part)
            i = self.draw(st.integers(0, len(s) - 2))
            n = s[i] * s[i + 1]
            divs = [d for d in range(2, n) if n % d == 0 and d not in (s[i], s[i + 1])]
            if not divs:
                return None
            d = self.draw(st.sampled_from(divs))
            new = s[:i] + [d, n // d] + s[i + 2:]
        else:
            return None
        return self.emit(f"{a.name}.reshape({tuple(new)})", new, exact=a.exact, uses=(a,))

    def op_transpose(self):
        a = self.pick()
        if len(a.shape) < 2:
            return None
        perm = self.draw(st.permutations(range(len(a.shape))))
        return self.emit(f"jnp.transpose({a.name}, {tuple(perm)})", [a.shape[p] for p in perm],
                         exact=a.exact, uses=(a,))

    def op_broadcast(self):
        a = self.pick()
        kind = self.draw(st.sampled_from(["lead", "expand", "inner", "ones"]))
        if kind == "lead":
            new = (self.dim(),) + a.shape
            return self.emit(f"jnp.broadcast_to({a.name}, {new})", new, exact=a.exact, uses=(a,))
        i = self.draw(st.integers(0, len(a.shape)))
        if kind == "expand":
            new = a.shape[:i] + (1,) + a.shape[i:]
            return self.emit(f"jnp.expand_dims({a.name}, {i})", new, exact=a.exact, uses=(a,))
        if kind == "inner":
            new = a.shape[:i] + (self.dim(),) + a.shape[i:]
            return self.emit(f"jnp.broadcast_to(jnp.expand_dims({a.name}, {i}), {new})", new,
                             exact=a.exact, uses=(a,))
        ones = [d for d, s in enumerate(a.shape) if s == 1]
        if not ones:
            return None
        new = list(a.shape)
        new[self.draw(st.sampled_from(ones))] = self.dim()
        return self.emit(f"jnp.broadcast_to({a.name}, {tuple(new)})", new, exact=a.exact, uses=(a,))

    def op_reduce(self):
        a = self.pick()
        if not a.shape:
            return None
        axes = self.draw(st.lists(st.integers(0, len(a.shape) - 1), min_size=1, unique=True))
        axes = tuple(sorted(axes))
        keep = self.draw(st.booleans())
        fn = self.draw(st.sampled_from(["sum", "max"]))
        new = [1 if d in axes else s for d, s in enumerate(a.shape)] if keep else \
            [s for d, s in enumerate(a.shape) if d not in axes]
        return self.emit(f"jnp.{fn}({a.name}, axis={axes}, keepdims={keep})", new,
                         exact=a.exact and fn == "max", uses=(a,))

    def op_concat(self):
        a = self.pick()
        if not a.shape:
            return None
        ax = self.draw(st.integers(0, len(a.shape) - 1))
        others = [n for n in self.nodes if len(n.shape) == len(a.shape)
                  and all(x == y for d, (x, y) in enumerate(zip(n.shape, a.shape)) if d != ax)]
        b = self.pick(others)
        new = list(a.shape)
        new[ax] += b.shape[ax]
        return self.emit(f"jnp.concatenate([{a.name}, {b.name}], axis={ax})", new,
                         exact=a.exact and b.exact, uses=(a, b))

    def op_argreduce(self):
        """argmax / argmin (as floats, for the loss) of an exactly computed value: a sharded
        arg-reduction reduces partial (value, index) pairs, and near-ties of an inexact
        value could flip it."""
        a = self.pick()
        if not a.shape or not a.exact:
            return None
        ax = self.draw(st.integers(0, len(a.shape) - 1))
        fn = self.draw(st.sampled_from(["argmax", "argmin"]))
        new = [s for d, s in enumerate(a.shape) if d != ax]
        return self.emit(f"jnp.{fn}({a.name}, axis={ax}).astype(jnp.float32)", new, exact=True, uses=(a,))

    def pick_axis(self, min_size: int):
        """A value and one of its dims of at least ``min_size``, or None."""
        a = self.pick()
        dims = [d for d, s in enumerate(a.shape) if s >= min_size]
        return (a, self.draw(st.sampled_from(dims))) if dims else None

    def op_window_update(self):
        """``a.at[..., i:i+w, ...].add(...)``: a scatter-add whose window spans part of a dim."""
        picked = self.pick_axis(3)
        if picked is None:
            return None
        a, ax = picked
        s = a.shape[ax]
        w = self.draw(st.integers(2, s - 1))
        start = self.draw(st.integers(0, s - w))
        src = self.draw(st.integers(0, s - w))
        dst = ", ".join([":"] * ax + [f"{start}:{start + w}"])
        frm = ", ".join([":"] * ax + [f"{src}:{src + w}"])
        return self.emit(f"{a.name}.at[{dst}].add(jnp.tanh({a.name}[{frm}]))", a.shape, uses=(a,))

    def op_conv(self):
        """A 1-D convolution (NHC) of a rank-3 value with a new kernel input: stride 1 or 2,
        "SAME", "VALID" or explicit padding, kernel 1-3 wide, plain, grouped or depthwise.
        Sharding its rows costs a halo exchange; its weight gradient reduces over them."""
        a = self.pick()
        if len(a.shape) != 3 or a.shape[1] < 2:
            return None
        _, h, c = a.shape
        k = self.draw(st.integers(1, min(3, h)))
        stride = self.draw(st.sampled_from([1, 2] if h % 2 == 0 else [1]))
        groups = self.draw(st.sampled_from(sorted({1, c} | ({2} if c % 2 == 0 else set()))))
        o = groups * self.draw(st.sampled_from([1, 2]))
        pad = self.draw(st.sampled_from(["SAME", "VALID", "EXPLICIT"]))
        if pad == "SAME":
            n, padding = -(-h // stride), '"SAME"'
        elif pad == "VALID":
            n, padding = (h - k) // stride + 1, '"VALID"'
        else:
            lo, hi = self.draw(st.integers(0, k - 1)), self.draw(st.integers(0, k - 1))
            n, padding = (h + lo + hi - k) // stride + 1, f"(({lo}, {hi}),)"
        w = f"w{len(self.floats)}"
        self.floats.append((w, (k, c // groups, o)))
        expr = (f"lax.conv_general_dilated({a.name}, {w}, ({stride},), {padding}, dimension_numbers=('NHC', 'HIO', 'NHC'), "
                f"feature_group_count={groups})")
        return self.emit(expr, (a.shape[0], n, o), uses=(a,))

    def op_slice(self):
        picked = self.pick_axis(2)
        if picked is None:
            return None
        a, ax = picked
        s = a.shape[ax]
        start = self.draw(st.integers(0, s - 1))
        stop = self.draw(st.integers(start + 1, s))
        step = self.draw(st.sampled_from([1, 2]))
        n = len(range(start, stop, step))
        idx = ", ".join([":"] * ax + [f"{start}:{stop}" + (f":{step}" if step > 1 else "")])
        new = list(a.shape)
        new[ax] = n
        return self.emit(f"{a.name}[{idx}]", new, exact=a.exact, uses=(a,))

    def op_roll(self):
        """jnp.roll by a static shift (a rotation: one op, its rows shardable with a halo)."""
        picked = self.pick_axis(2)
        if picked is None:
            return None
        a, ax = picked
        shift = self.draw(st.integers(-a.shape[ax], a.shape[ax]))
        return self.emit(f"jnp.roll({a.name}, {shift}, axis={ax})", a.shape, exact=a.exact, uses=(a,))

    def op_gather(self):
        a = self.pick()
        if not a.shape or len(self.indices) >= 2:
            return None
        if self.draw(st.booleans()):
            i = self.index_input(a.shape[0])
            ishape = self.indices[-1][1]
            return self.emit(f"{a.name}[{i}]", ishape + a.shape[1:], exact=a.exact, uses=(a,))
        ax = self.draw(st.integers(0, len(a.shape) - 1))
        i = self.index_input(a.shape[ax])
        ishape = self.indices[-1][1]
        return self.emit(f"jnp.take({a.name}, {i}, axis={ax})",
                         a.shape[:ax] + ishape + a.shape[ax + 1:], exact=a.exact, uses=(a,))

    def op_scan(self):
        xs = self.pick()
        if len(xs.shape) < 2:
            return None
        item = xs.shape[1:]
        body = self.draw(st.sampled_from(["ew", "matmul"]))
        consts = []
        if body == "matmul":
            ws = [n for n in self.nodes if len(n.shape) == 2 and n.shape[0] == item[-1]]
            if not ws:
                return None
            w = self.pick(ws)
            consts.append(w)
            carry = item[:-1] + (w.shape[1],)
            step = f"jnp.tanh(c + x @ {w.name})"
        else:
            carry = item
            step = "jnp.tanh(c + x)"
        inits = [n for n in self.nodes if n.shape == carry]
        if inits and self.draw(st.booleans()):
            init = self.pick(inits)
            consts.append(init)
            init_expr = init.name
        else:
            init_expr = f"jnp.zeros({carry}, jnp.float32)"
        ys = self.draw(st.sampled_from(["c", "c * x.sum()", "jnp.sum(c, axis=-1)"]))
        rev = self.draw(st.booleans())
        fname = f"body{self.count}"
        self.lines += [f"def {fname}(c, x):", f"    c = {step}", f"    return c, {ys}"]
        ys_shape = {"c": carry, "c * x.sum()": carry, "jnp.sum(c, axis=-1)": carry[:-1]}[ys]
        name_c, name_y = f"v{self.count}", f"v{self.count + 1}"
        if math.prod((xs.shape[0],) + ys_shape) > MAX_ELEMS or math.prod(carry) > MAX_ELEMS:
            del self.lines[-3:]
            return None
        self.count += 2
        self.lines.append(f"{name_c}, {name_y} = lax.scan({fname}, {init_expr}, {xs.name}"
                          + (", reverse=True)" if rev else ")"))
        self.consumed.update([xs.name] + [n.name for n in consts])
        self.nodes.append(_Node(name_c, tuple(carry), False))
        self.nodes.append(_Node(name_y, (xs.shape[0],) + tuple(ys_shape), False))
        return self.nodes[-1]

    OPS = ("dot", "dot", "elementwise", "elementwise", "reshape", "transpose", "broadcast",
           "reduce", "concat", "slice", "roll", "gather", "scan", "argreduce", "window_update", "conv")


def _broadcasts(small, big) -> bool:
    if len(small) > len(big):
        return False
    return all(s == b or s == 1 for s, b in zip(reversed(small), reversed(big)))


@st.composite
def programs(draw) -> GenProgram:
    b = _Builder(draw)
    n_in = draw(st.integers(1, 3))
    for k in range(n_in):
        shape = b.shape()
        while math.prod(shape) > MAX_ELEMS // 4:  # room to grow
            shape = shape[:-1]
        b.floats.append((f"x{k}", shape))
        b.nodes.append(_Node(f"x{k}", shape, True))
    n_ops = draw(st.integers(2, 8))
    for _ in range(n_ops):
        for _attempt in range(4):  # an op that does not fit the shapes at hand: draw another
            if getattr(b, "op_" + draw(st.sampled_from(_Builder.OPS)))() is not None:
                break
    if not b.lines:
        b.emit("jnp.tanh(x0)", b.nodes[0].shape, uses=(b.nodes[0],))
    made = [n for n in b.nodes if not n.name.startswith("x")]
    sinks = [n for n in made if n.name not in b.consumed][-3:] or made[-1:]
    grad = draw(st.integers(0, 2)) == 0  # a third are training steps
    fparams = [n for n, _ in b.floats]
    params = ", ".join(fparams + [n for n, _, _ in b.indices])
    outs = ", ".join(n.name for n in sinks)
    if grad:
        loss = " + ".join(f"jnp.sum({n.name} * {n.name})" for n in sinks)
        body = b.lines + [f"return {loss}"]
        argnums = tuple(range(len(fparams)))
        src = (f"def f({params}):\n    def loss({', '.join(fparams)}):\n"
               + textwrap.indent("\n".join(body), " " * 8)
               + f"\n    return jax.value_and_grad(loss, argnums={argnums})({', '.join(fparams)})\n")
    else:
        src = f"def f({params}):\n" + textwrap.indent("\n".join(b.lines + [f"return ({outs},)"]), " " * 4) + "\n"
    specs = tuple((n, s, "float32", None) for n, s in b.floats) + \
        tuple((n, s, "int32", bound) for n, s, bound in b.indices)
    return GenProgram(src, specs, draw(st.integers(0, 2**16)))


# --------------------------------------------------------------------------- checks

def _analysed(prog: GenProgram):
    fn, args = prog.build()
    program = trace(fn, args)
    an = analyze(program)
    return fn, args, ModelAnalysis(LoadedModel("generated", fn, args), program, an, 0.0)


def _check_factor_sizes(program, factors):
    for op, fs in zip(program.ops, factors, strict=True):
        ins = [program.values[i].shape for i in op.inputs]
        outs = [program.values[o].shape for o in op.outputs]
        for f in fs:
            sizes = [ins[i][d] for i, d in f.operands] + [outs[j][d] for j, d in f.results]
            if op.primitive == "reshape" or f.halo is not None:
                assert all(s % f.size == 0 for s in sizes), (op.primitive, op.source, f, sizes)
            else:
                assert all(s == f.size for s in sizes), (op.primitive, op.source, f, sizes)
            if f.kind == FactorKind.REDUCTION:
                assert not f.results, (op.primitive, f)


def _assert_same(got, ref, what: str) -> None:
    g_leaves, r_leaves = jax.tree.leaves(got), jax.tree.leaves(ref)
    assert jax.tree.structure(got) == jax.tree.structure(ref), what
    for k, (g, r) in enumerate(zip(g_leaves, r_leaves)):
        g, r = np.asarray(g), np.asarray(r)
        assert g.shape == r.shape and g.dtype == r.dtype, (what, k, g.shape, r.shape)
        scale = float(np.max(np.abs(r))) if r.size else 0.0
        atol = ATOL * (scale if scale > 0 else 1.0)
        np.testing.assert_allclose(g, r, rtol=RTOL, atol=atol, err_msg=f"{what}: output leaf {k}")


def _describe(plan) -> None:
    """Hypothesis notes (printed for a failing example) and statistics about a plan."""
    note(f"plan inputs {plan.inputs}\nplan outputs {plan.outputs}")
    sharded = sum(any(e is not None for e in spec) for spec in plan.inputs.values())
    event(f"decisions: {len(plan.decisions)}, sharded input leaves: {min(sharded, 3)}{'+' if sharded > 3 else ''}")


def _run_plan(plan, fn, args, ref):
    planned = plan.apply(fn)
    fresh = tuple(jnp.array(a) for a in args)  # the plan may donate its arguments
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*donated buffers were not usable.*")
        got = planned(*fresh)
    _assert_same(got, ref, "the planned function differs from the unsharded one")


# --------------------------------------------------------------------------- properties

@_settings(200)
@given(programs())
def test_analysis_never_crashes(prog):
    fn, args = prog.build()
    program = trace(fn, args)
    an = analyze(program)
    assert an.unknown_primitives == {}, an.unknown_primitives
    _check_factor_sizes(program, an.factors)
    assert all(0 <= g.id < len(an.groups) for g in an.decision_groups)


@_settings(100)
@given(programs(), st.sampled_from(MESHES), st.data())
def test_random_decisions_apply_and_match(prog, mesh_text, data):
    fn, args, ma = _analysed(prog)
    mesh = MeshSpec.parse(mesh_text)
    pairs = [Shard(g.id, a) for g in ma.analysis.decision_groups for a in mesh.axes]
    decisions = []
    if pairs:
        order = data.draw(st.lists(st.integers(0, len(pairs) - 1), unique=True, min_size=1,
                                   max_size=min(len(pairs), 6)), label="decision indices")
        decisions = [pairs[i] for i in order]
    labels = [(ma.analysis.groups[d.group].label, ma.analysis.groups[d.group].size, d.axis) for d in decisions]
    note(f"decisions (group label, size, axis): {labels}")
    ref = jax.jit(fn)(*args)
    plan = make_plan(ma, mesh, get_hardware("cpu"), decisions)
    _describe(plan)
    _run_plan(plan, fn, args, ref)


def _searched_plan(ma, mesh: MeshSpec, seed: int):
    """The search's best plan after 20 simulations on ``mesh``, any mesh (a Session would
    refuse an axis that divides nothing: here that is part of what is tested)."""
    cm, space = search_inputs(ma, mesh, get_hardware("cpu"))
    search = Search(cm, space, seed=seed)
    search.step(20, Pins())
    best = search.best()
    return None if best is None else make_plan(ma, mesh, cm.hw, list(best.decisions), strategy="mcts",
                                               donate=cm.donate, cost_model=cm)


@_settings(50)
@given(programs(), st.sampled_from(MESHES), st.integers(0, 3))
def test_search_plan_applies_and_matches(prog, mesh_text, seed):
    fn, args, ma = _analysed(prog)
    mesh = MeshSpec.parse(mesh_text)
    plan = _searched_plan(ma, mesh, seed)
    assert plan is not None  # the default cpu budget (16 GiB) always fits the replicated plan
    ref = jax.jit(fn)(*args)
    note(f"search decisions: {[(d.group, d.axis) for d in plan.decisions]}")
    _describe(plan)
    _run_plan(plan, fn, args, ref)


# --------------------------------------------------------------------------- found programs

# Minimal programs the properties above found failing (shrunk by hypothesis, then by hand).
# Random generation hits them only now and then, so they are checked on every run: each
# under every single decision on every mesh, and with the search's own plan.
FOUND = {
    # jax transposes the strided slice x[1::2] into lax.pad with interior padding (1, 0, 1);
    # XLA's SPMD partitioner gets that pad wrong when its result is sharded along the padded
    # dim: wrong values on 2 devices ([4, 4, 8, 8] for [0, 4, 0, 8]), "hlo verifier" compile
    # errors on others
    "grad_of_strided_slice": GenProgram(
        "def f(x0):\n    return (jax.grad(lambda x: jnp.sum(x[1::2] ** 2))(x0),)\n",
        (("x0", (4,), "float32", None),), 0),
    # nothing but inputs and outputs (no materialised intermediate): CostModel._memory adds
    # float resharding buffers to np.bincount's int64 result for an empty intermediate list
    "no_intermediates": GenProgram(
        "def f(x0):\n    return (jnp.concatenate([x0, x0], axis=0),)\n",
        (("x0", (8,), "float32", None),), 0),
    # a depthwise conv whose windows span the whole image (a 1-wide output), channels sharded
    # over part of the mesh: XLA's partitioner crashes the process ("free(): invalid pointer")
    "depthwise_conv_one_wide": GenProgram(
        "def f(x0, w1):\n    def loss(x0, w1):\n        v = lax.conv_general_dilated(x0, w1, (1,), 'VALID', "
        "dimension_numbers=('NHC', 'HIO', 'NHC'), feature_group_count=4)\n        return jnp.sum(v * v)\n"
        "    return jax.value_and_grad(loss, argnums=(0, 1))(x0, w1)\n",
        (("x0", (4, 3, 4), "float32", None), ("w1", (3, 1, 4), "float32", None)), 0),
    # the same with 2 outputs per group: a plan sharding the conv's output features after the
    # conv, were XLA left to shard the conv itself, compiles to invalid HLO ("output feature
    # dimension ... divisible by feature_group_count"); apply pins the conv's result at the
    # plan's view first
    "grouped_conv_one_wide": GenProgram(
        "def f(x0, w1):\n    def loss(x0, w1):\n        v = lax.conv_general_dilated(x0, w1, (1,), 'VALID', "
        "dimension_numbers=('NHC', 'HIO', 'NHC'), feature_group_count=4)\n        return jnp.sum(v * v)\n"
        "    return jax.value_and_grad(loss, argnums=(0, 1))(x0, w1)\n",
        (("x0", (3, 3, 4), "float32", None), ("w1", (3, 1, 8), "float32", None)), 0),
    # no mesh axis divides any dim: the search has no action at all
    "nothing_divides": GenProgram(
        "def f(x0):\n    return (0.5 * x0,)\n", (("x0", (3,), "float32", None),), 0),
}


@pytest.mark.parametrize("name", list(FOUND))
def test_found_programs(name):
    fn, args, ma = _analysed(FOUND[name])
    ref = jax.jit(fn)(*args)
    failures = []
    for mesh_text in MESHES:
        mesh = MeshSpec.parse(mesh_text)
        runs = [[Shard(g.id, a)] for g in ma.analysis.decision_groups for a in mesh.axes] + ["search"]
        for decisions in runs:
            what = f"{mesh_text}: " + ("search" if decisions == "search" else
                                       f"{ma.analysis.groups[decisions[0].group].label} -> {decisions[0].axis}")
            try:
                if decisions == "search":
                    plan = _searched_plan(ma, mesh, 0)
                else:
                    plan = make_plan(ma, mesh, get_hardware("cpu"), decisions)
                _run_plan(plan, fn, args, ref)
            except Exception as e:  # collect them all: one failure hides no other
                failures.append(f"{what}: {type(e).__name__}: {' '.join(str(e).split())[:300]}")
    assert not failures, f"{len(failures)} failing:\n" + "\n".join(failures)
