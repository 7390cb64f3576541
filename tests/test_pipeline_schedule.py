"""The pipeline's schedule (``plan._pipelined_scan.Schedule``) as plain arithmetic: its ticks,
slots and bubble for GPipe's and the circular schedule, the iteration and slot each stage takes
at each tick, and one traced loop whose tick count is the schedule's."""

import jax
import jax.numpy as jnp
import pytest

import partex
from partex.analysis._pipeline_stacks import SUM
from partex.plan._pipelined_scan import Schedule, pipelined_scan


def _runs(schedule: Schedule, reverse: bool = False) -> dict[tuple[int, int], int]:
    """(tick, stage) -> the iteration the stage runs there, for the ticks where it runs one."""
    out = {}
    for t in range(schedule.ticks):
        for s in range(schedule.stages):
            i = t - schedule.position(s, reverse)
            if 0 <= i < schedule.slots:
                out[t, s] = i
    return out


@pytest.mark.parametrize("stages,microbatches", [(2, 1), (2, 4), (4, 2), (4, 8), (8, 16)])
def test_gpipe_fills_and_drains_in_m_plus_s_minus_one_ticks(stages, microbatches):
    s = Schedule(stages, microbatches)
    assert s.kind == "gpipe" and s.slots == microbatches
    assert s.ticks == microbatches + stages - 1
    assert s.bubble == (stages - 1) / (microbatches + stages - 1)


@pytest.mark.parametrize("stages,microbatches,repeats", [(2, 4, 2), (4, 4, 2), (4, 8, 3), (2, 2, 4)])
def test_the_circular_schedule_passes_the_stages_r_times_in_rm_plus_s_minus_one_ticks(stages, microbatches, repeats):
    s = Schedule(stages, microbatches, repeats)
    assert s.kind == "circular" and s.slots == repeats * microbatches
    assert s.ticks == repeats * microbatches + stages - 1
    assert s.bubble == (stages - 1) / (repeats * microbatches + stages - 1)
    # R rounds divide the bubble by about R: fewer idle ticks than GPipe's with the same microbatches
    assert s.bubble < Schedule(stages, microbatches).bubble


def test_bubbles_of_a_few_pipelines_by_hand():
    assert Schedule(4, 8).ticks == 11 and Schedule(4, 8).bubble == pytest.approx(3 / 11)
    assert Schedule(4, 8, 2).ticks == 19 and Schedule(4, 8, 2).bubble == pytest.approx(3 / 19)
    assert Schedule(2, 4).bubble == pytest.approx(1 / 5)
    assert Schedule(1, 4).bubble == 0.0  # one stage never waits
    # the microbatch counts the mesh search offers (2S, 4S): a bubble under a third, a fifth
    assert all(Schedule(s, 2 * s).bubble < 1 / 3 and Schedule(s, 4 * s).bubble < 1 / 5 for s in (2, 4, 8, 16))


def test_a_pipeline_decision_reports_its_schedules_bubble():
    assert partex.Pipeline("stack0", "stage", 8).bubble(4) == Schedule(4, 8).bubble
    circular = partex.Pipeline.parse("stack0:stage:8:circular2")
    assert circular.bubble(4) == Schedule(4, 8, 2).bubble == pytest.approx(3 / 19)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("stages,microbatches,repeats", [(2, 4, 1), (4, 2, 1), (4, 8, 1), (2, 4, 2), (3, 3, 2), (4, 4, 3)])
def test_every_stage_runs_every_iteration_once_and_idles_for_the_bubble(reverse, stages, microbatches, repeats):
    s = Schedule(stages, microbatches, repeats)
    runs = _runs(s, reverse)
    for stage in range(stages):
        mine = sorted(i for (_, st), i in runs.items() if st == stage)
        assert mine == list(range(s.slots))
    assert 1 - len(runs) / (stages * s.ticks) == pytest.approx(s.bubble)
    # the first stage in the pipeline starts at tick 0, the last one ends at the last tick
    assert min(t for t, _ in runs) == 0 and max(t for t, _ in runs) == s.ticks - 1


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("stages,microbatches,repeats", [(2, 4, 1), (4, 8, 1), (2, 4, 2), (3, 3, 2), (4, 4, 3)])
def test_the_slot_all_stages_take_at_a_tick_holds_each_stages_own_iteration(reverse, stages, microbatches, repeats):
    """Stage s's slot u holds iteration (u - s) mod RM of the loop's order; a reverse loop runs
    that order from the last, so the one slot of a tick is every stage's own iteration, and
    its microbatch the one the stage runs."""
    s = Schedule(stages, microbatches, repeats)
    n = s.slots
    for (t, stage), i in _runs(s, reverse).items():
        held = (s.slot(t, reverse) - stage) % n
        assert held == (n - 1 - i if reverse else i)
        assert s.microbatch(i % microbatches, reverse) == held % microbatches
        assert s.round(i) == i // microbatches < repeats


@pytest.mark.parametrize("stages,microbatches,repeats", [(2, 2, 2), (4, 4, 2), (4, 8, 3), (3, 5, 2)])
def test_a_circular_microbatch_is_back_on_the_first_stage_before_its_next_round(stages, microbatches, repeats):
    """What ``block`` asks of a circular schedule (at least as many microbatches as stages):
    the last stage's output of round r reaches the first stage before it runs round r+1."""
    s = Schedule(stages, microbatches, repeats)
    s.block(stages * repeats)
    runs = _runs(s)
    tick_of = {(st, i): t for (t, st), i in runs.items()}
    for i in range(s.slots - microbatches):
        assert tick_of[stages - 1, i] < tick_of[0, i + microbatches]


def test_layers_and_microbatches_that_do_not_fit_the_schedule_are_refused():
    assert Schedule(4, 8).block(8) == 2 and Schedule(2, 4, 2).block(8) == 2
    with pytest.raises(ValueError, match="8 layers do not split into 3 stages$"):
        Schedule(3, 4).block(8)
    with pytest.raises(ValueError, match="8 layers do not split into 2 stages of 3 rounds"):
        Schedule(2, 4, 3).block(8)
    with pytest.raises(ValueError, match=r"at least as many microbatches as stages \(2 < 4\)"):
        Schedule(4, 2, 2).block(8)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("stages,microbatches,repeats", [(2, 4, 1), (4, 2, 1), (2, 4, 2)])
def test_the_traced_pipeline_runs_the_schedules_ticks(reverse, stages, microbatches, repeats):
    """``pipelined_scan``'s tick loop has ``Schedule.ticks`` trips, each stage's inner loop
    ``Schedule.block`` layers."""
    layers, batch, d = 8, 8, 4

    def layer(cs, c, x):
        (h,), (w,) = c, x
        out = jnp.tanh(h @ w)
        return [out], [out, jnp.einsum("bd,be->de", h, out)]

    def piped(w, h):
        return pipelined_scan(layer, [], [h], [w], length=layers, reverse=reverse, stages=stages,
                              microbatches=microbatches, axis="stage", const_batch=[], carry_batch=[0],
                              xs_batch=[None], ys_batch=[0, SUM], repeats=repeats, constrain=lambda x, spec: x)

    jaxpr = jax.make_jaxpr(piped)(jnp.ones((layers, d, d)), jnp.ones((batch, d)))
    (outer,) = [e for e in jaxpr.eqns if e.primitive.name == "scan"]
    inner = [e for e in outer.params["jaxpr"].eqns if e.primitive.name == "scan"]
    s = Schedule(stages, microbatches, repeats)
    assert outer.params["length"] == s.ticks
    assert [e.params["length"] for e in inner] == [s.block(layers)]
