"""The background search: each browser session steps its own Session in short chunks and
publishes snapshots that the page picks up on its clock.

The search runs in a child process forked from the server (``ProcessRunner``), so that it
shares neither the GIL nor the garbage collector with the server's event loop: a search
that keeps a core busy then never holds up a page. (In one process, every socket call of
the event loop waits to get the GIL back from the search, and a full collection of the
search's objects stops every thread: measured here, 100-300 ms stalls of the page.) The
child inherits the page's ``partex.Session`` by fork (its analysed model, its search), so
nothing is traced or pickled twice. Where there is no fork, ``ThreadRunner`` steps the
session in a thread instead.

A runner may be held (``hold``): its search stops between two chunks, its state kept, and
goes on when let go; what it was asked to do (Run, the simulations of a Step) waits. The
server's pool of search slots holds the searches of the pages waiting for a slot
(``_pool``); ``busy`` says whether a search has work, held or not.

A Session is not thread-safe; each runner calls it from one place only (the child's loop,
or the thread under ``lock``). A failure in the child is reported on the page in one line
and logged whole, with its traceback, in the server's log.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from typing import Any, Callable, Iterator

from partex import PartexError, SearchStats

from ._engine import PlanSummary, Workspace

log = logging.getLogger("partex.explorer")

COMMANDS = ("pin", "forbid", "unpin", "save", "mark_infeasible", "consider")  # what ``call`` may ask of the session
# Where cores are few, the page (server loop, browser) comes before the search: the child
# runs at a lower priority. With a core to itself it runs at full speed all the same.
CHILD_NICENESS = 5

# What the page runs with the search's answer to ``ask``: done(ok, value), value the command's
# result where ok, else the one line that says why it failed.
Done = Callable[[bool, Any], None]


@dataclasses.dataclass(frozen=True)
class SearchSnapshot:
    version: int
    running: bool
    stats: SearchStats
    best: PlanSummary | None
    pins: tuple
    forbidden: tuple
    error: str | None = None
    traceback: str | None = None  # of the error, for the server's log
    # from the child process: ``best`` is left out (None), being the one sent before (the
    # parent puts that back in before anyone reads the snapshot)
    best_unchanged: bool = False
    seen: int = 0  # from the child process: the messages it had read when it sent this one


class _Stepper:
    """The search side of a runner: steps the session in chunks sized to ``chunk_seconds``
    and builds snapshots (the best plan is looked at only when it may have changed)."""

    def __init__(self, session, workspace: Workspace, chunk_seconds: float):
        self.session = session
        self.workspace = workspace
        self.chunk_seconds = chunk_seconds
        # simulations per chunk, adapted; the first is one: on a large model its local search
        # takes seconds, and the page shows what it found once it ends
        self.chunk = 1
        self.version = 0
        self._best_key = None
        self._best: PlanSummary | None = None

    def step(self, limit: int | None = None) -> int:
        n = self.chunk if limit is None else max(1, min(limit, self.chunk))
        t0 = time.perf_counter()
        self.session.step(n)
        dt = time.perf_counter() - t0
        # aim at chunk_seconds per chunk; grow slowly, shrink at once
        self.chunk = max(1, min(int(n * self.chunk_seconds / max(dt, 1e-5)), self.chunk * 2, 5000))
        return n

    def command(self, name: str, *args) -> Any:
        if name not in COMMANDS:
            raise PartexError(f"unknown search command {name!r}")
        s = self.session
        getattr(s, name)(*args)
        return s.pins, s.forbidden

    def snapshot(self, running: bool, error: str | None = None, *, changes_only: bool = False,
                 tb: str | None = None, seen: int = 0) -> SearchSnapshot:
        """The search's state now. changes_only: ``best`` is left out (``best_unchanged``)
        when it is the one sent before (a pipe need not carry the plan again); ``seen``: the
        commands read so far."""
        s = self.session
        stats = s.stats()
        pins = tuple(s.pins)
        forbidden = tuple(s.forbidden)
        key = (len(stats.best_history), stats.best_step_time, pins, forbidden)
        changed = key != self._best_key
        if changed:
            self._best_key = key
            best = s.best()
            self._best = None if best is None else self.workspace.summarize(
                "search", best.decisions, pinned=pins, plan=s.best_plan(), simulation=best.simulation,
                report=best.report)
        self.version += 1
        unchanged = changes_only and not changed
        return SearchSnapshot(self.version, running, stats, None if unchanged else self._best, pins, forbidden,
                              error, tb, best_unchanged=unchanged, seen=seen)


def make_runner(search_session, workspace: Workspace, session: str = "", *, held: bool = False):
    """A runner stepping ``search_session`` (a partex.Session); ``session`` names the tab;
    ``held``: it starts held (``hold``)."""
    if "fork" in multiprocessing.get_all_start_methods() and sys.platform != "darwin":
        return ProcessRunner(search_session, workspace, session=session, held=held)
    return ThreadRunner(search_session, workspace, session=session, held=held)


# --------------------------------------------------------------------------- in a child process

class ProcessRunner:
    """Steps the search in a forked child. The page's thread is the only one that talks to
    it: commands go down a pipe; snapshots and replies come back and are read by
    ``receive`` (from the page's clock) or by ``call`` (waiting for its reply).

    chunk_seconds: target wall time of one ``step(k)``: the longest a command waits.
    publish_seconds: least time between two snapshots while running.
    held: the child starts held (``hold``).
    """

    def __init__(self, search_session, workspace: Workspace, *, session: str = "", chunk_seconds: float = 0.05,
                 publish_seconds: float = 0.25, held: bool = False):
        self.session = session
        self.snapshot: SearchSnapshot | None = None
        self._running = False
        self._closed = False
        self._held = held
        self._calls = 0
        self._asked: dict[int, tuple[str, Done]] = {}  # ask's calls not answered yet, by id
        self._answers: list[tuple[Done, bool, Any]] = []  # answered, not yet handed to their done
        self._sent = 0  # messages sent down the pipe (the child counts those it read: ``SearchSnapshot.seen``)
        self._steps_until = 0  # a Step's message's number, until a snapshot says its simulations are made
        ctx = multiprocessing.get_context("fork")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_child_main, name=f"partex-search-{session}", daemon=True,
                                 args=(child, self._conn, _Stepper(search_session, workspace, chunk_seconds),
                                       publish_seconds, held))
        # forked while no thread of the server is inside the workspace's cost model (its
        # caches whole in the child); the child's copy of the lock, held at the fork, is replaced
        with workspace.lock:
            start_forked(self._proc)
        child.close()

    @property
    def running(self) -> bool:
        return self._running

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    @property
    def alive(self) -> bool:
        return not self._closed and self._proc.is_alive()

    @property
    def busy(self) -> bool:
        """Whether the search has work, held or not: Run pressed, or a Step whose simulations
        are not all made (until a snapshot sent after the child read the Step says so)."""
        if self._running:
            return True
        snap = self.snapshot
        if self._steps_until and snap is not None and snap.seen >= self._steps_until and not snap.running:
            self._steps_until = 0
        return self._steps_until > 0

    def hold(self, held: bool) -> None:
        """Hold the search between two chunks (True), or let it go on (False)."""
        if held != self._held:
            self._held = held
            self._send("hold", held)

    def _send(self, *msg) -> None:
        self._sent += 1
        try:
            self._conn.send(msg)
        except (OSError, ValueError):  # the child is gone: ``alive`` says so
            self._running = False

    def run(self) -> None:
        self._running = True
        self._send("run")

    def pause(self) -> None:
        self._running = False
        self._send("pause")

    def step(self, n: int) -> None:
        self._send("step", int(n))
        self._steps_until = self._sent

    def quiet(self, seconds: float) -> None:
        """Nothing to do: the child shares no GIL with the page."""

    def ask(self, name: str, *args, done: Done) -> None:
        """Ask the search to do ``name`` (one of COMMANDS) between two chunks, without waiting:
        on a large model one chunk (a simulation) takes seconds, and the page's event loop
        must not wait that long. ``done(ok, value)`` runs when ``answered`` hands it the
        answer (the page's poll, on its loop)."""
        self._calls += 1
        self._asked[self._calls] = (name, done)
        self._send("call", self._calls, name, args)

    def answered(self) -> Iterator[tuple[Done, bool, Any]]:
        """The answers to ``ask`` that came (read by ``receive``), each with its ``done``."""
        while self._answers:
            yield self._answers.pop(0)

    def call(self, name: str, *args, timeout: float = 10.0) -> Any:
        """Ask the search to do ``name`` between two chunks; wait for it (up to ``timeout``
        s: the caller waits, where the page's loop must not, use ``ask``)."""
        self._calls += 1
        ident = self._calls
        self._send("call", ident, name, args)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._conn.poll(min(0.5, max(0.0, deadline - time.monotonic()))):
                if not self._proc.is_alive():
                    break
                continue
            msg = self._recv()
            if msg is None:
                break
            if msg[0] == "reply" and msg[1] == ident:
                ok, value = msg[2], msg[3]
                if ok:
                    return value
                if len(msg) > 4 and msg[4]:  # not bad input: the child's own failure, logged whole
                    log.error("partex: %s failed in the search process (session %s):\n%s", name, self.session, msg[4])
                raise PartexError(value)
        raise PartexError(f"the search did not answer {name} within {timeout:.0f} s")

    def receive(self) -> SearchSnapshot | None:
        """Read what the child sent (never blocks); the latest snapshot. A closed runner's
        pipe is not read again: it keeps its last snapshot."""
        while not self._closed and self._poll():
            if self._recv() is None:
                break
        return self.snapshot

    def _poll(self) -> bool:
        try:
            return self._conn.poll(0)
        except (EOFError, OSError):  # the pipe closed under us: the child is gone
            self._running = False
            return False

    def _recv(self):
        try:
            msg = self._conn.recv()
        except (EOFError, OSError):
            self._running = False
            return None
        if msg[0] == "reply" and msg[1] in self._asked:
            name, done = self._asked.pop(msg[1])
            if not msg[2] and len(msg) > 4 and msg[4]:  # not bad input: the child's own failure, logged whole
                log.error("partex: %s failed in the search process (session %s):\n%s", name, self.session, msg[4])
            self._answers.append((done, msg[2], msg[3]))
        elif msg[0] == "snapshot":
            snap = msg[1]
            if snap.best_unchanged:
                snap = dataclasses.replace(snap, best=self.snapshot.best if self.snapshot else None,
                                           best_unchanged=False)
            self.snapshot = snap
            if snap.error:
                self._running = False
                if snap.traceback:
                    log.error("partex: the search process failed (session %s):\n%s", self.session, snap.traceback)
        return msg

    def close(self, wait: float = 2.0) -> None:
        """Stop the child: "close" ends it between two chunks; past ``wait`` it is
        terminated. The page's thread does not wait for it."""
        if self._closed:
            return
        self._closed = True
        self._running = False
        self._send("close")
        threading.Thread(target=self._reap, args=(wait,), name=f"partex-reap-{self.session}", daemon=True).start()

    def _reap(self, wait: float) -> None:
        reap(self._proc, self._conn, wait)
        log.info("partex: search stopped (session %s)", self.session)


def start_forked(proc) -> None:
    """Start a forked child of the server. JAX warns on every fork once its runtime is up:
    the children run numpy (the cost model) and never call into JAX, whose threads they
    lack; Python 3.12 likewise on a fork of any multi-threaded process (the server's)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        warnings.filterwarnings("ignore", message=r"This process .* is multi-threaded", category=DeprecationWarning)
        proc.start()


def reap(proc, conn, wait: float) -> None:
    """Wait ``wait`` s for a child to end, then terminate it; close its pipe."""
    proc.join(wait)
    if proc.is_alive():
        proc.terminate()
        proc.join(1.0)
    conn.close()


def _child_main(conn, parent_end, stepper: _Stepper, publish_seconds: float, held: bool = False) -> None:
    """The child's loop: commands between chunks; a snapshot now and then. Held, it steps
    nothing and waits for the next command. It ends on "close", or when the server goes away
    (end of file on the pipe)."""
    parent_end.close()  # its copy of the server's end would hide the server's exit
    # the server's handlers (Bokeh stops its event loop on SIGTERM) mean nothing here
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.nice(CHILD_NICENESS)
    gc.freeze()  # what it inherited is never garbage here: keep collections short
    stepper.workspace.lock = threading.Lock()  # the server held its copy at the fork
    running, pending, last, seen = False, 0, 0.0, 0

    def publish(error=None, tb=None):
        nonlocal last
        conn.send(("snapshot", stepper.snapshot(running or pending > 0, error, changes_only=True, tb=tb, seen=seen)))
        last = time.perf_counter()

    try:
        publish()
        while True:
            busy = (running or pending > 0) and not held
            if conn.poll(0 if busy else None):
                msg = conn.recv()
                seen += 1
                kind = msg[0]
                if kind == "close":
                    return
                if kind == "hold":
                    held = msg[1]
                    if held:
                        publish()  # the count it stopped at
                elif kind == "run":
                    running = True
                elif kind == "pause":
                    running = False
                    publish()
                elif kind == "step":
                    pending += msg[1]
                elif kind == "call":
                    _, ident, name, args = msg
                    try:
                        conn.send(("reply", ident, True, stepper.command(name, *args)))
                    except PartexError as e:
                        conn.send(("reply", ident, False, str(e)))
                    except OSError as e:
                        conn.send(("reply", ident, False, f"{type(e).__name__}: {e}"))
                    except Exception as e:  # the process's boundary: one line on the page, the traceback logged
                        conn.send(("reply", ident, False, f"internal error: {type(e).__name__}: {e}",
                                   traceback.format_exc()))
                    publish()
                continue
            try:
                n = stepper.step(None if running else pending)
            except Exception as e:  # the process's boundary: one line on the page, the traceback logged
                running, pending = False, 0
                publish(f"the search failed: {type(e).__name__}: {e}", traceback.format_exc())
                continue
            if not running:
                pending = max(0, pending - n)
            if time.perf_counter() - last >= publish_seconds or not (running or pending):
                publish()
    except (EOFError, OSError, KeyboardInterrupt):  # the server went away
        return


# --------------------------------------------------------------------------- in a thread

# The server's event loop is I/O-bound and the search CPU-bound: each time the loop gives
# up the GIL for a socket call it waits up to the switch interval to get it back (5 ms by
# default). A short interval keeps the page's round trips short while a search runs.
SWITCH_INTERVAL = 0.0005


class ThreadRunner:
    """Steps the search in a thread of the server (where fork is not available). Every
    call into the search holds ``lock``; the thread sleeps ``yield_seconds`` between chunks
    and stays off the GIL while the page renders a snapshot (``quiet``)."""

    def __init__(self, search_session, workspace: Workspace, *, session: str = "", chunk_seconds: float = 0.02,
                 yield_seconds: float = 0.02, publish_seconds: float = 0.25, held: bool = False):
        self.session = session
        self._held = held
        self.yield_seconds = yield_seconds
        self.publish_seconds = publish_seconds
        self.lock = threading.Lock()
        self._stepper = _Stepper(search_session, workspace, chunk_seconds)
        self._cmd_lock = threading.Lock()  # guards _pending
        self._wake = threading.Event()
        self._running = False
        self._pending = 0
        self._dirty = True
        self._closed = False
        self._quiet_until = 0.0
        self._answers: collections.deque[tuple[Done, bool, Any]] = collections.deque()
        self.snapshot: SearchSnapshot | None = None  # replaced whole: readers need no lock
        if sys.getswitchinterval() > SWITCH_INTERVAL:
            sys.setswitchinterval(SWITCH_INTERVAL)
        self._thread = threading.Thread(target=self._loop, name=f"partex-search-{session}", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._running

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def busy(self) -> bool:
        """Whether the search has work, held or not: Run pressed, or a Step not all made."""
        return self._running or self._pending > 0

    def hold(self, held: bool) -> None:
        """Hold the search between two chunks (True), or let it go on (False)."""
        if held != self._held:
            self._held = held
            self._wake.set()

    @property
    def pid(self) -> int:
        return os.getpid()

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
        self._quiet_until = max(self._quiet_until, time.perf_counter() + seconds)

    def ask(self, name: str, *args, done: Done) -> None:
        """As ``ProcessRunner.ask``: the command runs in a thread of its own, which waits for
        the search's chunk to end."""

        def work():
            try:
                out = (done, True, self.call(name, *args))
            except PartexError as e:
                out = (done, False, str(e))
            except Exception as e:  # a thread's boundary: one line on the page, the traceback logged
                log.exception("partex: %s failed in the search (session %s)", name, self.session)
                out = (done, False, f"internal error: {type(e).__name__}: {e}")
            self._answers.append(out)

        threading.Thread(target=work, name=f"partex-ask-{self.session}", daemon=True).start()

    def answered(self) -> Iterator[tuple[Done, bool, Any]]:
        while self._answers:
            yield self._answers.popleft()

    def call(self, name: str, *args) -> Any:
        with self.lock:
            out = self._stepper.command(name, *args)
        self._dirty = True
        self._wake.set()
        return out

    def receive(self) -> SearchSnapshot | None:
        return self.snapshot

    def close(self, wait: float = 2.0) -> None:
        self._closed = True
        self._running = False
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(wait)

    def _loop(self) -> None:
        last = 0.0
        error = None
        while not self._closed:
            self._wake.clear()
            if (self._running or self._pending > 0) and not self._held:
                try:
                    with self.lock:
                        n = self._stepper.step(None if self._running else self._pending)
                except Exception as e:  # the thread's boundary: report it on the page
                    log.exception("search worker failed")
                    self._running, self._pending = False, 0
                    error = f"the search failed: {type(e).__name__}: {e}"
                    self._dirty = True
                    continue
                if not self._running:
                    with self._cmd_lock:
                        self._pending = max(0, self._pending - n)
                if time.perf_counter() - last >= self.publish_seconds or not (self._running or self._pending):
                    self._publish(error)
                    last = time.perf_counter()
                time.sleep(max(self.yield_seconds, self._quiet_until - time.perf_counter()))
            elif self._dirty:
                self._dirty = False
                self._publish(error)
                error = None
            else:
                self._wake.wait()
        log.info("partex: search stopped (session %s)", self.session)

    def _publish(self, error=None) -> None:
        with self.lock:
            self.snapshot = self._stepper.snapshot(self._running or self._pending > 0, error)
