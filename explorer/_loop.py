"""What runs beside the page's event loop: slow jobs in worker threads (``Jobs``) and the
clock that measures how long the loop is held (``PageClock``).

The loop is the server's one thread for every page: a callback that takes long holds every
tab up. Tracing a model, building a search or compiling with XLA therefore runs in a worker
thread; its result waits in an inbox until the page's next poll applies it, on the loop.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import sys
import threading
import time
from typing import Any, Callable, Iterator, NamedTuple

from partex import PartexError

log = logging.getLogger("partex.explorer")

SLOW_CALLBACK_MS = 100
# A job's thread and the page's loop share the GIL: each time the loop gives it up (a socket
# call), it waits up to the switch interval to get it back while a job runs Python (5 ms by
# default; a callback that applies a model then took several times its CPU time in wall time).
SWITCH_INTERVAL = 0.0005

class Turns:
    """Turns at running Python-bound work, one at a time across the server's pages, each
    turn at most ``slice_s``: a job that holds it longer (a slow trace, or a load its page
    has already superseded) passes it on and goes on beside the next. Twenty pages opening
    at once then run their loads one after the other, not twenty threads at once asking for
    the one interpreter lock, among which the loop waited up to a second in a callback of
    20 ms; and no job waits on another for more than ``slice_s``."""

    def __init__(self, slice_s: float):
        self.slice_s = slice_s
        self._cond = threading.Condition()
        self._holder: object | None = None
        self._since = 0.0

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        token = object()
        with self._cond:
            while self._holder is not None:
                left = self._since + self.slice_s - time.monotonic()
                if left <= 0:
                    break  # the holder's turn is over: it goes on beside this one
                self._cond.wait(left)
            self._holder, self._since = token, time.monotonic()
        try:
            yield
        finally:
            with self._cond:
                if self._holder is token:
                    self._holder = None
                    self._cond.notify()


# The kinds of job whose work is Python the whole way (tracing a model, pricing its plans)
# take ``PYTHON_TURNS``; verify and measure wait on XLA and on other processes.
PYTHON_KINDS = ("load", "upload")
PYTHON_TURNS = Turns(slice_s=2.0)

# How a part of the page runs slow work: submit(kind, work, done) runs work() in a worker
# thread; done(its result) runs later on the page's loop (``Jobs``).
Submit = Callable[[str, Callable[[], Any], Callable[[Any], None]], None]


class Finished(NamedTuple):
    """A job's result, waiting to be applied: ``status`` "ok" (``value`` is what the work
    returned) or "error" (``value`` is a PartexError, or one line for partex's own bug)."""

    kind: str
    gen: int
    done: Callable[[Any], None]
    status: str
    value: Any


class Jobs:
    """Work in worker threads, by kind ("load", "upload", "verify"). A newer job of one kind
    supersedes an older one still running: the older one's result is dropped."""

    def __init__(self, name: str):
        self.name = name  # the threads' names end with it (the session's id)
        self._inbox: collections.deque[Finished] = collections.deque()
        self._gen: collections.Counter[str] = collections.Counter()

    def submit(self, kind: str, work: Callable[[], Any], done: Callable[[Any], None]) -> None:
        """Run work() in a worker thread; ``finished`` then hands ``done`` its result."""
        self._gen[kind] += 1
        gen = self._gen[kind]
        if sys.getswitchinterval() > SWITCH_INTERVAL:
            sys.setswitchinterval(SWITCH_INTERVAL)

        def run():
            try:
                with PYTHON_TURNS.turn() if kind in PYTHON_KINDS else contextlib.nullcontext():
                    out = Finished(kind, gen, done, "ok", work())
            except PartexError as e:
                out = Finished(kind, gen, done, "error", e)
            except Exception as e:  # a thread's boundary: show one line, log the traceback
                log.exception("explorer job %s failed", kind)
                out = Finished(kind, gen, done, "error", f"internal error: {type(e).__name__}: {e}")
            self._inbox.append(out)

        threading.Thread(target=run, name=f"partex-{kind}-{self.name}", daemon=True).start()

    def latest(self, kind: str, gen: int) -> bool:
        """Whether job ``gen`` is the newest of its kind."""
        return gen == self._gen[kind]

    def finished(self) -> Iterator[Finished]:
        """The results in, in the order they came, less those a newer job superseded."""
        while self._inbox:
            out = self._inbox.popleft()
            if self.latest(out.kind, out.gen):
                yield out


SLOWEST_KEPT = 5  # the slowest callbacks the clock names (``PageClock.slowest``)
NESTED_NOTED_MS = 10  # a callback run inside another is named in its log line from this long


class LagHistogram:
    """Lags in ms, counted in 1 ms bins up to ``LAG_BINS`` ms (the last bin holds all beyond):
    a percentile in constant memory, however long the page is open."""

    def __init__(self):
        self.counts = [0] * LAG_BINS
        self.n = 0

    def add(self, ms: float) -> None:
        self.counts[min(LAG_BINS - 1, max(0, int(ms)))] += 1
        self.n += 1

    def percentile(self, q: float) -> float:
        """The lag (ms, the upper edge of its bin) that ``q`` (0-1) of the lags are under; 0
        with none counted."""
        if not self.n:
            return 0.0
        want, seen = q * self.n, 0
        for ms, c in enumerate(self.counts):
            seen += c
            if seen >= want:
                return float(ms + 1)
        return float(LAG_BINS)

    def sparse(self, width: int = 10) -> dict[int, int]:
        """{ms: lags counted from ms to ms + width}, the bins where any fell (a reader's
        percentile over a window: the difference of two of these)."""
        out: dict[int, int] = {}
        for ms, c in enumerate(self.counts):
            if c:
                out[ms - ms % width] = out.get(ms - ms % width, 0) + c
        return out


LAG_BINS = 2000


class LoopLag:
    """The event loop's lag: ``tick`` called every ``period`` s on the loop; a late call means
    the loop was blocked for that long (an early one, after a late one, counts as none). One
    per server (``server_loop_lag``): every page on it waits on the same loop."""

    def __init__(self):
        self.hist = LagHistogram()
        self.max_ms = 0.0
        self._last: float | None = None

    def tick(self, period: float) -> None:
        now = time.perf_counter()
        if self._last is not None:
            lag = max(0.0, (now - self._last - period) * 1e3)
            self.hist.add(lag)
            self.max_ms = max(self.max_ms, lag)
        self._last = now


_SERVER_LAG: tuple[object, LoopLag] | None = None
_SERVER_LAG_LOCK = threading.Lock()


def server_loop_lag(period_ms: int, loop=None) -> LoopLag:
    """The lag monitor of the server's event loop, started on it on first use: one periodic
    callback for the whole server, not one per page (twenty pages ticking ten times a second
    are two hundred callbacks a second on the loop they measure). ``loop``: the server's
    (a Tornado IOLoop); None: the one running in this thread, or, in a thread that runs none
    (a page built in a worker thread: ``_server``), the one started last."""
    global _SERVER_LAG
    from tornado.ioloop import IOLoop, PeriodicCallback

    with _SERVER_LAG_LOCK:
        loop = loop if loop is not None else IOLoop.current(instance=False)
        if loop is None and _SERVER_LAG is not None:
            return _SERVER_LAG[1]
        loop = loop if loop is not None else IOLoop.current()
        if _SERVER_LAG is None or _SERVER_LAG[0] is not loop:
            lag = LoopLag()
            # started on the loop itself (a PeriodicCallback runs on the loop current where it starts)
            loop.add_callback(lambda: PeriodicCallback(lambda: lag.tick(period_ms / 1e3), period_ms).start())
            _SERVER_LAG = (loop, lag)
        return _SERVER_LAG[1]


class PageClock:
    """How long the page waits on the server: its callbacks on the event loop (``timed``: the
    slowest, in wall time and in the loop thread's own CPU time, which other processes and
    threads on a busy machine do not inflate; a slow one is logged with what it did) and the
    loop's lag (``lag``: the server's one monitor, ``server_loop_lag``; ``report`` gives both,
    in ms). ``slowest``: the SLOWEST_KEPT slowest callbacks, slowest
    first, as (what, wall ms, CPU ms)."""

    def __init__(self, name: str, lag: "LoopLag | None" = None):
        self.name = name
        self.timings = {"max_callback_ms": 0.0, "max_callback_cpu_ms": 0.0, "callbacks": 0}
        self.lag = lag if lag is not None else LoopLag()
        self.slowest: list[tuple[str, float, float]] = []
        # the callbacks running now on each thread, outermost first: one run inside another
        # (a state's watcher, inside the button that set the state) is part of the outer one
        self._open: dict[int, list[list[str]]] = {}
        self._later: dict[object, Callable[[], Any]] = {}  # ``later``'s work, by key

    def report(self) -> dict:
        """The timings (``timings``) with the server's loop lag (``lag``) beside them: its
        largest, its 95th percentile and its histogram ({ms: ticks} where any fell)."""
        return {**self.timings, "max_loop_lag_ms": self.lag.max_ms, "p95_loop_lag_ms": self.lag.hist.percentile(0.95),
                "lag_histogram": self.lag.hist.sparse()}

    @contextlib.contextmanager
    def timed(self, what: str) -> Iterator[list[str]]:
        """Measure a callback on the server's event loop (the page waits on it) that does
        ``what``; the body may add what else it did to the list it is handed (the jobs' results
        it applied), for the log line of a slow callback. A callback run inside another is
        counted as part of it: the outer one's list names it when it took NESTED_NOTED_MS or
        more."""
        stack = self._open.setdefault(threading.get_ident(), [])
        t0, cpu0 = time.perf_counter(), time.thread_time()
        done: list[str] = []
        stack.append(done)
        try:
            yield done
        finally:
            try:
                while len(stack) == 1 and self._later:  # the outermost callback ends: what waited runs
                    self._later.pop(next(iter(self._later)))()
            finally:
                stack.pop()
            ms, cpu = (time.perf_counter() - t0) * 1e3, (time.thread_time() - cpu0) * 1e3
            if stack:
                if ms >= NESTED_NOTED_MS:
                    stack[-1].append(f"{what} {ms:.0f} ms" + (f" [{'; '.join(done)}]" if done else ""))
            else:
                self._record("; ".join([what, *done]), ms, cpu)

    def later(self, key: object, fn: Callable[[], Any]) -> None:
        """Run ``fn()`` once when the outermost callback running now ends (at once where none
        runs): work that reads the whole state after all of a callback's changes, done once
        however many of them ask for it (by ``key``: a later ask replaces an earlier one)."""
        if self._open.get(threading.get_ident()):
            self._later[key] = fn
        else:
            fn()

    def watcher(self, what: str, fn: Callable[..., Any]) -> Callable[..., None]:
        """``fn`` as a parameter watcher timed on this clock (``timed``), for the state's own
        watchers (the views' go through ``_widgets.on_change``, which also sends their Bokeh
        changes together)."""

        def watch(*events) -> None:
            with self.timed(what):
                fn(*events)

        return watch

    def _record(self, what: str, ms: float, cpu: float) -> None:
        t = self.timings
        t["callbacks"] += 1
        if ms > SLOW_CALLBACK_MS:
            log.warning("partex: slow callback on the page's event loop: %.0f ms (%.0f ms of CPU): %s (session %s)",
                        ms, cpu, what, self.name)
        t["max_callback_ms"], t["max_callback_cpu_ms"] = max(t["max_callback_ms"], ms), max(t["max_callback_cpu_ms"], cpu)
        if len(self.slowest) < SLOWEST_KEPT or ms > self.slowest[-1][1]:
            self.slowest = sorted([*self.slowest, (what[:300], ms, cpu)], key=lambda c: -c[1])[:SLOWEST_KEPT]
