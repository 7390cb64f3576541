"""Decisions as typed values (``partex.Shard``, ``Resolve``, ``Recompute``), and the files
that spell them as pairs: plan and session files written before the types existed
(``tests/fixtures``, written by partex at commit a2f8be4) load unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest

import partex
from partex import Decision, Recompute, Resolve, Shard
from partex._decisions import decision_of, slot_kind

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"


def test_each_kind_round_trips_through_its_file_pair():
    for d in (Shard(3, "data"), Resolve(3, "second"), Recompute(0, "full")):
        assert decision_of(*d.to_json()) == d
        assert slot_kind(d.slot) is type(d)
    assert Shard(1, "model").to_json() == [1, "model"]
    assert Resolve(2, "neither").to_json() == [2, "resolve:neither"]
    assert Recompute(0, "dots").to_json() == [0, "recompute:dots"]


def test_kinds_never_compare_equal_across_types_and_sort_as_their_pairs():
    # a layer stack's id and a group's id share numbers: Recompute(1, ...) is not about group 1
    assert Shard(1, "full") != Recompute(1, "full") and Shard(1, "data") != (1, "data")
    assert len({Shard(1, "data"), Shard(1, "data"), Resolve(1, "second")}) == 2
    mixed = [Recompute(0, "full"), Shard(2, "model"), Resolve(0, "second"), Shard(0, "data")]
    assert sorted(mixed) == sorted(mixed, key=Decision.pair)
    assert [d.pair() for d in sorted(mixed)] == sorted(d.pair() for d in mixed)
    assert hash(Shard(4, "data")) == hash((4, "data"))  # sets iterate as the pairs' would
    with pytest.raises(dataclasses.FrozenInstanceError):
        Shard(0, "data").axis = "model"  # type: ignore[misc]


@pytest.fixture(scope="module")
def session():
    return partex.Session.from_spec("transformer", mesh="data=4,model=2", memory="3MiB")


def test_names_resolve_to_typed_decisions_with_one_clear_error_each(session):
    an = session.analysis
    seq, batch = an.group_by_label("seq").id, an.group_by_label("batch").id
    (u,) = session.units
    got = session.decisions([("seq", "model"), ("seq", "resolve:second"), (u.label, "recompute:full"),
                             ("batch/tokens:0", "data")])
    assert got == [Shard(seq, "model"), Resolve(seq, "second"), Recompute(u.id, "full"), Shard(batch, "data")]
    for item, needle in [(("seq", "pipe"), "unknown mesh axis 'pipe'"),
                         (("seq", "resolve:sideways"), "unknown conflict resolution 'sideways'"),
                         (("batch", "resolve:second"), "no conflict to resolve"),
                         ((u.label, "recompute:some"), "unknown recompute kind 'some'"),
                         (("no such layers", "recompute:full"), "unknown layer stack"),
                         (("nonsense", "data"), "unknown dimension 'nonsense'")]:
        with pytest.raises(partex.PartexError, match=needle):
            session.decisions([item])


def test_a_plan_file_from_before_the_types_loads_and_scores_as_it_did(session):
    path = FIXTURES / "transformer.plan.json"
    plan = partex.Plan.load(path)
    an = session.analysis
    seq, batch = an.group_by_label("seq").id, an.group_by_label("batch").id
    (u,) = session.units
    candidate = session.scored(plan)
    assert candidate.decisions == (Shard(batch, "data"), Shard(seq, "model"), Resolve(seq, "second"),
                                   Recompute(u.id, "full"))
    # its step time and memory as the cost model prices the same decisions now (the file's own
    # figures are an older model's: its step time 1.5e-5 apart, before the model computed
    # cheap elementwise chains where each fusion reads them)
    now = session.evaluate(list(candidate.decisions))
    assert candidate.report.step_time == now.step_time
    assert candidate.report.memory.peak == now.memory.peak
    # written again, the plan's decisions are the file's, pins included
    again = session.plan(list(candidate.decisions), strategy=plan.strategy,
                         pinned=[d for d, pd in zip(candidate.decisions, plan.decisions) if pd.pinned])
    original = json.loads(path.read_text())
    assert [d.to_json() for d in again.decisions] == original["decisions"]
    assert again.inputs == plan.inputs and again.outputs == plan.outputs


def test_a_session_file_from_before_the_types_resumes(tmp_path):
    path = FIXTURES / "transformer.session.json"
    saved = json.loads(path.read_text())
    s = partex.Session.load(path)
    an = s.analysis
    (u,) = s.units
    assert s.pins == [Shard(an.group_by_label("heads").id, "model"), Recompute(u.id, "dots")]
    assert s.forbidden == [Shard(an.group_by_label("batch").id, "model")]
    best = s.best()
    assert best is not None
    assert [d.to_json() for d in best.decisions] == saved["search"]["best"][1]
    assert best.report.step_time == s.evaluate(list(best.decisions)).step_time  # as the model prices it now
    assert s.stats().simulations == saved["search"]["simulations"]
    s.step(8)
    assert s.stats().simulations == saved["search"]["simulations"] + 8
    assert all(p in s.best().decisions for p in s.pins)
    # saved again: the same format, the decisions as pairs
    s.save(tmp_path / "again.json")
    state = json.loads((tmp_path / "again.json").read_text())["search"]
    assert state["pins"] == saved["search"]["pins"] and state["forbidden"] == saved["search"]["forbidden"]
    # the space has gained a recompute kind and memory decisions since the file was written: its actions are the
    # file's and the new kind's
    assert [a for a in state["actions"] if a in saved["search"]["actions"]] == saved["search"]["actions"]
    assert {a[1] for a in state["actions"] if a not in saved["search"]["actions"]} == {"recompute:offload", "recompute:full_offload", "memory:host"}
