"""Incremental Monte Carlo Tree Search over ordered sharding decisions.

State: the decisions so far, pins first. Actions: (decision group, mesh axis) for the groups
worth sharding, and *stop*. Decisions on different mesh axes commute, so a state is keyed by
the ordered groups of each axis (a transposition table: the same decisions reached in
another order are one node). Selection by UCT; expansion of one untried action; a greedy
rollout that tries a few random actions per step and keeps the best improvement (cheap, as
the cost model memoises per pattern); the reward of the best plan met on the way is backed
up. Rewards sit in [0, 1]: feasible plans score in [0.2, 1) by step time against a reference
(the best hand-independent reference: the replicated plan's time), plans over the memory
budget below 0.2 by how far over they are; an infeasible plan is never returned.

``step(n)`` runs n simulations and returns; pins re-root the tree at the pinned state and
keep every statistic that still applies; the whole search saves as JSON and resumes
(``state`` / ``from_state``; ``Session.save`` writes it).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, NamedTuple, Sequence

import numpy as np

from ._decisions import Decision, Recompute, Resolve, Shard, decision_of
from ._errors import PartexError
from ._mesh import Hardware, MeshSpec
from ._planned import default_donate
from ._planning import make_plan
from ._results import RootAction, SearchStats
from ._space import DecisionSpace
from ._strategies import baseline_names, strategy_decisions
from .cost import CostModel, CostReport

# The most mark_infeasible scales every prediction by: the cost model's memory is within
# +-35% of XLA's on the plans it is checked on (1 / 0.65 ~ 1.5).
XLA_SCALE_CAP = 1.5
PENALTIES = (0.3, 1.0, 3.0, 10.0, 100.0)  # _oscillate: memory penalty weights, in turn
STOP = -1  # the stop action


@dataclasses.dataclass(frozen=True)
class SearchResult:
    decisions: tuple[Decision, ...]
    report: CostReport
    simulation: int  # the simulation that first found it
    seconds: float  # search seconds until it was first found (time-to-best)


class _Best(NamedTuple):
    """The fastest plan that fits met so far."""

    step_time: float
    decisions: tuple[Decision, ...]
    simulation: int  # the simulation that first found it
    seconds: float  # search seconds until then


@dataclasses.dataclass
class _Node:
    visits: int = 0
    value: float = 0.0  # sum of rewards
    children: dict = dataclasses.field(default_factory=dict)  # action -> child key
    untried: list | None = None  # actions not yet expanded (None: not yet listed)


class Search:
    """MCTS over decisions for one analysed model on one mesh and hardware.

    exploration: c in UCT, Q/N + c * sqrt(ln N_parent / N_child).
    rollout_width: random actions scored per rollout step (greedy among them); at least
      sqrt(legal actions).
    polish_every: every so many simulations, a first-improvement local search from the best
      plan (when it changed since the last polish).
    warm_start: score the hand strategies (dp, megatron, zero3, expert) as the first
      candidates, as PartIR composes tactics with its search; False searches from nothing.
    seed: the RNG seed; the same seed and number of simulations give the same plan.
    """

    def __init__(self, model, mesh: MeshSpec, hardware: Hardware, *, seed: int = 0,
                 exploration: float = 0.5, rollout_width: int = 4, polish_every: int = 32,
                 warm_start: bool = True, donate=None,
                 cost_model: CostModel | None = None, user_shardings: str = "keep"):
        self.model = model
        self.an = model.analysis
        self.mesh = mesh
        self.hw = hardware
        self.seed = seed
        self.exploration = exploration
        self.rollout_width = rollout_width
        self.polish_every = polish_every
        self._polished: tuple = ()
        self._deadline: float | None = None  # run(): polishing stops at the budget
        self.stop_requested = False  # set by request_stop() (a signal handler): run() returns
        self.donate = tuple(default_donate(model.program) if donate is None else donate)
        self.cm = cost_model or CostModel(self.an, mesh, hardware, donate=self.donate,
                                          user_shardings=user_shardings)
        self.rng = np.random.default_rng(seed)
        # candidate actions: groups on the mesh axes that divide them, layer stacks'
        # recompute kinds, conflicts' resolutions (DecisionSpace)
        self.space = DecisionSpace(self.an, mesh, self.cm.fixed)
        self.actions: list[Decision] = list(self.space.actions)
        self._axes = self.space.slots
        self.pins: list[Decision] = []
        self.forbidden: set[Decision] = set()
        self.xla_scale = 1.0  # XLA's / the model's memory, the most seen (mark_infeasible)
        self.nodes: dict[Any, _Node] = {}
        self._evals: dict[Any, tuple[float, float, bool]] = {}
        self.simulations = 0
        self.seconds = 0.0
        self.history: list[tuple[int, float, float]] = []  # (simulation, seconds, step time)
        self._best: _Best | None = None
        self.smallest_memory = (math.inf, ())
        base = self.cm.evaluate([])
        self.t_ref = base.step_time if base.step_time > 0 else 1e-9
        base_score = self._score(())  # the replicated plan is a candidate too
        # Priors: how much each decision alone improves on replication. Expansion tries the
        # most promising actions first and rollouts sample in proportion to exp(prior / tau).
        self.prior = np.array([self._score((d,)) - base_score for d in self.actions], dtype=np.float64)
        tau = float(self.prior.std()) if len(self.prior) else 1.0
        top = float(self.prior.max()) if len(self.prior) else 0.0
        self._weights = np.exp((self.prior - top) / (tau or 1.0)) + 1e-6
        self.warm_start = warm_start
        if warm_start:
            # PartIR composes hand tactics with the search: the expert strategies are the
            # first candidates, and the first polish starts from the best of them.

            for name in baseline_names(self.an):
                dec = tuple(d for d in strategy_decisions(name, self.an, mesh) if d in self.actions)
                self._score(dec)

    # ------------------------------------------------------------------ keys and scores
    def _key(self, decisions: Sequence[Decision]) -> tuple:
        per_axis: dict[str, list[int]] = {}
        for d in decisions:
            per_axis.setdefault(d.slot, []).append(d.id)
        return tuple((a, tuple(per_axis[a])) for a in self._axes if a in per_axis)

    def _score(self, decisions: tuple[Decision, ...]) -> float:
        t, peak, fits = self._eval(decisions)
        if fits:
            return 0.2 + 0.8 * self.t_ref / (self.t_ref + t)
        return 0.2 * min(1.0, self.hw.limit / peak)

    def _eval(self, decisions: tuple[Decision, ...]) -> tuple[float, float, bool]:
        """(step time, peak, fits), from the cache or the cost model (which may make a new best)."""
        key = self._key(decisions)
        e = self._evals.get(key)
        if e is None:
            r = self.cm.evaluate(decisions)
            e = self._evals[key] = (r.step_time, r.memory.peak, self._fits(r.memory.peak))
            if r.memory.peak < self.smallest_memory[0]:
                self.smallest_memory = (r.memory.peak, decisions)
            if e[2] and (self._best is None or r.step_time < self._best.step_time * (1 - 1e-9)):
                self._best = _Best(r.step_time, decisions, self.simulations, self.seconds + self._elapsed())
                self.history.append((self.simulations, self._best.seconds, r.step_time))
        return e

    def _elapsed(self) -> float:
        t0 = getattr(self, "_t0", None)
        return time.perf_counter() - t0 if t0 else 0.0

    # ------------------------------------------------------------------ tree
    def _legal(self, decisions: Sequence[Decision]) -> list[int]:
        taken = set(decisions)
        recomputed = {d.unit for d in decisions if isinstance(d, Recompute)}  # one kind per stack
        resolved = {d.group for d in decisions if isinstance(d, Resolve)}  # one resolution per group ...
        sharded = {d.group for d in decisions if isinstance(d, Shard)}  # ... of a group the plan shards
        return [i for i, d in enumerate(self.actions) if d not in taken and d not in self.forbidden
                and not (isinstance(d, Recompute) and d.unit in recomputed)
                and not (isinstance(d, Resolve) and (d.group in resolved or d.group not in sharded))]

    def _node(self, decisions: tuple[Decision, ...]) -> _Node:
        key = self._key(decisions)
        node = self.nodes.get(key)
        if node is None:
            node = self.nodes[key] = _Node()
        if node.untried is None:
            legal = self._legal(decisions)
            noise = self.rng.random(len(legal)) * 1e-9  # seeded tie-break
            # pop() takes from the end: the best prior last
            order = sorted(range(len(legal)), key=lambda i: (self.prior[legal[i]] + noise[i]))
            node.untried = [STOP] + [legal[i] for i in order]
        return node

    def _uct(self, parent: _Node, decisions) -> int:
        logn = math.log(max(parent.visits, 1))
        best, best_a = -math.inf, STOP
        for a, key in parent.children.items():
            if a != STOP and self.actions[a] in self.forbidden:
                continue
            child = self.nodes[key]
            if child.visits == 0:
                return a
            u = child.value / child.visits + self.exploration * math.sqrt(logn / child.visits)
            if u > best:
                best, best_a = u, a
        return best_a

    def _rollout(self, decisions: tuple[Decision, ...]) -> float:
        """Greedy-random completion: each step scores a few random actions and takes the
        best one if it improves the plan; the best reward met is returned."""
        best = self._score(decisions)
        while True:
            legal = self._legal(decisions)
            if not legal:
                return best
            # wider for bigger action spaces; sampled by prior
            k = min(max(self.rollout_width, int(math.ceil(math.sqrt(len(legal))))), len(legal))
            w = self._weights[legal]
            picks = self.rng.choice(len(legal), size=k, replace=False, p=w / w.sum())
            cand = max(((self._score(decisions + (self.actions[legal[i]],)), legal[i]) for i in picks))
            if cand[0] <= best:
                return best
            best = cand[0]
            decisions = decisions + (self.actions[cand[1]],)

    def _moves(self, current: tuple[Decision, ...]):
        """The plans one change away, cheapest kinds first: add an action (in prior order),
        drop an unpinned decision, swap two decisions on one axis (the earlier keeps the axis
        where their groups conflict), exchange two mesh axes throughout, replace a decision by
        another action in its place (a layer stack's recompute by another kind too), and
        insert an action before a decision of its axis."""
        for cand in self._raw_moves(current):
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
            if cand != current and len(cand) >= len(self.pins):
                yield cand

    def _raw_moves(self, current: tuple[Decision, ...]):
        first = len(self.pins)
        legal = sorted(self._legal(current), key=lambda a: -self.prior[a])
        for a in legal:
            yield current + (self.actions[a],)
        for i in range(first, len(current)):
            yield current[:i] + current[i + 1:]
        for i in range(first, len(current)):
            for j in range(i + 1, len(current)):
                if current[i].slot == current[j].slot:
                    yield current[:i] + (current[j],) + current[i + 1:j] + (current[i],) + current[j + 1:]
        # two mesh axes exchanged in every decision (the 4-way axis for tensor parallelism and
        # the 2-way one for the batch, say): a plan no chain of single changes reaches
        axes = self.mesh.axes
        actions = set(self.actions)
        for x in range(len(axes)):
            for y in range(x + 1, len(axes)):
                swap = {axes[x]: axes[y], axes[y]: axes[x]}
                cand = current[:first] + tuple(Shard(d.group, swap.get(d.axis, d.axis)) if isinstance(d, Shard) else d
                                               for d in current[first:])
                if cand != current and all(d in actions and d not in self.forbidden for d in cand[first:]):
                    yield cand
        for i in range(first, len(current)):
            # what could stand in place i: legal without the decision there (another kind for
            # its layer stack, another resolution for its conflict)
            rest = current[:i] + current[i + 1:]
            for a in sorted(self._legal(rest), key=lambda a: -self.prior[a]):
                if self.actions[a] != current[i]:
                    yield current[:i] + (self.actions[a],) + current[i + 1:]
        for i in range(first, len(current)):
            for a in legal:
                if self.actions[a].slot == current[i].slot:
                    yield current[:i] + (self.actions[a],) + current[i:]

    def _polish(self) -> None:
        """Local search from the best plan: take the first single change (``_moves``) that
        improves it, until none does; then strategic oscillation (``_oscillate``) and, where
        that found a better plan, the local search again from there. Its evaluations share
        the cache; a better plan found becomes the best."""
        if self._best is None:
            return
        self._descend(tuple(self._best.decisions), lambda d: -self._score(d))
        start = self._best
        self._oscillate(start)
        if self._best is not None and self._best.decisions != start.decisions:
            self._descend(tuple(self._best.decisions), lambda d: -self._score(d))

    def _oscillate(self, best: _Best) -> None:
        """Strategic oscillation: where the budget is tight the plans that fit form islands
        no chain of fitting single changes joins (Llama at its leanest hand plan's memory:
        the warm start is a local optimum 8% above plans ten changes away). The descent
        minimises step time plus a penalty on the memory over the limit, weighted
        ``PENALTIES`` times the best step time per unit of relative excess, a weight that
        grows: first the plan drifts over the limit to faster plans, then the penalty pulls
        it back to fit elsewhere. Every fitting plan met on the way is a candidate."""
        t_best = best.step_time
        limit = min(self.hw.limit, self.hw.budget / self.xla_scale)

        def penalised(weight):
            def objective(decisions):
                t, peak, _ = self._eval(decisions)
                return t + weight * t_best * max(0.0, peak / limit - 1.0)
            return objective

        current = tuple(best.decisions)
        for weight in PENALTIES:
            current = self._descend(current, penalised(weight))

    def _descend(self, current: tuple[Decision, ...], objective) -> tuple[Decision, ...]:
        """First-improvement descent on ``objective`` (lower is better) over ``_moves``
        until no move improves, the step limit, or the deadline; returns where it stopped."""
        value = objective(current)
        for _ in range(4 * len(self.actions)):
            improved = False
            for cand in self._moves(current):
                if self._deadline is not None and time.perf_counter() > self._deadline:
                    return current
                v = objective(cand)
                if v < value - 1e-9 * abs(value):
                    current, value, improved = cand, v, True
                    break
            if not improved:
                break
        return current

    def _simulate(self) -> None:
        decisions = tuple(self.pins)
        node = self._node(decisions)
        path = [node]
        while True:
            while node.untried and node.untried[-1] != STOP and self.actions[node.untried[-1]] in self.forbidden:
                node.untried.pop()
            if node.untried:
                a = node.untried.pop()
                if a == STOP:
                    reward = self._score(decisions)
                    child_key = ("stop", self._key(decisions))
                    child = self.nodes.setdefault(child_key, _Node(untried=[]))
                    node.children[STOP] = child_key
                    path.append(child)
                    break
                decisions = decisions + (self.actions[a],)
                node.children[a] = self._key(decisions)
                child = self._node(decisions)
                path.append(child)
                reward = self._rollout(decisions)
                break
            if not node.children:
                reward = self._score(decisions)
                break
            a = self._uct(node, decisions)
            if a == STOP:
                child = self.nodes[node.children[STOP]]
                path.append(child)
                reward = self._score(decisions)
                break
            decisions = decisions + (self.actions[a],)
            node = self._node(decisions)
            path.append(node)
        for n in path:
            n.visits += 1
            n.value += reward
        self.simulations += 1
        if self.simulations % self.polish_every == 0 and self._best is not None \
                and self._best.decisions != self._polished:
            self._polished = self._best.decisions
            self._polish()

    # ------------------------------------------------------------------ public API
    def step(self, n: int = 1) -> None:
        """Run n simulations."""
        self._t0 = time.perf_counter()
        try:
            for _ in range(n):
                if self._deadline is not None and time.perf_counter() > self._deadline:
                    break
                self._simulate()
        finally:
            self.seconds += time.perf_counter() - self._t0
            self._t0 = None

    def request_stop(self) -> None:
        """Ask a running ``run`` to return after the simulation in hand. Safe to call from a
        signal handler: it only sets a flag (raising there can be swallowed when the signal
        lands inside a garbage-collector callback)."""
        self.stop_requested = True
        self._deadline = time.perf_counter()

    def run(self, seconds: float, chunk: int = 16, callback=None) -> None:
        """Simulate for about ``seconds`` (in chunks; callback(stats) after each)."""
        end = time.perf_counter() + seconds
        self._deadline = end
        try:
            while time.perf_counter() < end and not self.stop_requested:
                self.step(chunk)
                if callback is not None:
                    callback(self)
        finally:
            self._deadline = None

    def best(self) -> SearchResult | None:
        if self._best is None:
            return None
        t, decisions, sim, secs = self._best
        return SearchResult(decisions, self.cm.evaluate(decisions, detail=True), sim, secs)

    def best_without_recompute(self) -> tuple[Decision, ...] | None:
        """The fastest plan that fits among those the search scored with no recompute
        decision (the bench's row beside the search's best)."""
        best = None
        for key, (t, _, fits) in self._evals.items():
            if fits and all(self.space.on_group(a) for a, _ in key) and (best is None or t < best[0]):
                best = (t, key)
        if best is None:
            return None
        return self._decisions_of(best[1])

    def _decisions_of(self, key) -> tuple[Decision, ...]:
        """The decisions of a tree key (``_key``), by slot."""
        return tuple(self.space.make(a, g) for a, gs in key for g in gs)

    def best_plan(self, strategy: str = "mcts"):
        b = self.best()
        if b is None:
            return None
        return make_plan(self.model, self.mesh, self.hw, list(b.decisions), strategy=strategy,
                         pinned=self.pins, donate=self.donate, cost_model=self.cm,
                         user_shardings=self.cm.user_shardings)

    def label(self, decision: Decision) -> str:
        return self.an.decision_label(decision)

    def stats(self) -> SearchStats:
        root = self.nodes.get(self._key(tuple(self.pins)))
        actions = []
        if root is not None:
            for a, key in root.children.items():
                child = self.nodes[key]
                actions.append(RootAction("stop" if a == STOP else self.label(self.actions[a]), child.visits,
                                          child.value / child.visits if child.visits else 0.0))
        actions.sort(key=lambda d: -d.visits)
        depth = max((sum(len(gs) for _, gs in k) for k in self.nodes if k and k[0] != "stop"), default=0)
        return SearchStats(
            simulations=self.simulations, nodes=len(self.nodes), depth=depth - len(self.pins),
            evaluations=len(self._evals), seconds=self.seconds,
            sims_per_s=self.simulations / self.seconds if self.seconds > 0 else 0.0,
            best_step_time=self._best.step_time if self._best else None, best_history=tuple(self.history),
            smallest_memory=self.smallest_memory[0], root_actions=tuple(actions),
            pins=tuple(self.label(p) for p in self.pins), forbidden=tuple(sorted(self.label(f) for f in self.forbidden)))

    # ------------------------------------------------------------------ pins
    def pin(self, d: Decision) -> Decision:
        """Fix a decision: the search keeps it, first, and never undoes it."""
        self.space.check_takeable(d)
        if d in self.forbidden:
            raise PartexError(f"cannot pin {self.label(d)}: it is forbidden (unpin the forbid first)")
        if d in self.pins:
            return d
        self.pins.append(d)
        self._invalidate_best()
        return d

    def forbid(self, d: Decision) -> Decision:
        """Never take this decision."""
        self.space.check_takeable(d)
        if d in self.pins:
            raise PartexError(f"cannot forbid {self.label(d)}: it is pinned (unpin it first)")
        self.forbidden.add(d)
        self._invalidate_best()
        return d

    def unpin(self, d: Decision) -> Decision:
        """Remove a pin or a forbid."""
        if d not in self.pins and d not in self.forbidden:
            raise PartexError(f"{self.label(d)} is neither pinned nor forbidden")
        if d in self.pins:
            self.pins.remove(d)
        self.forbidden.discard(d)
        self._invalidate_best()
        return d

    def _fits(self, peak: float) -> bool:
        """Within the budget less its margin, and within the budget once scaled by how far
        XLA has measured this model's plans above their prediction (``mark_infeasible``)."""
        return peak <= self.hw.limit and peak * self.xla_scale <= self.hw.budget

    def mark_infeasible(self, decisions: Sequence[Decision], measured_peak: float) -> None:
        """XLA measured this plan over the budget (``verify``): from now on it scores as not
        fitting, and the best plan becomes the next best that fits. The memory model is
        calibrated on the way: every plan predicted within ``measured / predicted`` of the
        budget no longer fits either (XLA would put it over too), up to ``XLA_SCALE_CAP``:
        a plan XLA puts further off is an outlier of its own (XLA:CPU not realising one
        plan's recomputation at full size: T48 at sequence 2048, 8.3 GiB predicted and 245 GiB
        compiled), which must not make every other plan infeasible."""
        key = self._key(tuple(decisions))
        t, predicted, _ = self._evals.get(key, (math.inf, 0.0, False))
        if predicted > 0:
            self.xla_scale = max(self.xla_scale, min(float(measured_peak) / predicted, XLA_SCALE_CAP))
        self._evals[key] = (t, max(measured_peak, self.hw.budget * (1 + 1e-9)), False)
        self._evals = {k: (t, p, f and self._fits(p)) for k, (t, p, f) in self._evals.items()}
        self._invalidate_best()

    def _invalidate_best(self) -> None:
        """Keep the best evaluated plan that honours the pins and forbids (statistics of
        the tree stay: the re-rooted subtree keeps its visits)."""
        old, self._best = self._best, None
        self.history = []
        pins = list(self.pins)
        best = None
        for key, (t, _, fits) in self._evals.items():
            if not fits:
                continue
            decisions = self._decisions_of(key)
            if any(p not in decisions for p in pins) or any(f in decisions for f in self.forbidden):
                continue
            if best is None or t < best[0]:
                best = (t, decisions)
        if best is not None:
            e = None if old is None else self._evals.get(self._key(old.decisions))
            if old is not None and e is not None and e[2] and e[0] <= best[0] \
                    and all(p in old.decisions for p in pins) and not any(f in old.decisions for f in self.forbidden):
                best = (e[0], old.decisions)  # still the best (or as good): it keeps its order
            ordered = tuple(pins) + tuple(d for d in best[1] if d not in pins)
            self._best = _Best(best[0], ordered, self.simulations, self.seconds)
            self.history.append((self.simulations, self.seconds, best[0]))

    # ------------------------------------------------------------------ persistence
    def state(self) -> dict:
        """The whole search as plain JSON data (no pickle): the tree, the evaluations, the
        best plan, the statistics and the RNG. ``Session.save`` writes it in its session file;
        ``from_state`` restores it, checking every field."""
        return {
            "params": {"seed": self.seed, "exploration": self.exploration,
                       "rollout_width": self.rollout_width, "polish_every": self.polish_every,
                       "warm_start": self.warm_start, "donate": list(self.donate)},
            "actions": [d.to_json() for d in self.actions],
            "pins": [d.to_json() for d in self.pins],
            "forbidden": [d.to_json() for d in sorted(self.forbidden)],
            "nodes": [[_key_text(k), n.visits, n.value,
                       [[a, _key_text(c)] for a, c in n.children.items()], n.untried]
                      for k, n in self.nodes.items()],
            "evals": [[_key_text(k), t, peak, fits] for k, (t, peak, fits) in self._evals.items()],
            "xla_scale": self.xla_scale,
            "simulations": self.simulations, "seconds": self.seconds,
            "history": [list(h) for h in self.history],
            "best": None if self._best is None else
            [self._best.step_time, [d.to_json() for d in self._best.decisions], self._best.simulation,
             self._best.seconds],
            "smallest_memory": [self.smallest_memory[0], [d.to_json() for d in self.smallest_memory[1]]],
            "polished": [d.to_json() for d in self._polished],
            "rng": self.rng.bit_generator.state, "t_ref": self.t_ref,
        }

    @classmethod
    def from_state(cls, model, mesh: MeshSpec, hardware: Hardware, state: dict, **kw) -> "Search":
        """A search restored from ``state()``. Raises ValueError / KeyError / TypeError on a
        state that does not fit this model and mesh (the caller turns them into one line)."""
        p = state["params"]
        s = cls(model, mesh, hardware, seed=int(p["seed"]), exploration=float(p["exploration"]),
                rollout_width=int(p["rollout_width"]), polish_every=int(p["polish_every"]),
                warm_start=bool(p["warm_start"]), donate=[int(i) for i in p["donate"]], **kw)
        if [_decision(x) for x in state["actions"]] != s.actions:
            raise ValueError("it was saved for a different model or mesh (its decision space differs)")
        def dec(x) -> Decision:
            d = _decision(x)
            if not s.space.in_range(d):
                raise ValueError(f"decision {x!r} names no group or axis of this model and mesh")
            return d

        def decs(xs) -> tuple[Decision, ...]:
            return tuple(dec(x) for x in xs)

        def key(text):
            return _key_parse(text, s.space)

        s.pins = list(decs(state["pins"]))
        s.forbidden = set(decs(state["forbidden"]))
        nodes = {}
        n_actions = len(s.actions)
        for k, visits, value, children, untried in state["nodes"]:
            kids = {}
            for a, c in children:
                if not (a == STOP or 0 <= int(a) < n_actions):
                    raise ValueError(f"action {a!r} out of range")
                kids[int(a)] = key(c)
            if untried is not None:
                untried = [int(a) for a in untried]
                if any(not (a == STOP or 0 <= a < n_actions) for a in untried):
                    raise ValueError("an untried action is out of range")
            nodes[key(k)] = _Node(int(visits), float(value), kids, untried)
        for node in nodes.values():
            for c in node.children.values():
                if c not in nodes:
                    raise ValueError("a child of the tree is missing")
        s.nodes = nodes
        s._evals = {key(k): (float(t), float(peak), bool(fits)) for k, t, peak, fits in state["evals"]}
        s.xla_scale = float(state.get("xla_scale", 1.0))
        s.simulations, s.seconds = int(state["simulations"]), float(state["seconds"])
        s.history = [(int(a), float(b), float(c)) for a, b, c in state["history"]]
        b = state["best"]
        s._best = None if b is None else _Best(float(b[0]), decs(b[1]), int(b[2]), float(b[3]))
        sm = state["smallest_memory"]
        s.smallest_memory = (float(sm[0]), decs(sm[1]))
        s._polished = decs(state["polished"])
        rng = state["rng"]
        if not isinstance(rng, dict) or rng.get("bit_generator") != s.rng.bit_generator.state["bit_generator"]:
            raise ValueError("its RNG state is not a PCG64 state")
        s.rng.bit_generator.state = rng
        s.t_ref = float(state["t_ref"])
        return s


def _decision(x) -> Decision:
    g, a = x
    if not isinstance(g, int) or not isinstance(a, str):
        raise TypeError(f"a decision is [group id, axis], got {x!r}")
    return decision_of(g, a)


def _key_text(key) -> str:
    """A tree key as text: 'data:3,5|model:2'; a stop node 'stop@' + its state's key."""
    if key and key[0] == "stop":
        return "stop@" + _key_text(key[1])
    return "|".join(f"{a}:{','.join(map(str, gs))}" for a, gs in key)


def _key_parse(text: str, space: DecisionSpace):
    if not isinstance(text, str):
        raise TypeError(f"a tree key is text, got {type(text).__name__}")
    if text.startswith("stop@"):
        return ("stop", _key_parse(text[5:], space))
    key = []
    for part in text.split("|") if text else ():
        a, _, gs = part.rpartition(":")
        groups = tuple(int(g) for g in gs.split(","))
        n = 0 if a not in space.slots else len(space.an.groups) if space.on_group(a) else len(space.units)
        if not all(0 <= g < n for g in groups):
            raise ValueError(f"tree key {text!r} names no group or axis of this model and mesh")
        key.append((a, groups))
    return tuple(key)


def check_mesh_axes(search: "Search") -> None:
    """A mesh axis that divides no dimension a decision could shard is bad input (every
    decision on it would do nothing): Session refuses it for the CLI, the explorer and the
    API. (The search itself runs on any mesh: the property tests drive it so.)"""
    used = {d.axis for d in search.actions if isinstance(d, Shard)} | {d.axis for d in search.cm.fixed.decisions}
    for a, n in zip(search.mesh.axes, search.mesh.sizes):
        if n > 1 and a not in used:
            raise PartexError(useless_axis(a, n, search.an), field="mesh")


def useless_axis(axis: str, n: int, an) -> str:
    """The message for a mesh axis that divides no dimension a decision could shard."""
    sizes = sorted({s for g in an.decision_groups for nd in g.named_dims for s in an.named_dims[nd].sizes if s > 1})
    good = [d for d in range(2, 4 * n + 2) if any(s % d == 0 for s in sizes)]  # near n: no scan to the largest size
    near = sorted(good, key=lambda d: (abs(d - n), d))[:2]
    hint = " or ".join(f"{axis}={d}" for d in sorted(near))
    shown = ", ".join(map(str, sizes[:8])) + (", ..." if len(sizes) > 8 else "")
    return (f"mesh axis {axis!r} (size {n}) divides no dimension of this model (sizes {shown}): "
            f"every decision on it would do nothing; " + (f"use e.g. {hint}, " if hint else "") + "or leave it out")
