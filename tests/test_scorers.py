"""The search's plans scored on several processes (``partex.planner._scorers``): the same
answers as one process, children that really score, their failures raised."""

from __future__ import annotations

import os
import sys

import pytest

from partex import PartexError, Session, analyze_model, get_hardware, parse_bytes
from partex.planner import _evaluator, _scorers
from partex.planner._scorers import PROCESSES_ENV, Scorers, ScorerError, default_processes, raw

# scoring processes are forked, on Linux only (elsewhere plans are scored in the search's own
# process, which every other test file covers); on Linux, CI's platform, these always run
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="scoring processes are forked on Linux only")


@pytest.fixture(scope="module")
def tiny():
    return analyze_model("transformer")


def _session(res, seed=0):
    hw = get_hardware("tpu-v4", memory_budget=parse_bytes("2MiB"))
    return Session.from_analysis(res, mesh="data=4,model=2", hardware=hw, seed=seed)


def _plans(s: Session) -> list:
    """Plans of one, two and three decisions from the search's own actions."""
    acts = list(s._state.search.actions)
    return [tuple(acts[i:i + n]) for n in (1, 2, 3) for i in range(0, 12, 3)]


def test_children_score_their_share_as_this_process_would(tiny):
    s = _session(tiny)
    plans = _plans(s)
    expected = [raw(s.cost_model, p) for p in plans]
    with Scorers(s.cost_model, 3) as sc:
        assert sc.processes == 3
        pids = [p.pid for p in sc._procs]
        assert len(set(pids)) == 2 and os.getpid() not in pids and all(p.is_alive() for p in sc._procs)
        assert sc.score(plans) == expected
        assert sc.score(plans[:1]) == expected[:1]  # fewer plans than processes
    assert not sc._procs and all(not _alive(pid) for pid in pids)  # the children end with the block


def _alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
        os.kill(pid, 0)
    except (ChildProcessError, ProcessLookupError):
        return False
    return True


def test_a_search_on_two_processes_is_the_search_on_one(tiny, monkeypatch):
    """Same seed, same simulations: the same plans scored, the same best, found at the same
    simulation, where the search's plans were scored side by side."""
    batches = []
    score = Scorers.score

    def counted(self, plans):
        batches.append(len(plans))
        return score(self, plans)

    monkeypatch.setattr(Scorers, "score", counted)
    monkeypatch.setattr(_evaluator, "FORK_AFTER", 0.0)  # this small model's polishes take less: fork at once
    runs = []
    for processes in ("1", "2"):
        monkeypatch.setenv(PROCESSES_ENV, processes)
        s = _session(tiny)
        s.run(3600, simulations=60)
        ev = s._state.search.evaluator
        runs.append((s.best().decisions, s.best().simulation, s.stats().evaluations, dict(ev.evals)))
        assert not ev.ahead  # what was scored ahead and never asked for is forgotten
    assert runs[0] == runs[1]
    # only with two processes, batches of a run of plans per process (kicks: all their plans)
    assert batches and min(batches) > 1 and 2 * _evaluator.RUN in batches


def test_a_short_polish_scores_on_its_own_process(tiny, monkeypatch):
    """Nothing forked for a polish shorter than ``FORK_AFTER`` (the fork would cost more)."""
    monkeypatch.setenv(PROCESSES_ENV, "2")
    monkeypatch.setattr(_evaluator, "FORK_AFTER", 3600.0)
    forked = []
    monkeypatch.setattr(_evaluator, "Scorers", lambda *a: forked.append(a))
    s = _session(tiny)
    s.run(3600, simulations=30)
    assert s.best() is not None and not forked


class _FailsInChild:
    """A cost model that scores here and fails in a forked child."""

    def __init__(self, cm):
        self.cm, self.pid = cm, os.getpid()

    def evaluate(self, decisions):
        if os.getpid() != self.pid:
            raise ZeroDivisionError("a bug in a scoring child")
        return self.cm.evaluate(decisions)


def test_a_failing_child_raises_with_its_traceback(tiny):
    s = _session(tiny)
    with Scorers(_FailsInChild(s.cost_model), 2) as sc, pytest.raises(ScorerError) as err:
        sc.score(_plans(s)[:2])
    assert "ZeroDivisionError: a bug in a scoring child" in str(err.value) and "Traceback" in str(err.value)


def test_processes_from_the_environment(monkeypatch):
    monkeypatch.setenv(PROCESSES_ENV, "3")
    assert default_processes() == 3
    monkeypatch.delenv(PROCESSES_ENV)
    assert default_processes() == max(1, min(_scorers.cores(), _scorers.MAX_PROCESSES))
    for bad in ("0", "two"):
        monkeypatch.setenv(PROCESSES_ENV, bad)
        with pytest.raises(PartexError, match=f"{PROCESSES_ENV}='{bad}': give a whole number of processes >= 1"):
            default_processes()


def test_the_cli_refuses_a_bad_process_count_in_one_line(monkeypatch, capsys, tmp_path):
    from partex.cli import main

    monkeypatch.setenv(PROCESSES_ENV, "0")
    out = tmp_path / "plan.json"
    assert main(["search", "transformer", "--mesh", "data=4,model=2", "--simulations", "5", "--out", str(out)]) == 2
    assert not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"partex: error: {PROCESSES_ENV}='0': give a whole number of processes >= 1 "
                   "(1 scores every plan in the search's own process)"]


def test_children_end_when_the_parent_goes_without_a_word(tiny):
    """A parent killed mid-search sends no goodbye: its ends of the pipes close, and each
    child (holding none of them) sees that and ends."""
    s = _session(tiny)
    sc = Scorers(s.cost_model, 3)
    procs = list(sc._procs)
    for conn in sc._conns:
        conn.close()
    for p in procs:
        p.join(timeout=30)
    assert all(p.exitcode == 0 for p in procs)
    sc._conns = []
    sc.close()
