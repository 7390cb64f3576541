"""Rotations: ``jnp.roll``'s slices and concatenate, and its VJP's split, pads and sum, are
each rewritten into one ``roll`` eqn that computes the same values; look-alikes are not."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from partex.tracing._program import trace
from partex.tracing._rotate import roll_p, rotations


def _prims(closed) -> list[str]:
    out = []

    def walk(jaxpr):
        for e in jaxpr.eqns:
            out.append(e.primitive.name)
            for p in e.params.values():
                inner = getattr(p, "jaxpr", p)
                if hasattr(inner, "eqns"):
                    walk(inner)
    walk(closed.jaxpr)
    return out


def _same(fn, *args):
    """The rewritten jaxpr's values equal the function's; returns its primitives."""
    closed = jax.make_jaxpr(fn)(*args)
    new = rotations(closed)
    got = jax.core.eval_jaxpr(new.jaxpr, new.consts, *args)
    ref = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *args)
    for g, r in zip(got, ref, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(r))
    return _prims(new)


X = jnp.arange(6 * 10 * 4, dtype=jnp.float32).reshape(6, 10, 4)


@pytest.mark.parametrize("shift,axis", [(3, 1), (-2, 1), (13, 1), (1, 0), ((2, -1), (1, 2))])
def test_roll_and_its_vjp_become_one_op_each(shift, axis):
    def f(x):
        y, vjp = jax.vjp(lambda x: jnp.roll(x, shift, axis=axis), x)
        return y, vjp(jnp.sin(y))[0]

    prims = _same(f, X)
    n = len(shift) if isinstance(shift, tuple) else 1
    assert prims.count("roll") == 2 * n, prims
    assert not {"concatenate", "slice", "split", "pad", "add_any"} & set(prims), prims


def test_rolls_inside_scan_and_vmap_are_rewritten_in_their_bodies():
    def f(x):
        def body(c, row):
            return jnp.roll(c, 1, axis=0) + row, jnp.roll(row, -1)
        c, ys = lax.scan(body, x[0], x)
        return c, jax.vmap(lambda r: jnp.roll(r, 2, axis=0))(ys)

    prims = _same(f, X[:, :, 0])
    assert prims.count("roll") == 3 and "concatenate" not in prims, prims


def test_look_alikes_are_left_as_they_are():
    def f(x, z):
        a = jnp.concatenate([x[:, 7:], z[:, :7]], axis=1)  # pieces of two values
        p = x[:, 7:]
        b = jnp.concatenate([p, x[:, :7]], axis=1) + p.sum()  # a piece used twice
        c = jnp.concatenate([x[:, 5:], x[:, 3:8]], axis=1)  # pieces that overlap
        d = jnp.pad(x[:, :7], ((0, 0), (3, 0), (0, 0)), constant_values=1.0) + jnp.pad(x[:, 7:], ((0, 0), (0, 7), (0, 0)))
        return a, b, c, d

    prims = _same(f, X, -X)
    assert "roll" not in prims, prims


def test_the_roll_primitive_differentiates_and_batches_like_jnp_roll():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 7, 5), dtype=np.float32))

    def mine(x):
        return roll_p.bind(x, axis=1, shift=3)

    def ref(x):
        return jnp.roll(x, 3, axis=1)

    np.testing.assert_array_equal(jax.jit(mine)(x), ref(x))
    w = jnp.cos(x)
    g1 = jax.grad(lambda x: jnp.sum(mine(x) * w))(x)
    g2 = jax.grad(lambda x: jnp.sum(ref(x) * w))(x)
    np.testing.assert_array_equal(g1, g2)
    np.testing.assert_array_equal(jax.vmap(mine, in_axes=1)(x), jax.vmap(ref, in_axes=1)(x))


def test_a_traced_step_sees_one_roll_op_and_its_rows_tied():
    program = trace(lambda x: jnp.tanh(jnp.roll(x, 4, axis=1)), (X,))
    (op,) = [op for op in program.ops if op.primitive == "roll"]
    assert op.params == {"axis": 1, "shift": 4}
    assert [o.primitive for o in program.ops].count("slice") == 0
