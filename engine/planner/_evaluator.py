"""The evaluation cache the tree search and the local search share.

Each plan is keyed by the ordered groups of each slot (decisions on different mesh axes
commute, so the same decisions in another order are one plan) and evaluated once by the cost
model: an ``Evaluation`` (step time, peak memory, fits). The cache keeps the fastest plan that
fits met so far (and when: the simulation and the search seconds) and the smallest peak met
(what to ask for when nothing fits). A plan XLA measured over the budget (``mark_infeasible``) scores as not
fitting from then on, and the memory model is calibrated by it.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Callable, Collection, Iterator, NamedTuple, Sequence

from .._decisions import Decision, Shard
from .._mesh import Hardware, format_bytes
from ..analysis._space import DecisionSpace
from ..cost import CostModel
from ._scorers import Raw, Scorers, default_processes, raw

# A key's entry (``Evaluator.key``) for the groups sharded over several mesh axes in another
# order than the slots': no slot has this name (mesh axes are identifiers).
ORDER = "~order"

# The most mark_infeasible scales every prediction by: the cost model's memory is within
# +-35% of XLA's on the plans it is checked on (1 / 0.65 ~ 1.5).
XLA_SCALE_CAP = 1.5

# Scoring on several processes (``Evaluator.scoring``, ``_scorers``): the seconds work scores
# on its own before it forks them, and the plans per process a batch asks for (``batch``).
# A batch's plans are the next a search will try: a local search's improving moves are few
# (one plan in a hundred), so the plans after one are seldom wasted, and a run of four shares
# more of its process's memo tables.
FORK_AFTER = 0.25
RUN = 4


class Evaluation(NamedTuple):
    """A plan as the cost model scores it: the cache's entry."""

    step_time: float  # seconds
    peak: float  # peak bytes per device
    fits: bool  # within the budget (``Evaluator.fits``) and the host's memory
    host: float = 0.0  # host memory per device


class Best(NamedTuple):
    """The fastest plan that fits met so far."""

    step_time: float
    decisions: tuple[Decision, ...]
    simulation: int  # the simulation that first found it
    seconds: float  # search seconds until then


class Evaluator:
    """Plans scored through the cost model, each once. ``progress()`` gives (simulations,
    search seconds) now: when a new best is met."""

    def __init__(self, cm: CostModel, hw: Hardware, space: DecisionSpace,
                 progress: Callable[[], tuple[int, float]]):
        self.cm = cm
        self.hw = hw
        self.space = space
        self.progress = progress
        self.slots = tuple(space.slots)
        self._slot_index = {a: i for i, a in enumerate(self.slots)}
        self.evals: dict[Any, Evaluation] = {}  # by ``key``
        self.best: Best | None = None
        self.history: list[tuple[int, float, float]] = []  # (simulation, seconds, step time)
        self.smallest_memory: tuple[float, tuple[Decision, ...]] = (math.inf, ())
        self.xla_scale = 1.0  # XLA's / the model's memory, the most seen (mark_infeasible)
        self.t_ref = 1e-9  # the reference step time of the score (the replicated plan's)
        self.ahead: dict[Any, Raw] = {}  # by ``key``: plans scored ahead, not yet asked for (``prefetch``)
        self._scoring: tuple[int, float] | None = None  # in ``scoring``: (processes, since when)
        self._scorers: Scorers | None = None  # forked in ``scoring`` (``_open_scorers``)

    def key(self, decisions: Sequence[Decision]) -> tuple:
        """The plan's key: per slot (in the space's order), its groups in decision order; then,
        where a group is sharded over several mesh axes in another order than the slots',
        its axes in order (an ``ORDER`` entry, ``cross_order``). Decisions on different
        axes commute but for that: a dim sharded over ``(model, data)`` is cut otherwise
        than one over ``(data, model)`` (the first decision's axis is the major one), and
        the cost model prices them apart."""
        per_axis: dict[str, list[int]] = {}
        for d in decisions:
            per_axis.setdefault(d.slot, []).append(d.id)
        key = tuple((a, tuple(per_axis[a])) for a in self.slots if a in per_axis)
        order = self.cross_order(decisions)
        return key + ((ORDER, order),) if order else key

    def cross_order(self, decisions: Sequence[Decision]) -> tuple[int, ...]:
        """Each group whose shardings come in another order than their slots' (in the
        space's order), as ``group, count, slot index...`` (by group; empty where none)."""
        axes: dict[int, list[int]] = {}
        for d in decisions:
            if isinstance(d, Shard):
                axes.setdefault(d.group, []).append(self._slot_index[d.axis])
        out: list[int] = []
        for g in sorted(axes):
            xs = axes[g]
            if any(a > b for a, b in zip(xs, xs[1:])):
                out += [g, len(xs), *xs]
        return tuple(out)

    def decisions_of(self, key) -> tuple[Decision, ...]:
        """The decisions of a key: by slot, merged so that each group sharded over several
        axes takes them in the order the key's ``ORDER`` entry gives (else the slots' order)
        and each slot's decisions keep theirs."""
        queues = [[self.space.make(a, g) for g in gs] for a, gs in key if a != ORDER]
        order = next((xs for a, xs in key if a == ORDER), ())
        if not order:
            return tuple(d for q in queues for d in q)
        axes: dict[int, list[int]] = {}  # group -> its shardings' slots, in order
        for d in (d for q in queues for d in q):
            if isinstance(d, Shard):
                axes.setdefault(d.group, []).append(self._slot_index[d.axis])
        i = 0
        while i < len(order):
            g, n = order[i], order[i + 1]
            axes[g] = list(order[i + 2:i + 2 + n])
            i += 2 + n
        before: dict[Decision, Decision] = {  # a sharding -> its group's sharding just before it
            Shard(g, self.slots[b]): Shard(g, self.slots[a]) for g, xs in axes.items() for a, b in zip(xs, xs[1:])}
        return _merged(queues, before)

    def evaluate(self, decisions: tuple[Decision, ...]) -> Evaluation:
        """The plan's evaluation, from the cache or the cost model (which may make a new best).
        A plan scored ahead (``prefetch``) enters the cache here, when it is asked for: the
        cache, the best and its history are what scoring one plan at a time makes."""
        key = self.key(decisions)
        e = self.evals.get(key)
        if e is None:
            step, peak, host = self.ahead.pop(key, None) or raw(self.cm, decisions)
            e = self.evals[key] = Evaluation(step, peak, self.fits(peak) and host <= self.hw.host_limit, host)
            if peak < self.smallest_memory[0]:
                self.smallest_memory = (peak, decisions)
            if e.fits and (self.best is None or step < self.best.step_time * (1 - 1e-9)):
                simulation, seconds = self.progress()
                self.best = Best(step, decisions, simulation, seconds)
                self.history.append((simulation, seconds, step))
        return e

    @contextlib.contextmanager
    def scoring(self) -> Iterator[None]:
        """Work inside may score its plans on several processes (``prefetch``; one set for
        nested calls). On exit they end, and the plans they scored ahead that nobody asked
        for are forgotten."""
        if self._scoring is not None:
            yield
            return
        self._scoring = (default_processes(), time.perf_counter())
        try:
            yield
        finally:
            if self._scorers is not None:
                self._scorers.close()
                self._scorers = None
            self._scoring = None
            self.ahead.clear()

    def _open_scorers(self) -> Scorers | None:
        """The scoring processes of the work in hand (``scoring``): forked once it has taken
        ``FORK_AFTER`` seconds on this process alone (a fork and its end take tens of
        milliseconds, more than a small model's whole polish), with the cost model's memo
        tables as they are then. None while plans are scored here, one by one."""
        if self._scorers is None and self._scoring is not None:
            n, since = self._scoring
            if n >= 2 and time.perf_counter() - since >= FORK_AFTER:
                self._scorers = Scorers(self.cm, n)
        sc = self._scorers
        return sc if sc is not None and sc.processes > 1 else None

    def batch(self) -> int:
        """How many plans ``prefetch`` scores side by side now (0: none, plans are scored
        one by one): ``RUN`` per scoring process."""
        sc = self._open_scorers()
        return 0 if sc is None else RUN * sc.processes

    def unscored(self, decisions: Sequence[Decision]) -> bool:
        """Neither scored nor scored ahead."""
        k = self.key(decisions)
        return k not in self.evals and k not in self.ahead

    def prefetch(self, plans: Sequence[tuple[Decision, ...]]) -> None:
        """Score those of ``plans`` not scored yet side by side, in runs of plans next to each
        other, one run per process (``Scorers``), to be taken by ``evaluate`` when asked for;
        nothing where plans are scored one by one (``batch``)."""
        sc = self._open_scorers()
        if sc is None:
            return
        todo = {self.key(p): p for p in plans if self.unscored(p)}  # one of each plan
        if len(todo) > 1:
            self.ahead.update(zip(todo, sc.score(list(todo.values()))))

    def score(self, decisions: tuple[Decision, ...]) -> float:
        """The reward in [0, 1]: a plan that fits in [0.2, 1) by its step time against the
        reference, one over the budget below 0.2 by how far over it is."""
        e = self.evaluate(decisions)
        if e.fits:
            return 0.2 + 0.8 * self.t_ref / (self.t_ref + e.step_time)
        return 0.2 * min(1.0, self.hw.limit / e.peak, self.hw.host_limit / e.host if e.host else 1.0)

    def no_fit(self, pins: Sequence[Decision] = (), forbidden: Collection[Decision] = ()) -> str:
        """Why no plan met that honours ``pins`` and ``forbidden`` fits, for people: the limit
        that binds (the device's budget, the host's memory or both) and by how much."""
        hw = self.hw
        device_ok, host_ok, least_host, least_device = math.inf, math.inf, math.inf, math.inf
        for key, e in self.evals.items():
            if (pins or forbidden) and not self.honours(self.decisions_of(key), pins, forbidden):
                continue
            on_device, on_host = self.fits(e.peak), e.host <= hw.host_limit
            least_host, least_device = min(least_host, e.host), min(least_device, e.peak)
            if on_device and not on_host:  # the least host memory a plan within the budget needs
                device_ok = min(device_ok, e.host)
            if on_host and not on_device:  # the least device memory of a plan within the host's
                host_ok = min(host_ok, e.peak)
        if least_device == math.inf:
            return "no plan has been tried yet"
        kept = f" less its {hw.memory_margin:.0%} margin" if hw.memory_margin else ""
        host = (f"{format_bytes(hw.host_limit)} of host memory per device (the host's "
                f"{format_bytes(hw.host_memory_bytes)}{kept})")
        if device_ok < math.inf:
            return (f"host memory binds: plans within the {format_bytes(hw.budget)} per-device budget need "
                    f"{format_bytes(device_ok)} of host memory per device at the least, "
                    f"{format_bytes(device_ok - hw.host_limit)} over the {host}"
                    + (f"; within the host's memory the smallest device memory found is {format_bytes(host_ok)}"
                       if host_ok < math.inf else ""))
        limit = min(hw.limit, hw.budget / self.xla_scale)
        scaled = (f" (XLA measured this model's plans at up to {self.xla_scale:.2f}x their prediction)"
                  if self.xla_scale > 1 and limit < hw.limit else "")
        smallest = host_ok if host_ok < math.inf else least_device
        device = (f"the smallest device memory found is {format_bytes(smallest)}, "
                  f"{format_bytes(max(smallest - limit, 0.0))} over the {format_bytes(hw.budget)} per-device budget"
                  f"{kept}{scaled}")
        if host_ok < math.inf or least_host <= hw.host_limit:
            return f"device memory binds: {device}"
        return (f"device and host memory both bind: {device}; and every plan needs {format_bytes(least_host)} of "
                f"host memory per device at the least, {format_bytes(least_host - hw.host_limit)} over the {host}")

    def fits(self, peak: float) -> bool:
        """Within the budget less its margin, and within the budget once scaled by how far
        XLA has measured this model's plans above their prediction (``mark_infeasible``)."""
        return peak <= self.hw.limit and peak * self.xla_scale <= self.hw.budget

    def mark_infeasible(self, decisions: Sequence[Decision], measured_peak: float) -> None:
        """XLA measured this plan over the budget (``verify``): from now on it scores as not
        fitting. The memory model is calibrated on the way: every plan predicted within
        ``measured / predicted`` of the budget no longer fits either (XLA would put it over
        too), up to ``XLA_SCALE_CAP``: a plan XLA puts further off is an outlier of its own
        (XLA:CPU not realising one plan's recomputation at full size: T48 at sequence 2048,
        8.3 GiB predicted and 245 GiB compiled), which must not make every other plan
        infeasible. The caller then finds the best again (``rebest``)."""
        key = self.key(tuple(decisions))
        was = self.evals.get(key, Evaluation(math.inf, 0.0, False))
        if was.peak > 0:
            self.xla_scale = max(self.xla_scale, min(float(measured_peak) / was.peak, XLA_SCALE_CAP))
        self.evals[key] = Evaluation(was.step_time, max(measured_peak, self.hw.budget * (1 + 1e-9)), False)
        self.evals = {k: e._replace(fits=e.fits and self.fits(e.peak)) for k, e in self.evals.items()}

    def honours(self, decisions: Sequence[Decision], pins: Sequence[Decision],
                forbidden: Collection[Decision]) -> bool:
        """Whether the plan of ``decisions`` is one the pinned search may return: it takes every
        pin and no forbidden decision, and it is the plan it stays with the pins put first.
        Decisions on one slot do not commute (where two of its groups meet in one tensor the
        earlier keeps the axis), so a plan that has a pin behind another decision of its slot
        is another plan than the pinned one: ``ffn->data, batch->data`` is not ``batch->data,
        ffn->data``, and the cost model prices them apart."""
        if any(f in decisions for f in forbidden) or any(p not in decisions for p in pins):
            return False
        pinned = tuple(pins) + tuple(d for d in decisions if d not in pins)
        return self.key(pinned) == self.key(decisions)

    def rebest(self, pins: Sequence[Decision], forbidden: Collection[Decision], simulation: int,
               seconds: float) -> None:
        """The best evaluated plan that honours the pins and forbids (``honours``), pins first;
        the history starts again from it."""
        old, self.best = self.best, None
        self.history = []
        pins = tuple(pins)
        best = None
        for key, e in self.evals.items():
            if not e.fits or (best is not None and e.step_time >= best[0]):
                continue
            decisions = self.decisions_of(key)
            if self.honours(decisions, pins, forbidden):
                best = (e.step_time, decisions)
        if best is not None:
            e = None if old is None else self.evals.get(self.key(old.decisions))
            if old is not None and e is not None and e.fits and e.step_time <= best[0] \
                    and self.honours(old.decisions, pins, forbidden):
                best = (e.step_time, old.decisions)  # still the best (or as good): it keeps its order
            ordered = pins + tuple(d for d in best[1] if d not in pins)
            self.best = Best(best[0], ordered, simulation, seconds)
            self.history.append((simulation, seconds, best[0]))

    def top(self, k: int, pins: Sequence[Decision] = (), forbidden: Collection[Decision] = ()
            ) -> list[tuple[Decision, ...]]:
        """The ``k`` fastest plans that fit among those scored, honouring the pins and forbids,
        fastest first; of plans with the same predicted step time and peak (decisions that
        shard nothing differently) the first met only."""
        seen: set[tuple[float, float]] = set()
        out: list[tuple[float, tuple[Decision, ...]]] = []
        for key, e in sorted(self.evals.items(), key=lambda kv: kv[1].step_time):
            if not e.fits or (round(e.step_time, 12), round(e.peak)) in seen:
                continue
            decisions = self.decisions_of(key)
            if not self.honours(decisions, pins, forbidden):
                continue
            seen.add((round(e.step_time, 12), round(e.peak)))
            out.append((e.step_time, tuple(pins) + tuple(d for d in decisions if d not in pins)))
            if len(out) >= k:
                break
        return [d for _, d in out]

    def best_without_recompute(self) -> tuple[Decision, ...] | None:
        """The fastest plan that fits among those scored with no recompute decision."""
        best = None
        for key, e in self.evals.items():
            if e.fits and all(a == ORDER or self.space.on_group(a) for a, _ in key) and (best is None or e.step_time < best[0]):
                best = (e.step_time, key)
        return None if best is None else self.decisions_of(best[1])


def _merged(queues: list[list[Decision]], before: dict[Decision, Decision]) -> tuple[Decision, ...]:
    """The decisions of ``queues`` (one per slot) in one order: each queue's kept, and each
    decision in ``before`` after the one it names. Takes from the first queue whose next
    decision may come now; a set of queues and constraints made of one plan always has one."""
    out: list[Decision] = []
    placed: set[Decision] = set()
    heads = [0] * len(queues)

    def may_come(d: Decision) -> bool:
        return d not in before or before[d] in placed

    for _ in range(sum(map(len, queues))):
        ready = [k for k, q in enumerate(queues) if heads[k] < len(q)]
        k = next((k for k in ready if may_come(queues[k][heads[k]])), ready[0])
        out.append(queues[k][heads[k]])
        placed.add(out[-1])
        heads[k] += 1
    return tuple(out)
