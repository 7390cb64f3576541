"""The background search: one worker thread per browser session steps its Search in short
chunks and publishes snapshots that the page picks up.

The Search is not thread-safe: every call into it, from the worker or from the page (pin,
forbid, save), holds ``SearchRunner.lock``. A chunk is sized to take about
``chunk_seconds``, so a click that needs the lock waits at most that long, and the worker
sleeps ``yield_seconds`` between chunks so the server's event loop gets the GIL.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
from typing import Any, Callable

from engine import PartexError

from ._engine import PlanSummary, Workspace

log = logging.getLogger("partex.explorer")

# The server's event loop is I/O-bound and the search CPU-bound: each time the loop gives
# up the GIL for a socket call it waits up to the switch interval to get it back (5 ms by
# default), and answering one websocket message takes dozens of such calls. A short
# interval keeps the page's round trips short while a search runs.
SWITCH_INTERVAL = 0.0005


@dataclasses.dataclass(frozen=True)
class SearchSnapshot:
    version: int
    running: bool
    stats: dict
    best: PlanSummary | None
    pins: tuple
    forbidden: tuple
    error: str | None = None


class SearchRunner:
    """Owns one Search and the thread that steps it.

    chunk_seconds: target wall time of one ``step(k)`` call (k adapts to it).
    yield_seconds: pause between chunks, so that the page's callbacks get the GIL.
    publish_seconds: least time between two published snapshots while running.
    """

    def __init__(self, search, workspace: Workspace, *, chunk_seconds: float = 0.02,
                 yield_seconds: float = 0.01, publish_seconds: float = 0.25, session: str = ""):
        self.search = search
        self.workspace = workspace
        self.chunk_seconds = chunk_seconds
        self.yield_seconds = yield_seconds
        self.publish_seconds = publish_seconds
        self.session = session
        self.lock = threading.Lock()
        self._cmd_lock = threading.Lock()  # guards _pending
        self._wake = threading.Event()
        self._running = False
        self._pending = 0  # simulations asked for by Step
        self._dirty = True  # publish a snapshot without stepping
        self._closed = False
        self._quiet_until = 0.0  # the page asked the worker to stay off the GIL until then
        self._chunk = 4  # simulations per chunk, adapted to chunk_seconds
        self._best_key = None
        self._best: PlanSummary | None = None
        self.snapshot: SearchSnapshot | None = None  # replaced whole: readers need no lock
        self._version = 0
        if sys.getswitchinterval() > SWITCH_INTERVAL:
            sys.setswitchinterval(SWITCH_INTERVAL)
        self._thread = threading.Thread(target=self._loop, name=f"partex-search-{session}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ commands (any thread)
    @property
    def running(self) -> bool:
        return self._running

    def run(self) -> None:
        self._running = True
        self._wake.set()

    def pause(self) -> None:
        self._running = False
        self._dirty = True
        self._wake.set()

    def step(self, n: int) -> None:
        with self._cmd_lock:
            self._pending += int(n)
        self._wake.set()

    def quiet(self, seconds: float) -> None:
        """Keep off the GIL for a while after the current chunk: the page is about to
        render a snapshot (its callback, then Bokeh serialising the changes)."""
        self._quiet_until = max(self._quiet_until, time.perf_counter() + seconds)

    def call(self, fn: Callable[[Any], Any]) -> Any:
        """Run fn(search) between two chunks; the result is published at once."""
        with self.lock:
            out = fn(self.search)
        self._dirty = True
        self._wake.set()
        return out

    def close(self, wait: float = 2.0) -> None:
        self._closed = True
        self._running = False
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(wait)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------------ the worker
    def _loop(self) -> None:
        last_publish = 0.0
        try:
            while not self._closed:
                self._wake.clear()
                if self._running or self._pending > 0:
                    n = self._chunk if self._running else min(self._pending, self._chunk)
                    with self.lock:
                        t0 = time.perf_counter()
                        self.search.step(n)
                        dt = time.perf_counter() - t0
                    if not self._running:
                        with self._cmd_lock:
                            self._pending = max(0, self._pending - n)
                    # aim at chunk_seconds per chunk; grow slowly, shrink at once
                    ideal = max(1, int(n * self.chunk_seconds / max(dt, 1e-5)))
                    self._chunk = min(ideal, self._chunk * 2, 2000)
                    now = time.perf_counter()
                    if now - last_publish >= self.publish_seconds or (not self._running and not self._pending):
                        self._publish()
                        last_publish = time.perf_counter()
                    time.sleep(max(self.yield_seconds, self._quiet_until - time.perf_counter()))
                elif self._dirty:
                    self._dirty = False
                    self._publish()
                else:
                    self._wake.wait()
        except PartexError as e:
            self._fail(str(e))
        except Exception as e:  # the thread's boundary: report it on the page, log the traceback
            log.exception("search worker failed")
            self._fail(f"internal error in the search: {type(e).__name__}: {e}")
        log.info("partex: search thread stopped (session %s)", self.session)

    def _fail(self, message: str) -> None:
        self._running = False
        self._pending = 0
        self._version += 1
        prev = self.snapshot
        self.snapshot = SearchSnapshot(self._version, False, prev.stats if prev else {}, self._best,
                                       prev.pins if prev else (), prev.forbidden if prev else (), message)

    def _publish(self) -> None:
        with self.lock:
            s = self.search
            stats = s.stats()
            pins = tuple(s.pins)
            forbidden = tuple(sorted(s.forbidden))
            # the best plan is looked at (a detailed evaluation) only when it may have changed
            key = (len(stats.get("best_history", ())), stats.get("best_step_time"), pins, forbidden)
            best = plan = None
            if key != self._best_key:
                best = s.best()
                plan = s.best_plan() if best is not None else None
        if key != self._best_key:
            self._best_key = key
            self._best = None if best is None else self.workspace.summarize(
                "search", best.decisions, pinned=pins, plan=plan, simulation=best.simulation, report=best.report)
        self._version += 1
        self.snapshot = SearchSnapshot(self._version, self._running or self._pending > 0, stats,
                                       self._best, pins, forbidden)
