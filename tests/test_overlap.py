"""Collectives overlapping compute (Hardware.overlap): what hides, what stays exposed."""

from __future__ import annotations

import pytest

import partex
from partex import get_hardware

# compute comparable to communication at these tiny sizes: slow chips, fast links, no latency
SLOW = dict(peak_flops=2e9, hbm_bandwidth=1e12, link_bandwidth=2e9, link_latency=0.0)


def _hw(overlap=True, **kw):
    return get_hardware("tpu-v4", overlap=overlap, **{**SLOW, **kw})


def _session(fn, args, mesh, overlap=True):
    return partex.Session(fn, args, mesh=mesh, hardware=_hw(overlap))


def _consistent(r):
    """Exposed and hidden add up: per plan, and per collective against the plan."""
    assert r.step_time == pytest.approx(r.compute_time + r.comm_time - r.hidden_time, rel=1e-9)
    assert 0 <= r.hidden_time <= r.comm_time * (1 + 1e-9)
    assert r.step_time >= r.compute_time * (1 - 1e-9)
    assert sum(c.hidden for c in r.collectives) == pytest.approx(r.hidden_time, rel=1e-6, abs=1e-12)
    for c in r.collectives:
        assert 0 <= c.hidden <= c.time * (1 + 1e-9)


def test_without_overlap_every_collective_is_exposed():
    s = partex.Session.from_spec("transformer", preset="tiny", mesh="data=4,model=2", hardware="cpu")
    assert not s.hardware.overlap
    for name in ("dp", "megatron", "zero3"):
        r = s.evaluate(s.strategy(name))
        assert r.comm_time > 0
        assert r.hidden_time == 0 and r.exposed_time == r.comm_time
        assert r.step_time == pytest.approx(r.compute_time + r.comm_time, rel=1e-12)
        assert all(c.hidden == 0 for c in r.collectives)


def _tiny(model="transformer", mesh="data=8", overlap=True, **hw):
    return partex.Session.from_spec(model, preset="tiny", mesh=mesh, hardware=_hw(overlap, **hw))


def test_weight_gathers_hide_under_the_previous_layers_compute():
    """ZeRO-3: every weight gathered over `data` for its reader. The first has no compute
    before it to hide under; the others are fetched while the ops before them run."""
    on, off = _tiny(), _tiny(overlap=False)
    dec = on.strategy("zero3")
    r_on, r_off = on.evaluate(dec), off.evaluate(dec)
    _consistent(r_on)
    gathers = sorted((c for c in r_on.collectives if c.kind == "all-gather" and c.operand >= 0), key=lambda c: c.op)
    assert len(gathers) >= 5
    assert gathers[0].hidden < 0.01 * gathers[0].time  # (a few cheap ops run before it)
    later = gathers[1:]
    assert sum(c.hidden for c in later) > 0.8 * sum(c.time for c in later)
    assert r_off.hidden_time == 0 and r_on.comm_time == pytest.approx(r_off.comm_time)
    assert r_on.step_time == pytest.approx(r_off.step_time - r_on.hidden_time)


def test_a_reduction_the_next_op_reads_stays_exposed():
    """Megatron's forward all-reduces (the row-parallel matmul's partial sums, read by the
    residual add next) cannot hide; the step waits for each."""
    s = _tiny(mesh="model=8", link_bandwidth=2e7)
    dec = [(g.label, "model") for g in s.groups if g.label in ("heads", "ffn")]
    assert len(dec) == 2
    r = s.evaluate(dec)
    _consistent(r)
    fwd = s.analysis.roles.forward_ops
    forward = [c for c in r.collectives if c.kind == "all-reduce" and c.op in fwd]
    assert forward and r.comm_time > 0.1 * r.compute_time
    for c in forward:
        assert c.hidden < 0.01 * c.time, (c.source, c.hidden, c.time)


def test_gradient_reductions_hide_under_the_rest_of_the_backward_pass():
    """Data parallel: each weight gradient is reduced while the backward pass goes on to the
    layers before it; only the reductions at its very end are left for the step to wait on."""
    s = _tiny(link_bandwidth=2e8)
    r = s.evaluate(s.strategy("dp"))
    _consistent(r)
    grads = sorted((c for c in r.collectives if c.operand < 0 and c.time > 0), key=lambda c: c.op)
    assert len(grads) >= 4
    early, last = grads[:-2], grads[-1]
    assert sum(c.hidden for c in early) > 0.8 * sum(c.time for c in early)
    assert last.exposed > 0
    assert r.exposed_time > 0 and r.hidden_time > 0


def test_scan_bodies_prefetch_the_next_layers_weights():
    """Under scan, the next trip's weights are gathered during this trip's compute: the
    same plan on the scanned and the unrolled model hides most of its gathers both ways."""
    for model in ("transformer", "transformer-scan"):
        s = _tiny(model)
        r = s.evaluate(s.strategy("zero3"))
        _consistent(r)
        gathers = [c for c in r.collectives if c.kind == "all-gather" and c.operand >= 0
                   and s.program.ops[c.op].region != 0]
        if model == "transformer-scan":
            assert gathers, "the scan body gathers its weights"
            assert sum(c.hidden for c in gathers) > 0.5 * sum(c.time for c in gathers)
        assert r.hidden_time > 0.3 * r.comm_time


def test_report_json_and_cli(capsys):
    from partex.cli import main

    s = _tiny()
    r = s.evaluate(s.strategy("zero3"))
    j = r.to_json()
    assert j["comm_exposed_s"] == pytest.approx(r.comm_time - r.hidden_time)
    assert j["comm_hidden_s"] == pytest.approx(r.hidden_time) and r.hidden_time > 0
    assert get_hardware("cpu").overlap is False and get_hardware("tpu-v5p").overlap is True
    assert main(["bench", "transformer", "--mesh", "data=4,model=2", "--overlap", "off", "--budget", "1",
                 "--simulations", "20", "--ilp-time", "2", "--json"]) == 0
    rows = {r["strategy"]: r for r in __import__("json").loads(capsys.readouterr().out)["rows"]}
    assert rows["zero3"]["step_time_s"] > 0
    with pytest.raises(SystemExit) as e:
        main(["bench", "transformer", "--mesh", "data=4,model=2", "--overlap", "maybe"])
    assert e.value.code == 2


def test_the_explorer_says_what_is_exposed_and_what_is_hidden():
    from partex.explorer._tables import comm_split

    s = _tiny()
    r = s.evaluate(s.strategy("zero3"))
    text = comm_split(r, s.hardware)
    assert "exposed" in text and "hidden under compute" in text
    off = _tiny(overlap=False)
    assert "all exposed" in comm_split(off.evaluate(off.strategy("zero3")), off.hardware)
