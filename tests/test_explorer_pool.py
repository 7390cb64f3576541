"""The server's search slots (``partex.explorer._pool``) without a browser: bounded, first
come first served with each page's place, turns that rotate while others wait, and a page
that pauses or goes away gives its slot to the next."""

from __future__ import annotations

import threading

import pytest

from partex import PartexError
from partex.explorer._pool import (PageLimit, SearchPool, SearchTurn, Standing, default_workers, ordinal, parse_workers,
                                   queue_words)


class Clock:
    """A test's own monotonic clock."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeRunner:
    """A runner's gate and work, as ``SearchTurn`` sees them."""

    def __init__(self):
        self.alive, self.busy, self.held = True, False, True

    def hold(self, held: bool) -> None:
        self.held = held


def _pool(slots: int, slice_seconds: float = 10.0):
    clock = Clock()
    return SearchPool(slots, slice_seconds=slice_seconds, clock=clock), clock


def test_no_more_searches_run_than_the_pool_has_slots():
    pool, _ = _pool(2)
    tickets = [pool.ticket(f"p{i}") for i in range(5)]
    states = [pool.sync(t, True).state for t in tickets]
    assert states == ["running", "running", "waiting", "waiting", "waiting"]
    assert pool.running == ["p0", "p1"] and pool.waiting == ["p2", "p3", "p4"]


def test_the_queue_is_first_come_first_served_and_each_page_knows_its_place():
    pool, _ = _pool(1)
    first, *rest = [pool.ticket(f"p{i}") for i in range(4)]
    pool.sync(first, True)
    for t in rest:
        pool.sync(t, True)
    assert [pool.standing(t) for t in rest] == [Standing("waiting", i, 3, 1) for i in (1, 2, 3)]
    pool.sync(first, False)  # the first has no more work: the head of the queue gets its slot
    assert pool.standing(rest[0]).state == "running"
    assert [pool.standing(t).place for t in rest[1:]] == [1, 2]


def test_a_turn_over_while_others_wait_goes_to_the_back_of_the_queue():
    pool, clock = _pool(1, slice_seconds=10.0)
    a, b, c = (pool.ticket(n) for n in "abc")
    for t in (a, b, c):
        pool.sync(t, True)
    clock.now = 9.9
    assert pool.sync(a, True).state == "running"  # its turn is not over
    clock.now = 10.0
    assert pool.sync(a, True) == Standing("waiting", 2, 2, 1)  # behind c, who waited before it
    assert pool.running == ["b"] and pool.waiting == ["c", "a"]
    clock.now = 20.0
    pool.rotate()
    assert pool.running == ["c"] and pool.waiting == ["a", "b"]
    clock.now = 30.0
    pool.rotate()
    assert pool.running == ["a"] and (a.turns, b.turns, c.turns) == (2, 1, 1)  # round robin


def test_a_search_no_one_waits_for_keeps_its_slot_and_only_as_many_yield_as_wait():
    pool, clock = _pool(2, slice_seconds=10.0)
    a, b, c = (pool.ticket(n) for n in "abc")
    pool.sync(a, True)
    clock.now = 1.0
    pool.sync(b, True)
    clock.now = 100.0
    assert pool.sync(a, True).state == "running" and pool.sync(b, True).state == "running"
    pool.sync(c, True)  # one waits: the older turn (a's) yields, b keeps its slot
    assert pool.running == ["b", "c"] and pool.waiting == ["a"]


def test_a_paused_search_gives_up_its_slot_or_its_place():
    pool, _ = _pool(1)
    a, b, c = (pool.ticket(n) for n in "abc")
    for t in (a, b, c):
        pool.sync(t, True)
    assert pool.sync(b, False) == Standing("idle", 0, 1, 1)  # b paused while waiting: it leaves the queue
    assert pool.standing(c).place == 1
    pool.sync(a, False)  # a paused while running: c runs
    assert pool.running == ["c"] and pool.waiting == []
    assert pool.sync(b, True) == Standing("waiting", 1, 1, 1)  # Run again: at the back


def test_a_closed_page_leaves_the_queue_and_frees_its_slot_for_good():
    pool, _ = _pool(1)
    a, b, c = (pool.ticket(n) for n in "abc")
    for t in (a, b, c):
        pool.sync(t, True)
    pool.leave(b)  # waiting
    assert pool.waiting == ["c"]
    pool.leave(a)  # running
    assert pool.running == ["c"] and pool.waiting == []
    assert pool.sync(a, True).state == "idle"  # a closed page asks for nothing (a late poll)
    assert pool.running == ["c"]


def test_a_turn_holds_its_runner_until_it_has_a_slot_and_again_when_its_turn_is_over():
    pool, clock = _pool(1, slice_seconds=10.0)
    first, second = SearchTurn(pool, "a"), SearchTurn(pool, "b")
    ra, rb = FakeRunner(), FakeRunner()
    assert first.sync(ra).state == "idle" and ra.held  # no work: nothing asked
    ra.busy = rb.busy = True
    assert first.sync(ra).state == "running" and not ra.held
    assert second.sync(rb) == Standing("waiting", 1, 1, 1) and rb.held
    clock.now = 10.0
    assert second.sync(rb).state == "running" and not rb.held  # a's turn is over: b's search goes on
    assert first.sync(ra).state == "waiting" and ra.held  # a's own poll holds it
    ra.alive = False  # a dead search asks for nothing
    assert first.sync(ra).state == "idle" and pool.waiting == []
    second.leave()
    assert pool.running == []


def test_a_mesh_search_waits_its_turn_then_keeps_its_slot_to_its_end():
    """A page's mesh search queues behind other pages' searches as a search does; once it runs
    its turn never rotates (its budget is seconds of wall clock), and it frees its slot when it
    ends."""
    pool, clock = _pool(1, slice_seconds=10.0)
    other, page = SearchTurn(pool, "a"), SearchTurn(pool, "b")
    ra = FakeRunner()
    ra.busy = True
    other.sync(ra)
    assert page.sync_meshes(True) == Standing("waiting", 1, 1, 1)  # behind a's search
    clock.now = 10.0
    assert page.sync_meshes(True).state == "running" and other.sync(ra).state == "waiting" and ra.held
    clock.now = 100.0  # long past a turn, a waiting: the mesh search keeps its slot
    assert page.sync_meshes(True).state == "running" and other.sync(ra).state == "waiting"
    assert page.sync_meshes(False).state == "idle"  # it ended
    assert other.sync(ra).state == "running" and not ra.held


def test_a_pages_mesh_search_takes_its_own_searchs_slot_rather_than_wait_behind_it():
    """One slot, held by the page's own search: the page's mesh search starts at once, the
    page's search is held first in the queue (before pages that queued earlier) and gets the
    slot back when the mesh search ends."""
    pool, _ = _pool(1)
    page, other = SearchTurn(pool, "a"), SearchTurn(pool, "b")
    ra, rb = FakeRunner(), FakeRunner()
    ra.busy = rb.busy = True
    page.sync(ra)
    other.sync(rb)
    assert page.sync_meshes(True).state == "running" and page.lent
    assert page.sync(ra) == Standing("waiting", 1, 2, 1) and ra.held
    assert pool.running == ["a (meshes)"] and pool.waiting == ["a", "b"]
    page.sync_meshes(False)
    assert page.sync(ra).state == "running" and not ra.held and not page.lent
    page.leave()  # both of the page's tickets go
    assert pool.running == ["b"] and pool.waiting == []


def test_a_pages_mesh_search_takes_a_free_slot_beside_its_own_search():
    pool, _ = _pool(2)
    page = SearchTurn(pool, "a")
    ra = FakeRunner()
    ra.busy = True
    page.sync(ra)
    assert page.sync_meshes(True).state == "running" and not page.lent
    assert page.sync(ra).state == "running" and not ra.held
    assert pool.running == ["a", "a (meshes)"]


def test_the_pool_keeps_its_bound_under_threads():
    pool, _ = _pool(3)
    tickets = [pool.ticket(f"p{i}") for i in range(40)]
    most = []

    def churn(ts):
        for _ in range(200):
            for t in ts:
                pool.sync(t, True)
                most.append(len(pool.running))
                pool.sync(t, False)

    threads = [threading.Thread(target=churn, args=(tickets[i::4],)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert max(most) <= 3 and pool.running == [] and pool.waiting == []


def test_a_waiting_page_says_its_place_in_words():
    assert queue_words(Standing("waiting", 3, 7, 2)) == (
        "queued: 3rd of 7 waiting for a search slot (2 run at once on this server)")
    assert queue_words(Standing("waiting", 1, 1, 1)).endswith("(one runs at a time on this server)")
    assert queue_words(Standing("running", 0, 4, 2)) == ""
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]


def test_search_workers_default_to_one_fewer_than_the_cores_and_refuse_nonsense():
    assert default_workers(8) == 7 and default_workers(2) == 1 and default_workers(1) == 1
    assert parse_workers("3") == 3
    for bad in ("0", "-2", "many", ""):
        with pytest.raises(PartexError, match="--search-workers .* is not a positive whole number"):
            parse_workers(bad)
    with pytest.raises(PartexError, match="at least one slot"):
        SearchPool(0)


def test_a_step_holds_its_slot_until_its_simulations_are_made_then_gives_it_up():
    """A real search process: held, it makes no simulation; a Step asks for the slot, makes
    its simulations once it has it, and the slot goes back once its last snapshot says so."""
    import time

    import partex
    from partex.explorer._engine import Workspace
    from partex.explorer._runner import ProcessRunner

    session = partex.Session.from_spec("mlp", mesh="data=4,model=2", memory="3MiB")
    pool, _ = _pool(1)
    other = pool.ticket("other")
    pool.sync(other, True)  # the slot is taken
    runner = ProcessRunner(session, Workspace(session.spec, session), session="t", held=True)
    turn = SearchTurn(pool, "t")
    try:
        runner.step(30)
        assert turn.sync(runner) == Standing("waiting", 1, 1, 1) and runner.busy
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # held: nothing happens however long it waits
            runner.receive()
            time.sleep(0.05)
        assert runner.snapshot is not None and runner.snapshot.stats.simulations == 0
        pool.sync(other, False)
        assert turn.sync(runner).state == "running"
        deadline = time.monotonic() + 60
        while turn.sync(runner).state == "running" and time.monotonic() < deadline:
            runner.receive()
            time.sleep(0.05)
        assert runner.snapshot.stats.simulations == 30 and not runner.busy and turn.standing.state == "idle"
    finally:
        runner.close()


def test_pages_past_the_limit_are_refused_until_one_closes():
    """``PageLimit``: a page is counted from its session's start to its end; one past the
    limit is refused, and a page may open again once another closes (the same session
    closed twice frees one place)."""
    pages = PageLimit(2)
    assert pages.open("a") and pages.open("b") and pages.count == 2
    assert not pages.open("c") and pages.count == 2
    pages.close("a")
    pages.close("a")
    assert pages.count == 1 and pages.open("c") and not pages.open("d")
