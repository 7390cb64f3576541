"""Where the step's state lives as a decision (``memory:host``): the optimizer state or the
parameters kept in host memory between steps, priced as the step that places them there
itself is, searched with the rest of the plan, written to plan files and applied."""

import collections

import jax
import pytest

import partex
from partex import Memory, demo_models
from partex.cost import CollectiveKind, CostModel

OPT, PARAMS = partex.STATES.index("optimizer"), partex.STATES.index("parameters")


def _session(name="llama", overrides=None, hardware="tpu-v6e", **kw):
    m = demo_models.build(name, "tiny", overrides)
    return partex.Session(m.fn, m.args, mesh="data=4,model=2", hardware=hardware, **kw)


@pytest.fixture(scope="module")
def llama():
    return _session()


def test_state_kept_in_host_memory_prices_as_the_step_that_keeps_it_there_itself(llama):
    """A memory decision on the llama step costs what the same step written with MaxText's
    optimizer / parameter memory host offload (the step's own ``device_put``s) costs: the
    same device peak and host memory; the optimizer state leaves the device's peak."""
    base = llama.strategy("zero3")
    none = llama.evaluate(base).memory
    for state, flag in ((OPT, "optimizer_memory_host_offload"), (PARAMS, "parameter_memory_host_offload")):
        own = _session(overrides={flag: True})
        assert state not in own.analysis.movable_states()
        mine = llama.evaluate([*base, Memory(state, "host")])
        theirs = own.evaluate(own.strategy("zero3"))
        assert mine.memory.peak == pytest.approx(theirs.memory.peak, rel=1e-9), state
        assert mine.memory.host == pytest.approx(theirs.memory.host, rel=1e-9) and mine.memory.host > 0
        rows = [c for c in mine.collectives if c.kind == CollectiveKind.HOST_TRANSFER]
        assert [r.cause for r in rows] == [f"{partex.STATE_LABELS[partex.STATES[state]]} in host memory"]
        assert rows[0].bytes * rows[0].count == pytest.approx(mine.memory.host * 2)
    opt = llama.evaluate([*base, Memory(OPT, "host")]).memory
    assert opt.peak < none.peak and opt.breakdown["optimizer"] == 0 < none.breakdown["optimizer"]


def test_xla_cpu_keeps_state_on_the_device_so_there_it_only_costs(llama):
    """Under XLA:CPU's lowering (which ignores memory spaces) a memory decision frees no
    device memory and its copies still take time: never better than leaving the state."""
    cm = CostModel(llama.analysis, llama.mesh, llama.hardware, donate=llama.donate, lowering="cpu")
    base = llama.strategy("zero3")
    a, b = cm.evaluate(base), cm.evaluate([*base, Memory(OPT, "host")])
    assert b.memory.peak == a.memory.peak and b.memory.host == 0 and b.step_time >= a.step_time


def test_memory_decisions_are_named_checked_and_offered_only_where_the_state_is_on_the_device(llama):
    offered = {d for d in llama._search.actions if isinstance(d, Memory)}
    assert offered == {Memory(OPT, "host"), Memory(PARAMS, "host")}
    assert llama.decisions([("optimizer", "memory:host"), ("parameters", "memory:host")]) == \
        [Memory(OPT, "host"), Memory(PARAMS, "host")]
    assert llama.label(Memory(OPT, "host")) == "optimizer state->memory:host"
    with pytest.raises(partex.PartexError, match="unknown memory space 'disk'"):
        llama.decisions([("optimizer", "memory:disk")])
    with pytest.raises(partex.PartexError, match="unknown state set 'gradients'"):
        llama.decisions([("gradients", "memory:host")])
    own = _session(overrides={"optimizer_memory_host_offload": True})
    with pytest.raises(partex.PartexError, match="in host memory already"):
        own.decisions([("optimizer", "memory:host")])
    assert {d for d in own._search.actions if isinstance(d, Memory)} == {Memory(PARAMS, "host")}

    def forward(w, x):  # no training state: nothing to place
        return (x @ w).sum()

    s = partex.Session(forward, (jax.ShapeDtypeStruct((8, 8), "float32"), jax.ShapeDtypeStruct((4, 8), "float32")),
                       mesh="data=4,model=2", hardware="tpu-v6e")
    assert not any(isinstance(d, Memory) for d in s._search.actions)
    with pytest.raises(partex.PartexError, match="has no optimizer state"):
        s.decisions([("optimizer", "memory:host")])


def test_plan_files_carry_the_state_kept_in_host_memory(llama, tmp_path):
    plan = llama.plan([*llama.strategy("zero3"), Memory(OPT, "host")])
    mem = [d for d in plan.decisions if d.axis == "memory:host"]
    assert [(d.group, d.anchor) for d in mem] == [("optimizer state", "state:optimizer")]
    opt = {p for p, v in zip(llama.program.input_paths, llama.program.inputs)
           if v in llama.analysis.state_inputs(OPT)}
    assert set(plan.host_inputs) == opt and len(plan.host_outputs) == len(opt)
    path = tmp_path / "plan.json"
    plan.save(path)
    back = partex.Plan.load(path)
    assert back.host_inputs == plan.host_inputs and back.host_outputs == plan.host_outputs
    assert llama.scored(back).decisions == llama.scored(plan).decisions
    assert Memory(OPT, "host") in llama.scored(back).decisions
    # an export of the specs alone says what they cannot carry, and which leaves
    from partex.plan._export import export_text, specs_json
    assert specs_json(plan)["host_memory"]["inputs"] == list(plan.host_inputs)
    assert "Not carried: host memory" in export_text(plan, "specs")
    assert "host_memory" not in specs_json(llama.plan(llama.strategy("zero3")))
    d = plan.to_json()
    d["host_memory"]["inputs"] = ["params/no_such_leaf"]
    with pytest.raises(partex.PartexError, match="host_memory must list"):
        partex.Plan.from_json(d)
    d = plan.to_json()
    d["decisions"][-1]["axis"] = "memory:disk"
    with pytest.raises(partex.PartexError, match="memory space 'disk'"):
        partex.Plan.from_json(d)


@pytest.mark.parametrize("name", ["llama", "transformer-scan"])
def test_a_plan_keeping_state_in_host_memory_runs_with_the_unsharded_numerics(name):
    """Both state sets in host memory, with a recompute of the layer stack: the applied
    step takes and returns them in pinned host memory, copies them to the device where it
    reads them, and computes the unsharded step's loss and updates."""
    s = _session(name)
    (u, *_) = s.units
    plan = s.plan([*s.strategy("zero3"), Memory(OPT, "host"), Memory(PARAMS, "host"), (u.label, "recompute:full")])
    out = s.verify(plan, run=True, mark=False)
    assert out.numerics.ok, out.numerics
    m = s.model.model
    fn = partex.apply_plan(plan, m.fn)
    args = partex.shard_inputs(plan, m.args)
    kinds = collections.Counter(x.sharding.memory_kind for x in jax.tree.leaves(args))
    assert kinds["pinned_host"] == len(plan.host_inputs) > 0
    assert "pinned_host" in fn.lower(*args).as_text()
    res = fn(*args)
    out_kinds = collections.Counter(getattr(x, "sharding", None) and x.sharding.memory_kind
                                    for x in jax.tree.leaves(res))
    assert out_kinds["pinned_host"] == len(plan.host_outputs)


def test_the_search_keeps_state_in_host_memory_where_the_same_plan_on_the_device_does_not_fit():
    """Under a tight budget the search's plan and the ILP's keep state in host memory, and
    each plan without its memory decisions is over the budget: the decision does the work."""
    free = _session()
    limit = 0.37 * 2**20
    hw = partex.get_hardware("tpu-v6e").replace(memory_budget=limit, memory_margin=0.0)
    s = _session(hardware=hw)
    s.step(60)
    # the ILP solves to optimality in ~25 s of HiGHS on this model; the limit is a safety net
    # only (at 30 s a loaded machine left it with no plan at all)
    ilp = s.ilp(time_limit=300)
    assert ilp.status == "optimal", ilp
    for decisions, report in ((s.best().decisions, s.best().report), (ilp.decisions, ilp.report)):
        assert report is not None and report.memory.peak <= limit
        assert any(isinstance(d, Memory) for d in decisions), decisions
        assert free.evaluate([d for d in decisions if not isinstance(d, Memory)]).memory.peak > limit
