"""The MCTS search: determinism, pins, memory safety, resume, Megatron recovery, CLI."""

from __future__ import annotations

import json

import pytest

import partex
from partex import MeshSpec, PartexError, Plan, Session, Shard, analyze_model, get_hardware, parse_bytes
from partex.planner._pins import Pins
from partex.planner._search import Search, search_inputs
from partex.planner._strategies import strategy_decisions
from partex.cli import main


@pytest.fixture(scope="module")
def tiny():
    return analyze_model("transformer")


def _session(res, mesh="data=4,model=2", memory=None, seed=0):
    hw = get_hardware("tpu-v4", memory_budget=parse_bytes(memory) if memory else None)
    return Session.from_analysis(res, mesh=mesh, hardware=hw, seed=seed)


def test_same_seed_same_plan(tiny):
    a, b = _session(tiny, memory="2MiB"), _session(tiny, memory="2MiB")
    a.step(60)
    b.step(60)
    assert a.best().decisions == b.best().decisions
    assert a.stats().nodes == b.stats().nodes


def test_every_returned_plan_fits_and_improves_on_replicated(tiny):
    s = _session(tiny, memory="2MiB")
    replicated = s.cost_model.evaluate([])
    assert not replicated.fits  # the budget rules replication out
    s.step(150)
    best = s.best()
    assert best is not None and best.report.fits and best.report.memory.peak <= parse_bytes("2MiB")
    st = s.stats()
    assert st.simulations == 150 and st.nodes > 10 and st.root_actions
    assert st.best_history and st.best_history[-1][2] == pytest.approx(best.report.step_time)


def test_impossible_budget_returns_nothing_and_reports_smallest(tiny):
    s = _session(tiny, memory="1KiB")
    s.step(40)
    assert s.best() is None and s.best_plan() is None
    assert s.stats().smallest_memory > 1024


def test_pins_and_forbids_are_honoured(tiny):
    s = _session(tiny, memory="2MiB")
    s.pin("ffn", "model")
    s.forbid("batch", "model")
    s.step(120)
    best = s.best()
    labels = [s.label(d) for d in best.decisions]
    assert labels[0] == "ffn->model"
    assert "batch->model" not in labels
    plan = s.best_plan()
    assert any(d.group == "ffn" and d.axis == "model" and d.pinned for d in plan.decisions)
    entry = plan.inputs["params/layers/0/w1"][1]
    assert entry == "model" or (isinstance(entry, list) and entry[0] == "model")
    s.unpin("ffn", "model")
    assert s.pins == [] and s.forbidden == s.decisions([("batch", "model")])


@pytest.mark.parametrize("call,needle", [
    (lambda s: s.pin("nonsense", "model"), "unknown dimension 'nonsense'"),
    (lambda s: s.pin("ffn", "pipe"), "unknown mesh axis 'pipe'"),
    (lambda s: (s.forbid("ffn", "model"), s.pin("ffn", "model")), "forbidden"),
    (lambda s: (s.pin("ffn", "model"), s.forbid("ffn", "model")), "pinned"),
    (lambda s: s.unpin("ffn", "data"), "neither pinned nor forbidden"),
])
def test_bad_pins_are_clear_errors(tiny, call, needle):
    with pytest.raises(PartexError, match=needle):
        call(_session(tiny))


def _per_axis(decisions):
    out = {}
    for d in decisions:
        out.setdefault(d.slot, []).append(d.id)
    return out


DEMOS = ("mlp", "transformer", "unet", "gns", "moe")  # DESIGN's five demo models


def _keeps(decisions, pins, forbidden=()) -> bool:
    """Whether a plan is one the pinned search may return: every pin in it, ahead of the
    plan's other decisions on its mesh axis and of its group's other shardings (decisions on
    one axis, and one group's axes, do not commute), and nothing forbidden."""
    decisions = list(decisions)
    if any(f in decisions for f in forbidden) or any(p not in decisions for p in pins):
        return False
    for p in pins:
        before = [d for d in decisions[:decisions.index(p)] if d not in pins]
        if any(d.slot == p.slot or isinstance(d, Shard) and isinstance(p, Shard) and d.group == p.group
               for d in before):
            return False
    return True


def _at_or_under(t: float, other: float) -> bool:
    return t <= other * (1 + 1e-12)  # one plan priced twice: its sums may round apart


def _never_rises(s: Session, rounds: int, n: int) -> None:
    """``rounds`` steps of ``n`` simulations: the best never rises, and the chart's history
    ends at the plan the headline shows."""
    before = s.best().report.step_time
    for _ in range(rounds):
        s.step(n)
        best, stats = s.best(), s.stats()
        assert _at_or_under(best.report.step_time, before), (before, best.report.step_time)
        assert stats.best_step_time == pytest.approx(best.report.step_time, rel=1e-12)
        assert stats.best_history[-1][2] == pytest.approx(best.report.step_time, rel=1e-12)
        history = [h[2] for h in stats.best_history]
        assert history == sorted(history, reverse=True)
        before = best.report.step_time


def _starts_from_the_best_kept_plan(s: Session, previous) -> None:
    """The incumbent right after a pin or forbid: within the pins and forbids, at or under
    every hand plan that keeps them and the previous best with the pins applied."""
    pins, forbidden = s.pins, s.forbidden
    best = s.best()
    assert best is not None and _keeps(best.decisions, pins, forbidden)
    assert list(best.decisions[:len(pins)]) == pins
    # the chart's point and the headline: one plan, one step time
    assert s.stats().best_history == ((s.stats().simulations, s.stats().seconds, best.report.step_time),)
    kept = {name: c.report.step_time for name, c in s.baselines().items()
            if c.report.fits and _keeps(c.decisions, pins, forbidden)}
    for name, t in kept.items():
        assert _at_or_under(best.report.step_time, t), (name, t, best.report.step_time)
    carried = s.evaluate(pins + [d for d in previous if d not in pins and d not in forbidden])
    if carried.fits and _keeps(pins + [d for d in previous if d not in pins], pins, forbidden):
        assert _at_or_under(best.report.step_time, carried.step_time)


@pytest.mark.parametrize("model", DEMOS)
def test_after_a_pin_or_forbid_the_search_starts_from_the_best_plan_that_keeps_them(model):
    """A pin after a short search (the batch on the data axis, as dp takes it, not where the
    search's best had it), then a forbid (the best's first decision after the pin): each time
    the search goes on from the best plan known that keeps the pins and forbids -- at or under
    every hand plan that keeps them, and the previous best with them applied -- and its best
    never rises afterwards."""
    s = Session.from_spec(model, mesh="data=4,model=2", memory="3MiB", seed=0)
    s.step(40)
    previous = s.best().decisions
    pin = s.strategy("dp")[0]
    s.pin(pin.group, pin.axis)
    _starts_from_the_best_kept_plan(s, previous)
    _never_rises(s, 3, 20)
    previous = s.best().decisions
    free = [d for d in previous if d not in s.pins]
    if free:
        s.forbid(free[0].id, free[0].slot)
        _starts_from_the_best_kept_plan(s, previous)
        _never_rises(s, 3, 20)


def test_a_pin_the_best_plan_holds_behind_another_decision_is_not_taken_as_kept(tiny):
    """The transformer after 76 simulations (the explorer's default model, mesh and budget):
    its best plans shard the batch on the data axis behind other groups there, and the same
    decisions with the batch first are another, slower plan. Pinning batch->data then starts
    from a plan with the batch first that is faster than dp (batch->data alone), and the best
    reads as what that plan costs."""
    s = Session.from_analysis(tiny, mesh="data=4,model=2", memory="3MiB", seed=0)
    s.step(76)
    s.pin("batch", "data")
    best = s.best()
    dp = s.baselines()["dp"].report.step_time
    assert best.report.step_time < dp
    assert s.label(best.decisions[0]) == "batch->data"
    assert s.stats().best_step_time == pytest.approx(best.report.step_time, rel=1e-12)


def test_one_groups_axes_in_another_order_are_another_plan(tiny):
    """ffn over (model, data) is cut otherwise than over (data, model): the search keys and
    prices the two orders apart, and a key gives back the plan it was made of."""
    s = _session(tiny, memory="3MiB")
    ev = s._search.evaluator
    a = tuple(s.decisions([("batch", "data"), ("ffn", "model"), ("ffn", "data")]))
    b = tuple(s.decisions([("batch", "data"), ("ffn", "data"), ("ffn", "model")]))
    assert ev.key(a) != ev.key(b)
    assert ev.evaluate(a).step_time == s.evaluate(a).step_time != s.evaluate(b).step_time == ev.evaluate(b).step_time
    s.step(60)
    for key in ev.evals:
        assert ev.key(ev.decisions_of(key)) == key


def test_save_and_resume_continues_the_same_search(tmp_path, tiny):
    def session():
        return Session.from_analysis(tiny, mesh="data=4,model=2", memory="2MiB", seed=3,
                                     spec=partex.ModelSpec("transformer"))

    straight = session().step(80)
    part = session().step(40)
    part.pin("ffn", "model")
    part.unpin("ffn", "model")  # the tree keeps its statistics through a pin and its release
    part.save(tmp_path / "s.session.json")
    resumed = Session.load(tmp_path / "s.session.json", analyses=lambda spec: tiny)
    resumed.step(40)
    assert resumed.stats().simulations == 80
    # the same plan: the same groups in the same order on each axis (a pin reorders the
    # best plan's decisions, pins first, and order across axes means nothing)
    assert _per_axis(resumed.best().decisions) == _per_axis(straight.best().decisions)
    assert resumed.stats().nodes == straight.stats().nodes


def test_a_tampered_or_foreign_session_file_is_one_clear_error(tmp_path, tiny):
    s = Session.from_analysis(tiny, mesh="data=4,model=2", memory="2MiB", spec=partex.ModelSpec("transformer"))
    s.step(20)
    path = tmp_path / "s.json"
    s.save(path)
    good = json.loads(path.read_text())
    cases = {
        "not json": "{",
        "foreign": json.dumps({"format": "something-else"}),
        "old pickle": "\x80\x05}q\x00.",
        "group out of range": json.dumps({**good, "search": {**good["search"], "pins": [[10_000, "data"]]}}),
        "axis unknown": json.dumps({**good, "search": {**good["search"], "forbidden": [[0, "nope"]]}}),
        "tree key": json.dumps({**good, "search": {**good["search"], "nodes": [["data:x", 1, 0.5, [], None]]}}),
        "another model": json.dumps({**good, "signature": {"inputs": [["x", [1], "float32"]]}}),
        "missing field": json.dumps({k: v for k, v in good.items() if k != "mesh"}),
    }
    for what, text in cases.items():
        path.write_text(text)
        with pytest.raises(PartexError) as e:
            Session.load(path, analyses=lambda spec: tiny)
        assert "\n" not in str(e.value) and str(path) in str(e.value), (what, str(e.value))


def test_megatron_recovery():
    """automap's result: with weights dwarfing activations (batch 1) and a budget under
    replication, the search shards w1 and w2 on the FFN hidden dim and attention on heads."""
    res = analyze_model("transformer", "tiny", ["batch=1", "d_model=256", "d_ff=1024"])
    s = _session(res, mesh="model=4", memory="8MiB")
    assert not s.cost_model.evaluate([]).fits
    s.step(300)
    plan = s.best_plan()
    for layer in (0, 1):
        ins = {k.rsplit("/", 1)[1]: v for k, v in plan.inputs.items() if k.startswith(f"params/layers/{layer}/")}
        assert ins["w1"] == [None, "model"] and ins["w2"] == ["model", None]
        for w in ("wq", "wk", "wv"):
            assert ins[w] == [None, "model", None]
        assert ins["wo"] == ["model", None, None]


def test_search_against_hand_plans_on_full_t32_two_layers():
    """From nothing (cold) the search gets within 2% of the best hand plan in 300
    simulations; warm-started from the hand strategies it never does worse than them."""
    res = analyze_model("transformer", "t32", ["layers=2"])
    mesh = MeshSpec.parse("data=8,model=4")
    hw = get_hardware("tpu-v4", memory_budget=parse_bytes("4GiB"))
    cm, space = search_inputs(res, mesh, hw)  # one cost model and space for both searches
    cold = Search(cm, space, seed=0, warm_start=False)
    hand = [cm.evaluate(strategy_decisions(n, res.analysis, mesh)) for n in ("dp", "megatron", "zero3")]
    best_hand = min(r.step_time for r in hand if r.fits)
    cold.step(300, Pins())
    assert cold.best().report.fits
    assert cold.best().report.step_time <= best_hand * 1.02
    warm = Search(cm, space, seed=0)
    warm.step(100, Pins())
    assert warm.best().report.fits and warm.best().report.step_time <= best_hand * (1 + 1e-9)


def test_cli_search_writes_plan_and_state_and_resumes(tmp_path, capsys):
    out = tmp_path / "plan.json"
    argv = ["search", "transformer", "--mesh", "data=4,model=2", "--memory", "2MiB", "--simulations", "40",
            "--pin", "ffn=model", "--out", str(out), "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["fits"] and d["simulations"] > 0
    plan = Plan.load(out)
    assert plan.strategy == "mcts" and any(x.pinned for x in plan.decisions)
    state = tmp_path / "plan.session.json"
    assert state.exists()
    assert main(["search", "transformer", "--mesh", "data=4,model=2", "--memory", "2MiB", "--simulations", "10",
                 "--resume", str(state), "--out", str(out), "--json"]) == 0
    d2 = json.loads(capsys.readouterr().out)
    assert d2["simulations"] == d["simulations"] + 10
    assert Session.load(state).pins == Session.load(state).decisions([("ffn", "model")])


def test_cli_resume_with_another_budget_or_hardware_uses_it(tmp_path, capsys):
    """--memory / --hardware given on --resume reconfigure the session: the search goes on
    with the new cost model and budget, not the saved ones."""
    out, state = tmp_path / "plan.json", tmp_path / "plan.session.json"
    assert main(["search", "transformer", "--mesh", "data=4,model=2", "--memory", "2MiB", "--simulations", "30",
                 "--pin", "ffn=model", "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    assert main(["search", "transformer", "--resume", str(state), "--memory", "3MiB", "--hardware", "tpu-v5e",
                 "--simulations", "30", "--out", str(out), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    s = Session.load(state)
    assert s.hardware.name == "tpu-v5e" and s.hardware.budget == parse_bytes("3MiB")
    assert d["memory_bytes"] <= parse_bytes("3MiB") and d["simulations"] == 30  # a new search, pins kept
    assert s.pins == s.decisions([("ffn", "model")])
    assert Plan.load(out).hardware.name == "tpu-v5e"


def test_cli_search_impossible_budget_exit_2(tmp_path, capsys):
    code = main(["search", "transformer", "--mesh", "data=4,model=2", "--memory", "1KiB", "--budget", "1",
                 "--out", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert code == 2 and "no plan fits: device memory binds: the smallest device memory found is" in err
    assert "over the 1.0 KiB per-device budget less its 10% margin" in err
    assert not (tmp_path / "p.json").exists()


def test_cli_search_pin_that_breaks_the_budget_names_it(tmp_path, capsys):
    code = main(["search", "transformer", "--mesh", "data=4,model=2", "--memory", "700KiB", "--budget", "2",
                 "--pin", "head_dim=data", "--forbid", "batch=data", "--forbid", "seq=data",
                 "--forbid", "d_model=data", "--forbid", "optimizer=memory:host", "--forbid", "parameters=memory:host",
                 "--out", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert code == 2 and "with pins head_dim->data: device memory binds: the smallest device memory found" in err


def test_cli_bench_json_rows(capsys):
    """The rows, the search's plan within the budget, and the exhaustive row's optimum over
    every plan of at most one decision per axis: no hand plan of that size beats it."""
    assert main(["bench", "transformer", "--mesh", "data=4,model=2", "--memory", "3MiB", "--simulations", "60",
                 "--ilp-time", "5", "--exhaustive", "1", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    names = [r["strategy"] for r in d["rows"]]
    assert names == ["replicated", "dp", "megatron", "zero3", "dp+remat", "megatron+remat", "zero3+remat",
                     "ilp", "mcts", "mcts-no-remat", "exhaustive"]
    for r in d["rows"]:
        assert set(r) >= {"strategy", "step_time_s", "mfu", "memory_bytes", "fits", "search_s", "plan"}
    rows = {r["strategy"]: r for r in d["rows"]}
    mcts, ex = rows["mcts"], rows["exhaustive"]
    assert mcts["fits"] and mcts["memory_bytes"] <= d["budget_bytes"]
    # each row names its plan's decisions as the CLI's --pin takes them (GROUP->AXIS)
    assert rows["replicated"]["plan"] == [] and mcts["plan"]
    s = Session.from_spec("transformer", mesh="data=4,model=2", memory="3MiB")
    assert s.evaluate([tuple(x.split("->")) for x in mcts["plan"]]).step_time == pytest.approx(mcts["step_time_s"])
    # the best plan without recompute the search met: no faster than its best
    assert rows["mcts-no-remat"]["step_time_s"] >= mcts["step_time_s"] * (1 - 1e-9)
    one = [c for c in s.baselines().values() if c.report.fits and len({d.slot for d in c.decisions}) == len(c.decisions)]
    per_axis = [sum(1 for d in s._search.actions if d.slot == axis) for axis in ("data", "model")]
    # and one more choice: the layer stack saved, recomputed one of three ways, or offloaded
    # (its matmul outputs, or its layers' inputs under full recompute);
    # and each state set (the optimizer state, the parameters) on the device or in host memory
    states = len(s.analysis.movable_states())
    assert states == 2
    assert ex["complete"] and ex["plans"] == ex["space"] == (1 + per_axis[0]) * (1 + per_axis[1]) * 6 * 2**states
    assert one and all(ex["step_time_s"] <= c.report.step_time * (1 + 1e-9) for c in one)


def test_cli_bench_exhaustive_skips_a_space_over_its_limit(capsys):
    assert main(["bench", "mlp", "--mesh", "data=4,model=2", "--simulations", "8", "--ilp-time", "5",
                 "--exhaustive-limit", "10"]) == 0
    out = capsys.readouterr().out
    # 1296 sharding plans, each with the optimizer state and the parameters on the device or the host
    assert "exhaustive: skipped, 5184 plans of at most 3 decisions per axis (over --exhaustive-limit 10)" in out
    assert [line.split() for line in out.splitlines() if line.strip().startswith("exhaustive ")] == \
        [["exhaustive", "-", "-", "-", "-", "-"]]  # no plan: not "does not fit"
    assert main(["bench", "mlp", "--mesh", "data=4,model=2", "--simulations", "8", "--ilp-time", "5",
                 "--exhaustive-time", "1e-6", "--json"]) == 0
    ex = json.loads(capsys.readouterr().out)["rows"][-1]
    assert ex["strategy"] == "exhaustive" and not ex["complete"] and ex["plans"] == 512 and ex["step_time_s"] is None
    assert ex["projected_s"] > 0
    assert main(["bench", "mlp", "--mesh", "data=4,model=2", "--exhaustive", "-1"]) == 2


def test_sigterm_during_search_keeps_the_plan_and_the_state(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import ROOT

    out = tmp_path / "plan.json"
    state = tmp_path / "plan.session.json"
    proc = subprocess.Popen([sys.executable, "-m", "partex", "search", "transformer", "--mesh", "data=4,model=2",
                             "--memory", "2MiB", "--budget", "120", "--out", str(out), "--json"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while not state.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)  # waits for the first autosave: the search is running
    assert state.exists(), proc.stderr.read() if proc.poll() is not None else "no autosave"
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    d = json.loads(stdout)
    assert d["interrupted"] and d["fits"]
    assert Plan.load(out).strategy == "mcts"
    resumed = Session.load(state)
    assert resumed.stats().simulations == d["simulations"]
    assert os.path.getsize(state) > 0


def test_cli_search_state_in_a_missing_folder_is_one_line_before_searching(tmp_path, capsys):
    code = main(["search", "transformer", "--mesh", "data=4,model=2", "--memory", "3MiB", "--budget", "60",
                 "--state", str(tmp_path / "nope" / "s.json"), "--out", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "cannot write session" in err and "No such file" in err, err


def test_cli_resume_of_a_foreign_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"format": "partex-explorer-session", "search": "../../etc/passwd"}))
    code = main(["search", "transformer", "--resume", str(bad), "--out", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert code == 2 and "is not a partex session" in err and err.count("\n") == 1, err


def test_cli_bench_verify_reports_the_mcts_plans_memory_per_xla(capsys):
    # 6 MiB: the replicated plan fits, so the plan needs no recompute (XLA:CPU's scheduler
    # does not always realise a recomputation's savings: see docs/results.md, "Long sequences")
    assert main(["bench", "transformer", "--mesh", "data=4,model=2", "--memory", "6MiB", "--simulations", "50",
                 "--ilp-time", "5", "--verify", "--exhaustive", "0", "--json"]) == 0
    mcts = next(r for r in json.loads(capsys.readouterr().out)["rows"] if r["strategy"] == "mcts")
    assert mcts["xla_fits"]  # (XLA's device figure: a plan may keep its state in host memory)
    assert mcts["memory_ratio"] == pytest.approx(mcts["memory_bytes"] / mcts["xla_memory_bytes"])
    assert 0.7 < mcts["memory_ratio"] < 1.3


def test_exhaustive_finds_the_optimum_of_every_ordering_and_the_search_reaches_it():
    """Every plan of at most 2 decisions per axis, once per ordering of conflicting groups:
    the same optimum as scoring every ordered sequence (no pruning), and the MCTS reaches it."""
    import itertools
    import math

    from partex.planner._exhaustive import axis_sequences, conflicts, exhaustive

    s = Session.from_spec("mlp", mesh="data=4,model=2", memory="160KiB")
    cm, actions = s.cost_model, s._search.actions
    ex = exhaustive(cm, actions, 2)
    assert ex.complete and ex.report is not None and ex.report.fits
    shards = [d for d in actions if isinstance(d, Shard)]
    axes = [a for a in cm.mesh.axes if any(d.axis == a for d in shards)]
    every = [[()] + [p for r in (1, 2) for p in itertools.permutations([d.group for d in shards if d.axis == a], r)]
             for a in axes]
    # each state set on the device or in host memory
    placed = [[(), (d,)] for d in actions if isinstance(d, partex.Memory)]
    assert len(placed) == 2
    best = math.inf
    for combo in itertools.product(*every, *placed):
        r = cm.evaluate(tuple(Shard(g, a) for a, seq in zip(axes, combo) for g in seq)
                        + tuple(d for ds in combo[len(axes):] for d in ds))
        if r.fits:
            best = min(best, r.step_time)
    assert ex.report.step_time == pytest.approx(best, rel=1e-12)
    assert ex.plans <= math.prod(len(e) for e in every + placed)
    # without conflicts order does not matter: sequences are the subsets
    assert len(axis_sequences([0, 1, 2], 2, set())) == 1 + 3 + 3
    assert len(axis_sequences([0, 1, 2], 2, {frozenset((0, 1))})) == 1 + 3 + 4
    assert conflicts(cm)  # the MLP's hidden and batch dims share its activations
    s.step(64)
    assert s.best().report.step_time <= ex.report.step_time * (1 + 1e-9)


def test_session_exhaustive_scores_several_budgets_in_one_pass():
    """One pass over the plans gives each budget's optimum, as a session on that budget finds
    it alone; the ILP and the search never beat the optimum of a space they lie in."""
    s = Session.from_spec("mlp", mesh="data=4,model=2")
    both = s.exhaustive(2, budgets=["120KiB", "1MiB"])
    for budget, ex in zip(["120KiB", "1MiB"], both):
        alone = Session.from_spec("mlp", mesh="data=4,model=2", memory=budget)
        one = alone.exhaustive(2)
        assert one.complete and one.plans == alone.exhaustive_size(2)
        assert (ex.decisions, ex.report.step_time) == (one.decisions, one.report.step_time)
        ilp = alone.ilp(10)
        if all(n <= 2 for n in (sum(1 for d in ilp.decisions if d.slot == x) for x in ("data", "model"))):
            assert ilp.report.step_time >= one.report.step_time * (1 - 1e-9)
    assert both[1].report.step_time <= both[0].report.step_time



def test_settle_ends_where_no_polish_or_kick_improves_the_best():
    """``Session.settle`` (the mesh search's last word on a candidate): from the hand plans
    alone it polishes the best (no simulation), it never makes the best worse, a second
    settle finds nothing more, and where it returns none of the best plan's kicks descends
    to a better plan."""
    from partex.planner._local import KICK_EVALS
    from partex.planner._search import KICKS

    s = _session(analyze_model("moe"), memory="1MiB")
    assert s.best() is None and s.settle(60.0) is False  # nothing fits yet: nothing to settle
    s = _session(analyze_model("moe"), memory="2MiB")
    hand = s.best().report.step_time
    assert s.settle(0.0) is False and s.best().report.step_time == hand  # no time: nothing done
    assert s.settle(120.0) is True and s.best().report.step_time < hand and s.stats().simulations == 0
    s = _session(analyze_model("moe"), memory="1MiB")
    s.step(3)
    before = s.best().report.step_time
    s.settle(120.0)
    after = s.best()
    assert after.report.step_time <= before
    assert s.settle(120.0) is False and s.best().decisions == after.decisions
    search = s._state.search
    ev, local, pins = search.evaluator, search.local, s._state.pins
    kicks = local.kicks(tuple(after.decisions), len(pins.pinned), pins.forbidden)[:KICKS]
    assert kicks  # two groups sharded on two axes: their exchange is a kick
    for kick in kicks:
        end = local.descend(kick, lambda d: -ev.score(d), len(pins.pinned), pins.forbidden, None, budget=KICK_EVALS)
        e = ev.evaluate(end)
        assert not e.fits or e.step_time >= after.report.step_time * (1 - 1e-9)


def test_a_stop_ends_the_polish_in_hand_at_the_next_plan(tiny):
    """Ctrl-C during a long polish (``request_stop``, a signal handler's flag): the descent
    ends before its next plan rather than at its end or the run's deadline."""
    def polished(stop: bool) -> int:
        """The plans other than its start that the polish scored (scored before or not)."""
        s = _session(tiny, memory="2MiB")
        s.step(3)
        search = s._state.search
        ev = search.evaluator
        start, score, visited = tuple(ev.best.decisions), ev.score, []

        def counted(decisions):
            if tuple(decisions) != start:
                visited.append(decisions)
            return score(decisions)

        ev.score = counted  # the descent looks it up on each plan
        if stop:
            search.request_stop()
        search.local.polish(s._state.pins.pinned, s._state.pins.forbidden, None)
        return len(visited)

    assert polished(False) > 20  # a polish of this plan goes through many plans
    assert polished(True) == 0
