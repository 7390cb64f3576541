"""A stand-in for ``engine._search.Search`` while that module is being written.

The explorer imports ``engine._search.Search`` when it exists and this class otherwise
(see ``explorer._engine.Search``); the two share one interface, so nothing else in the
explorer knows which one it drives. This is a small UCT search over (group, axis)
decisions with random rollouts and a transposition table keyed by the decision set; it is
good enough to drive the UI and its tests, not a replacement for the engine's search.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
import random
import time

from engine import PartexError, analyze_model
from engine._cost import CostModel, CostReport
from engine._plan import Plan, default_donate, make_plan

Decision = tuple[int, str]
STOP = (-1, "")  # the action that ends a plan


@dataclasses.dataclass(frozen=True)
class SearchResult:
    decisions: tuple[Decision, ...]
    report: CostReport
    simulation: int
    seconds: float


@dataclasses.dataclass
class _Node:
    visits: int = 0
    value: float = 0.0
    children: dict = dataclasses.field(default_factory=dict)  # action -> child key


class Search:
    """Incremental UCT search. Not thread-safe: call it from one thread at a time.

    c: exploration constant in UCT. rollout_stop: probability that a random rollout stops
    after each extra decision.
    """

    def __init__(self, res, mesh, hw, seed: int = 0, *, c: float = 1.0, rollout_stop: float = 0.4):
        self.res, self.mesh, self.hw, self.seed = res, mesh, hw, seed
        self.c, self.rollout_stop = c, rollout_stop
        an = res.analysis
        self.donate = default_donate(res.program)
        self.cm = CostModel(an, mesh, hw, donate=self.donate)
        self.actions = [(g.id, a) for g in an.decision_groups for a in mesh.axes]
        self.rng = random.Random(seed)
        self._pins: list[Decision] = []
        self._forbidden: set[Decision] = set()
        self.ref_time = self.cm.evaluate([]).step_time or 1e-9
        self._simulations = 0
        self._evaluations = 0
        self._seconds = 0.0
        self._best: SearchResult | None = None
        self._history: list[list[float]] = []
        self._smallest = math.inf
        self._recent: list[tuple[int, float]] = []
        self._nodes: dict[frozenset, _Node] = {}
        self._root = frozenset()
        self._nodes[self._root] = _Node()

    # ------------------------------------------------------------------ decisions
    def _group_id(self, group) -> int:
        an = self.res.analysis
        if isinstance(group, int) and 0 <= group < len(an.groups):
            return group
        g = an.group_by_label(str(group))
        if g is None:
            raise PartexError(f"unknown group {group!r}; groups: {', '.join(x.label for x in an.decision_groups)}")
        return g.id

    def _decision(self, group, axis) -> Decision:
        self.mesh.index(axis)
        return (self._group_id(group), axis)

    def label(self, decision: Decision) -> str:
        g, a = decision
        return f"{self.res.analysis.groups[g].label}->{a}"

    @property
    def pins(self) -> list[Decision]:
        return list(self._pins)

    @property
    def forbidden(self) -> set[Decision]:
        return set(self._forbidden)

    def pin(self, group, axis) -> None:
        d = self._decision(group, axis)
        if d in self._forbidden:
            raise PartexError(f"{self.label(d)} is forbidden: unforbid it before pinning it")
        if d not in self._pins:
            self._pins.append(d)
        self._reroot()

    def forbid(self, group, axis) -> None:
        d = self._decision(group, axis)
        if d in self._pins:
            raise PartexError(f"{self.label(d)} is pinned: unpin it before forbidding it")
        self._forbidden.add(d)
        self._reroot()

    def unpin(self, group, axis) -> None:
        d = self._decision(group, axis)
        if d in self._pins:
            self._pins.remove(d)
        elif d in self._forbidden:
            self._forbidden.discard(d)
        else:
            raise PartexError(f"{self.label(d)} is neither pinned nor forbidden")
        self._reroot()

    def _reroot(self) -> None:
        """Re-root the tree at the pinned state; keep the statistics of known states."""
        self._root = frozenset(self._pins)
        self._nodes.setdefault(self._root, _Node())
        best = self._best
        if best is not None and (not set(self._pins) <= set(best.decisions)
                                 or set(best.decisions) & self._forbidden):
            self._best = None
        self._consider(list(self._pins))

    # ------------------------------------------------------------------ search
    def _legal(self, decisions: list[Decision]) -> list[Decision]:
        taken = set(decisions)
        return [d for d in self.actions if d not in taken and d not in self._forbidden] + [STOP]

    def _consider(self, decisions: list[Decision]) -> float:
        report = self.cm.evaluate(decisions)
        self._evaluations += 1
        self._smallest = min(self._smallest, report.memory.peak)
        if not report.fits:
            return 0.0
        if self._best is None or report.step_time < self._best.report.step_time:
            self._best = SearchResult(tuple(decisions), report, self._simulations, self._seconds)
            self._history.append([self._simulations, round(self._seconds, 4), report.step_time])
        return self.ref_time / (self.ref_time + report.step_time)

    def _simulate(self) -> None:
        decisions = list(self._pins)
        key = self._root
        path = [key]
        while True:
            node = self._nodes[key]
            legal = self._legal(decisions)
            untried = [a for a in legal if a not in node.children]
            if untried:
                action = self.rng.choice(untried)
            else:
                logn = math.log(node.visits + 1)
                action = max(legal, key=lambda a: self._uct(node, a, logn))
            if action == STOP:
                node.children.setdefault(STOP, None)
                break
            decisions.append(action)
            child = frozenset(decisions)
            node.children[action] = child
            fresh = child not in self._nodes
            self._nodes.setdefault(child, _Node())
            path.append(child)
            key = child
            if fresh:
                break
        # random rollout from the new state
        rollout = list(decisions)
        while self.rng.random() > self.rollout_stop:
            legal = self._legal(rollout)[:-1]
            if not legal:
                break
            rollout.append(self.rng.choice(legal))
        reward = self._consider(rollout)
        for k in path:
            n = self._nodes[k]
            n.visits += 1
            n.value += reward
        self._simulations += 1

    def _uct(self, node: _Node, action: Decision, logn: float) -> float:
        child = node.children.get(action)
        if child is None:  # STOP: its value is the parent's own plan
            return node.value / max(node.visits, 1)
        n = self._nodes[child]
        if n.visits == 0:
            return math.inf
        return n.value / n.visits + self.c * math.sqrt(logn / n.visits)

    def step(self, n: int = 1) -> None:
        t0 = time.perf_counter()
        for _ in range(int(n)):
            self._simulate()
        dt = time.perf_counter() - t0
        self._seconds += dt
        self._recent = (self._recent + [(int(n), dt)])[-20:]

    # ------------------------------------------------------------------ results
    def best(self) -> SearchResult | None:
        return self._best

    def best_plan(self) -> Plan | None:
        if self._best is None:
            return None
        return make_plan(self.res, self.mesh, self.hw, list(self._best.decisions), strategy="search",
                         pinned=self._pins, donate=self.donate, cost_model=self.cm)

    def stats(self) -> dict:
        sims = sum(n for n, _ in self._recent)
        secs = sum(t for _, t in self._recent)
        root = self._nodes[self._root]
        actions = []
        for a, child in root.children.items():
            if child is None:
                continue
            n = self._nodes[child]
            actions.append({"action": self.label(a), "visits": n.visits,
                            "value": n.value / n.visits if n.visits else 0.0})
        actions.sort(key=lambda r: -r["visits"])
        return {
            "simulations": self._simulations,
            "nodes": len(self._nodes),
            "depth": max((len(k) for k in self._nodes), default=0) - len(self._root),
            "sims_per_s": sims / secs if secs > 0 else 0.0,
            "evaluations": self._evaluations,
            "smallest_memory": self._smallest if math.isfinite(self._smallest) else None,
            "best_history": [list(h) for h in self._history],
            "root_actions": actions,
        }

    # ------------------------------------------------------------------ persistence
    def save(self, path) -> None:
        m = self.res.model
        config = dataclasses.asdict(m.config) if dataclasses.is_dataclass(m.config) else {}
        state = {k: v for k, v in self.__dict__.items() if k not in ("res", "cm")}
        state["model"] = (m.name, m.preset, [f"{k}={v}" for k, v in config.items()])
        with open(path, "wb") as f:
            pickle.dump(state, f)

    @classmethod
    def load(cls, path) -> "Search":
        with open(path, "rb") as f:
            state = pickle.load(f)
        name, preset, overrides = state.pop("model")
        res = analyze_model(name, preset=preset, overrides=overrides if preset != "custom" else None)
        self = cls.__new__(cls)
        self.__dict__.update(state)
        self.res = res
        self.cm = CostModel(res.analysis, self.mesh, self.hw, donate=self.donate)
        return self
