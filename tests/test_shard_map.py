"""``shard_map`` regions: per-device code inside a step. partex traces the body at the shapes
each device holds, takes the region's in/out specs as the user's shardings of the values
crossing it (so plans shard an MoE's expert weights as the region reads them), prices the
collectives written in the body with their per-device bytes, counts the body's buffers at
their per-device sizes, and never shards the body's values itself."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, PartitionSpec as P

import partex

E, D, F, T = 4, 16, 32, 64


def _moe_step(layers: int = 2):
    """Top-1 MoE layers; tokens dispatched to their expert's device with ``all_to_all``
    inside a ``shard_map`` over the `expert` axis (each device holds one expert)."""
    mesh = jax.make_mesh((4, 2), ("expert", "model"), axis_types=(AxisType.Auto,) * 2)
    ks = jax.random.split(jax.random.key(0), 3 * layers + 1)
    params = [{"router": jax.random.normal(ks[3 * i], (D, E)) / 4,
               "w1": jax.random.normal(ks[3 * i + 1], (E, D, F)) / 4,
               "w2": jax.random.normal(ks[3 * i + 2], (E, F, D)) / 6} for i in range(layers)]
    x = jax.random.normal(ks[-1], (T, D))
    cap = T // 4 // E * 2  # slots per expert per device

    @partial(jax.shard_map, mesh=mesh, in_specs=(P("expert"), P("expert"), P("expert"), P()),
             out_specs=P("expert"), check_vma=False)
    def moe(x, w1, w2, router):
        e = jnp.argmax(x @ router, -1)
        onehot = jax.nn.one_hot(e, E)
        pos = jnp.cumsum(onehot, 0) * onehot
        keep = (pos > 0) & (pos <= cap)
        slot = jnp.where(keep, pos - 1, 0).sum(-1).astype(jnp.int32)
        dispatch = jax.nn.one_hot(slot, cap)[:, None, :] * keep[:, :, None]  # [t, E, cap]
        xe = jnp.einsum("tec,td->ecd", dispatch, x)
        xe = jax.lax.all_to_all(xe, "expert", 0, 0, tiled=True)  # this device's expert's tokens
        h = jax.nn.relu(jnp.einsum("ecd,edf->ecf", xe.reshape(1, -1, D), w1))
        y = jnp.einsum("ecf,efd->ecd", h, w2).reshape(E, cap, D)
        y = jax.lax.all_to_all(y, "expert", 0, 0, tiled=True)
        return jnp.einsum("tec,ecd->td", dispatch, y)

    def loss(params, x):
        h = x
        for p in params:
            h = h + moe(h, p["w1"], p["w2"], p["router"])
        return jnp.mean(h ** 2)

    def step(params, x):
        value, g = jax.value_and_grad(loss)(params, x)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, g), value

    return step, (params, x)


def _ring_step():
    """Attention over a sequence sharded on `data`, K/V passed round the ring with ``ppermute``
    inside a ``shard_map`` (exact softmax by a running max and sum)."""
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    n, S = 4, 32
    ks = jax.random.split(jax.random.key(1), 4)
    w = {k: jax.random.normal(ks[i], (D, D)) / 4 for i, k in enumerate(("q", "k", "v"))}
    x = jax.random.normal(ks[3], (S, D))

    @partial(jax.shard_map, mesh=mesh, in_specs=(P("data"), P("data"), P("data")), out_specs=P("data"),
             check_vma=False)
    def ring(q, k, v):
        def body(i, carry):
            k, v, m, s, o = carry
            a = q @ k.T
            m2 = jnp.maximum(m, a.max(-1, keepdims=True))
            scale = jnp.exp(m - m2)
            p = jnp.exp(a - m2)
            s, o = s * scale + p.sum(-1, keepdims=True), o * scale + p @ v
            perm = [(j, (j + 1) % n) for j in range(n)]
            return jax.lax.ppermute(k, "data", perm), jax.lax.ppermute(v, "data", perm), m2, s, o
        init = (k, v, jnp.full((q.shape[0], 1), -jnp.inf), jnp.zeros((q.shape[0], 1)), jnp.zeros_like(q))
        _, _, _, s, o = jax.lax.fori_loop(0, n, body, init, unroll=True)
        return o / s

    def loss(w, x):
        return jnp.mean(ring(x @ w["q"], x @ w["k"], x @ w["v"]) ** 2)

    def step(w, x):
        value, g = jax.value_and_grad(loss)(w, x)
        return jax.tree.map(lambda p, g: p - 0.1 * g, w, g), value

    return step, (w, x)


def _partial_step():
    """A region manual over `data` only (``axis_names={'data'}``): a per-shard sum of
    squares ``psum``-ed over `data`, while `model` stays the partitioner's."""
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    ks = jax.random.split(jax.random.key(2), 3)
    params = {"w1": jax.random.normal(ks[0], (D, F)) / 4, "w2": jax.random.normal(ks[1], (F, D)) / 6}
    x = jax.random.normal(ks[2], (T, D))

    @partial(jax.shard_map, mesh=mesh, in_specs=P("data"), out_specs=P(), axis_names={"data"}, check_vma=False)
    def mean_square(h):
        return jax.lax.psum(jnp.sum(h ** 2), "data") / (T * D)

    def loss(params, x):
        return mean_square(jax.nn.relu(x @ params["w1"]) @ params["w2"])

    def step(params, x):
        value, g = jax.value_and_grad(loss)(params, x)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, g), value

    return step, (params, x)


def _collectives(out) -> dict[str, tuple[float, float]]:
    return {k: (c.predicted_bytes, c.xla_bytes) for k, c in out.collectives.items() if c.predicted_bytes or c.xla_bytes}


def test_an_moe_regions_all_to_all_is_priced_and_its_experts_stay_sharded():
    step, args = _moe_step()
    s = partex.Session(step, args, mesh="expert=4,model=2")
    an = s.model.analysis
    assert an.program.manual_values  # the body is traced, per device
    body_groups = {an.group_of(v, d) for v in an.program.manual_values for d in range(len(an.program.values[v].shape))}
    assert not body_groups & {g.id for g in an.decision_groups}  # no plan shards the body's values
    fixed = {(f["group"], f["axis"]) for f in s.fixed}
    assert ("*/w1[0]", "expert") in fixed and ("*/w2[0]", "expert") in fixed  # the experts, as the region reads them
    for name in ("dp", "zero3"):
        out = s.verify(s.plan(strategy=name), run=True, mark=False, explain=True)
        assert out.numerics.ok, out.numerics
        # each of XLA's collectives traced to the one predicted in the region's body
        assert out.explain["matched_fraction"] == 1.0 and not out.explain["unmatched_predicted"], out.explain
        got = _collectives(out)
        assert got["all-to-all"][1] > 0 and got["all-to-all"][0] == got["all-to-all"][1], got
        assert "all-gather" not in got, got  # no expert weight (or its gradient) gathered
        assert 0.85 <= out.memory.ratio <= 1.15, out.memory


def test_a_ring_attentions_ppermutes_are_priced():
    step, args = _ring_step()
    s = partex.Session(step, args, mesh="data=4,model=2")
    out = s.verify(s.plan(strategy="dp"), run=True, mark=False)
    assert out.numerics.ok, out.numerics
    cp = out.collectives["collective-permute"]
    # every hop's K and V, forward and backward: 4 hops x 2 x 2 of a [8, 16] float32 block
    assert cp.predicted_bytes == 4 * 2 * 2 * 8 * D * 4
    # XLA unrolls the loop and drops the permutes whose results nothing reads (the last hop's
    # K and V forward, one more in the backward): partex's figure is over, never under
    assert 0.75 * cp.predicted_bytes <= cp.xla_bytes <= cp.predicted_bytes, _collectives(out)


def test_a_partially_manual_region_leaves_the_other_axes_to_the_plan():
    step, args = _partial_step()
    s = partex.Session(step, args, mesh="data=4,model=2")
    assert {f["axis"] for f in s.fixed} == {"data"}, s.fixed  # the region's specs: over data, nothing on model
    out = s.verify(s.plan(strategy="megatron"), run=True, mark=False)
    assert out.numerics.ok, out.numerics
    assert any(d.axis == "model" for d in s.strategy("megatron") if isinstance(d, partex.Shard))


def test_the_plan_adopts_the_regions_mesh_and_axis_names():
    step, args = _moe_step(layers=1)
    s = partex.Session(step, args, mesh="step")
    assert s.mesh.text() == "expert=4,model=2"
    assert "expert" in {f["axis"] for f in s.fixed}  # the experts over the region's own axis
    plain = (lambda w, x: (w - 0.1 * jax.grad(lambda w: jnp.sum((x @ w) ** 2))(w),), (jnp.ones((D, D)), jnp.ones((T, D))))
    with pytest.raises(partex.PartexError, match="mesh='step': the step names no mesh of its own"):
        partex.Session(*plain, mesh="step")


def test_replacing_the_users_shardings_keeps_a_regions_specs():
    """A region's body is written for the blocks its specs give it: "replace" frees the
    step's other shardings, never those."""
    step, args = _moe_step(layers=1)
    s = partex.Session(step, args, mesh="step", user_shardings="replace")
    assert s.fixed and {f["kind"] for f in s.fixed} <= {"shard_map in_specs", "shard_map out_specs"}
    out = s.verify(s.plan(strategy="dp"), mark=False)
    assert "all-gather" not in _collectives(out)


def test_a_region_on_the_devices_in_another_order_runs_on_the_plans_mesh():
    """The region's mesh names the plan's axes over the devices in reverse order: apply runs
    the region on the plan's mesh, and the step computes what it computes unsharded."""
    import numpy as np
    from jax.sharding import Mesh

    mesh = Mesh(np.array(jax.devices()[::-1]).reshape(4, 2), ("data", "model"))

    @partial(jax.shard_map, mesh=mesh, in_specs=P("data"), out_specs=P(), check_vma=False)
    def total(h):
        return jax.lax.psum(jnp.sum(h ** 2), "data")

    def step(w, x):
        value, g = jax.value_and_grad(lambda w: total(x @ w))(w)
        return w - 0.01 * g, value

    args = (jax.random.normal(jax.random.key(3), (D, D)) / 4, jax.random.normal(jax.random.key(4), (T, D)))
    plan = partex.Session(step, args, mesh="data=4,model=2").plan(strategy="dp")
    want = jax.jit(step)(*args)
    got = partex.apply_plan(plan, step)(*args)  # donates w
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("manual", [("data", "model"), ("data",)], ids=["all-manual", "data-manual"])
def test_a_region_in_an_explicit_mode_step(manual):
    """A shard_map region in a step whose mesh has Explicit axes (all manual, or manual over
    `data` with `model` still explicit inside): it traces, applies on the plan's mesh (the body
    evaluated again there, its typed shardings dropped) and computes what the step computes."""
    import numpy as np
    from jax.sharding import NamedSharding

    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    w = jax.device_put(jax.random.normal(jax.random.key(5), (D, D)) / 4, NamedSharding(mesh, P(None, "model")))
    x = jax.device_put(jax.random.normal(jax.random.key(6), (T, D)), NamedSharding(mesh, P("data", None)))
    inner = P("data", "model" if manual == ("data",) else None)

    @partial(jax.shard_map, mesh=mesh, in_specs=P("data"), out_specs=P(), axis_names=set(manual))
    def total(h):
        return jax.lax.psum(jnp.sum(h ** 2), "data")

    def step(w, x):
        value, g = jax.value_and_grad(lambda w: total(jnp.einsum("bd,de->be", x, w, out_sharding=inner)))(w)
        return w - 0.01 * g, value

    with jax.set_mesh(mesh):
        want = jax.jit(step)(w, x)
    s = partex.Session(step, (w, x), mesh="step")
    out = s.verify(s.plan(strategy="megatron"), run=True, mark=False)
    assert out.numerics.ok, out.numerics
    got = partex.apply_plan(s.plan(strategy="megatron"), step)(w, x)
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), rtol=1e-5)


def test_a_regions_gathers_and_reduce_scatters_are_priced_and_traced():
    """An FSDP-style region: the weight ``all_gather``-ed over `data` before its matmul, the
    result ``psum_scatter``-ed and gathered again; the backward pass transposes each."""
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)

    @partial(jax.shard_map, mesh=mesh, in_specs=(P("data"), P("data")), out_specs=P("data"), check_vma=False)
    def fsdp(x, w):
        y = x @ jax.lax.all_gather(w, "data", tiled=True)
        s = jax.lax.psum_scatter(y, "data", scatter_dimension=1, tiled=True)
        return jax.lax.all_gather(s, "data", axis=1, tiled=True)

    def step(w, x):
        value, g = jax.value_and_grad(lambda w: jnp.mean(fsdp(x, w) ** 2))(w)
        return w - 0.1 * g, value

    args = (jax.random.normal(jax.random.key(7), (32, 32)) / 6, jax.random.normal(jax.random.key(8), (16, 32)))
    s = partex.Session(step, args, mesh="step")
    out = s.verify(s.plan(strategy="dp"), run=True, mark=False, explain=True)
    assert out.numerics.ok, out.numerics
    got = _collectives(out)
    for kind in ("all-gather", "reduce-scatter"):
        assert got[kind][1] > 0 and got[kind][0] == got[kind][1], got
    assert out.explain["matched_fraction"] == 1.0, out.explain


def test_a_region_over_a_mesh_with_size_one_axes_runs_on_the_plans_mesh():
    """MaxText's meshes carry a dozen axes, most of size 1: a region over such a mesh runs on
    the plan's devices under the region's own axis names."""
    import numpy as np

    mesh = jax.make_mesh((4, 1, 2), ("data", "expert", "model"), axis_types=(AxisType.Auto,) * 3)

    def step(w, x):
        def loss(w):
            h = jax.shard_map(lambda x: x * jax.lax.psum(jnp.sum(x), "expert"), mesh=mesh,
                              in_specs=P(("data", "expert")), out_specs=P(("data", "expert")))(x @ w)
            return jnp.mean(h ** 2)
        value, g = jax.value_and_grad(loss)(w)
        return w - 0.1 * g, value

    args = (jax.random.normal(jax.random.key(9), (D, F)) / 4, jax.random.normal(jax.random.key(10), (8, D)))
    want = jax.jit(step)(*args)
    got = partex.apply_plan(partex.Session(step, args, mesh="data=4,model=2").plan(strategy="dp"), step)(*args)
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), rtol=1e-4, atol=1e-6)
