"""engine._hlo: collectives and memory read from XLA's compiled HLO.

The compiled cases assert what XLA on CPU (jax 0.10.x, 8 simulated devices) really emits;
the hand-written snippets cover the spellings CPU does not produce (async pairs, iota
groups with a transpose, sub-axes).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from partex.plan._hlo import (
    Collective,
    collective_bytes_by_kind,
    memory_stats,
    parse_collectives,
    parse_replica_groups,
    shape_bytes,
)

F32 = 4


@pytest.fixture(scope="module")
def mesh2d():
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


@pytest.fixture(scope="module")
def mesh1d():
    return jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))


def _compile(fn, mesh, in_specs, out_spec, *args, **jit_kw):
    return (
        jax.jit(
            fn,
            in_shardings=tuple(NamedSharding(mesh, s) for s in in_specs),
            out_shardings=NamedSharding(mesh, out_spec),
            **jit_kw,
        )
        .lower(*args)
        .compile()
    )


def _colls(fn, mesh, in_specs, out_spec, *args) -> list[Collective]:
    return parse_collectives(_compile(fn, mesh, in_specs, out_spec, *args).as_text(), mesh)


def _of(colls, kind):
    return [c for c in colls if c.kind == kind]


# ----------------------------------------------------------------------------- shapes


def test_shape_bytes():
    assert shape_bytes("f32[4,256]{1,0}") == 4 * 256 * 4
    assert shape_bytes("f32[]") == 4
    assert shape_bytes("pred[3]{0}") == 3
    assert shape_bytes("bf16[2,2]{1,0}") == 8
    assert shape_bytes("(f32[4]{0}, bf16[2,2]{1,0})") == 24
    assert shape_bytes("(f32[2]{0}, /*index=5*/s8[5]{0}, (u32[], f64[2]{0}))") == 8 + 5 + 4 + 16
    assert shape_bytes("f32[8,128]{1,0:T(8,128)}") == 8 * 128 * 4
    assert shape_bytes("s4[3]{0}") == 2  # sub-byte: rounded up
    assert shape_bytes("c64[2]{0}") == 16


def test_replica_group_spellings():
    assert parse_replica_groups("{{0,1},{2,3}}", 4) == [[0, 1], [2, 3]]
    assert parse_replica_groups("{}", 4) == [[0, 1, 2, 3]]
    assert parse_replica_groups("[4,2]<=[8]", 8) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert parse_replica_groups("[2,4]<=[4,2]T(1,0)", 8) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    # general form: reshape to [2,2,2], transpose (0,2,1), regroup as [4,2]
    assert parse_replica_groups("[4,2]<=[2,2,2]T(0,2,1)", 8) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    # XLA's mesh-based form, as seen on CPU
    assert parse_replica_groups("mesh['axis_0'=4,'axis_1'=2] {'axis_1'}", 8) == [
        [0, 1], [2, 3], [4, 5], [6, 7]]
    g = parse_replica_groups(
        "mesh['axis_0'=1,'axis_1'=4,'axis_2'=2], device_ids=([2,2,2]T(0,2,1)) {'axis_1'}", 8)
    assert sorted(map(sorted, g)) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    g = parse_replica_groups("mesh['x'=8] {'x':(2)2}", 8)  # sub-axis: [8] -> [2,2,2], middle
    assert sorted(map(sorted, g)) == [[0, 2], [1, 3], [4, 6], [5, 7]]


# ----------------------------------------------------------------------------- compiled


def test_matmul_contracting_on_model_is_one_all_reduce(mesh2d):
    x, w = jnp.ones((16, 64)), jnp.ones((64, 32))
    colls = _colls(lambda a, b: a @ b, mesh2d, [P("data", "model"), P("model", None)],
                   P("data", None), x, w)
    assert [c.kind for c in colls] == ["all-reduce"]
    (ar,) = colls
    assert ar.axes == ("model",)
    assert ar.group_size == 2
    assert ar.trips == 1
    assert ar.bytes == (16 // 4) * 32 * F32  # the per-device result
    assert collective_bytes_by_kind(colls) == {
        "all-reduce": ar.bytes, "all-gather": 0, "reduce-scatter": 0, "all-to-all": 0,
        "collective-permute": 0}


@pytest.mark.parametrize("which", ["2d", "1d"])
def test_all_gather_to_replicated(which, mesh2d, mesh1d):
    mesh = mesh2d if which == "2d" else mesh1d
    x = jnp.ones((16, 64))
    colls = _colls(lambda a: a * 2, mesh, [P("data")], P(), x)
    assert [c.kind for c in colls] == ["all-gather"]
    ag = colls[0]
    assert ag.axes == ("data",)
    assert ag.group_size == mesh.shape["data"]
    assert ag.bytes == x.size * F32  # the full gathered array


def test_sharded_contraction_to_sharded_output_is_all_reduce_on_cpu(mesh1d, mesh2d):
    """XLA's CPU pipeline has no reduce-scatter creation: the SPMD partitioner's
    all-reduce + dynamic-slice stays. (GPU/TPU would turn it into a reduce-scatter.)"""
    x, w = jnp.ones((16, 64)), jnp.ones((64, 32))
    colls = _colls(lambda a, b: a @ b, mesh1d, [P(None, "data"), P("data", None)],
                   P("data", None), x, w)
    assert [c.kind for c in colls] == ["all-reduce"]
    assert colls[0].axes == ("data",) and colls[0].group_size == 8
    assert colls[0].bytes == 16 * 32 * F32  # the whole, unscattered result
    # On the 2-D mesh, output sharded on the contracting axis: each device computes its
    # 8 rows, all-reduces over "model", then a collective-permute moves the blocks where the
    # output sharding wants them.
    colls = _colls(lambda a, b: a @ b, mesh2d, [P(None, "model"), P("model", None)],
                   P("model", None), x, w)
    assert [c.kind for c in colls] == ["all-reduce", "collective-permute"]
    ar, cp = colls
    assert ar.axes == ("model",) and ar.bytes == 8 * 32 * F32
    assert cp.bytes == 8 * 32 * F32


def test_reduce_scatter_from_shard_map(mesh2d):
    def f(x):
        return jax.lax.psum_scatter(x, "data", scatter_dimension=0, tiled=True)

    g = jax.shard_map(f, mesh=mesh2d, in_specs=P(None, "model"), out_specs=P("data", "model"))
    x = jnp.ones((16, 64))
    colls = _colls(g, mesh2d, [P(None, "model")], P("data", "model"), x)
    assert [c.kind for c in colls] == ["reduce-scatter"]
    rs = colls[0]
    assert rs.axes == ("data",) and rs.group_size == 4
    assert rs.bytes == 16 * 32 * F32  # operand (per device) > result


@pytest.mark.parametrize("which", ["1d", "2d"])
def test_all_to_all_from_moving_the_sharded_dim(which, mesh1d, mesh2d):
    mesh = mesh1d if which == "1d" else mesh2d
    x = jnp.ones((16, 32))
    colls = _colls(lambda a: a * 1, mesh, [P("data", None)], P(None, "data"), x)
    assert [c.kind for c in colls] == ["all-to-all"]
    a2a = colls[0]
    n = mesh.shape["data"]
    assert a2a.axes == ("data",) and a2a.group_size == n
    # XLA emits a tuple all-to-all of n pieces: their sum is the per-device shard
    assert a2a.bytes == x.size * F32 // n


def test_scan_all_reduce_runs_per_iteration(mesh2d):
    x, w = jnp.ones((16, 64)), jnp.ones((64, 64))

    def f(x, w):
        return jax.lax.scan(lambda h, _: (h @ w, None), x, None, length=5)[0]

    colls = _colls(f, mesh2d, [P("data", "model"), P("model", None)], P("data", None), x, w)
    (ar,) = _of(colls, "all-reduce")
    assert ar.trips == 5
    assert ar.axes == ("model",)
    assert ar.bytes == 4 * 64 * F32
    assert ar.total_bytes == 5 * ar.bytes
    assert collective_bytes_by_kind(colls)["all-reduce"] == 5 * ar.bytes


def test_nested_scans_multiply(mesh2d):
    x, w = jnp.ones((16, 64)), jnp.ones((64, 64))

    def f(x, w):
        inner = lambda h, _: (jnp.tanh(h @ w), None)
        outer = lambda h, _: (jax.lax.scan(inner, h, None, length=4)[0], None)
        return jax.lax.scan(outer, x, None, length=3)[0]

    colls = _colls(f, mesh2d, [P("data", "model"), P("model", None)], P("data", None), x, w)
    (ar,) = _of(colls, "all-reduce")
    assert ar.trips == 12


def test_collective_permute_from_roll(mesh1d):
    x = jnp.ones((16, 64))
    colls = _colls(lambda a: jnp.roll(a, 1, axis=0), mesh1d, [P("data")], P("data"), x)
    (cp,) = _of(colls, "collective-permute")
    assert cp.axes == ("data",)
    assert cp.group_size == 8  # one ring over all devices
    assert cp.bytes == 1 * 64 * F32  # the one boundary row


def test_group_ids_are_mesh_positions_not_device_ids(mesh2d):
    """On a mesh with permuted devices, HLO group ids are partition numbers (positions in
    mesh.devices.flat); reading them as Device.id would give the wrong axes."""
    devs = np.array(jax.devices())[[3, 1, 7, 5, 0, 2, 6, 4]].reshape(4, 2)
    mesh = Mesh(devs, ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    x, w = jnp.ones((16, 64)), jnp.ones((64, 32))
    colls = _colls(lambda a, b: a @ b, mesh, [P("data", "model"), P("model", None)],
                   P("data", None), x, w)
    assert [(c.kind, c.axes) for c in colls] == [("all-reduce", ("model",))]


# ----------------------------------------------------------------------------- memory


def test_memory_stats(mesh2d):
    x, w = jnp.ones((16, 64)), jnp.ones((64, 32))
    c = _compile(lambda a, b: a @ b, mesh2d, [P("data", "model"), P("model", None)],
                 P("data", None), x, w)
    m = memory_stats(c)
    assert set(m) == {"argument", "output", "temp", "alias", "generated_code", "total"}
    assert m["total"] == m["argument"] + m["output"] + m["temp"] - m["alias"]
    assert m["argument"] == x.size * F32 // 8 + w.size * F32 // 2
    assert m["output"] == 16 * 32 * F32 // 4
    assert m["alias"] == 0


def test_memory_stats_donation(mesh2d):
    x = jnp.ones((16, 64))
    c = _compile(lambda a: a + 1, mesh2d, [P("data")], P("data"), x, donate_argnums=(0,))
    m = memory_stats(c)
    assert m["alias"] == x.size * F32 // 4 > 0
    assert m["total"] == m["argument"] + m["output"] + m["temp"] - m["alias"]


# ----------------------------------------------------------------------------- snippets

def _m42():
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


ASYNC_HLO = """\
HloModule jit_f, is_scheduled=true, entry_computation_layout={(f32[4,8]{1,0})->f32[16,8]{1,0}}, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

ENTRY %main (p0: f32[4,8]) -> (f32[16,8], f32[4,8], f32[4,8]) {
  %p0 = f32[4,8]{1,0} parameter(0), metadata={op_name="x{weird}(\\"q\\")" source_file="/a b/c.py" source_line=3}
  %ags = (f32[4,8]{1,0}, f32[16,8]{1,0}) all-gather-start(f32[4,8]{1,0} %p0), channel_id=1, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}, use_global_device_ids=true, metadata={op_name="jit(f)/all_gather[axis={0}]" source_file="f.py" source_line=7}
  %agd = f32[16,8]{1,0} all-gather-done((f32[4,8]{1,0}, f32[16,8]{1,0}) %ags)
  %ars = f32[4,8]{1,0} all-reduce-start(%p0), channel_id=2, replica_groups={{0,1},{2,3},{4,5},{6,7}}, use_global_device_ids=true, to_apply=%add
  %ard = f32[4,8]{1,0} all-reduce-done(%ars)
  %cps = (f32[4,8]{1,0}, f32[4,8]{1,0}, u32[], u32[]) collective-permute-start(%p0), channel_id=3, source_target_pairs={{0,2},{2,4},{4,6},{6,0}}
  %cpd = f32[4,8]{1,0} collective-permute-done(%cps)
  ROOT %t = (f32[16,8]{1,0}, f32[4,8]{1,0}, f32[4,8]{1,0}) tuple(%agd, %ard, %cpd)
}
"""


def test_async_pairs_counted_once():
    colls = parse_collectives(ASYNC_HLO, _m42())
    assert [(c.kind, c.name) for c in colls] == [
        ("all-gather", "ags"), ("all-reduce", "ars"), ("collective-permute", "cps")]
    ag, ar, cp = colls
    assert ag.bytes == 16 * 8 * F32 and ag.axes == ("data",) and ag.group_size == 4
    assert ar.bytes == 4 * 8 * F32 and ar.axes == ("model",) and ar.group_size == 2
    assert cp.bytes == 4 * 8 * F32 and cp.axes == ("data",) and cp.group_size == 4
    assert all(c.trips == 1 and c.computation == "main" for c in colls)


def test_async_start_without_done():
    text = "\n".join(l for l in ASYNC_HLO.splitlines() if "-done" not in l)
    ag, ar, cp = parse_collectives(text, _m42())
    assert ag.bytes == 16 * 8 * F32  # the result inside the (operand, result) tuple
    assert ar.bytes == 4 * 8 * F32
    assert cp.bytes == 4 * 8 * F32  # context scalars u32[] not counted


TUPLE_AR_HLO = """\
HloModule m

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %c = f32[] add(%a, %b)
}

ENTRY %e (p: f32[4,8], q: bf16[16], r: s32[]) -> (f32[4,8], bf16[16], s32[]) {
  %p = f32[4,8]{1,0} parameter(0)
  %q = bf16[16]{0} parameter(1)
  %r = s32[] parameter(2)
  // merged by XLA's all-reduce combiner
  ROOT %all-reduce.7 = (f32[4,8]{1,0}, bf16[16]{0}, /*index=2*/s32[]) all-reduce(%p, %q, %r), channel_id=5, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%sum
}
"""


def test_tuple_all_reduce_sums_elements():
    (ar,) = parse_collectives(TUPLE_AR_HLO, _m42())
    assert ar.kind == "all-reduce"
    assert ar.bytes == 4 * 8 * 4 + 16 * 2 + 4
    assert ar.group_size == 8 and ar.axes == ("data", "model")
    assert ar.name == "all-reduce.7" and ar.computation == "e"


LOOPS_HLO = """\
HloModule loops

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%inner_body (t: (s32[], f32[8])) -> (s32[], f32[8]) {
  %t = (s32[], f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %v = f32[8]{0} get-tuple-element(%t), index=1
  %ar = f32[8]{0} all-reduce(%v), channel_id=1, replica_groups={{0,1},{2,3},{4,5},{6,7}}, use_global_device_ids=true, to_apply=%add
  ROOT %o = (s32[], f32[8]{0}) tuple(%i, %ar)
}

%inner_cond (t: (s32[], f32[8])) -> pred[] {
  %t = (s32[], f32[8]{0}) parameter(0)
  ROOT %p = pred[] constant(true)
}

%helper (v: f32[8]) -> f32[8] {
  %v = f32[8]{0} parameter(0)
  %z = s32[] constant(0)
  %tup = (s32[], f32[8]{0}) tuple(%z, %v)
  %w = (s32[], f32[8]{0}) while(%tup), condition=%inner_cond, body=%inner_body, backend_config={"known_trip_count":{"n":"4"}}
  ROOT %r = f32[8]{0} get-tuple-element(%w), index=1
}

%branch_a (v: f32[8]) -> f32[8] {
  %v = f32[8]{0} parameter(0)
  ROOT %cp = f32[8]{0} collective-permute(%v), channel_id=2, source_target_pairs={{0,1},{1,0},{2,3},{3,2},{4,5},{5,4},{6,7},{7,6}}
}

%branch_b (v: f32[8]) -> f32[8] {
  ROOT %v = f32[8]{0} parameter(0)
}

%outer_body (t: (s32[], f32[8])) -> (s32[], f32[8]) {
  %t = (s32[], f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %v = f32[8]{0} get-tuple-element(%t), index=1
  %c = f32[8]{0} call(%v), to_apply=%helper
  %k = s32[] constant(1)
  %d = f32[8]{0} conditional(%k, %c, %c), branch_computations={%branch_a, %branch_b}
  ROOT %o = (s32[], f32[8]{0}) tuple(%i, %d)
}

%outer_cond (t: (s32[], f32[8])) -> pred[] {
  %t = (s32[], f32[8]{0}) parameter(0)
  ROOT %p = pred[] constant(true)
}

%unknown_body (t: (s32[], f32[8])) -> (s32[], f32[8]) {
  %t = (s32[], f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %v = f32[8]{0} get-tuple-element(%t), index=1
  %g = f32[64]{0} all-gather(%v), channel_id=3, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true
  %s = f32[8]{0} slice(%g), slice={[0:8]}
  ROOT %o = (s32[], f32[8]{0}) tuple(%i, %s)
}

ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %z = s32[] constant(0)
  %tup = (s32[], f32[8]{0}) tuple(%z, %p)
  %w = (s32[], f32[8]{0}) while(%tup), condition=%outer_cond, body=%outer_body, backend_config={"known_trip_count":{"n":"3"},"known_init_step":{"init":"0","step":"1"}}
  %w2 = (s32[], f32[8]{0}) while(%w), condition=%outer_cond, body=%unknown_body
  ROOT %r = f32[8]{0} get-tuple-element(%w2), index=1
}
"""


def test_loops_calls_and_conditionals():
    by_name = {c.name: c for c in parse_collectives(LOOPS_HLO, _m42())}
    assert by_name["ar"].trips == 12  # 3 (outer while) x call x 4 (inner while)
    assert by_name["ar"].computation == "inner_body"
    assert by_name["ar"].axes == ("model",)
    assert by_name["cp"].trips == 3  # conditional branch inside the outer loop
    assert by_name["cp"].axes == ("model",) and by_name["cp"].group_size == 2
    assert by_name["g"].trips == 1  # no known_trip_count -> 1
    assert by_name["g"].bytes == 64 * F32 and by_name["g"].axes == ("data", "model")
    kinds = collective_bytes_by_kind(by_name.values())
    assert kinds["all-reduce"] == 12 * 8 * F32
    assert kinds["collective-permute"] == 3 * 8 * F32


def test_mesh_form_groups_with_device_ids_and_sub_axes():
    text = """\
HloModule m
ENTRY %e (p: f32[4,8]) -> f32[4,8] {
  %p = f32[4,8]{1,0} parameter(0)
  %a = f32[4,8]{1,0} all-reduce(%p), channel_id=1, replica_groups=mesh['axis_0'=1,'axis_1'=2,'axis_2'=4], device_ids=([4,2]T(1,0)) {'axis_1'}, use_global_device_ids=true, to_apply=%add
  %b = f32[16,8]{1,0} all-gather(%p), channel_id=2, replica_groups=mesh['axis_0'=4,'axis_1'=1,'axis_2'=2] {'axis_0'}, dimensions={0}, use_global_device_ids=true
  ROOT %c = f32[4,8]{1,0} all-reduce(%p), channel_id=3, replica_groups=mesh['x'=8] {'x':(2)2}, use_global_device_ids=true, to_apply=%add
}
"""
    a, b, c = parse_collectives(text, _m42())
    assert (a.axes, a.group_size) == (("model",), 2)
    assert (b.axes, b.group_size, b.bytes) == (("data",), 4, 16 * 8 * F32)
    # sub-axis: groups {0,2},{1,3},{4,6},{5,7}: half of the data axis
    assert (c.axes, c.group_size) == (("data",), 2)


def test_irregular_groups_give_unknown_axes():
    text = """\
HloModule m
ENTRY %e (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %a = f32[4]{0} all-reduce(%p), replica_groups={{0,1},{2,4},{3,5},{6,7}}, to_apply=%add
}
"""
    (a,) = parse_collectives(text, _m42())
    assert a.axes == () and a.group_size == 2


def test_generic_async_wrapper_counts_once_inside_loop():
    """async-start/async-done both name the wrapped computation: one call site, not two."""
    text = """\
HloModule m
%a2a_comp (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  ROOT %a2a = f32[8]{0} all-to-all(%x), channel_id=1, replica_groups={{0,2,4,6},{1,3,5,7}}, dimensions={0}
}
%body (t: (s32[], f32[8])) -> (s32[], f32[8]) {
  %t = (s32[], f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %v = f32[8]{0} get-tuple-element(%t), index=1
  %st = ((f32[8]{0}), f32[8]{0}, s32[]) async-start(%v), calls=%a2a_comp
  %dn = f32[8]{0} async-done(%st), calls=%a2a_comp
  ROOT %o = (s32[], f32[8]{0}) tuple(%i, %dn)
}
%cond (t: (s32[], f32[8])) -> pred[] {
  %t = (s32[], f32[8]{0}) parameter(0)
  ROOT %p = pred[] constant(true)
}
ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %z = s32[] constant(0)
  %tup = (s32[], f32[8]{0}) tuple(%z, %p)
  %w = (s32[], f32[8]{0}) while(%tup), condition=%cond, body=%body, backend_config="{\\"known_trip_count\\":{\\"n\\":\\"7\\"}}"
  ROOT %r = f32[8]{0} get-tuple-element(%w), index=1
}
"""
    (a,) = parse_collectives(text, _m42())
    assert (a.kind, a.trips, a.bytes, a.axes, a.group_size) == ("all-to-all", 7, 32, ("data",), 4)
    assert a.computation == "a2a_comp"
