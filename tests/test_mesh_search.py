"""The mesh's shape as a decision: candidate factorisations of the devices, searched with the
plan by successive halving (``Session.search_meshes``, ``partex search --devices``)."""

from __future__ import annotations

import json
import math
import time
from types import SimpleNamespace

import pytest

import partex
from partex._errors import PartexError
from partex._meshes import MeshSearcher, Topology, candidate_meshes
from partex._results import SearchStats
from partex.cli import main


def test_candidates_are_the_factorisations_of_the_devices():
    meshes = candidate_meshes(8)
    assert sorted(m.sizes for m in meshes) == [(2, 2, 2), (4, 2), (8,)]
    big = candidate_meshes(256, max_axes=4)
    assert len(big) == 15  # the partitions of 2^8 into at most four factors
    assert all(math.prod(m.sizes) == 256 and len(m.axes) <= 4 for m in big)
    assert len({tuple(sorted(m.sizes)) for m in big}) == len(big)  # axis sizes tell them apart
    assert len(candidate_meshes(256, max_axes=2)) == 5


def test_a_topology_puts_one_axis_across_the_slow_network():
    topo = Topology.parse("4x64@6.25", 256)
    assert (topo.granules, topo.per, topo.dcn_bandwidth) == (4, 64, 6.25e9)
    meshes = candidate_meshes(256, topo, 4, link_bandwidth=100e9)
    for m in meshes:
        assert m.axes[0] == "data" and m.sizes[0] % 4 == 0 and math.prod(m.sizes) == 256
        assert m.bandwidth is not None and m.bandwidth[0] == 6.25e9 and set(m.bandwidth[1:]) <= {100e9}
        assert m.slow_axes() == (("data",) if len(m.axes) > 1 else ())
    assert {m.sizes[0] for m in meshes} == {4 * k for k in (1, 2, 4, 8, 16, 32, 64)}


@pytest.mark.parametrize("text,devices,msg", [
    ("4x", None, "cannot read topology"), ("4x64@fast", None, "cannot read topology"),
    ("4x64", 128, "holds 256 devices but --devices is 128"), ("0x8", None, "must be positive"),
])
def test_bad_topologies_say_what_to_write(text, devices, msg):
    with pytest.raises(PartexError, match=msg):
        Topology.parse(text, devices)


def test_search_meshes_keeps_the_best_and_its_session():
    s = partex.Session.from_spec("transformer", preset="tiny", overrides=["layers=4"], mesh="data=8",
                                 hardware="tpu-v4", memory="2MiB")
    found = s.search_meshes(8, topology="2x4@25", seconds=6)
    trials = found.trials
    assert len(trials) == 4 and found.best is not None
    steps = [t.step_time for t in trials if t.step_time is not None]
    assert steps == sorted(steps) and found.best.step_time == steps[0]
    assert found.best.session is not None and all(t.session is None for t in trials[1:])
    assert all(t.warm_step is None or t.step_time <= t.warm_step * (1 + 1e-9) for t in trials if t.step_time)
    assert all(t.status not in ("open", "scored", "searching") for t in trials)  # each says how it ended
    assert found.best_at is not None and 0 <= found.best_at <= found.seconds
    table = found.table()
    assert found.best.mesh.text() in table.splitlines()[1]
    s.use_mesh(found.best)
    assert s.mesh == found.best.mesh and s.best().report.step_time == pytest.approx(found.best.step_time)
    assert s.best().report.fits



def test_continuing_on_a_mesh_the_search_let_go_starts_from_the_plan_it_found():
    """The mesh search keeps only the best candidate's session; another one picked
    (``use_mesh``) gets a new search on its mesh that starts from the plan the mesh search
    found there (``MeshTrial.plan``), not from its hand plans: at 0 simulations its best is
    that plan's step time, pipelined candidates included."""
    def session():
        return partex.Session.from_spec("transformer-scan", preset="tiny", overrides=["layers=4"], mesh="data=8",
                                        hardware="tpu-v4", memory="3MiB")

    found = session().search_meshes(8, topology="2x4@25", seconds=8)
    let_go = [t for t in found.trials if t.session is None and t.step_time is not None]
    # the case that matters: the search beat the hand plans there
    assert any(t.step_time < t.warm_step * (1 - 1e-9) for t in let_go if t.warm_step is not None), found.table()
    for t in let_go:
        s = session()
        s.use_mesh(t)
        assert (s.mesh, s.pipeline) == (t.mesh, t.pipeline)
        assert s.stats().simulations == 0
        assert s.best().report.step_time == pytest.approx(t.step_time, rel=1e-12), t.text()

def test_cli_search_with_devices(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["search", "transformer", "--devices", "8", "--budget", "3", "--out", str(out), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["mesh"] == d["meshes"]["chosen"] and len(d["meshes"]["meshes"]) == 3
    plan = partex.Plan.load(str(out))
    assert plan.mesh.text() == d["mesh"]
    assert main(["search", "transformer", "--devices", "8", "--mesh", "data=8", "--out", str(out)]) == 2
    assert "--devices searches the mesh" in capsys.readouterr().err


def test_without_a_budget_the_mesh_search_runs_its_schedule_to_the_end(tmp_path, capsys):
    """No time limit (the default): the schedule as written, to its end, the same
    candidates, simulations and plans on every run (nothing depends on the machine's speed)."""
    s = partex.Session.from_spec("transformer", preset="tiny", mesh="data=8", hardware="tpu-v4", memory="2MiB")
    runs = [s.search_meshes(8) for _ in range(2)]
    assert all(r.converged and not r.stopped and "convergence" in r.how() for r in runs)
    a, b = ([(t.text(), t.step_time, t.simulations, t.status) for t in r.trials] for r in runs)
    assert a == b and sum(t[2] for t in a) > 0
    out = str(tmp_path / "plan.json")
    assert main(["search", "transformer", "--devices", "8", "--memory", "2MiB", "--out", out, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["meshes"]["converged"] and d["meshes"]["chosen"] == runs[0].best.mesh.text()


def test_more_candidates_never_make_a_worse_plan():
    """Monotone by construction: with pipelines allowed, the mesh search first runs exactly the
    search without them (the same simulations, the same plans: a schedule in simulations, not
    shares of time), then the pipelined candidates, each from the best plan so far; its answer
    is never worse. Anytime: the incumbent it reports only improves, and a stop keeps it."""
    s = partex.Session.from_spec("transformer-scan", preset="tiny", overrides=["layers=4"], mesh="data=8",
                                 hardware="tpu-v4")
    narrow = s.mesh_searcher(8, topology="2x4@1.25", max_axes=3, pipelines=False, effort=0.25).run(600)
    seen = []
    wide_search = s.mesh_searcher(8, topology="2x4@1.25", max_axes=3, pipelines=None, effort=0.25)
    wide = wide_search.run(600, callback=lambda trials: seen.append(
        (wide_search.best.step_time, wide_search.best_at) if wide_search.best is not None else (math.inf, None)))
    assert narrow.converged and wide.converged and "convergence" in wide.how()
    plain = {t.text(): (t.step_time, t.simulations, t.status) for t in narrow.trials}
    assert {t.text(): (t.step_time, t.simulations, t.status) for t in wide.trials if t.pipeline is None} == plain
    assert wide.best.step_time <= narrow.best.step_time
    assert any(t.pipeline is not None and t.simulations > 0 for t in wide.trials)
    steps = [step for step, _ in seen]
    assert steps and steps == sorted(steps, reverse=True) and steps[-1] == wide.best.step_time
    assert 0 <= wide.best_at <= wide.seconds

    stopping = s.mesh_searcher(8, topology="2x4@1.25", max_axes=3, effort=0.25)
    cut = stopping.run(600, callback=lambda trials: stopping.request_stop() if stopping.best else None)
    assert cut.stopped and not cut.converged and "stopped" in cut.how()
    assert cut.best is not None and cut.best.session is not None
    assert any(t.status in ("not reached", "stopped") for t in cut.trials)


class _Improving:
    """A candidate's search (``Searched``) whose best improves with every simulation up to
    ``until`` (a step time of ``base / (1 + simulations)``), each simulation taking ``pause``
    seconds."""

    def __init__(self, base: float, until: int, pause: float = 0.005):
        self.base, self.until, self.pause = base, until, pause
        self.sims, self.secs, self.found = 0, 0.0, (0, 0.0)

    def _step(self) -> float:
        return self.base / (1 + min(self.found[0], self.until))

    def run(self, seconds, callback=None, *, simulations=None):
        for _ in range(simulations or 1):
            time.sleep(self.pause)
            self.sims += 1
            self.secs += self.pause
            if self.sims <= self.until:
                self.found = (self.sims, self.secs)
            if callback is not None:
                callback(self)
        return self

    def best(self):
        report = SimpleNamespace(step_time=self._step(), mfu=0.5, memory=SimpleNamespace(peak=1.0))
        return SimpleNamespace(report=report, decisions=(), simulation=self.found[0], seconds=self.found[1])

    def stats(self):
        return SearchStats(simulations=self.sims, seconds=self.secs)

    def warm_from(self, other):
        return math.inf

    def portable(self, decisions):
        return []

    def probe(self, evaluations):
        return self

    def settle(self, seconds):
        return False

    def step(self, n=1):
        return self.run(0, simulations=n)

    def request_stop(self):
        pass


def test_the_time_to_best_moves_when_the_incumbent_betters_itself():
    """``best_at`` is when the incumbent was found, whichever trial found it: the leading
    mesh bettering its own best (as the last one standing does, simulation after
    simulation) makes a new incumbent and a later time."""
    sessions = {"data=4": _Improving(1.0, until=40), "data=2,fsdp=2": _Improving(10.0, until=0)}
    searcher = MeshSearcher(lambda mesh, pipeline: sessions[mesh.text()],
                            [[partex.MeshSpec.parse("data=4"), partex.MeshSpec.parse("data=2,fsdp=2")]], effort=0.25)
    firsts = []
    found = searcher.run(60, callback=lambda trials: firsts.append(searcher.best_at) if not firsts else None)
    assert found.converged and found.best.mesh.text() == "data=4"
    assert found.best.step_time == pytest.approx(1.0 / 41)
    # the last of its 40 improvements, not the first: each simulation takes 5 ms
    assert firsts[0] is not None and found.best_at >= firsts[0] + 30 * 0.005


class _FitsAfter(_Improving):
    """A candidate's search no plan of which fits (``best`` None: no hand plan, carried plan
    or probe does) until its ``fits_after``-th simulation (None: never), then one of
    ``base`` seconds."""

    def __init__(self, base: float, fits_after: int | None):
        super().__init__(base, until=0)
        self.fits_after = fits_after

    def best(self):
        if self.fits_after is None or self.sims < self.fits_after:
            return None
        return super().best()


def test_a_candidate_no_plan_fits_yet_gets_simulations_before_the_screen_drops_it():
    """On a model far over the memory budget no hand plan fits most meshes, and the probe's
    descent can stop over the budget too; such a mesh is not known to be poor. It gets
    simulations of its own until a plan fits (here its second: the fastest mesh of all),
    at most ``patience`` of them (a mesh that never fits is then dropped), before the screen
    keeps the best few."""
    meshes = ["data=8", "data=4,fsdp=2", "data=2,fsdp=4", "fsdp=8", "data=2,fsdp=2,tensor=2", "fsdp=4,tensor=2",
              "fsdp=2,tensor=4"]
    sessions = {m: _Improving(10.0 + k, until=0) for k, m in enumerate(meshes[:5])}
    sessions["fsdp=4,tensor=2"] = _FitsAfter(1.0, fits_after=2)
    sessions["fsdp=2,tensor=4"] = never = _FitsAfter(0.5, fits_after=None)
    searcher = MeshSearcher(lambda mesh, pipeline: sessions[mesh.text()],
                            [[partex.MeshSpec.parse(m) for m in meshes]], effort=0.25)
    found = searcher.run(60)
    assert found.converged and found.best.mesh.text() == "fsdp=4,tensor=2" and found.best.step_time == 1.0
    never_trial = next(t for t in found.trials if t.mesh.text() == "fsdp=2,tensor=4")
    assert never.sims == searcher.patience and never_trial.status == "dropped" and never_trial.step_time is None
    assert never_trial.rounds == 0  # the screen's simulations are not a round of the halving
