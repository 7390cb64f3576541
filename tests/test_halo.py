"""Spatial sharding of convolutions: the rows each device needs from its neighbours (a halo),
tied height/width decision groups, the halo's collective-permutes priced as XLA emits them,
and plans that shard a spatial dim compiled and run with the unsharded function's numbers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import partex
from partex.analysis._rules import FactorKind, Halo, factors_of
from partex.cost._patterns import XLA_SUMS_CONV_PARTIALS_OVER_WHOLE_MESH


def _conv(x, w, stride=1, padding="SAME"):
    return lax.conv_general_dilated(x, w, (stride, stride), padding, dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _conv_ops(fn, *shapes):
    jaxpr = jax.make_jaxpr(fn)(*(jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes))
    return [e for e in jaxpr.eqns if e.primitive.name == "conv_general_dilated"]


@pytest.mark.parametrize("stride", [1, 2])
def test_halo_rows_of_a_conv_its_transpose_and_its_weight_gradient(stride):
    """Each of the three convs of a 3x3 "SAME" conv's VJP reads, on 4 devices, the rows XLA
    sends it (measured: tests below and docs/results.md): stride 1, one row each side for all
    three; stride 2 (padding (0, 1)), one row from the right for the conv and its weight
    gradient, one from the left for the transposed conv (lhs dilation 2, padding (2, 1))."""

    def f(x, w):
        y, vjp = jax.vjp(lambda x, w: _conv(x, w, stride), x, w)
        return vjp(y)

    fwd, wgrad, dgrad = _conv_ops(f, (2, 16, 16, 6), (3, 3, 6, 4))
    rows = {}
    for name, e in (("conv", fwd), ("weight grad", wgrad), ("input grad", dgrad)):
        ins = [v.aval.shape for v in e.invars]
        fs = factors_of("conv_general_dilated", e.params, ins, [e.outvars[0].aval.shape])
        halos = [f for f in fs if f.halo is not None]
        assert len(halos) == 2, (name, fs)  # height and width
        rows[name] = halos[0].halo.rows(4)
        kind = FactorKind.REDUCTION if name == "weight grad" else FactorKind.PERMUTE
        assert all(f.kind == kind and f.ties for f in halos), (name, halos)
    if stride == 1:
        assert rows == {"conv": (1, 1), "weight grad": (1, 1), "input grad": (1, 1)}
    else:
        assert rows == {"conv": (0, 1), "weight grad": (0, 1), "input grad": (1, 0)}


def test_a_valid_conv_that_shrinks_the_image_keeps_its_rows_unsharded():
    (e,) = _conv_ops(lambda x, w: _conv(x, w, padding="VALID"), (2, 16, 16, 6), (3, 3, 6, 4))
    fs = factors_of("conv_general_dilated", e.params, [(2, 16, 16, 6), (3, 3, 6, 4)], [(2, 14, 14, 4)])
    assert not any(f.halo for f in fs)
    assert all(f.kind == FactorKind.PERMUTE and not f.ties for f in fs if f.operands and f.operands[0][1] in (1, 2))


def test_halo_rows_at_the_edges_of_a_small_block():
    """Two rows per device and a 5-wide window: each device needs two rows from each side."""
    assert Halo(0, 1, 8, 8, 1, 5, 1, 2, 1).rows(4) == (2, 2)
    assert Halo(0, 1, 8, 8, 1, 5, 1, 2, 1).rows(1) == (0, 0)


def test_unet_height_and_width_are_one_decision_group_each():
    """Every conv of the U-Net ties its image rows (and columns) to its output's: stride-1
    convs at one level, stride-2 downsamplings and the nearest-neighbour upsampling across
    levels: the tiny U-Net has one height and one width group, not one per conv output (16
    spatial groups)."""
    an = partex.analyze_model("unet", "tiny").analysis
    spatial = set()
    for op in an.program.ops:
        if op.primitive != "conv_general_dilated":
            continue
        dn = op.params["dimension_numbers"]
        for vid, dims in ((op.inputs[0], dn.lhs_spec[2:]), (op.outputs[0], dn.out_spec[2:])):
            for d in dims:
                if an.program.values[vid].shape[d] > 3:  # not a weight gradient's 3x3 window
                    spatial.add(an.group_of(vid, d))
    labels = sorted(an.groups[g].label for g in spatial)
    assert labels == ["height", "width"], labels


def test_xla_sums_a_padded_weight_gradient_over_every_device():
    """The XLA behaviour the cost model works around before jaxlib 0.12.1 (Shardy and GSPMD
    alike): a padded conv's weight gradient with its rows sharded over part of the mesh is
    all-reduced over every device, copies included: on data=4,model=2 with the rows on model
    it comes out 4 times too large (the 4 copies along data). From 0.12.1 it is right. The
    cost model's belief (``XLA_SUMS_CONV_PARTIALS_OVER_WHOLE_MESH``) must be what XLA does."""
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16, 16, 6), dtype=np.float32)
    w = rng.standard_normal((3, 3, 6, 4), dtype=np.float32)

    def grad(w, x):
        return jax.grad(lambda w: jnp.sum(jnp.sin(_conv(x, w))))(w)

    ref = grad(w, x)
    rows = NamedSharding(mesh, P(None, "model"))
    got = jax.jit(grad, in_shardings=(NamedSharding(mesh, P()), rows), out_shardings=NamedSharding(mesh, P()))(w, x)
    copies = 4 if XLA_SUMS_CONV_PARTIALS_OVER_WHOLE_MESH else 1
    np.testing.assert_allclose(np.asarray(got), copies * np.asarray(ref), rtol=1e-4, atol=1e-4)


def test_xla_sums_a_depthwise_weight_gradient_over_every_device():
    """The same with a depthwise conv's weight gradient (batch_group_count = channels) and
    only its batch sharded, on data (plain data parallelism on a 2-D mesh): 2x too large
    (the 2 copies along model) before jaxlib 0.12.1, right from it. ``tests/test_properties.py``
    FOUND holds partex's plans."""
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16, 16, 8), dtype=np.float32)
    w = rng.standard_normal((3, 3, 1, 8), dtype=np.float32)

    def grad(w, x):
        conv = lambda w: lax.conv_general_dilated(  # noqa: E731
            x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=8)
        return jax.grad(lambda w: jnp.sum(jnp.sin(conv(w))))(w)

    ref = grad(w, x)
    got = jax.jit(grad, in_shardings=(NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))),
                  out_shardings=NamedSharding(mesh, P()))(w, x)
    copies = 2 if XLA_SUMS_CONV_PARTIALS_OVER_WHOLE_MESH else 1
    np.testing.assert_allclose(np.asarray(got), copies * np.asarray(ref), rtol=1e-4, atol=1e-4)


def _conv_step(x, w1, w2):
    def loss(w1, w2):
        h = jax.nn.relu(_conv(x, w1))
        return jnp.mean(_conv(h, w2, stride=2) ** 2)
    return jax.value_and_grad(loss, argnums=(0, 1))(w1, w2)


@pytest.fixture(scope="module")
def conv_session():
    rng = np.random.default_rng(1)
    args = (jnp.asarray(rng.standard_normal((8, 16, 16, 6), dtype=np.float32)),
            jnp.asarray(rng.standard_normal((3, 3, 6, 8), dtype=np.float32)),
            jnp.asarray(rng.standard_normal((3, 3, 8, 8), dtype=np.float32)))
    return partex.Session(_conv_step, args, mesh="data=4,model=2")


@pytest.mark.parametrize("decisions", [["x:1:model"], ["x:0:data", "x:1:model"], ["x:1:data"]],
                         ids=["rows-on-model", "batch-data-rows-model", "rows-on-data"])
def test_a_plan_sharding_the_rows_runs_right_and_its_halos_are_priced_as_xla_sends_them(conv_session, decisions):
    """Rows sharded on part of the mesh (the weight gradients then take the rest on their
    batch: XLA's bug above), on all of it, and 4 ways: the outputs match the unsharded step
    and XLA's collective-permute and all-reduce bytes equal the prediction."""
    s = conv_session
    plan = s.plan([(s.group(d.rsplit(":", 1)[0]).label, d.rsplit(":", 1)[1]) for d in decisions])
    out = s.verify(plan, run=True)
    assert out.numerics.ok, out.numerics
    colls = out.collectives
    assert colls["collective-permute"].xla_bytes > 0
    assert colls["collective-permute"].ratio == pytest.approx(1.0), colls
    # the filter gradients exactly; XLA may reduce the 4-byte loss once per mesh axis
    assert abs(colls["all-reduce"].predicted_bytes - colls["all-reduce"].xla_bytes) <= 4, colls


@pytest.mark.parametrize("cut", ["1:33", ":32", "2:66"])
@pytest.mark.parametrize("axis", ["model", "data"])
def test_a_sharded_slice_reads_its_neighbours_rows_as_xla_sends_them(cut, axis):
    """x[:, a:b] with the column dim sharded 2 (model) or 4 (data) ways: operand and result
    columns are one named dimension, and the collective-permute bytes equal XLA's (none for
    x[:, 2:66] of 68 on 2 devices: each output block lies on its own input block)."""
    lo, hi = (int(v) if v else None for v in cut.split(":"))
    width = 68 if cut == "2:66" else 64

    def step(x):
        return jnp.tanh(x[:, lo:hi])

    x = jnp.asarray(np.random.default_rng(2).standard_normal((4, width), dtype=np.float32))
    s = partex.Session(step, (x,), mesh="data=4,model=2")
    an = s.analysis
    sl = next(op for op in an.program.ops if op.primitive == "slice")
    assert an.group_of(sl.inputs[0], 1) == an.group_of(sl.outputs[0], 1)
    out = s.verify(s.plan([(s.group("x:1").label, axis)]), run=True)
    c = out.collectives["collective-permute"]
    assert out.numerics.ok and c.predicted_bytes == c.xla_bytes, c
    assert (c.xla_bytes > 0) == ((cut, axis) != ("2:66", "model")), c


def _roll_step(shift):
    def step(x, w):
        def loss(x, w):
            return jnp.sum(jnp.tanh(jnp.roll(x, shift, axis=1)) * w)
        return jax.grad(loss, argnums=(0, 1))(x, w)
    return step


@pytest.mark.parametrize("shift,axis", [(3, "model"), (20, "data"), (-5, "data"), (32, "model")])
def test_a_sharded_roll_is_one_rotation_priced_as_xla_sends_it(shift, axis):
    """jnp.roll (two slices and a concatenate) and its VJP (a split, two pads and a sum) are
    each one ``roll`` op whose rows tie to its operand's: a roll along a sharded dim sends
    each device the rows rotating into its block (at most a block: a shift of 20 over blocks
    of 16 takes them from two devices), and the collective-permute bytes equal XLA's."""
    rng = np.random.default_rng(3)
    x, w = (jnp.asarray(rng.standard_normal((4, 64, 16), dtype=np.float32)) for _ in range(2))
    s = partex.Session(_roll_step(shift), (x, w), mesh="data=4,model=2")
    ops = [op.primitive for op in s.analysis.program.ops]
    assert ops.count("roll") == 2 and "concatenate" not in ops and "pad" not in ops, ops
    assert len(s.analysis.decision_groups) == 3  # batch, rows, features: rows rotate together
    out = s.verify(s.plan([(s.group("x:1").label, axis)]), run=True)
    c = out.collectives
    assert out.numerics.ok, out.numerics
    assert c["collective-permute"].xla_bytes > 0
    assert c["collective-permute"].predicted_bytes == c["collective-permute"].xla_bytes, c
    assert all(v.xla_bytes == 0 for k, v in c.items() if k != "collective-permute"), c
