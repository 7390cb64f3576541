"""A conflict's resolutions as decisions: which dim of a tensor holding two dims of one
group keeps the mesh axis (attention's query or key sequence), or neither."""

import pytest

import partex


def _session(mesh="data=4,model=2"):
    return partex.Session.from_spec("transformer", mesh=mesh, hardware="tpu-v4")


def test_a_resolution_picks_which_dim_of_the_scores_keeps_the_axis():
    """The attention scores hold the sequence twice: by default the query dim keeps the
    axis, "second" gives it to the key dim, "neither" to no dim; each applied plan gives
    the unsharded step's loss and gradients, and XLA moves the bytes predicted."""
    s = _session()
    an = s.analysis
    (c,) = [c for c in an.conflicts if an.groups[c.group].label == "seq"]
    vid, a, b = c.values[0]
    base = [("seq", "data"), ("heads", "model")]
    seen = {}
    for how in (None, "second", "neither"):
        dec = base + ([("seq", "resolve:" + how)] if how else [])
        spec = s.cost_model.value_specs(s.decisions(dec))[vid]
        seen[how] = (spec[a], spec[b])
        out = s.verify(s.plan(dec), run=True, mark=False)
        assert out.numerics.ok, (how, out.numerics)
        for kind, coll in out.collectives.items():
            if coll.xla_bytes or coll.predicted_bytes:
                assert coll.ratio == pytest.approx(1.0, abs=0.02), (how, kind, coll)
    assert seen == {None: (("data",), ()), "second": ((), ("data",)), "neither": ((), ())}
    # "neither" moves Q, K and V whole; the default K and V only
    r = {how: s.evaluate(base + ([("seq", "resolve:" + how)] if how else [])) for how in (None, "neither")}
    assert r["neither"].collective_bytes["all-gather"] > r[None].collective_bytes["all-gather"]


def test_the_search_offers_a_resolution_once_the_group_is_sharded_and_pins_name_it(tmp_path):
    s = _session()
    an = s.analysis
    seq = an.group_by_label("seq").id
    space, none = s._state.space, frozenset()
    resolve = [i for i, d in enumerate(space.actions) if isinstance(d, partex.Resolve)]
    assert {space.actions[i] for i in resolve} == {partex.Resolve(seq, "second"), partex.Resolve(seq, "neither")}
    assert not set(resolve) & set(space.legal((), none))
    legal = space.legal((partex.Shard(seq, "model"),), none)
    assert set(resolve) <= set(legal)
    assert not set(resolve) & set(space.legal((partex.Shard(seq, "model"), partex.Resolve(seq, "second")), none))
    assert not set(resolve) & set(space.legal((partex.Shard(seq, "model"),), frozenset(space.actions[i] for i in resolve)))
    plan = s.plan([("seq", "model"), ("seq", "resolve:neither")])
    path = tmp_path / "plan.json"
    plan.save(path)
    assert any(d.axis == "resolve:neither" for d in partex.Plan.load(path).decisions)
    with pytest.raises(partex.PartexError, match="no conflict to resolve"):
        s.plan([("batch", "data"), ("batch", "resolve:second")])
    with pytest.raises(partex.PartexError, match="unknown conflict resolution"):
        s.plan([("seq", "data"), ("seq", "resolve:sideways")])
