"""Recompute as a decision: the layer stacks a decision covers, apply's re-emitted forward
ops, the cost model's charge for them, and the search and plan files that carry them."""

import jax
import jax.numpy as jnp
import pytest

import partex
from partex import demo_models
from partex.tracing._program import trace
from partex.analysis._recompute import backward_span, plan_unit, units
from partex.cost import CostModel


def _session(name, mesh="data=4,model=2", **kw):
    m = demo_models.build(name, "tiny")
    return partex.Session(m.fn, m.args, mesh=mesh, hardware="tpu-v4", **kw)


def test_a_unit_is_a_forward_layer_stack_read_again_by_the_backward_pass():
    """The tiny transformer's two unrolled layers are one unit ahead of the backward pass;
    the scan variant's layers are one too (a forward loop whose stacked residuals the
    backward loop reads), and a step without gradients has no backward pass to recompute in."""
    m = demo_models.build("transformer", "tiny")
    p = trace(m.fn, m.args)
    (u,) = units(p)
    first, last = backward_span(p)
    assert len(u.copies) == 2 and u.copies[-1][1] <= first == u.boundary and u.until == last
    full = plan_unit(p, u, "full")
    dots = plan_unit(p, u, "dots")
    for f, d in zip(full, dots):
        assert f.at >= first and f.ops and set(d.recomputed) < set(f.recomputed)
        # dots saves the matmuls with weights: none of them is recomputed
        assert all(p.ops[p.values[v].producer].primitive != "dot_general"
                   or p.ops[p.values[v].producer].params["dimension_numbers"][1][0] for v in d.recomputed)
        assert all(p.values[v].producer < 0 for v in f.weights)
    # the last layer's backward comes first
    assert full[1].at < full[0].at
    scan = demo_models.build("transformer-scan", "tiny")
    sp = trace(scan.fn, scan.args)
    (su,) = units(sp)
    assert su.block is None and su.layers == 2 and su.kinds == ("dots", "full", "offload", "full_offload")
    fwd, bwd = su.loop
    assert fwd < su.boundary <= bwd and sp.ops[fwd].primitive == sp.ops[bwd].primitive == "scan_enter"
    (lf,) = plan_unit(sp, su, "full")
    (ld,) = plan_unit(sp, su, "dots")
    # the forward loop stacks fewer residuals under full remat than under dots; the ops run
    # again are forward body ops, and dots runs none of the matmuls with weights again
    assert set(ld.dropped) < set(lf.dropped) and set(ld.ops) < set(lf.ops)
    assert all(fwd < o < su.copies[0][1] for o in lf.ops)
    assert not any(sp.ops[o].primitive == "dot_general" and not sp.ops[o].params["dimension_numbers"][1][0]
                   for o in ld.ops)
    assert {i for i, _ in lf.feeds} and all(sp.ops[bwd].inputs[i] in sp.ops[su.copies[0][1] - 1].outputs
                                             for i, _ in lf.feeds)

    def forward(w, x):
        return jnp.tanh(jnp.tanh(x @ w[0]) @ w[1]).sum()

    w = jnp.ones((2, 8, 8))
    assert units(trace(forward, (w, jnp.ones((4, 8))))) == []


@pytest.mark.parametrize("name", ["transformer", "moe", "gns", "unet", "transformer-scan", "llama"])
def test_every_recompute_kind_matches_the_unsharded_step(name):
    """Each kind applied (on ZeRO-3 + tensor parallel, where weights are gathered) runs and
    gives the unsharded step's loss and gradients, and XLA's collective bytes stay those
    predicted (the recomputed layer's collectives counted again, a re-gathered weight once
    more per layer). Layers under scan recompute in every iteration of the backward loop."""
    s = _session(name)
    (u, *_) = s.units
    assert (u.loop is not None) == (name in ("transformer-scan", "llama"))
    base = s.strategy("zero3")
    for kind in u.kinds:
        plan = s.plan([*base, (u.label, "recompute:" + kind)])
        assert any(d.axis == "recompute:" + kind for d in plan.decisions)
        out = s.verify(plan, run=True, mark=False)
        assert out.numerics.ok, (kind, out.numerics)
        for coll in ("all-reduce", "all-gather"):
            c = out.collectives[coll]
            if c.xla_bytes:
                assert c.ratio is not None and 0.75 <= c.ratio <= 1.4, (kind, coll, c)


def test_recompute_frees_what_xla_keeps_and_the_model_predicts_it():
    """ZeRO-3 on the tiny transformer: XLA's per-device memory falls from save to regather
    to full remat, and the prediction follows it within the tolerance verify uses."""
    s = _session("transformer")
    (u,) = s.units
    base = s.strategy("zero3")
    xla, pred = {}, {}
    for kind in (None, *partex.RECOMPUTE_KINDS):
        plan = s.plan(base + ([(u.label, "recompute:" + kind)] if kind else []))
        out = s.verify(plan, mark=False)
        xla[kind], pred[kind] = out.memory.xla, out.memory.predicted
        assert 0.65 <= out.memory.ratio <= 1.35, (kind, out.memory)
    assert xla["full"] < xla["regather"] < xla[None], xla
    assert pred["full"] < pred["regather"] < pred[None], pred


def test_a_scan_stacks_fewer_residuals_and_the_model_predicts_it():
    """ZeRO-3 on the scanned transformer: the forward loop stacks fewer residuals under dots
    and fewer still under full remat; XLA's memory falls so, and the prediction with it."""
    s = _session("transformer-scan")
    (u,) = s.units
    base = s.strategy("zero3")
    xla, pred = {}, {}
    for kind in (None, *u.kinds):
        out = s.verify(s.plan(base + ([(u.label, "recompute:" + kind)] if kind else [])), mark=False)
        xla[kind], pred[kind] = out.memory.xla, out.memory.predicted
        assert 0.65 <= out.memory.ratio <= 1.35, (kind, out.memory)
    assert xla["full"] < xla["dots"] < 0.7 * xla[None], xla
    assert pred["full"] < pred["dots"] < 0.7 * pred[None], pred
    with pytest.raises(partex.PartexError, match="under scan"):
        s.plan(base + [(u.label, "recompute:regather")])


@pytest.mark.parametrize("name", ["transformer", "transformer-scan"])
def test_the_steps_own_checkpoint_is_kept_and_modelled_as_it_is(name):
    """Every layer under the user's own jax.checkpoint: nothing is left for a decision to
    recompute; the checkpoint's backward reads the weights through its barrier, so XLA
    gathers a ZeRO-3 weight again there, and the prediction says so (collective bytes exact,
    memory close); the step still matches the unsharded one."""
    s = partex.Session.from_spec(name, mesh="data=4,model=2", overrides=["remat=true"])
    assert s.units == ()
    out = s.verify(s.plan(strategy="zero3"), run=True, mark=False)
    assert out.numerics.ok, out.numerics
    for kind, c in out.collectives.items():
        if c.xla_bytes or c.predicted_bytes:
            assert c.ratio == pytest.approx(1.0, abs=0.02), (kind, c)
    assert 0.9 <= out.memory.ratio <= 1.1, out.memory
    plain = partex.Session.from_spec(name, mesh="data=4,model=2")
    assert out.memory.xla < plain.verify(plain.plan(strategy="zero3"), mark=False).memory.xla


def test_the_cost_model_charges_the_recomputation():
    """Full remat runs the layers' forward ops twice: more compute, the same weights and
    optimizer state, less memory on a plan whose activations dominate."""
    s = _session("transformer", mesh="data=8")
    cm = s.cost_model
    dec = s.decisions(s.strategy("dp"))
    save = cm.evaluate(dec, detail=True)
    full = cm.evaluate([*dec, partex.Recompute(0, "full")], detail=True)
    assert full.compute_time > save.compute_time and full.memory.peak < save.memory.peak
    assert full.memory.arguments == save.memory.arguments
    # a recompute decision shards nothing
    assert cm.value_specs([*dec, partex.Recompute(0, "full")]) == cm.value_specs(dec)


def test_the_search_takes_recompute_when_only_that_fits_and_the_plan_file_keeps_it(tmp_path):
    """With a budget below every sharding-only plan's memory (the state kept on the device),
    the best plan recomputes; the decision survives the plan file (found again by the
    layers' signature), and an unknown kind is one clear error."""
    sharding_only = _session("transformer", memory="1000KiB")
    for kind in partex.RECOMPUTE_KINDS:
        sharding_only.forbid(0, "recompute:" + kind)
    for state in partex.STATES:
        sharding_only.forbid(state, "memory:host")
    sharding_only.step(150)
    assert sharding_only.best() is None
    s = _session("transformer", memory="1000KiB")
    for state in partex.STATES:
        s.forbid(state, "memory:host")
    s.step(150)
    best = s.best()
    assert best is not None and any(isinstance(d, partex.Recompute) for d in best.decisions)
    plan = s.best_plan()
    path = tmp_path / "p.json"
    plan.save(path)
    again = partex.Plan.load(path)
    assert [d.to_json() for d in again.decisions] == [d.to_json() for d in plan.decisions]
    m = demo_models.build("transformer", "tiny")
    out = partex.verify(again, m.fn, m.args, run=True)
    assert out.numerics.ok, out.numerics
    text = path.read_text().replace("recompute:", "recompute:bogus-", 1)
    with pytest.raises(partex.PartexError, match="recompute kind 'bogus-"):
        partex.Plan.loads(text)


def test_pins_name_a_layer_stack_and_a_kind():
    s = _session("transformer")
    (u,) = s.units
    d = s.pin(u.label, "recompute:full")
    assert d == partex.Recompute(u.id, "full") and s.label(d).endswith("->recompute:full")
    s.step(20)
    assert d in s.best().decisions
    with pytest.raises(partex.PartexError, match="unknown recompute kind 'some'"):
        s.pin(u.label, "recompute:some")
    with pytest.raises(partex.PartexError, match="unknown layer stack"):
        s.pin("no such layers", "recompute:full")


def _dropout_step(typed: bool):
    """A two-layer MLP trained one step with dropout in each layer, its keys split from a
    key argument: a typed key (``jax.random.key``) or a legacy uint32 one (``PRNGKey``)."""
    import jax

    def loss(params, x, y, key):
        h = x
        for i, layer in enumerate(params["layers"]):
            h = jnp.tanh(h @ layer["w"] + layer["b"])
            keep = jax.random.bernoulli(jax.random.fold_in(key, i), 0.9, h.shape)
            h = jnp.where(keep, h / 0.9, 0.0)
        return jnp.mean((h @ params["out"] - y) ** 2)

    def step(params, x, y, key):
        value, grads = jax.value_and_grad(loss)(params, x, y, key)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    k = jax.random.split(jax.random.PRNGKey(1), 4)
    params = {"layers": [{"w": jax.random.normal(k[i], (16, 16)) * 0.3, "b": jnp.zeros(16)} for i in range(2)],
              "out": jax.random.normal(k[2], (16, 4)) * 0.3}
    x, y = jax.random.normal(k[3], (8, 16)), jnp.ones((8, 4))
    key = jax.random.key(0) if typed else jax.random.PRNGKey(0)
    return step, (params, x, y, key)


@pytest.mark.parametrize("typed", [True, False], ids=["typed-key", "legacy-key"])
def test_dropout_keys_go_through_every_recompute_kind(typed):
    """Dropout keys, typed (``key<fry>``) or legacy uint32, through each recompute kind of the
    layer stack on data parallelism: the plan applies, runs and gives the unsharded step's
    loss and parameters; a typed key's values are not numbers apply can compute with."""
    fn, args = _dropout_step(typed)
    s = partex.Session(fn, args, mesh="data=4,model=2", hardware="tpu-v4")
    (u,) = s.units
    for kind in u.kinds:
        plan = s.plan([*s.strategy("dp"), (u.label, "recompute:" + kind)])
        out = s.verify(plan, run=True, mark=False)
        assert out.numerics is not None and out.numerics.ok, (kind, out.numerics)


def test_full_offload_keeps_each_layers_input_in_host_memory():
    """``full_offload`` recomputes what ``full`` does, from each layer's input kept in host
    memory (MaxText's ``decoder_layer_input: offload``): one value per unrolled layer (the
    input the forward made for it), a scan's stacked layer inputs; out of device memory,
    into host memory, on the device again under XLA:CPU; applied, copied to host memory."""
    for name in ("transformer", "transformer-scan"):
        m = demo_models.build(name, "tiny")
        s = partex.Session(m.fn, m.args, mesh="data=4,model=2", hardware="tpu-v5p")
        (u,) = s.units
        p = s.program
        off, full = plan_unit(p, u, "full_offload"), plan_unit(p, u, "full")
        for o, f in zip(off, full, strict=True):
            assert o.ops == f.ops
            if u.loop is None:
                assert o.recomputed == f.recomputed and len(o.offloaded) == 1
                (x,) = o.offloaded
                assert x in o.leaves and p.values[x].shape == (8, 32, 64)  # [batch, seq, d_model]
            else:
                assert o.dropped == f.dropped and o.host_ys and o.host_in
        base = s.strategy("zero3")
        with_full, with_off = [*base, partex.Recompute(0, "full")], [*base, partex.Recompute(0, "full_offload")]
        r_full, r_off = s.evaluate(with_full, detail=True), s.evaluate(with_off, detail=True)
        assert r_full.memory.host == 0 and r_off.memory.host > 0
        assert r_off.memory.peak <= r_full.memory.peak
        moved = [c for c in r_off.collectives if c.kind == "host-transfer"]
        assert sum(c.bytes * c.count for c in moved) == pytest.approx(2 * r_off.memory.host)
        cpu = CostModel(s.analysis, s.cost_model.mesh, s.cost_model.hw, lowering="cpu")
        c_full, c_off = cpu.evaluate(s.decisions(with_full)), cpu.evaluate(s.decisions(with_off))
        assert c_off.memory.peak == c_full.memory.peak and c_off.memory.host == 0
        text = str(jax.make_jaxpr(partex.apply_plan(s.plan(with_off), m.fn))(*m.args))
        assert "<host>" in text
        assert "<host>" not in str(jax.make_jaxpr(partex.apply_plan(s.plan(with_full), m.fn))(*m.args))


def test_offload_keeps_the_saved_matmul_outputs_in_host_memory():
    """``offload`` saves what ``dots`` saves, in host memory: the same ops recomputed, the
    saved matmul outputs the backward pass reads out of device memory and into host memory,
    copied out and back over the host link (XLA:CPU ignores memory spaces: there it is
    ``dots``). Applied, the step copies them to host memory (in its jaxpr); its numerics are
    the unsharded step's (``test_every_recompute_kind_matches_the_unsharded_step``)."""
    for name in ("transformer", "transformer-scan"):
        m = demo_models.build(name, "tiny")
        s = partex.Session(m.fn, m.args, mesh="data=4,model=2", hardware="tpu-v5p")
        (u,) = s.units
        p = s.program
        off, dots = plan_unit(p, u, "offload"), plan_unit(p, u, "dots")
        for o, d in zip(off, dots, strict=True):
            assert o.ops == d.ops
            if u.loop is None:
                assert o.recomputed == d.recomputed and o.offloaded
                assert all(p.ops[p.values[v].producer].primitive == "dot_general" for v in o.offloaded)
            else:
                assert o.dropped == d.dropped and o.host_ys and o.host_in
        base = s.strategy("zero3")
        with_dots, with_off = [*base, partex.Recompute(0, "dots")], [*base, partex.Recompute(0, "offload")]
        r_dots, r_off = s.evaluate(with_dots, detail=True), s.evaluate(with_off, detail=True)
        assert r_dots.memory.host == 0 and r_off.memory.host > 0
        assert r_off.memory.peak <= r_dots.memory.peak
        moved = [c for c in r_off.collectives if c.kind == "host-transfer"]
        assert moved and all(c.cause == f"{u.label} offload" for c in moved)
        assert sum(c.bytes * c.count for c in moved) == pytest.approx(2 * r_off.memory.host)
        slow = partex.Session(m.fn, m.args, mesh="data=4,model=2",
                              hardware=s.cost_model.hw.replace(host_bandwidth=1e6))
        assert slow.evaluate(with_off).step_time > r_off.step_time + 0.5 * 2 * r_off.memory.host / 1e6
        # XLA:CPU's lowering keeps them on the device
        cpu = CostModel(s.analysis, s.cost_model.mesh, s.cost_model.hw, lowering="cpu")
        c_dots, c_off = cpu.evaluate(s.decisions(with_dots)), cpu.evaluate(s.decisions(with_off))
        assert c_off.memory.peak == c_dots.memory.peak and c_off.memory.host == 0
        # applied: copied to host memory in the step's jaxpr
        text = str(jax.make_jaxpr(partex.apply_plan(s.plan(with_off), m.fn))(*m.args))
        assert "<host>" in text
        assert "<host>" not in str(jax.make_jaxpr(partex.apply_plan(s.plan(with_dots), m.fn))(*m.args))


def test_the_search_takes_offload_where_dots_does_not_fit_and_full_costs_more():
    """Under a budget that the matmul outputs saved on the device exceed, the search keeps
    them in host memory (the transfers run under compute) rather than recompute the layer
    whole. Host memory is a budget too: on hosts with too little of it for the offloaded
    values no plan offloads, and the best plan is slower. (The optimizer state and the
    parameters stay on the device: moving them would free the memory the residuals need.)"""
    m = demo_models.build("transformer-scan", "tiny")
    s = partex.Session(m.fn, m.args, mesh="data=4,model=2", hardware="tpu-v5p", memory="700KiB")
    for state in partex.STATES:
        s.forbid(state, "memory:host")
    s.step(80)
    best = s.best()
    assert best is not None and partex.Recompute(0, "offload") in best.decisions
    assert best.report.memory.host > 0 and best.report.fits
    # (the plan may keep the optimizer state in host memory too: the host given holds half
    # of what the offload alone keeps there)
    offload_host = s.evaluate([d for d in best.decisions if not isinstance(d, partex.Memory)]).memory.host
    assert 0 < offload_host <= best.report.memory.host
    small_host = partex.get_hardware("tpu-v5p").replace(host_memory_bytes=offload_host / 2)
    cramped = partex.Session(m.fn, m.args, mesh="data=4,model=2", hardware=small_host, memory="700KiB")
    for state in partex.STATES:
        cramped.forbid(state, "memory:host")
    assert not cramped.evaluate(best.decisions).fits  # the same plan over the host's memory
    cramped.step(80)
    other = cramped.best()
    assert other is None or (partex.Recompute(0, "offload") not in other.decisions
                             and other.report.step_time > best.report.step_time)


@pytest.mark.parametrize("lowering", ["tpu", "gpu"])
def test_a_recompute_variant_compiles_as_a_whole_compile_would(lowering):
    """A recompute decision prices the program as XLA fuses it under the decision (a
    variant of the cost model's tables); the variant compiles again only the ops whose key
    may differ, and gives every op the pattern a compile of the whole program gives it."""
    import dataclasses

    from partex.analysis._recompute import value_readers
    from partex.cost._compile import compile_patterns
    from partex.cost._variants import variant_reads

    s = partex.Session.from_spec("llama", preset="tiny", mesh="data=4,model=2")
    cm = CostModel(s.analysis, s.mesh, s.hardware, donate=s.donate, lowering=lowering)
    for kind in ("dots", "full", "offload"):
        rc = ((0, kind),)
        v = cm._variant(rc)
        assert v is not cm
        t = v.tables
        ignore, stand = variant_reads(cm.tables, rc, cm.units, value_readers(cm.program))
        stand = {a: b for a, b in stand.items() if t.variant_fused[a]}
        whole = compile_patterns(t.analysis, t.sigs, t.vsig, t.nbytes, t.variant_fused, lowering, None, stand, ignore)
        for op in cm.program.ops:
            mine, theirs = t.patterns[t.op_pattern[op.id]], whole[0][whole[1][op.id]]
            assert dataclasses.replace(mine, weight=0, ops=()) == dataclasses.replace(theirs, weight=0, ops=()), op
    # priced on the program's own patterns (no variant), the recomputation would write out
    # and read back the residuals XLA fuses into their readers: it would cost more
    plain = CostModel(s.analysis, s.mesh, s.hardware, donate=s.donate, lowering=lowering)
    plain._variants = None
    for kind in ("full", "dots"):
        plan = s.strategy("megatron") + [partex.Recompute(0, kind)]
        assert cm.evaluate(plan).compute_time < plain.evaluate(plan).compute_time
