"""The server's searches shared fairly (``SearchPool``): at most ``slots`` pages' searches
step at once; the others wait in one queue, first come first served, each told its place. A
search that has had its turn (``slice_seconds`` of searching) while others wait goes to the
back of the queue, its state kept (its process held between two chunks, not ended), so that
every page's search makes progress, in turn. One pool per server process (``server_pool``),
shared by every page; a page's own pool where there is no server (``ExplorerState`` alone).

The pool decides; each page carries its decision out on its own clock (``SearchTurn.sync``,
from the page's poll and its Run and Step): only the page's thread talks to its search
process. A page that does not poll (its tab closed, its session not yet destroyed) therefore
keeps a slot until its session ends (``SearchTurn.leave``); the server ends unused sessions
within seconds (``partex serve``: ``serve_command``'s ``session_lifetime_ms``).

A page's mesh search (the Meshes card's, ``SearchTurn.sync_meshes``) takes a slot of the same
pool with a ticket of its own: it waits its turn as any page's search does, but once started it
keeps its slot until it ends (its budget is seconds of wall clock; a search held mid-way would
end with less than was asked), and a page never waits behind itself: where no slot is free its
mesh search takes the slot of the page's own search at once, that search then first in the queue.

Imports no Panel.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from typing import Callable, Literal, NamedTuple, Protocol

from partex import PartexError

from ._access import MAX_PAGES_ENV, SEARCH_WORKERS_ENV

log = logging.getLogger("partex.explorer")

# How long a search runs while others wait before it goes to the back of the queue. A turn
# shorter than the first simulation of a large model (seconds) would stop it before it shows
# anything; a longer one leaves the twentieth page waiting minutes for its first plan.
SLICE_SECONDS = 15.0

# What one open page may hold on the server, for the default page limit: its model's analysis
# and views in the server (~60 MiB on the demo models) and its search's own process (75-460 MiB
# there, growing with the search's tree; more on a full-size preset).
PAGE_MEMORY = 512 * 2**20
PAGE_MEMORY_SHARE = 0.75  # of the machine's memory, for the pages together

Clock = Callable[[], float]
TurnState = Literal["idle", "waiting", "running"]


def machine_cores() -> int:
    """The cores this process may run on (its affinity where the system says it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_workers(cores: int | None = None) -> int:
    """Searches that run at once by default: one fewer than the machine's cores (the server's
    own loop, which every page waits on, keeps one), at least one."""
    return max(1, (machine_cores() if cores is None else cores) - 1)


def host_memory() -> int:
    """This machine's physical memory, in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_max_pages(memory: int | None = None) -> int:
    """Pages open at once by default: as many as ``PAGE_MEMORY_SHARE`` of the machine's
    memory holds at ``PAGE_MEMORY`` each, at least one."""
    if memory is None:
        memory = host_memory()
    return max(1, int(memory * PAGE_MEMORY_SHARE // PAGE_MEMORY))


def parse_workers(text: str | int, where: str = "--search-workers") -> int:
    """A count (of searches run at once, of pages open at once): a positive whole number;
    PartexError naming ``where``."""
    try:
        n = int(str(text).strip())
    except ValueError:
        n = 0
    if n < 1:
        raise PartexError(f"{where} {text!r} is not a positive whole number: give how many searches run at once, "
                          f"e.g. {default_workers()} (one fewer than this machine's {machine_cores()} cores)")
    return n


class Standing(NamedTuple):
    """A page's standing with the pool: ``state`` (idle: it asks for nothing; waiting: in the
    queue; running: its search holds a slot), ``place`` (1 for the head of the queue; 0 when
    not waiting), ``waiting`` (how many wait in all) and ``slots`` (how many run at once)."""

    state: TurnState
    place: int
    waiting: int
    slots: int

    def to_json(self) -> dict:
        return self._asdict()


class Ticket:
    """One page's place with the pool (``SearchPool.ticket``); the pool alone changes it.
    ``since``: when it last got a slot (running) or joined the queue (waiting); ``turns``: the
    slots it has had."""

    __slots__ = ("name", "state", "since", "turns", "closed", "whole")

    def __init__(self, name: str, whole: bool = False):
        self.name = name
        self.state: TurnState = "idle"
        self.since = 0.0
        self.turns = 0
        self.closed = False
        self.whole = whole  # running to its end: its turn does not rotate (a mesh search)

    def __repr__(self) -> str:
        return f"Ticket({self.name!r}, {self.state}, turns={self.turns})"


class SearchPool:
    """At most ``slots`` tickets running; the others waiting, first come first served.
    Thread-safe: every method holds one lock. ``slice_seconds``: a running ticket's turn, after
    which it yields its slot to the head of the queue (if any wait) and rejoins at the back;
    ``clock``: monotonic seconds (a test's own)."""

    def __init__(self, slots: int, *, slice_seconds: float = SLICE_SECONDS, clock: Clock = time.monotonic):
        if slots < 1:
            raise PartexError(f"a search pool needs at least one slot, got {slots}")
        self.slots = slots
        self.slice_seconds = slice_seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._queue: collections.deque[Ticket] = collections.deque()
        self._running: list[Ticket] = []

    def ticket(self, name: str, whole: bool = False) -> Ticket:
        """A new ticket, idle, named for the log (the page's session id); ``whole``: once
        running, it keeps its slot until it gives it up (a mesh search)."""
        return Ticket(name, whole)

    def sync(self, t: Ticket, wants: bool, *, take_from: Ticket | None = None) -> Standing:
        """``t`` asks for a slot (``wants``: its search has work) or gives up what it holds or
        waits for; turns that are over rotate; returns ``t``'s standing. A closed ticket asks
        for nothing. ``take_from``: a ticket of the same page whose slot ``t``, waiting with no
        slot free, takes at once (that ticket then heads the queue)."""
        with self._lock:
            now = self.clock()
            if wants and not t.closed:
                if t.state == "idle":
                    t.state, t.since = "waiting", now
                    self._queue.append(t)
            else:
                self._drop(t)
            self._rotate(now)
            self._fill(now)
            if t.state == "waiting" and take_from is not None and take_from.state == "running":
                self._running.remove(take_from)  # no slot free: t takes its page's own
                self._queue.remove(t)
                take_from.state, take_from.since = "waiting", now
                self._queue.appendleft(take_from)
                self._start(t, now)
            return self._standing(t)

    def leave(self, t: Ticket) -> None:
        """``t``'s page is gone: it leaves the queue or its slot (the next waiting gets it),
        and never asks again."""
        with self._lock:
            t.closed = True
            self._drop(t)
            self._fill(self.clock())

    def rotate(self) -> None:
        """Turns that are over while others wait rotate (``sync`` does it too)."""
        with self._lock:
            now = self.clock()
            self._rotate(now)
            self._fill(now)

    def standing(self, t: Ticket) -> Standing:
        with self._lock:
            return self._standing(t)

    @property
    def running(self) -> list[str]:
        """The names of the running tickets, oldest turn first."""
        with self._lock:
            return [t.name for t in self._running]

    @property
    def waiting(self) -> list[str]:
        """The names of the waiting tickets, the head of the queue first."""
        with self._lock:
            return [t.name for t in self._queue]

    # ------------------------------------------------------------------ under the lock
    def _drop(self, t: Ticket) -> None:
        if t.state == "running":
            self._running.remove(t)
        elif t.state == "waiting":
            self._queue.remove(t)
        t.state = "idle"

    def _rotate(self, now: float) -> None:
        """The running whose turn is over go to the back of the queue, oldest turn first, as
        many as waited before them (one that no one waits for keeps its slot)."""
        over = [t for t in self._running if not t.whole and now - t.since >= self.slice_seconds]
        for t in sorted(over, key=lambda t: t.since)[:len(self._queue)]:
            self._running.remove(t)
            t.state, t.since = "waiting", now
            self._queue.append(t)
            log.info("partex: search %s yields its slot after %d s; %d waiting", t.name, self.slice_seconds,
                     len(self._queue))

    def _fill(self, now: float) -> None:
        while self._queue and len(self._running) < self.slots:
            self._start(self._queue.popleft(), now)

    def _start(self, t: Ticket, now: float) -> None:
        t.state, t.since = "running", now
        t.turns += 1
        self._running.append(t)

    def _standing(self, t: Ticket) -> Standing:
        place = self._queue.index(t) + 1 if t.state == "waiting" else 0
        return Standing(t.state, place, len(self._queue), self.slots)


_SERVER_POOL: SearchPool | None = None
_SERVER_POOL_LOCK = threading.Lock()


def _count_from_env(name: str, default: Callable[[], int], what: str) -> int:
    """A count the server reads from ``$name`` (``partex serve`` sets it); unset: ``default()``.
    One set by hand for ``panel serve`` that is not a count: the default, said in the log."""
    text = os.environ.get(name, "").strip()
    try:
        return parse_workers(text, name) if text else default()
    except PartexError as e:
        n = default()
        log.error("partex: %s; %d %s", e, n, what)
        return n


def server_pool() -> SearchPool:
    """The server's one pool, made on first use with ``$PARTEX_SEARCH_WORKERS`` slots (which
    ``partex serve --search-workers`` sets; unset: ``default_workers()``)."""
    global _SERVER_POOL
    with _SERVER_POOL_LOCK:
        if _SERVER_POOL is None:
            slots = _count_from_env(SEARCH_WORKERS_ENV, default_workers, "searches run at once")
            _SERVER_POOL = SearchPool(slots)
            log.info("partex: %d search%s at once on this server", slots, "es run" if slots > 1 else " runs")
        return _SERVER_POOL


class PageLimit:
    """The pages open on this server against the most it serves at once (``limit``): a page
    past it is told the server is full instead of getting a model, a search and their
    memory. A page counts from its session's start to its end (``open``, ``close``)."""

    def __init__(self, limit: int):
        self.limit = limit
        self._open: set[str] = set()
        self._lock = threading.Lock()

    def open(self, session: str) -> bool:
        """Count ``session`` as open, where there is room; False where the server is full."""
        with self._lock:
            if len(self._open) >= self.limit:
                return False
            self._open.add(session)
            return True

    def close(self, session: str) -> None:
        with self._lock:
            self._open.discard(session)

    @property
    def count(self) -> int:
        return len(self._open)


_SERVER_PAGES: PageLimit | None = None


def server_pages() -> PageLimit:
    """The server's one page count, its limit ``$PARTEX_MAX_PAGES`` (which ``partex serve
    --max-pages`` sets; unset: ``default_max_pages()``)."""
    global _SERVER_PAGES
    with _SERVER_POOL_LOCK:
        if _SERVER_PAGES is None:
            limit = _count_from_env(MAX_PAGES_ENV, default_max_pages, "pages open at once at most")
            _SERVER_PAGES = PageLimit(limit)
            log.info("partex: at most %d pages open at once on this server", limit)
        return _SERVER_PAGES


# --------------------------------------------------------------------------- a page's side

class Gated(Protocol):
    """What a turn needs of a page's search runner (``_runner``): whether it has work, and a
    gate that holds it between two chunks."""

    @property
    def alive(self) -> bool: ...

    @property
    def busy(self) -> bool: ...

    def hold(self, held: bool) -> None: ...


def ordinal(n: int) -> str:
    """1 -> '1st', 2 -> '2nd', 11 -> '11th', 23 -> '23rd'."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def queue_words(s: Standing) -> str:
    """A waiting page's place in words ("" when it is not waiting)."""
    if s.state != "waiting":
        return ""
    at_once = f"{s.slots} run at once" if s.slots > 1 else "one runs at a time"
    return f"queued: {ordinal(s.place)} of {s.waiting} waiting for a search slot ({at_once} on this server)"


class SearchTurn:
    """One page's turn at ``pool``: ``sync(runner)`` asks for a slot while the page's search
    has work, gives it up when it has none, and opens the runner's gate only while the page
    holds a slot; ``sync_meshes`` does the same for the page's mesh search, with a ticket of
    its own. ``name``: the page's session id."""

    def __init__(self, pool: SearchPool, name: str):
        self.pool = pool
        self.ticket = pool.ticket(name)
        self.meshes = pool.ticket(f"{name} (meshes)", whole=True)
        self.standing = Standing("idle", 0, 0, pool.slots)

    def sync_meshes(self, wants: bool) -> Standing:
        """The page's mesh search asks for a slot (``wants``: it waits to start or runs) or
        gives it up; once it has one it keeps it to its end, and where none is free it takes
        the slot of the page's own search rather than wait behind it."""
        return self.pool.sync(self.meshes, wants, take_from=self.ticket)

    @property
    def lent(self) -> bool:
        """Whether the page's mesh search holds the slot its search waits for."""
        return self.meshes.state == "running" and self.ticket.state == "waiting"

    def sync(self, runner: Gated | None) -> Standing:
        wants = runner is not None and runner.alive and runner.busy
        self.standing = self.pool.sync(self.ticket, wants)
        if runner is not None:
            runner.hold(self.standing.state != "running")
        return self.standing

    def leave(self) -> None:
        """The page is gone: its slots, or its places in the queue, go to the next."""
        self.pool.leave(self.meshes)
        self.pool.leave(self.ticket)
        self.standing = Standing("idle", 0, 0, self.pool.slots)
