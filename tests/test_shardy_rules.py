"""partex's factor rules against Shardy's, the rule registry of OpenXLA's own partitioner
(bundled with jaxlib), case by case (tests/shardy_cases.py; helpers in tests/_shardy.py).

Every case either agrees factor by factor with Shardy or is listed in ``DIFFERENCES`` with
partex's and Shardy's rule as they stand and the verdict, backed by what XLA compiles (the
collectives of the "Factor rules against Shardy" table in docs/results.md; ``XLA_EVIDENCE``
checks them). A disagreement not listed, a listed one whose rules differ from the listing, or
a listed one that agrees fails: the table stays the truth."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from _shardy import compare
from shardy_cases import CASES

# case -> (partex's rule, Shardy's rule, verdict). "finer": Shardy's rule shards what partex
# gathers; "per XLA": XLA compiles what partex's rule says; "same in effect": Shardy's extra
# factor can never be sharded (a minor part shards only after a fully sharded major one).
DIFFERENCES = {
    "reshape_gcd_uneven": ("in #0[PN,N]; out #0[PN,N]; ties P:in0.0=out0.0",
                           "in #0[PM,NP]; out #0[PM,NP]; ties P:in0.0=out0.0 P:in0.1'1=out0.1'1", "same in effect"),
    "cumsum": ("in #0[P,N]; out #0[P,N]; ties P:in0.0=out0.0", "in #0[P,M]; out #0[P,M]; ties P:in0.0=out0.0",
               "per XLA"),
    "cummax": ("in #0[P,N]; out #0[P,N]; ties P:in0.0=out0.0", "in #0[P,M]; out #0[P,M]; ties P:in0.0=out0.0",
               "per XLA"),
    "dynamic_update_slice": ("in #0[P,N] #1[P,N]; out #0[P,N]; ties P:in0.0=in1.0=out0.0",
                             "in #0[P,M] #1[P,M]; out #0[P,M]; ties P:in0.0=in1.0=out0.0", "per XLA"),
    "dynamic_update_slice_whole_row": (
        "in #0[P,P] #1[P]; out #0[P,P]; ties P:in0.0=out0.0 P:in0.1=in1.1=out0.1",
        "in #0[M,P] #1[P]; out #0[M,P]; ties P:in0.1=in1.1=out0.1", "per XLA"),
    "conv_strided": (
        "in #0[P,M,M,R] #1[M,M,R,P]; out #0[P,M,M,P]; ties P:in0.0=out0.0 P:in1.3=out0.3 R:in0.3=in1.2",
        "in #0[P,MR,MR,R] #1[R,R,R,P]; out #0[P,M,M,P]; ties P:in0.0=out0.0 P:in1.3=out0.3 R:in0.1'1=in1.0 "
        "R:in0.2'1=in1.1 R:in0.3=in1.2", "per XLA"),
    "conv_grouped": (
        "in #0[P,M,M,N] #1[M,M,N,N]; out #0[P,M,M,N]; ties P:in0.0=out0.0",
        "in #0[P,M,M,PR] #1[M,M,R,PP]; out #0[P,M,M,PP]; ties P:in0.0=out0.0 P:in0.3=in1.3=out0.3 "
        "P:in1.3'1=out0.3'1 R:in0.3'1=in1.2", "per XLA"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_factor_rule_agrees_with_shardy_or_is_listed(name):
    mine, theirs = compare(CASES[name])
    if name not in DIFFERENCES:
        assert mine == theirs, (f"{name}: partex and Shardy disagree (new: fix the rule, or list it in DIFFERENCES "
                                f"and docs/results.md's table with XLA's evidence)\n  partex: {mine.describe()}\n"
                                f"  shardy: {theirs.describe()}")
        return
    want_mine, want_theirs, _ = DIFFERENCES[name]
    assert mine != theirs, f"{name} agrees with Shardy: take it out of DIFFERENCES and docs/results.md's table"
    assert (mine.describe(), theirs.describe()) == (want_mine, want_theirs), (
        f"{name}: the rules differ from their listing\n  partex: {mine.describe()}\n  shardy: {theirs.describe()}")


def test_the_comparison_sees_factors_kinds_and_compound_dims():
    """The canonical forms themselves: a matmul's reduction, a reshape's compound dim."""
    mine, theirs = compare(CASES["dot_general"])
    assert mine == theirs and ("R", frozenset({("in", 0, 1, 0), ("in", 1, 0, 0)})) in theirs.ties
    _, theirs = compare(CASES["reshape_split"])
    assert dict(theirs.kinds)[("in", 0, 1)] == ("P", "P")


_COLLECTIVE = re.compile(r"(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)[\w.-]*\(")


def _collectives(fn, shapes, in_specs, out_spec, dtypes=None) -> set[str]:
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",), axis_types=(AxisType.Auto,))
    args = [jax.ShapeDtypeStruct(s, dt) for s, dt in zip(shapes, dtypes or [jnp.float32] * len(shapes))]
    sh = lambda spec: NamedSharding(mesh, P(*spec))  # noqa: E731
    text = jax.jit(fn, in_shardings=tuple(sh(s) for s in in_specs), out_shardings=sh(out_spec)).lower(
        *args).compile().as_text()
    return {m.group(1) for m in _COLLECTIVE.finditer(text)}


# The XLA column of docs/results.md's table: a dim sharded on 2 simulated devices, the collectives XLA emits.
XLA_EVIDENCE = {
    "reshape_split": (lambda a: a.reshape(16, 4, 64), [(16, 256)], [(None, "x")], (None, "x", None), set()),
    "reshape_gcd": (lambda a: a.reshape(4, 12), [(8, 6)], [("x", None)], ("x", None), set()),
    "reshape_gcd_uneven_rows": (lambda a: a.reshape(4, 6), [(6, 4)], [("x", None)], ("x", None), set()),
    "reshape_gcd_uneven_columns": (lambda a: a.reshape(4, 6), [(6, 4)], [(None, "x")], (None, "x"),
                                   {"all-gather"}),
    "argmax": (lambda a: jnp.argmax(a, 1), [(16, 4096)], [(None, "x")], (), {"all-gather"}),
    "cumsum": (lambda a: jnp.cumsum(a, 1), [(4, 64)], [(None, "x")], (None, "x"), {"all-gather"}),
    "cummax": (lambda a: lax.cummax(a, axis=1), [(4, 64)], [(None, "x")], (None, "x"), {"all-gather"}),
    "slice": (lambda a: a[:, 1:33], [(4, 64)], [(None, "x")], (None, "x"), {"collective-permute"}),
    "dynamic_update_slice": (lambda a, u, i: lax.dynamic_update_slice(a, u, (0, i)), [(4, 6), (4, 3), ()],
                             [(None, "x"), (), ()], (None, "x"), {"all-gather"}, [jnp.float32, jnp.float32, jnp.int32]),
    "dynamic_update_slice_whole_row": (lambda a, u, i: lax.dynamic_update_slice(a, u, (i, 0)),
                                       [(1024, 512), (1, 512), ()], [("x", None), (), ()], ("x", None), set(),
                                       [jnp.float32, jnp.float32, jnp.int32]),
    "scatter_add_window": (lambda x, i, u: x.at[i, 0:16].add(u), [(8, 32), (), (16,)], [(None, "x"), (), ()],
                           (None, "x"), {"all-gather"}, [jnp.float32, jnp.int32, jnp.float32]),
    "conv_grouped_features": (CASES["conv_grouped"].fn, [(2, 8, 8, 6), (3, 3, 3, 4)],
                              [(None, None, None, "x"), (None, None, None, "x")], (None, None, None, "x"),
                              {"all-gather"}),
    "conv_rows": (CASES["conv"].fn, [(2, 8, 8, 6), (3, 3, 6, 4)], [(None, "x", None, None), ()],
                  (None, "x", None, None), {"collective-permute"}),
    "conv_depthwise_weight_grad_rows": (CASES["conv_depthwise_weight_grad"].fn, [(2, 8, 8, 8), (2, 8, 8, 8)],
                                        [(None, "x", None, None), (None, "x", None, None)],
                                        (None, None, None, None), {"collective-permute", "all-reduce"}),
    "conv_depthwise_weight_grad_batch": (CASES["conv_depthwise_weight_grad"].fn, [(2, 8, 8, 8), (2, 8, 8, 8)],
                                         [("x", None, None, None), ("x", None, None, None)],
                                         (None, None, None, None), {"all-reduce"}),
    "conv_depthwise_weight_grad_channels": (CASES["conv_depthwise_weight_grad"].fn, [(2, 8, 8, 8), (2, 8, 8, 8)],
                                            [(None, None, None, "x"), (None, None, None, "x")],
                                            (None, None, None, "x"), set()),
    "scatter_add_row": (lambda x, i, u: x.at[i].add(u), [(8, 32), (), (32,)], [("x", None), (), ()], ("x", None),
                        set(), [jnp.float32, jnp.int32, jnp.float32]),
}


@pytest.mark.parametrize("name", list(XLA_EVIDENCE))
def test_the_tables_xla_evidence(name):
    fn, shapes, in_specs, out_spec, want, *dtypes = XLA_EVIDENCE[name]
    assert _collectives(fn, shapes, in_specs, out_spec, dtypes[0] if dtypes else None) == want


def test_xla_gathers_a_strided_convs_rows_where_shardy_would_sum_the_strides_minor_part():
    """Shardy's strided-conv rule splits the image rows into the output rows and the stride's
    minor part, a reduction with the kernel window. Sharding that minor part (image rows on
    (a, b), kernel window on b, output rows on a) XLA does not compute partial sums: it
    all-gathers. With the rows tied whole (partex's rule) it needs no collective."""
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("a", "b"), axis_types=(AxisType.Auto,) * 2)

    def conv(x, w):
        return lax.conv_general_dilated(x, w, (2, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    args = (jax.ShapeDtypeStruct((2, 8, 1, 4), jnp.float32), jax.ShapeDtypeStruct((2, 1, 4, 4), jnp.float32))

    def collectives(x, w, out):
        sh = [NamedSharding(mesh, s) for s in (x, w, out)]
        text = jax.jit(conv, in_shardings=tuple(sh[:2]), out_shardings=sh[2]).lower(*args).compile().as_text()
        return {m.group(1) for m in _COLLECTIVE.finditer(text)}

    assert collectives(P(None, ("a", "b")), P("b"), P(None, "a")) == {"all-gather"}
    assert collectives(P(None, ("a", "b")), P(), P(None, ("a", "b"))) == set()


def test_argmax_over_a_sharded_vocabulary_is_a_reduction_priced_as_xla_does():
    """argmax of vocabulary-sharded logits: each device's (value, index) pairs are gathered
    (16 rows x 4 devices x 8 bytes), not the logits (16 x 4096 x 4 bytes)."""
    import partex

    def step(w, x):
        logits = x @ w
        return jnp.argmax(logits, -1), jnp.sum(logits)

    s = partex.Session(step, (jnp.ones((64, 4096)), jnp.ones((16, 64))), mesh="data=2,model=4")
    vocab = s.group("w:1").label
    assert s.evaluate([(vocab, "model")]).collective_bytes["all-gather"] == 16 * 4 * (4 + 4)
    out = s.verify(s.plan([(vocab, "model")]), run=True)
    assert out.collectives["all-gather"].ratio == 1.0 and out.numerics.ok, out


def test_an_argmax_index_iota_is_resharded_from_the_results_sharding_as_xla_does():
    """The MoE demo's router argmax over experts sharded on `data`, its result on the batch
    (also `data`): XLA lowers the argmax to a reduce over the logits and an iota of their shape,
    gives the iota the result's sharding and all-to-alls it to the logits' (4 KiB over the two
    layers, which partex once missed); the (value, index) partials are gathered as before."""
    import partex

    m = partex.load_model("moe")
    s = partex.Session(m.fn, m.args, mesh="data=4,expert=2")
    out = s.verify(s.plan(strategy="expert"), mark=False)
    a2a = out.collectives["all-to-all"]
    assert a2a.xla_bytes > 0 and a2a.ratio == 1.0, a2a
    assert out.collectives["all-gather"].ratio == 1.0, out.collectives


def test_batched_linear_algebra_shards_its_batch_dims_with_vector_results_too():
    """eigh's eigenvalues are a vector per matrix: the batch dim ties the matrices, the
    eigenvectors and the eigenvalues alike (the rule counts batch dims from each tensor's own
    rank, not the smallest rank of all, which would leave none); XLA shards it with no collective (CPU lowers linalg to
    LAPACK custom calls, which Shardy has no rule for: XLA is the reference here)."""
    from partex import analyze

    def f(a):
        w, v = jnp.linalg.eigh(a)
        return w.sum() + v.sum()

    an = analyze(f, jax.ShapeDtypeStruct((4, 8, 8), jnp.float32)).analysis
    eigh = next(op for op in an.program.ops if op.primitive == "eigh")
    batch = {an.group_of(v, 0) for v in (*eigh.inputs, *eigh.outputs)}
    assert len(batch) == 1 and batch != {-1}, batch
    assert _collectives(lambda a: jnp.linalg.eigh(a)[0], [(4, 8, 8)], [("x", None, None)], ("x", None)) == set()


@pytest.mark.parametrize("batch", [4, 8])
def test_flattening_batch_and_sequence_keeps_both_shardings_where_the_blocks_line_up(batch):
    """(B, T, D) -> (B*T, D) with B on data (4) and T on model: the merged dim's blocks are
    the minor dim's only when B is sharded all the way (B = 4): then no collective, as XLA
    compiles it (the minor dim is a compound factor's minor part). With B = 8 each device
    holds two batch rows, the blocks do not line up, and the sequence is gathered (XLA too)."""
    import partex

    def step(x, w):
        return jnp.sum(jnp.tanh(x.reshape(-1, x.shape[-1]) @ w))

    rng = np.random.default_rng(0)
    args = (jnp.asarray(rng.standard_normal((batch, 16, 8), dtype=np.float32)),
            jnp.asarray(rng.standard_normal((8, 8), dtype=np.float32)))
    s = partex.Session(step, args, mesh="data=4,model=2")
    b, t = s.group("x:0").label, s.group("x:1").label
    decisions = [(b, "data"), (t, "model"), (b, "model")]  # the merged dim on (data, model)
    predicted = s.evaluate(decisions).collective_bytes.get("all-gather", 0.0)
    assert (predicted == 0) == (batch == 4), predicted
    out = s.verify(s.plan(decisions), run=True)
    assert out.numerics.ok and out.collectives["all-gather"].xla_bytes == predicted, out.collectives


def _attention_step(B, T, H, Dh):
    def step(x, wq, wo):
        def loss(wq, wo):
            q = (x @ wq).reshape(B, T, H, Dh)
            s = jnp.einsum("bthd,bshd->bhts", q, q)
            o = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(s), q).reshape(B, T, H * Dh)
            return jnp.sum((o @ wo) ** 2)
        return jax.value_and_grad(loss, argnums=(0, 1))(wq, wo)

    rng = np.random.default_rng(0)
    args = (jnp.asarray(rng.standard_normal((B, T, 32), dtype=np.float32)),
            jnp.asarray(rng.standard_normal((32, H * Dh), dtype=np.float32)) / 8,
            jnp.asarray(rng.standard_normal((H * Dh, 32), dtype=np.float32)) / 8)
    return step, args


@pytest.mark.parametrize("mesh,heads_on,head_dim_on,gathered", [
    ("model=8", ("model",), (), 16384),  # 4 heads cannot take 8: the split gathers them
    ("model=4,sub=2", ("model",), (), 0),  # heads on 4, replicated over the other 2
    ("model=4,sub=2", ("model", "sub"), (), 4096),  # the projection on all 8, heads on 4: gathered over sub
    ("model=4,sub=2", ("model", "sub"), ("sub",), 0),  # heads on model, head dim on sub: the split is free
])
def test_more_devices_than_heads_split_the_axis_in_the_mesh(mesh, heads_on, head_dim_on, gathered):
    """Four heads and a projection of 64 columns on 8 devices: a plan's decisions are whole
    mesh axes (as PartitionSpecs are), so where XLA would split one axis of 8 into 4 x 2
    (Shardy's sub-axes) the mesh says so (``model=4,sub=2``). The projection then takes both
    axes, the heads ``model`` and the head dim ``sub``: the reshape between them is a compound
    factor with no collective, priced as XLA compiles it, and the attention scores are summed
    over ``sub``."""
    import partex

    step, args = _attention_step(2, 16, 4, 16)
    s = partex.Session(step, args, mesh=mesh)
    heads = s.group("wq:1").label
    rs = next(op for op in s.analysis.program.ops if op.primitive == "reshape"
              and s.analysis.program.values[op.outputs[0]].shape == (2, 16, 4, 16))
    head_dim = s.analysis.groups[s.analysis.group_of(rs.outputs[0], 3)].label
    decisions = [(heads, a) for a in heads_on] + [(head_dim, a) for a in head_dim_on]
    out = s.verify(s.plan(decisions), run=True)
    c = out.collectives
    assert out.numerics.ok, out.numerics
    assert c["all-gather"].xla_bytes == c["all-gather"].predicted_bytes == gathered, c
    assert c["all-reduce"].xla_bytes == c["all-reduce"].predicted_bytes, c


def test_scan_outputs_stay_sharded_along_the_loop_axis():
    """A scan's stacked ys sharded along the loop axis: each device keeps its iterations'
    rows, no collective (XLA does so; a need-replication loop axis would price the whole stack
    on every device)."""
    import partex

    def step(c0, w):
        def body(c, _):
            c = jnp.tanh(c @ w)
            return c, c
        return lax.scan(body, c0, None, length=16)[1]

    rng = np.random.default_rng(0)
    args = (jnp.asarray(rng.standard_normal((8, 32), dtype=np.float32)),
            jnp.asarray(0.1 * rng.standard_normal((32, 32), dtype=np.float32)))
    s = partex.Session(step, args, mesh="data=4,model=2")
    an = s.analysis
    ys = an.program.outputs[0]
    loop = an.group_of(ys, 0)
    assert loop >= 0 and an.groups[loop].decidable
    report = s.evaluate([(loop, "data")])
    assert report.collective_bytes == {} and report.memory.outputs == 16 * 8 * 32 * 4 / 4
    out = s.verify(s.plan([(loop, "data")]), run=True)
    assert out.numerics.ok, out.numerics
    assert all(c.xla_bytes == 0 for c in out.collectives.values()), out.collectives
    assert out.xla_memory["output"] == 16 * 8 * 32 * 4 / 4

