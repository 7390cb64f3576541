"""The page's search (``SearchDriver``): its runner (``_runner``: a forked child, or a thread),
its turn at the server's search slots (``_pool``), the search controls' actions, and the
snapshots the page picks up from it."""

from __future__ import annotations

import math
import time
from typing import Callable

from partex import SearchStats, Session

from ._banner import Banner
from ._engine import PlanSummary, Workspace
from ._format import fmt_time
from ._pool import SearchTurn, Standing, queue_words
from ._runner import ProcessRunner, SearchSnapshot, ThreadRunner, make_runner
from ._slice import ParamSlice

# After picking up a snapshot the page renders it and Bokeh serialises the changes; a search
# in a thread (ThreadRunner) keeps off the GIL that long, so that it never holds the page up.
QUIET_SECONDS = 0.1
APPLY_SECONDS = 0.5  # while the search runs, the page shows its progress this often
NO_FIT_SIMULATIONS = 200  # with no plan that fits after this many, the page says so


def warm_start_name(best: PlanSummary, hand: dict[str, PlanSummary]) -> str | None:
    """The hand plan (of ``hand``, the baselines) that ``best`` is, by its predicted step time
    and peak (the warm start scores the hand plans before the first simulation); None where it
    is none of them."""
    for name, b in hand.items():
        r, o = best.report, b.report
        if o.fits and math.isclose(r.step_time, o.step_time, rel_tol=1e-9) and r.memory.peak == o.memory.peak:
            return name
    return None


class SearchDriver:
    """Drives the page's search. Owns its runner (``ProcessRunner`` or ``ThreadRunner``) and
    what the page has taken from it: the last snapshot shown, whether the no-fit warning was
    said, and a pause's message, whose count waits for the search's last snapshot. Its runner
    steps only while ``turn`` holds one of the server's search slots; waiting for one, the page
    says its place in the queue (``search_queue``, and the banner). ``page`` sets the state's
    ``running``, ``best``, ``stats``, ``pins``, ``forbidden`` and ``search_queue`` and reads
    ``workspace``, ``config`` and ``baselines``; ``probe()`` updates the state's JSON; ``internal_error``
    reports partex's own bug on the page. ``name``: the session's id (the runner's name)."""

    def __init__(self, page: ParamSlice, banner: Banner, probe: Callable[[], None],
                 internal_error: Callable[[str, Exception], None], name: str, turn: SearchTurn):
        self.page = page
        self.banner = banner
        self.probe = probe
        self.internal_error = internal_error
        self.name = name
        self.turn = turn
        # the banner's line the turn last said (searching, or the place in the queue): the
        # turn says its news again only while no newer message has replaced it
        self._turn_line: str | None = None
        self.runner: ProcessRunner | ThreadRunner | None = None
        self._seen_version = -1
        self._last_apply = 0.0
        self._warned_budget = False
        # the banner's line a pause left: its count is said again with the search's last
        # snapshot, unless a newer message has replaced it (None: no pause waits)
        self._pause_line: str | None = None
        # the count a Step ends at (its line waits for it: a snapshot of the pause before the
        # Step may come after it), and the count the pause line says (a later one is said anew)
        self._step_to: int | None = None
        self._said: int | None = None

    # ------------------------------------------------------------------ the runner's life
    def start(self, session: Session, ws: Workspace) -> None:
        """A new search on ``session`` (the runner steps a copy); its pins and forbids shown."""
        self.runner = make_runner(session, ws, session=self.name, held=True)  # until its turn
        self.page.pins = session.pins
        self.page.forbidden = session.forbidden

    def fresh(self) -> None:
        """Nothing of the search before stays on the page: no best plan, no statistics."""
        self.page.best = None
        self.page.stats = SearchStats()
        self._seen_version = -1
        self._warned_budget = False
        self._pause_line = self._step_to = self._said = None

    def drop_decisions(self) -> None:
        """The pins and forbids go (together): they were of another model."""
        self.page.set(pins=[], forbidden=[])

    def stop(self) -> None:
        """Close the runner (a new one is about to come)."""
        if self.runner is not None:
            self.runner.close(wait=0.2)
            self.runner = None
        self.take_turn()

    def close(self) -> None:
        """The tab closed: stop the search; its slot or place in the queue goes to the next."""
        if self.runner is not None:
            self.runner.close()
        self.turn.leave()

    # ------------------------------------------------------------------ its turn at the slots
    def take_turn(self) -> Standing:
        """Ask for a search slot while the search has work, give it up when it has none; the
        runner steps only while it holds one. A change of standing is said on the page: the
        place in the queue, the turn come or over."""
        before = self.turn.standing
        now = self.turn.sync(self.runner)
        words = queue_words(now)
        if now.state == "waiting" and self.turn.lent:
            words = f"{words}: the page's mesh search has its slot until it ends"
        if words != self.page.search_queue:
            self.page.search_queue = words
        if now[:2] != before[:2] and self._turn_line is not None and self._turn_line == self.banner.line:
            if now.state == "waiting":
                again = "its turn is over, " if before.state == "running" and not self.turn.lent else ""
                self.banner.say(f"{again}{words}; the search goes on when its turn comes (Pause leaves the "
                                "queue); pin, forbid, compare and verify meanwhile")
                self._turn_line = self.banner.line
            elif now.state == "running" and before.state == "waiting":
                self.banner.say(self._searching())
                self._turn_line = self.banner.line
        return now

    # ------------------------------------------------------------------ the search controls
    def need_runner(self) -> ProcessRunner | ThreadRunner | None:
        """The runner, or None with a message that there is no search yet."""
        if self.runner is None or not self.runner.alive:
            self.banner.notify("no search yet: wait for the model to load (or press Analyze)", "warning")
            return None
        return self.runner

    def run(self) -> None:
        r = self.need_runner()
        if r:
            r.run()
            self._step_to = None
            self.page.running = True
            self._pause_line = None
            self.banner.say(self._searching())
            self._turn_line = self.banner.line
            self.take_turn()

    def _searching(self) -> str:
        """What the search does once it runs, in words."""
        an = self.page.workspace.an
        pins = ", ".join(an.decision_label(d) for d in self.page.pins)
        first = self.page.stats.simulations == 0
        return (f"searching on {self.page.config.mesh.text()}"
                + (f" from the pinned {pins}" if pins else "")
                + (f"; the first simulation: {self._first()}" if first else "")
                + "; Pause to stop, pin or forbid a group any time")

    def _first(self) -> str:
        """What the first simulation does, in words (on a large model it takes seconds): a
        rollout, then a local search from the best plan so far, named where it is the warm
        start's (the best of the hand plans scored before the first simulation)."""
        best, hand = self.page.best, self.page.baselines
        if best is None:
            return f"a rollout that looks for a plan that fits (none of the {len(hand)} hand plans does)"
        name = warm_start_name(best, hand)
        t = fmt_time(best.report.step_time)
        start = f"the warm start's {name} at {t} (the best of its {len(hand)} hand plans)" if name else t
        return f"a rollout, then a local search from the best plan so far, {start}"

    def pause(self) -> None:
        if self.runner:
            self.runner.pause()
        self._turn_line = None
        self.take_turn()  # the slot goes to the next (a Step's simulations still to make keep it)
        was = self.page.running
        self.page.running = False
        if was:  # the "searching on ..." message would outlive the search
            # the search stops between two chunks: the count is said again with its last snapshot
            self._say_paused(pending=self.page.stats.simulations == 0)
            self._pause_line = self.banner.line if self.runner is not None else None

    def _say_paused(self, pending: bool = False) -> None:
        """Say the pause and its count; ``pending``: none has ended yet, and the first, under
        way, ends first (on a large model it takes seconds): what it does is said."""
        self._step_to = None
        first = f"; the first, under way, ends first: {self._first()}" if pending else ""
        self.banner.say(f"paused after {self.page.stats.simulations:,} simulations{first}; Run goes on, Reset "
                        "starts afresh")
        # a later count (the simulation under way when Pause was pressed) is said anew
        self._pause_line, self._said = self.banner.line, self.page.stats.simulations

    def _pause_waits(self, snap: SearchSnapshot) -> bool:
        """Whether the banner's line is a pause's (or a Step's) and ``snap`` has a count to say
        in it: another than the one it says, and, after a Step, the count the Step ends at."""
        n = snap.stats.simulations
        return (self._pause_line is not None and self._pause_line == self.banner.line and n != self._said
                and (self._step_to is None or n >= self._step_to))

    def step(self, n: int) -> None:
        r = self.need_runner()
        if r:
            r.step(n)
            if not self.page.running:  # its count is said when its simulations have ended
                start = self.page.stats.simulations
                self._step_to = start + n
                self.banner.say(f"stepping {n:,} simulations from {start:,}")
                self._pause_line = self.banner.line
            self._turn_line = self.banner.line  # a Step that waits for a slot says so
            self.take_turn()

    def decide(self, how: str, group: int | None, axis: str | None) -> None:
        """Pin, forbid or release (``how``: "pin", "forbid", "unpin") ``group`` on ``axis``."""
        r = self.need_runner()
        if r is None:
            return
        if group is None or axis is None:
            self.banner.notify("choose a group (click a node in the graph) and a mesh axis", "warning")
            return
        an = self.page.workspace.an
        lab = f"{an.groups[group].label}->{axis}"

        def done(ok: bool, value) -> None:
            if not ok:
                self.banner.notify(value if value.startswith("cannot") else f"cannot {how} {lab}: {value}", "danger")
                return
            pins, forbidden = value
            self._warned_budget = False
            verb = {"pin": "pinned", "forbid": "forbade", "unpin": "released"}[how]
            tail = "" if self.page.running else "; press Run to resume the search from here"
            # the message first: a page that sees the new pins also sees why
            self.banner.say(f"{verb} {lab}{tail}")
            self.page.pins, self.page.forbidden = pins, forbidden
            self.probe()

        # the search takes it between two of its chunks: on a large model, seconds away
        verb = {"pin": "pinning", "forbid": "forbidding", "unpin": "releasing"}[how]
        self.banner.say(f"{verb} {lab}: the search takes it once its simulation under way ends")
        r.ask(how, group, axis, done=done)

    def consider(self, plan) -> None:
        """Score ``plan`` ((label, slot) pairs: a Meshes card row's) as a candidate of the page's
        search (``Session.consider``): a better plan becomes its best."""
        r = self.need_runner()
        if r is None:
            return
        def done(ok: bool, value) -> None:
            if not ok:
                self.banner.notify(f"cannot start from the mesh search's plan: {value}", "danger")

        r.ask("consider", list(plan), done=done)

    # ------------------------------------------------------------------ its snapshots
    def poll(self) -> None:
        """Hand the search's answers to their callers (``ask``); show its latest snapshot: at
        once when it stopped or found a new best, else every APPLY_SECONDS."""
        r = self.runner
        snap = r.receive() if r is not None else None
        for done, ok, value in r.answered() if r is not None else ():
            try:
                done(ok, value)
            except Exception as e:
                self.internal_error("taking the search's answer", e)
        self.take_turn()
        now = time.perf_counter()
        if (r is not None and snap is not None and snap.version != self._seen_version
                and (not snap.running or snap.best is not self.page.best
                     or now - self._last_apply >= APPLY_SECONDS)):
            self._seen_version = snap.version  # a snapshot that fails below is not applied again
            self._last_apply = now
            r.quiet(QUIET_SECONDS)
            try:
                self._apply(snap)
            except Exception as e:
                self.internal_error("showing the search's progress", e)

    def _apply(self, snap: SearchSnapshot) -> None:
        page = self.page
        with page.batch():
            page.stats = snap.stats
            if snap.best is not page.best:
                page.best = snap.best
            if list(snap.pins) != page.pins:
                page.pins = list(snap.pins)
            if list(snap.forbidden) != page.forbidden:
                page.forbidden = list(snap.forbidden)
            if page.running and self.runner is not None and not self.runner.running and not snap.running:
                page.running = False
        if snap.best is not None and snap.best.report.fits:
            self.banner.standing = ""  # a plan fits after all
        if snap.error:
            page.running = False
            self._pause_line = None
            self.banner.notify(snap.error, "danger")
        elif snap.best is None and snap.stats.simulations >= NO_FIT_SIMULATIONS and not self._warned_budget:
            self._warned_budget = True
            no_fit = snap.stats.no_fit
            fix = "the host memory or the budget" if "host memory" in no_fit else "the budget"
            self.banner.standing = (f"no plan fits after {snap.stats.simulations} simulations: {no_fit}; raise "
                                    f"{fix}, grow the mesh or release a pin")
            if self._pause_waits(snap) and not snap.running:
                self._say_paused()
            else:
                self.banner.notify(self.banner.standing, "warning")
        elif self._pause_waits(snap) and not snap.running:
            self._say_paused()  # the search has stopped: its count is the one the page shows
        self.probe()
