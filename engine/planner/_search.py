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

``step(n, pins)`` runs n simulations from the pinned state and returns; new pins re-root the
tree there and keep every statistic that still applies; the whole search saves as JSON and
resumes (``state`` / ``from_state``; ``Session.save`` writes it).
"""

from __future__ import annotations

import dataclasses
import time
from typing import NamedTuple, Sequence

import numpy as np

from .._decisions import Decision, Shard, decision_of
from .._errors import PartexError
from .._mesh import Hardware, MeshSpec
from .._results import RootAction, SearchStats
from ..analysis._space import DecisionSpace
from ..cost import CostModel, CostReport
from ..plan._planned import default_donate
from . import STOP, Best, Evaluation, Evaluator, LocalSearch, Node, TreeSearch
from ._evaluator import ORDER
from ._pins import Pins
from ._strategies import baseline_names, strategy_decisions

# The local search runs at least this often, in new evaluations: 32 simulations score ~1000
# plans on a transformer, and ten on a U-Net of forty groups.
POLISH_EVALS = 400
KICKS = 4  # the kicks tried from one plan, best scored first (LocalSearch.kicks)


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """A plan the search found that fits: its ``decisions`` in order, their ``CostReport``,
    and when it was first found."""

    decisions: tuple[Decision, ...]
    report: CostReport
    simulation: int  # the simulation that first found it
    seconds: float  # search seconds until it was first found (time-to-best)


def search_inputs(model, mesh: MeshSpec, hardware: Hardware, *, donate=None,
                  user_shardings: str = "keep") -> tuple[CostModel, DecisionSpace]:
    """What a search runs on, for an analysed model (a ``ModelAnalysis``) on a mesh and
    hardware: its cost model (donating ``donate``, default: what the step's outputs can
    reuse) and its decision space (less what the step's own shardings fix)."""
    donate = tuple(default_donate(model.program) if donate is None else donate)
    # a pipelined step's stage axis is the stages' alone
    piped = getattr(model, "pipeline", None) is not None
    cm = CostModel(model.analysis, mesh, hardware, donate=donate, user_shardings=user_shardings,
                   reserve=(model.pipeline.axis,) if piped else (), work_flops=model.work_flops if piped else None)
    return cm, DecisionSpace(model.analysis, mesh, cm.fixed)


class Restored(NamedTuple):
    """A search read back from its ``state()``, with what it runs on and its pins."""

    cost_model: CostModel
    space: DecisionSpace
    search: "Search"
    pins: Pins


class Search:
    """MCTS over the decisions of ``space``, scored on ``cost_model``: the tree search
    (``planner.TreeSearch``) and the local search (``planner.LocalSearch``) over one
    evaluation cache (``planner.Evaluator``), with the driver and persistence. The caller
    (``Session``) owns the cost model, the space and the pins: every call that depends on
    the pins takes them (``Pins``).

    exploration: c in UCT, Q/N + c * sqrt(ln N_parent / N_child).
    rollout_width: random actions scored per rollout step (greedy among them); at least
      sqrt(legal actions).
    polish_every: every so many simulations, a first-improvement local search from the best
      plan (when it changed since the last polish).
    warm_start: score the hand strategies (dp, megatron, zero3, expert) as the first
      candidates, as PartIR composes tactics with its search; False searches from nothing.
    seed: the RNG seed; the same seed and number of simulations give the same plan.
    """

    def __init__(self, cost_model: CostModel, space: DecisionSpace, *, seed: int = 0,
                 exploration: float = 0.5, rollout_width: int = 4, polish_every: int = 32,
                 warm_start: bool = True):
        self.cm = cost_model
        self.an = cost_model.analysis
        self.mesh = cost_model.mesh
        self.hw = cost_model.hw
        self.seed = seed
        self.exploration = exploration
        self.rollout_width = rollout_width
        self.polish_every = polish_every
        self._polished: tuple = ()
        self._kick_base: tuple[Decision, ...] | None = None  # the plan the kicks start from
        self._kicks = 0  # kicks tried from it (LocalSearch.kick)
        self._polish_evals = 0  # evaluations when the local search last ran
        self._carried: set = set()  # the keys of plans carried from other searches (``consider``)
        self._deadline: float | None = None  # run(): polishing stops at the budget
        self._t0: float | None = None  # step(): when the simulations in hand began
        self.stop_requested = False  # set by request_stop() (a signal handler): run() returns
        self.rng = np.random.default_rng(seed)
        # candidate actions: groups on the mesh axes that divide them, layer stacks'
        # recompute kinds, conflicts' resolutions (DecisionSpace)
        self.space = space
        self.actions: list[Decision] = list(space.actions)
        self.simulations = 0
        self.seconds = 0.0
        self.evaluator = ev = Evaluator(cost_model, self.hw, space, self._progress)
        base = cost_model.evaluate([])
        ev.t_ref = base.step_time if base.step_time > 0 else 1e-9
        base_score = ev.score(())  # the replicated plan is a candidate too
        # Priors: how much each decision alone improves on replication. Expansion tries the
        # most promising actions first and rollouts sample in proportion to exp(prior / tau).
        prior = np.array([ev.score((d,)) - base_score for d in self.actions], dtype=np.float64)
        self.tree = TreeSearch(self.actions, prior, self.rng, score=ev.score, key=ev.key, legal=space.legal,
                               exploration=exploration, rollout_width=rollout_width, prefetch=ev.prefetch)
        self.local = LocalSearch(ev, self.actions, prior, self.mesh.axes, space.legal,
                                 stopped=lambda: self.stop_requested)
        self.warm_start = warm_start
        # PartIR composes hand tactics with the search: the expert strategies are the first
        # candidates, and the first polish starts from the best of them (and after a pin,
        # from the best of them with the pin applied: ``rebest``)
        self.hand: list[tuple[Decision, ...]] = [
            tuple(d for d in strategy_decisions(name, self.an, self.mesh, cost_model.fixed) if d in self.actions)
            for name in baseline_names(self.an)] if warm_start else []
        for dec in self.hand:
            ev.score(dec)

    def _progress(self) -> tuple[int, float]:
        """(simulations, search seconds) now: a new best records when it was met."""
        return self.simulations, self.seconds + (time.perf_counter() - self._t0 if self._t0 else 0.0)

    def _simulate(self, pins: Pins) -> None:
        with self.evaluator.scoring():  # a long simulation or polish scores on several processes
            self._simulate_here(pins)

    def _simulate_here(self, pins: Pins) -> None:
        self.tree.simulate(pins.pinned, pins.forbidden)
        self.simulations += 1
        ev = self.evaluator
        best = ev.best
        # the local search's turn: after the first simulation (from the best hand plan where
        # the search starts warm), then every polish_every simulations, or sooner where
        # rollouts are long (a model of many groups: a simulation scores a hundred plans or more)
        turn = self.simulations == 1 or self.simulations % self.polish_every == 0
        if best is None:
            return
        if best.decisions != self._polished:
            if turn or len(ev.evals) - self._polish_evals >= POLISH_EVALS:
                self._polished = best.decisions
                self.local.polish(pins.pinned, pins.forbidden, self._deadline)
                self._polish_evals = len(ev.evals)
        elif turn:  # the best is where the last polish left it: a kick, as often as a polish
            self._kick(best.decisions, pins)
            self._polish_evals = len(ev.evals)

    def probe(self, evaluations: int, pins: Pins) -> None:
        """Short descents, of at most ``evaluations`` plans scored each, from the best plan
        this search met itself (a rollout first where none fits yet) and from the best plan
        carried to it (``consider``) where that is its best: how far a candidate gets in a
        little time on its own and near the best plans found elsewhere, reproducibly (a
        count of plans, not seconds). A mesh whose own start is poor (no hand plan fits it)
        but which takes the incumbent's plan one axis further is seen to."""
        ev = self.evaluator
        start = self._own_best()
        if start is None:  # a rollout first, as a simulation's: most often it finds a plan that fits
            self.tree.simulate(pins.pinned, pins.forbidden)
            start = self._own_best()
        carried = ev.best.decisions if ev.best is not None and ev.key(ev.best.decisions) in self._carried else None
        for plan in (start, carried):
            if plan is not None and all(p in plan for p in pins.pinned):
                self.local.descend(tuple(plan), lambda d: -ev.score(d), len(pins.pinned), pins.forbidden, None,
                                   budget=int(evaluations))

    def _own_best(self) -> tuple[Decision, ...] | None:
        """The fastest plan that fits among those this search met itself (none carried from
        elsewhere by ``consider``)."""
        ev = self.evaluator
        b = ev.best
        if b is not None and ev.key(b.decisions) not in self._carried:
            return b.decisions
        own = [(e.step_time, k) for k, e in ev.evals.items() if e.fits and k not in self._carried]
        return ev.decisions_of(min(own)[1]) if own else None

    def _kick(self, best: tuple[Decision, ...], pins: Pins) -> None:
        """The next kick (``LocalSearch.kick``) from the kick base: the best plan when the
        kicks of the base before ran out (a kick that finds a slightly better plan does not
        start the list again: the one after it may find a much better one). Once every kick
        from the best was tried (the ``KICKS`` best scored), the tree search has the time
        until the best moves."""
        args = (len(pins.pinned), pins.forbidden, self._deadline)
        if self._kick_base is None:
            self._kick_base, self._kicks = best, 0
        if self._kicks >= KICKS or not self.local.kick(self._kick_base, self._kicks, *args):
            if self._kick_base == best:
                return
            self._kick_base, self._kicks = best, 0
            if not self.local.kick(best, 0, *args):
                return
        self._kicks += 1

    @property
    def smallest_memory(self) -> tuple[float, tuple[Decision, ...]]:
        """The smallest predicted peak met so far, and its plan."""
        return self.evaluator.smallest_memory

    # ------------------------------------------------------------------ public API
    def step(self, n: int, pins: Pins) -> None:
        """Run n simulations from the pinned state."""
        self._t0 = time.perf_counter()
        try:
            for _ in range(n):
                if self._deadline is not None and time.perf_counter() > self._deadline:
                    break
                self._simulate(pins)
        finally:
            self.seconds += time.perf_counter() - self._t0
            self._t0 = None

    def request_stop(self) -> None:
        """Ask a running ``run`` to return after the simulation in hand. Safe to call from a
        signal handler: it only sets a flag (raising there can be swallowed when the signal
        lands inside a garbage-collector callback)."""
        self.stop_requested = True
        self._deadline = time.perf_counter()

    def run(self, seconds: float, pins: Pins, chunk: int = 16, callback=None, simulations: int | None = None) -> None:
        """Simulate for about ``seconds`` (in chunks; callback(self) after each), or until
        ``simulations`` more have run where that comes first."""
        end = time.perf_counter() + seconds
        self._deadline = end
        left = float("inf") if simulations is None else int(simulations)
        try:
            while left > 0 and time.perf_counter() < end and not self.stop_requested:
                n = int(min(chunk, left))
                before = self.simulations
                self.step(n, pins)
                left -= self.simulations - before
                if callback is not None:
                    callback(self)
        finally:
            self._deadline = None

    def settle(self, seconds: float, pins: Pins) -> bool:
        """The local search's last word on the best plan: its polish (where the last polish
        did not start from it), then its kicks (``KICKS``, best scored first), and again
        from any better plan a kick finds, until none improves it or ``seconds`` pass. Where
        the descent stopped short, a kick most often finds the better plan that simulations
        would reach only at the next local-search turn. True where the best moved."""
        ev = self.evaluator
        first = ev.best
        if first is None:
            return False
        self._t0 = time.perf_counter()
        self._deadline = end = self._t0 + seconds
        args = (len(pins.pinned), pins.forbidden, end)
        best = first.decisions
        try:
            while not self.stop_requested and time.perf_counter() < end:
                if best != self._polished:
                    self._polished = best
                    self.local.polish(pins.pinned, pins.forbidden, end)
                elif not any(self._kicked(best, k, args) for k in range(KICKS)):
                    break
                best = self._best_decisions()
        finally:
            self.seconds += time.perf_counter() - self._t0
            self._t0 = self._deadline = None
        return best != first.decisions

    def _kicked(self, best: tuple[Decision, ...], k: int, args: tuple) -> bool:
        """Whether the ``k``-th kick from ``best`` (``LocalSearch.kick``) found a better plan."""
        return time.perf_counter() <= args[-1] and self.local.kick(best, k, *args) and self._best_decisions() != best

    def _best_decisions(self) -> tuple[Decision, ...]:
        b = self.evaluator.best
        assert b is not None
        return b.decisions

    def consider(self, decisions: Sequence[Decision], pins: Pins) -> tuple[tuple[Decision, ...], Evaluation]:
        """Score a plan from elsewhere (another mesh's best, translated) as a candidate of
        this search, the way the hand plans are: the pins, then each of ``decisions`` this
        space can take after those before it (the rest left out). A better plan becomes the
        best, and the next polish starts from it. Returns the plan scored and its evaluation."""
        plan = self._pinned(decisions, pins)
        self.evaluator.score(plan)
        self._carried.add(self.evaluator.key(plan))
        return plan, self.evaluator.evaluate(plan)

    def _pinned(self, decisions: Sequence[Decision], pins: Pins) -> tuple[Decision, ...]:
        """``decisions`` with the pins applied: the pins, then each of ``decisions`` this
        space can take after those before it (not forbidden, legal there; the rest left out)."""
        plan = list(pins.pinned)
        index = {d: i for i, d in enumerate(self.actions)}
        for d in decisions:
            i = index.get(d)
            if i is not None and d not in plan and i in self.space.legal(plan, pins.forbidden):
                plan.append(d)
        return tuple(plan)

    def best(self) -> SearchResult | None:
        b = self.evaluator.best
        if b is None:
            return None
        t, decisions, sim, secs = b
        return SearchResult(decisions, self.cm.evaluate(decisions, detail=True), sim, secs)

    def top(self, k: int, pins: Pins) -> list[tuple[Decision, ...]]:
        """The ``k`` fastest distinct plans that fit the search has scored (``Evaluator.top``)."""
        return self.evaluator.top(k, pins.pinned, pins.forbidden)

    def best_without_recompute(self) -> tuple[Decision, ...] | None:
        """The fastest plan that fits among those the search scored with no recompute
        decision (the bench's row beside the search's best)."""
        return self.evaluator.best_without_recompute()

    def stats(self, pins: Pins) -> SearchStats:
        tree, ev, label = self.tree, self.evaluator, self.an.decision_label
        root = tree.nodes.get(ev.key(pins.pinned))
        actions = []
        if root is not None:
            for a, key in root.children.items():
                child = tree.nodes[key]
                actions.append(RootAction("stop" if a == STOP else label(self.actions[a]), child.visits,
                                          child.value / child.visits if child.visits else 0.0))
        actions.sort(key=lambda d: -d.visits)
        return SearchStats(
            simulations=self.simulations, nodes=len(tree.nodes), depth=tree.depth(len(pins.pinned)),
            evaluations=len(ev.evals), seconds=self.seconds,
            sims_per_s=self.simulations / self.seconds if self.seconds > 0 else 0.0,
            best_step_time=ev.best.step_time if ev.best else None, best_history=tuple(ev.history),
            smallest_memory=ev.smallest_memory[0], no_fit="" if ev.best else ev.no_fit(pins.pinned, pins.forbidden), root_actions=tuple(actions),
            pins=tuple(label(p) for p in pins.pinned), forbidden=tuple(sorted(label(f) for f in pins.forbidden)))

    def mark_infeasible(self, decisions: Sequence[Decision], measured_peak: float, pins: Pins) -> None:
        """XLA measured this plan over the budget (``verify``): from now on it scores as not
        fitting (``Evaluator.mark_infeasible``), and the best plan becomes the next best that fits."""
        self.evaluator.mark_infeasible(decisions, measured_peak)
        self.rebest(pins)

    def rebest(self, pins: Pins) -> None:
        """The incumbent after the pins or forbids changed: the best plan known that honours
        them (``Evaluator.honours``: every plan scored that does, the hand plans among them),
        the previous best and the hand plans with the pins applied (``_pinned``) scored first
        as candidates, so that the search goes on from the best of them and its best never
        reads worse than a plan it knew that keeps the pins. The tree's statistics stay (the
        re-rooted subtree keeps its visits)."""
        old = self.evaluator.best
        for plan in ([old.decisions] if old is not None else []) + self.hand:
            self.evaluator.evaluate(self._pinned(plan, pins))
        self.evaluator.rebest(pins.pinned, pins.forbidden, self.simulations, self.seconds)

    # ------------------------------------------------------------------ persistence
    def state(self, pins: Pins) -> dict:
        """The whole search and its pins as plain JSON data (no pickle): the tree, the
        evaluations, the best plan, the statistics and the RNG. ``Session.save`` writes it
        in its session file; ``from_state`` restores it, checking every field."""
        best = self.evaluator.best
        return {
            "params": {"seed": self.seed, "exploration": self.exploration,
                       "rollout_width": self.rollout_width, "polish_every": self.polish_every,
                       "warm_start": self.warm_start, "donate": list(self.cm.donate)},
            "actions": [d.to_json() for d in self.actions],
            "pins": [d.to_json() for d in pins.pinned],
            "forbidden": [d.to_json() for d in sorted(pins.forbidden)],
            "nodes": [[_key_text(k), n.visits, n.value,
                       [[a, _key_text(c)] for a, c in n.children.items()], n.untried]
                      for k, n in self.tree.nodes.items()],
            "evals": [[_key_text(k), e.step_time, e.peak, e.fits, e.host] for k, e in self.evaluator.evals.items()],
            "xla_scale": self.evaluator.xla_scale,
            "simulations": self.simulations, "seconds": self.seconds,
            "history": [list(h) for h in self.evaluator.history],
            "best": None if best is None else
            [best.step_time, [d.to_json() for d in best.decisions], best.simulation, best.seconds],
            "smallest_memory": [self.smallest_memory[0], [d.to_json() for d in self.smallest_memory[1]]],
            "polished": [d.to_json() for d in self._polished],
            "kick_base": None if self._kick_base is None else [d.to_json() for d in self._kick_base],
            "kicks": self._kicks, "polish_evals": self._polish_evals,
            "rng": self.rng.bit_generator.state, "t_ref": self.evaluator.t_ref,
        }

    @classmethod
    def from_state(cls, model, mesh: MeshSpec, hardware: Hardware, state: dict, *,
                   user_shardings: str = "keep") -> Restored:
        """The cost model, space, search and pins restored from ``state()``. Raises
        ValueError / KeyError / TypeError on a state that does not fit this model and mesh
        (the caller turns them into one line)."""
        p = state["params"]
        cm, space = search_inputs(model, mesh, hardware, donate=[int(i) for i in p["donate"]],
                                  user_shardings=user_shardings)
        s = cls(cm, space, seed=int(p["seed"]), exploration=float(p["exploration"]),
                rollout_width=int(p["rollout_width"]), polish_every=int(p["polish_every"]),
                warm_start=bool(p["warm_start"]))
        saved = [_decision(x) for x in state["actions"]]
        # a state saved before its space gained decisions (a new recompute kind) resumes: its
        # actions are renumbered, and a node still expanding lists the new ones it may take
        index = {d: i for i, d in enumerate(s.actions)}
        if any(d not in index for d in saved):
            raise ValueError("it was saved for a different model or mesh (its decision space differs)")
        renumber = [index[d] for d in saved]
        added = sorted(set(range(len(s.actions))) - set(renumber))

        def action(a) -> int:
            a = int(a)
            if a == STOP:
                return a
            if not 0 <= a < len(renumber):
                raise ValueError(f"action {a!r} out of range")
            return renumber[a]

        def dec(x) -> Decision:
            d = _decision(x)
            if not space.in_range(d):
                raise ValueError(f"decision {x!r} names no group or axis of this model and mesh")
            return d

        def decs(xs) -> tuple[Decision, ...]:
            return tuple(dec(x) for x in xs)

        def key(text):
            return _key_parse(text, space)

        pins = Pins(decs(state["pins"]), frozenset(decs(state["forbidden"])))
        nodes = {}
        for k, visits, value, children, untried in state["nodes"]:
            kids = {action(a): key(c) for a, c in children}
            if untried is not None:
                untried = [action(a) for a in untried]
                if added and untried:  # the new actions it may take, tried after the rest
                    legal = set(s.tree.legal(s.evaluator.decisions_of(key(k)), pins.forbidden))
                    untried[1:1] = [a for a in added if a in legal and a not in kids]
            nodes[key(k)] = Node(int(visits), float(value), kids, untried)
        for node in nodes.values():
            for c in node.children.values():
                if c not in nodes:
                    raise ValueError("a child of the tree is missing")
        s.tree.nodes = nodes
        ev = s.evaluator
        ev.evals = {key(k): Evaluation(float(t), float(peak), bool(fits), float(host[0]) if host else 0.0)
                    for k, t, peak, fits, *host in state["evals"]}
        ev.xla_scale = float(state.get("xla_scale", 1.0))
        s.simulations, s.seconds = int(state["simulations"]), float(state["seconds"])
        ev.history = [(int(a), float(b), float(c)) for a, b, c in state["history"]]
        b = state["best"]
        ev.best = None if b is None else Best(float(b[0]), decs(b[1]), int(b[2]), float(b[3]))
        sm = state["smallest_memory"]
        ev.smallest_memory = (float(sm[0]), decs(sm[1]))
        s._polished = decs(state["polished"])
        base = state.get("kick_base")
        s._kick_base = None if base is None else decs(base)
        s._kicks, s._polish_evals = int(state.get("kicks", 0)), int(state.get("polish_evals", 0))
        rng = state["rng"]
        if not isinstance(rng, dict) or rng.get("bit_generator") != s.rng.bit_generator.state["bit_generator"]:
            raise ValueError("its RNG state is not a PCG64 state")
        s.rng.bit_generator.state = rng
        ev.t_ref = float(state["t_ref"])
        return Restored(cm, space, s, pins)


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
        if a == ORDER:
            _check_order(groups, space, text)
        elif not all(0 <= g < (space.id_count(a) if a in space.slots else 0) for g in groups):
            raise ValueError(f"tree key {text!r} names no group or axis of this model and mesh")
        key.append((a, groups))
    return tuple(key)


def _check_order(entry: tuple[int, ...], space: DecisionSpace, text: str) -> None:
    """A key's ``ORDER`` entry read back: ``group, count, slot index...`` per group, each
    group's and slot's index in range."""
    i = 0
    while i < len(entry):
        g, n = entry[i], entry[i + 1] if i + 1 < len(entry) else 0
        slots = entry[i + 2:i + 2 + n]
        if n < 2 or len(slots) != n or not 0 <= g < len(space.an.groups) \
                or not all(0 <= k < len(space.slots) for k in slots):
            raise ValueError(f"tree key {text!r} has an axis order that names no group or axis of this model "
                             "and mesh")
        i += 2 + n


def check_mesh_axes(space: DecisionSpace) -> None:
    """A mesh axis that divides no dimension a decision could shard is bad input (every
    decision on it would do nothing): Session refuses it for the CLI, the explorer and the
    API. (The search itself runs on any mesh: the property tests drive it so.)"""
    used = {d.axis for d in space.actions if isinstance(d, Shard)} | {d.axis for d in space.fixed.decisions}
    for a, n in zip(space.mesh.axes, space.mesh.sizes):
        if n > 1 and a not in used:
            raise PartexError(useless_axis(a, n, space.an), field="mesh")


def useless_axis(axis: str, n: int, an) -> str:
    """The message for a mesh axis that divides no dimension a decision could shard."""
    sizes = sorted({s for g in an.decision_groups for nd in g.named_dims for s in an.named_dims[nd].sizes if s > 1})
    good = [d for d in range(2, 4 * n + 2) if any(s % d == 0 for s in sizes)]  # near n: no scan to the largest size
    near = sorted(good, key=lambda d: (abs(d - n), d))[:2]
    hint = " or ".join(f"{axis}={d}" for d in sorted(near))
    shown = ", ".join(map(str, sizes[:8])) + (", ..." if len(sizes) > 8 else "")
    return (f"mesh axis {axis!r} (size {n}) divides no dimension of this model (sizes {shown}): "
            f"every decision on it would do nothing; " + (f"use e.g. {hint}, " if hint else "") + "or leave it out")
