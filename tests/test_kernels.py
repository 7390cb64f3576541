"""Kernels, custom-partitioned ops and host memory: a Pallas kernel is priced by its cost
estimate or its body and kept whole (XLA cannot partition it); a ``custom_partitioning``
op is sharded by its own ``sharding_rule``; a value offloaded to the host takes no device
memory on TPU/GPU and costs its transfer over the host link; on XLA:CPU, which ignores
memory spaces, nothing changes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.custom_partitioning import custom_partitioning

import _libcheck as lc
import partex
from partex.analysis._rules import FactorKind


def _form(name):
    return lc.load_form(name)


# --------------------------------------------------------------------------- custom_partitioning

@custom_partitioning
def _act(x):
    return jnp.tanh(x) * 2.0


@custom_partitioning
def _act_bwd(x, g):
    return g * 2.0 * (1 - jnp.tanh(x) ** 2)


def _same_as_first(mesh, arg_shapes, result_shape):
    s = arg_shapes[0].sharding
    n = len(arg_shapes)
    return mesh, (lambda *xs: _act.fun(*xs) if n == 1 else _act_bwd.fun(*xs)), s, (s,) * n


_act.def_partition(_same_as_first, sharding_rule="b f -> b f")
_act_bwd.def_partition(_same_as_first, sharding_rule="b f, b f -> b f", need_replication_factors=("b",))


@jax.custom_vjp
def act(x):
    return _act(x)


act.defvjp(lambda x: (_act(x), x), lambda x, g: (_act_bwd(x, g),))


def _cp_step(w1, w2, x):
    def loss(w1, w2):
        return (act(x @ w1) @ w2).sum()
    g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2)
    return w1 - 0.1 * g1, w2 - 0.1 * g2


def _cp_args():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    return (jax.random.normal(k1, (32, 64)), jax.random.normal(k2, (64, 32)) / 8, jax.random.normal(k3, (16, 32)))


def test_custom_partitioning_rule_is_read_and_its_plan_runs_as_predicted():
    s = partex.Session(_cp_step, _cp_args(), mesh="data=4,model=2", hardware="cpu")
    an = s.analysis
    fs = [fs for op, fs in zip(an.program.ops, an.factors) if op.primitive == "custom_partitioning"]
    assert len(fs) == 2 and not an.unknown_primitives
    fwd, bwd = fs
    # forward: both dims pass through (one named dim each with the matmul's); backward: b kept whole
    assert sorted((f.kind, f.size) for f in fwd) == [(FactorKind.PASS, 16), (FactorKind.PASS, 64)]
    assert {(f.kind, f.size) for f in bwd} == {(FactorKind.PASS, 64), (FactorKind.REPLICATE, 16)}
    kernels = an.kernels()
    assert [k["kind"] for k in kernels] == ["custom_partitioning"] * 2
    assert "'b f -> b f'" in kernels[0]["sharding"] and "b kept whole" in kernels[1]["sharding"]
    # megatron shards the hidden dim through the op: XLA runs it partitioned, as predicted
    dec = s.strategy("megatron")
    hidden = s.analysis.group_of(0, 1)
    assert partex.Shard(hidden, "model") in dec
    v = s.verify(s.plan(dec), run=True)
    assert v.numerics.ok, v.numerics
    assert v.memory.ratio == pytest.approx(1.0, abs=0.1), v.memory
    assert v.flops.ratio == pytest.approx(1.0, abs=0.1), v.flops
    # the backward op keeps the batch whole: its gather is predicted to the byte
    moved = {k: c for k, c in v.collectives.items() if c.xla_bytes or c.predicted_bytes}
    assert moved and all(c.ratio == pytest.approx(1.0) for c in moved.values()), moved


def test_a_rule_given_as_a_function_keeps_every_dim():
    from partex.analysis._rules import custom_partitioning_rule

    fs = custom_partitioning_rule({"sharding_rule": lambda *a: None}, [(4, 8)], [(4, 8)])
    assert {f.kind for f in fs} == {FactorKind.REPLICATE} and len(fs) == 4


# --------------------------------------------------------------------------- pallas_call

@pytest.mark.parametrize("form", ["pallas_matmul", "pallas_matmul_no_estimate"])
def test_a_bare_kernel_is_priced_kept_whole_and_said_so(form):
    m = _form(form)
    fn, args = m.make()
    s = partex.Session(fn, args, mesh=m.MESH, hardware="cpu")
    an = s.analysis
    ops = [op for op in an.program.ops if op.primitive == "pallas_call"]
    assert len(ops) == 2 and not an.unknown_primitives
    (k,) = an.kernels()
    assert k["count"] == 2 and "cannot see inside" in k["sharding"]
    assert k["cost"] == ("its cost_estimate" if form == "pallas_matmul" else "its body's FLOPs once per grid step")
    # the kernel's FLOPs: 2 m n k either way (the estimate says so; the body is one
    # block's matmul, once per grid step)
    x, w = args[2]["x"], args[0]["layers"][0]["w_in"]
    want = 2.0 * x.shape[0] * w.shape[1] * w.shape[0]
    from partex.cost._facts import facts_of
    assert facts_of("pallas_call").flops(ops[0].params, [], []) == want
    # every dim of the kernel's operands and results is kept whole: no named dim crosses it
    fs = an.factors[ops[0].id]
    assert fs and all(f.kind == FactorKind.REPLICATE and not f.ties for f in fs)
    # under dp the batch is gathered for the kernel (its rows are the batch)
    dp = s.evaluate(s.strategy("dp"), detail=True)
    assert any(c.kind == "all-gather" and c.op in [o.id for o in ops] for c in dp.collectives), dp.collectives


def test_a_kernels_estimated_bytes_bound_its_memory_time():
    m = _form("pallas_matmul")
    fn, args = m.make()
    s = partex.Session(fn, args, mesh=m.MESH, hardware="cpu")
    pats = [p for p in s.cost_model.patterns if p.kernel_bytes]
    assert pats and all(p.kernel_bytes > sum(p.operand_bytes) + sum(p.result_bytes) for p in pats)


# --------------------------------------------------------------------------- host memory

def _offload_step(policy):
    def layer(w, x):
        h = jax.ad_checkpoint.checkpoint_name(jnp.tanh(x @ w), "h")
        return jnp.sin(h @ w.T)

    f = jax.checkpoint(layer, policy=policy)

    def step(ws, x):
        def loss(ws):
            y = x
            for w in ws:
                y = f(w, y)
            return (y ** 2).sum()
        g = jax.grad(loss)(ws)
        return [w - 0.1 * gw for w, gw in zip(ws, g)]
    return step


_OFFLOAD = jax.checkpoint_policies.save_and_offload_only_these_names(
    names_which_can_be_saved=[], names_which_can_be_offloaded=["h"], offload_src="device", offload_dst="pinned_host")
_SAVE = jax.checkpoint_policies.save_only_these_names("h")


def _offload_args():
    k = jax.random.split(jax.random.key(1), 4)
    return ([jax.random.normal(k[i], (64, 256)) / 8 for i in range(3)], jax.random.normal(k[3], (512, 64)))


def _deep_offload_args(layers=8):
    """Enough layers that the residuals saved over the forward pass make the peak."""
    k = jax.random.split(jax.random.key(1), layers + 1)
    return ([jax.random.normal(k[i], (64, 256)) / 8 for i in range(layers)], jax.random.normal(k[-1], (2048, 64)))


def test_offloaded_values_take_host_memory_and_cost_their_transfer():
    args = _deep_offload_args()
    off = partex.Session(_offload_step(_OFFLOAD), args, mesh="data=4,model=2", hardware="tpu-v5p")
    save = partex.Session(_offload_step(_SAVE), args, mesh="data=4,model=2", hardware="tpu-v5p")
    assert any(v.host for v in off.program.values) and not any(v.host for v in save.program.values)
    d_off, d_save = off.strategy("dp"), save.strategy("dp")
    r_off, r_save = off.evaluate(d_off, detail=True), save.evaluate(d_save, detail=True)
    h = 2048 // 4 * 256 * 4  # one offloaded residual per device under dp
    assert r_save.memory.host == 0 and r_off.memory.host >= 8 * h
    assert r_off.memory.peak <= r_save.memory.peak - 5 * h  # most of the eight are held at the peak
    moved = [c for c in r_off.collectives if c.kind == "host-transfer"]
    assert sum(c.bytes * c.count for c in moved) == pytest.approx(2 * 8 * h)  # out and back, per layer
    assert not [c for c in r_save.collectives if c.kind == "host-transfer"]
    # the transfers take the host link's time
    slow = off.cost_model.hw.replace(host_bandwidth=1e6)
    s2 = partex.Session(_offload_step(_OFFLOAD), args, mesh="data=4,model=2", hardware=slow)
    assert s2.evaluate(d_off).step_time > r_off.step_time + 16 * h / 1e6 * 0.5


def test_xla_cpu_keeps_offloaded_values_on_the_device():
    """XLA:CPU ignores memory spaces: verify's prediction (lowering cpu) counts an offloaded
    residual as a saved one, and so does XLA."""
    args = _offload_args()
    off = partex.Session(_offload_step(_OFFLOAD), args, mesh="data=4,model=2", hardware="cpu")
    dec = off.strategy("dp")
    v = off.verify(off.plan(dec), run=True)
    assert v.numerics.ok
    assert v.memory.ratio == pytest.approx(1.0, abs=0.15), v.memory
    assert v.xla_memory["temp"] > 0


def test_llama_flash_attention_matches_the_einsum_attention():
    dot = partex.Session.from_spec("llama", preset="tiny", overrides=["seq=256"], mesh="data=4,model=2", hardware="cpu")
    flash = partex.Session.from_spec("llama", preset="tiny", overrides=["seq=256", "attention=flash"],
                                     mesh="data=4,model=2", hardware="cpu")
    fn_d, args = dot.model.model.fn, dot.model.model.args
    fn_f = flash.model.model.fn
    out_d, out_f = jax.jit(fn_d)(*args), jax.jit(fn_f)(*args)
    for a, b in zip(jax.tree.leaves(out_d), jax.tree.leaves(out_f)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)
    # the kernel's scores never reach memory: no [seq, seq] value in the flash program
    assert any(len(v.shape) >= 4 and v.shape[-2:] == (256, 256) for v in dot.program.values)
    assert not any(len(v.shape) >= 4 and v.shape[-2:] == (256, 256) for v in flash.program.values)
    # sharded over batch and heads as its rule says: zero3 runs with the unsharded step's numbers
    v = flash.verify(flash.plan(flash.strategy("megatron")), run=True)
    assert v.numerics.ok, v.numerics


def test_ragged_dot_is_priced_as_a_grouped_kernel_and_as_xla_cpu_runs_it():
    """2 m k n FLOPs for the forward and both gradients (a grouped kernel: TPU megablox,
    GPU); XLA:CPU lowers it densely, groups times that, and verify's prediction says so."""
    from partex.cost._facts import facts_of

    facts = facts_of("ragged_dot_general")
    m, k, n, g = 128, 32, 64, 4
    for ins, out in (([(m, k), (g, k, n), (g,)], (m, n)), ([(m, k), (m, n), (g,)], (g, k, n)),
                     ([(m, n), (g, k, n), (g,)], (m, k))):
        assert facts.flops({}, ins, [out]) == pytest.approx(2 * m * k * n)
        assert facts.cpu_flops({}, ins, [out]) == pytest.approx(g * 2 * m * k * n)
    m = _form("ragged_dot_moe")
    fn, args = m.make()
    s = partex.Session(fn, args, mesh=m.MESH, hardware="cpu")
    v = s.verify(s.plan(s.strategy("dp")), run=True)
    assert v.numerics.ok and v.flops.ratio == pytest.approx(1.0, abs=0.1), v.flops


def test_llama_keeps_its_optimizer_state_and_parameters_in_host_memory_as_maxtext_does():
    """``optimizer_memory_host_offload`` / ``parameter_memory_host_offload``: the state comes
    in host memory and goes back there, the step copying it to the device where it reads
    it: its device bytes leave the peak, host memory holds it (once: the update takes the
    donated argument's buffer), each copy a host
    transfer of its share; applied, the plan keeps those arguments in host memory and the
    step's numerics are the unsharded step's (XLA:CPU)."""
    plain = partex.Session.from_spec("llama", preset="tiny", mesh="data=4,model=2", hardware="tpu-v5p")
    opt = partex.Session.from_spec("llama", preset="tiny", overrides=["optimizer_memory_host_offload=true"],
                                   mesh="data=4,model=2", hardware="tpu-v5p")
    both = partex.Session.from_spec("llama", preset="tiny", mesh="data=4,model=2", hardware="tpu-v5p",
                                    overrides=["optimizer_memory_host_offload=true",
                                               "parameter_memory_host_offload=true"])
    r0, r1, r2 = (s.evaluate(s.strategy("zero3"), detail=True) for s in (plain, opt, both))
    state = r0.memory.breakdown["optimizer"]
    # (the state is donated: its update takes the argument's host buffer)
    assert r1.memory.breakdown["optimizer"] == 0 and r1.memory.host == pytest.approx(state)
    assert r1.memory.peak < r0.memory.peak
    moved = sum(c.bytes * c.count for c in r1.collectives if c.kind == "host-transfer")
    assert moved == pytest.approx(2 * state)
    params = r0.memory.breakdown["parameters"]
    assert r2.memory.breakdown["parameters"] == 0 and r2.memory.host == pytest.approx(state + params)
    cpu = partex.Session.from_spec("llama", preset="tiny", mesh="data=4,model=2", hardware="cpu",
                                   overrides=["optimizer_memory_host_offload=true",
                                              "parameter_memory_host_offload=true"])
    plan = cpu.plan(cpu.strategy("zero3"))
    shardings = partex.plan_shardings(plan, cpu.model.model.args)
    kinds = {sh.memory_kind for sh in jax.tree.leaves(shardings[:2])}
    assert kinds == {"pinned_host"}
    assert {sh.memory_kind for sh in jax.tree.leaves(shardings[2])} == {"device"}  # the batch
    out = cpu.verify(plan, run=True)
    assert out.numerics.ok, out.numerics
