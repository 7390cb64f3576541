"""Plans scored on several cores: forked copies of this process, each with the cost model
as it was at the fork (its memo tables warm), score a share of a batch of plans while this
process scores its own (``Scorers``). The local search asks for the plans it is about to try
(``Evaluator.prefetch``), a few at a time, and tries them in its own order: the search goes
as it would on one core, only faster.

The cost model is plain Python and NumPy: a forked child runs it without JAX (which warns on
a fork once its runtime is up; the child never calls it). Where there is no fork (macOS,
Windows), in a daemonic process (which may not have children) or with ``processes`` 1,
plans are scored here, one by one.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import sys
import traceback
import warnings
from typing import Sequence

from .._decisions import Decision
from .._errors import PartexError
from ..cost import CostModel

# The environment variable that sets how many processes score a search's plans (default:
# the cores this process may run on, at most MAX_PROCESSES).
PROCESSES_ENV = "PARTEX_PROCESSES"
MAX_PROCESSES = 8

Raw = tuple[float, float, float]  # (step time s, peak bytes per device, host bytes per device)


def raw(cm: CostModel, decisions: Sequence[Decision]) -> Raw:
    """A plan as the evaluator keeps it, scored by ``cm``."""
    r = cm.evaluate(decisions)
    return r.step_time, r.memory.peak, r.memory.host


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform
        return os.cpu_count() or 1


def default_processes() -> int:
    """``PARTEX_PROCESSES`` where set (a whole number >= 1), else the cores, at most
    ``MAX_PROCESSES`` (the batches the local search asks for are a few plans: more
    processes than that wait more than they score)."""
    text = os.environ.get(PROCESSES_ENV, "").strip()
    if not text:
        return max(1, min(cores(), MAX_PROCESSES))
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise PartexError(f"{PROCESSES_ENV}={text!r}: give a whole number of processes >= 1 "
                         f"(1 scores every plan in the search's own process)")
    return n


def can_fork() -> bool:
    """Whether this process may fork children that score plans."""
    return ("fork" in multiprocessing.get_all_start_methods() and sys.platform != "darwin"
            and not multiprocessing.current_process().daemon)


def _serve(conn, cm: CostModel, parent_ends: list) -> None:
    """A scoring child: batches of plans in, their ``Raw`` out, until the parent closes its
    end or ends (``parent_ends``: the parent's ends of the pipes open at the fork, this
    child's own among them, which the child closes so that their closing reaches it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    for end in parent_ends:
        end.close()
    _die_with_parent()
    gc.enable()
    while True:
        try:
            plans = conn.recv()
        except (EOFError, OSError):
            return
        if plans is None:
            return
        try:
            out = ("ok", [raw(cm, p) for p in plans])
        except BaseException:  # a bug in partex: the parent raises it with this traceback
            out = ("error", traceback.format_exc())
        conn.send(out)


def _die_with_parent() -> None:
    """Linux: the kernel ends this process when its parent ends, however it ends."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class ScorerError(RuntimeError):
    """A scoring child failed: its traceback is the message."""


class Scorers:
    """``processes - 1`` forked children and this process, scoring batches of plans through
    ``cm`` (``score``). A context manager: the children end on exit."""

    def __init__(self, cm: CostModel, processes: int):
        self.cm = cm
        self._conns: list = []
        self._procs: list = []
        if processes < 2 or not can_fork():
            return
        ctx = multiprocessing.get_context("fork")
        # The children share the parent's objects until they write them: the collector is
        # kept off them (gc.freeze), and a reference count's write copies a page only.
        gc.freeze()
        try:
            with warnings.catch_warnings():
                # JAX and Python 3.12 warn on a fork of a multi-threaded process: the child
                # calls neither JAX nor any thread's lock (the cost model is its own)
                warnings.filterwarnings("ignore", message=r".*fork\(\) was called", category=RuntimeWarning)
                warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks",
                                        category=DeprecationWarning)
                for _ in range(processes - 1):
                    parent, child = ctx.Pipe()
                    self._conns.append(parent)
                    proc = ctx.Process(target=_serve, args=(child, cm, list(self._conns)), daemon=True,
                                       name="partex-scorer")
                    proc.start()
                    child.close()
                    self._procs.append(proc)
        finally:
            gc.unfreeze()

    @property
    def processes(self) -> int:
        """The processes that score: the children and this one."""
        return len(self._conns) + 1

    def score(self, plans: Sequence[tuple[Decision, ...]]) -> list[Raw]:
        """Each plan's ``Raw``, in order: the plans cut in runs, one per process (this
        process the first). Plans next to each other in a local search's order change the
        same decision: a run shares its cost model's memo tables, where plans dealt out one
        by one would make every process price the same new pieces."""
        n = self.processes
        if n == 1 or len(plans) < 2:
            return [raw(self.cm, p) for p in plans]
        size = -(-len(plans) // n)
        runs = [list(plans[i:i + size]) for i in range(0, len(plans), size)]
        used = self._conns[:len(runs) - 1]
        for conn, run in zip(used, runs[1:]):
            conn.send(run)
        out = [raw(self.cm, p) for p in runs[0]]
        for k, conn in enumerate(used):
            try:
                status, got = conn.recv()
            except EOFError:
                raise ScorerError(f"a scoring process (pid {self._procs[k].pid}) ended without an answer") from None
            if status != "ok":
                raise ScorerError(f"a scoring process failed:\n{got}")
            out += got
        return out

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(None)
                conn.close()
            except OSError:
                pass
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self._conns, self._procs = [], []

    def __enter__(self) -> "Scorers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
