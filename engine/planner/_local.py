"""Local search from the best plan, sharing the evaluator's cache with the tree search.

A first-improvement descent over single changes (``moves``), then strategic oscillation: where
the budget is tight the plans that fit form islands no chain of fitting single changes joins
(Llama at its leanest hand plan's memory: the warm start is a local optimum 8% above plans ten
changes away). The oscillation descends on step time plus a penalty on the memory over the
limit, weighted ``PENALTIES`` times the best step time per unit of relative excess, a weight
that grows: first the plan drifts over the limit to faster plans, then the penalty pulls it
back to fit elsewhere. Every fitting plan met on the way is a candidate (the evaluator keeps
the best).

Where several processes score (``Evaluator.scoring``), the descent asks for the next few plans
it will try at once (``Evaluator.prefetch``) and tries them in its own order: the same descent,
the plans of a batch scored side by side.
"""

from __future__ import annotations

import collections
import itertools
import time
from typing import Callable, Collection, Iterable, Iterator, Sequence

import numpy as np

from .._decisions import Decision, Resolve, Shard
from ._evaluator import Best, Evaluator

PENALTIES = (0.3, 1.0, 3.0, 10.0, 100.0)  # oscillate: memory penalty weights, in turn
KICK_EVALS = 200  # a kick's descent gives up after scoring this many plans
# A batch the descent asks to score ahead (``Evaluator.batch``): the first plans not scored yet
# within this many batches' worth of moves (most moves after a step are scored already)
LOOKAHEAD = 4


class LocalSearch:
    """Descent and oscillation over ``actions`` (``legal(decisions, forbidden)`` the indices
    a plan may add; ``prior`` orders them) on the mesh axes ``axes``."""

    def __init__(self, evaluator: Evaluator, actions: Sequence[Decision], prior: np.ndarray, axes: Sequence[str],
                 legal: Callable[[Sequence[Decision], Collection[Decision]], list[int]],
                 stopped: Callable[[], bool] = lambda: False):
        self.evaluator = evaluator
        self.stopped = stopped  # true once the search is asked to stop (Ctrl-C): every descent ends
        self.actions = list(actions)
        self.prior = prior
        self.axes = tuple(axes)
        self.legal = legal

    def _ahead(self, moves: Iterable) -> Iterator:
        """``moves`` in order, the plans of the next few scored side by side before they are
        tried (``Evaluator.prefetch``): a batch of the first not scored yet within
        ``LOOKAHEAD`` batches' worth of moves."""
        ev = self.evaluator
        buf: collections.deque = collections.deque()
        it = iter(moves)
        while True:
            if not buf:
                nxt = next(it, None)
                if nxt is None:
                    return
                buf.append(nxt)
            size = ev.batch()
            if size and ev.unscored(buf[0][1]):
                buf.extend(itertools.islice(it, LOOKAHEAD * size - len(buf)))
                ev.prefetch([c for _, c in buf if ev.unscored(c)][:size])
            yield buf.popleft()

    def polish(self, pins: Sequence[Decision], forbidden: Collection[Decision], deadline: float | None) -> None:
        """From the best plan: the first single change that improves it, until none does;
        then strategic oscillation and, where that found a better plan, the descent again."""
        ev = self.evaluator
        if ev.best is None:
            return
        first = len(pins)
        with self.evaluator.scoring():
            self.descend(tuple(ev.best.decisions), lambda d: -ev.score(d), first, forbidden, deadline)
            start = ev.best
            self.oscillate(start, first, forbidden, deadline)
            if ev.best is not None and ev.best.decisions != start.decisions:
                self.descend(tuple(ev.best.decisions), lambda d: -ev.score(d), first, forbidden, deadline)

    def kicks(self, current: tuple[Decision, ...], first: int, forbidden: Collection[Decision]
              ) -> list[tuple[Decision, ...]]:
        """Plans two changes away that no chain of improving single changes reaches: the axes
        of two decisions of different groups exchanged (``experts -> data, ffn -> model``
        becomes ``experts -> model, ffn -> data``; halfway, both on one axis, the plan is
        worse or does not fit), best scored first. The pins stay."""
        ev = self.evaluator
        actions = set(self.actions)
        out = []
        for i in range(first, len(current)):
            for j in range(i + 1, len(current)):
                a, b = current[i], current[j]
                if not (isinstance(a, Shard) and isinstance(b, Shard)) or a.axis == b.axis or a.group == b.group:
                    continue
                x, y = Shard(a.group, b.axis), Shard(b.group, a.axis)
                if x not in actions or y not in actions or x in forbidden or y in forbidden or x in current \
                        or y in current:
                    continue
                out.append(current[:i] + (x,) + current[i + 1:j] + (y,) + current[j + 1:])
        ev.prefetch(out)
        scores = [ev.score(c) for c in out]
        return [out[k] for k in sorted(range(len(out)), key=lambda k: -scores[k])]

    def kick(self, current: tuple[Decision, ...], k: int, first: int, forbidden: Collection[Decision],
             deadline: float | None) -> bool:
        """Iterated local search where the descent is stuck: from the ``k``-th of ``kicks``
        of ``current`` (a best plan), the descent again, for ``KICK_EVALS`` plans at most;
        every fitting plan on the way is a candidate. False where there is no ``k``-th."""
        with self.evaluator.scoring():
            kicks = self.kicks(current, first, forbidden)
            if k >= len(kicks):
                return False
            ev = self.evaluator
            self.descend(kicks[k], lambda d: -ev.score(d), first, forbidden, deadline, budget=KICK_EVALS)
        return True

    def oscillate(self, best: Best, first: int, forbidden: Collection[Decision], deadline: float | None) -> None:
        ev = self.evaluator
        t_best = best.step_time
        limit = min(ev.hw.limit, ev.hw.budget / ev.xla_scale)

        def penalised(weight):
            def objective(decisions):
                e = ev.evaluate(decisions)
                return e.step_time + weight * t_best * max(0.0, e.peak / limit - 1.0)
            return objective

        current = tuple(best.decisions)
        for weight in PENALTIES:
            current = self.descend(current, penalised(weight), first, forbidden, deadline)

    def descend(self, current: tuple[Decision, ...], objective, first: int, forbidden: Collection[Decision],
                deadline: float | None, budget: int | None = None) -> tuple[Decision, ...]:
        """First-improvement descent on ``objective`` (lower is better) over ``moves``
        until no move improves, the step limit, the deadline, ``budget`` plans scored, or
        the search is asked to stop (``stopped``); returns where it stopped.

        A move that did not improve the plan it was tried on is not tried again while the
        descent goes on (a change elsewhere seldom makes it pay: "don't look bits", as in
        2-opt); a pass that finds nothing so is repeated with every move, so that the
        descent still ends at a local optimum of all of them."""
        with self.evaluator.scoring():
            value = objective(current)
            scored = 0
            failed: set = set()
            for _ in range(4 * len(self.actions)):
                improved, full = False, not failed
                for key, cand in self._ahead(m for m in self.moves(current, first, forbidden) if m[0] not in failed):
                    scored += 1
                    if deadline is not None and time.perf_counter() > deadline \
                            or budget is not None and scored > budget or self.stopped():
                        return current
                    v = objective(cand)
                    if v < value - 1e-9 * abs(value):
                        current, value, improved = cand, v, True
                        break
                    failed.add(key)
                if not improved:
                    if full:
                        break
                    failed = set()  # nothing but the moves that failed before: try them all once more
        return current

    def moves(self, current: tuple[Decision, ...], first: int, forbidden: Collection[Decision]):
        """(move, plan) for the plans one change away, cheapest kinds first: add an action
        (in prior order), drop an unpinned decision, swap two decisions on one axis (the
        earlier keeps the axis where their groups conflict), exchange two mesh axes
        throughout, replace a decision by another action in its place (a layer stack's
        recompute by another kind too), and insert an action before a decision of its
        axis. A move names the change, not the plan (``descend``). The first ``first`` (the
        pins) stay."""
        for key, cand in self._raw_moves(current, first, forbidden):
            # a resolution stays only after a decision that shards its group (a drop, a
            # replace or an insert may leave it before one or without one)
            sharded: set[int] = set()
            kept = []
            for d in cand:
                if isinstance(d, Resolve) and d.group not in sharded:
                    continue
                if isinstance(d, Shard):
                    sharded.add(d.group)
                kept.append(d)
            cand = tuple(kept)
            if cand != current and len(cand) >= first:
                yield key, cand

    def _raw_moves(self, current: tuple[Decision, ...], first: int, forbidden: Collection[Decision]):
        legal = sorted(self.legal(current, forbidden), key=lambda a: -self.prior[a])
        for a in legal:
            yield ("add", self.actions[a]), current + (self.actions[a],)
        for i in range(first, len(current)):
            yield ("drop", current[i]), current[:i] + current[i + 1:]
        for i in range(first, len(current)):
            for j in range(i + 1, len(current)):
                if current[i].slot == current[j].slot:
                    yield (("swap", current[i], current[j]),
                           current[:i] + (current[j],) + current[i + 1:j] + (current[i],) + current[j + 1:])
        # two mesh axes exchanged in every decision (the 4-way axis for tensor parallelism and
        # the 2-way one for the batch, say): a plan no chain of single changes reaches
        axes = self.axes
        actions = set(self.actions)
        for x in range(len(axes)):
            for y in range(x + 1, len(axes)):
                swap = {axes[x]: axes[y], axes[y]: axes[x]}
                cand = current[:first] + tuple(Shard(d.group, swap.get(d.axis, d.axis)) if isinstance(d, Shard) else d
                                               for d in current[first:])
                if cand != current and len(set(cand)) == len(cand) \
                        and all(d in actions and d not in forbidden for d in cand[first:]):
                    yield ("exchange", axes[x], axes[y]), cand
        for i in range(first, len(current)):
            # what could stand in place i: legal without the decision there (another kind for
            # its layer stack, another resolution for its conflict)
            rest = current[:i] + current[i + 1:]
            for a in sorted(self.legal(rest, forbidden), key=lambda a: -self.prior[a]):
                if self.actions[a] != current[i]:
                    yield ("replace", current[i], self.actions[a]), current[:i] + (self.actions[a],) + current[i + 1:]
        for i in range(first, len(current)):
            for a in legal:
                if self.actions[a].slot == current[i].slot:
                    yield ("insert", self.actions[a], current[i]), current[:i] + (self.actions[a],) + current[i:]
