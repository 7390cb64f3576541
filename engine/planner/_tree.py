"""Monte Carlo Tree Search over ordered decisions, over an injected score.

A state is the decisions so far (the pins first); its actions are the legal decisions and
*stop*. States are keyed as the evaluator keys plans, so the same decisions reached in another
order are one node (a transposition table). Selection by UCT; expansion of one untried action
(the best prior last, so first); a greedy rollout that scores a few actions sampled by prior
per step and keeps the best improvement; the best reward met on the way is backed up.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Collection, Sequence

import numpy as np

from .._decisions import Decision
from ._evaluator import ORDER

STOP = -1  # the stop action


@dataclasses.dataclass
class Node:
    visits: int = 0
    value: float = 0.0  # sum of rewards
    children: dict = dataclasses.field(default_factory=dict)  # action -> child key
    untried: list | None = None  # actions not yet expanded (None: not yet listed)


class TreeSearch:
    """The tree and its statistics over ``actions``. ``score(decisions)`` is the reward of a
    plan, ``key(decisions)`` its node's key, ``legal(decisions, forbidden)`` the indices of the
    actions it may take next; ``prior`` each action's gain alone, which orders expansion and weights the
    rollouts' samples (by exp(prior / its spread))."""

    def __init__(self, actions: Sequence[Decision], prior: np.ndarray, rng: np.random.Generator, *,
                 score: Callable[[tuple[Decision, ...]], float], key: Callable[[Sequence[Decision]], tuple],
                 legal: Callable[[Sequence[Decision], Collection[Decision]], list[int]], exploration: float, rollout_width: int,
                 prefetch: Callable[[Sequence[tuple[Decision, ...]]], None] = lambda plans: None):
        self.actions = list(actions)
        self.prior = prior
        self.rng = rng
        self.score, self.key, self.legal = score, key, legal
        self.prefetch = prefetch  # the plans about to be scored: scored side by side where it can
        self.exploration = exploration
        self.rollout_width = rollout_width
        self.nodes: dict[Any, Node] = {}
        tau = float(prior.std()) if len(prior) else 1.0
        top = float(prior.max()) if len(prior) else 0.0
        self.weights = np.exp((prior - top) / (tau or 1.0)) + 1e-6

    def node(self, decisions: tuple[Decision, ...], forbidden: Collection[Decision]) -> Node:
        key = self.key(decisions)
        node = self.nodes.get(key)
        if node is None:
            node = self.nodes[key] = Node()
        if node.untried is None:
            legal = self.legal(decisions, forbidden)
            noise = self.rng.random(len(legal)) * 1e-9  # seeded tie-break
            # pop() takes from the end: the best prior last
            order = sorted(range(len(legal)), key=lambda i: (self.prior[legal[i]] + noise[i]))
            node.untried = [STOP] + [legal[i] for i in order]
        return node

    def uct(self, parent: Node, forbidden: Collection[Decision]) -> int:
        logn = math.log(max(parent.visits, 1))
        best, best_a = -math.inf, STOP
        for a, key in parent.children.items():
            if a != STOP and self.actions[a] in forbidden:
                continue
            child = self.nodes[key]
            if child.visits == 0:
                return a
            u = child.value / child.visits + self.exploration * math.sqrt(logn / child.visits)
            if u > best:
                best, best_a = u, a
        return best_a

    def rollout(self, decisions: tuple[Decision, ...], forbidden: Collection[Decision]) -> float:
        """Greedy-random completion: each step scores a few random actions and takes the
        best one if it improves the plan; the best reward met is returned."""
        best = self.score(decisions)
        while True:
            legal = self.legal(decisions, forbidden)
            if not legal:
                return best
            # wider for bigger action spaces; sampled by prior
            k = min(max(self.rollout_width, int(math.ceil(math.sqrt(len(legal))))), len(legal))
            w = self.weights[legal]
            picks = self.rng.choice(len(legal), size=k, replace=False, p=w / w.sum())
            plans = [decisions + (self.actions[legal[i]],) for i in picks]
            self.prefetch(plans)
            cand = max((self.score(plan), legal[i]) for plan, i in zip(plans, picks))
            if cand[0] <= best:
                return best
            best = cand[0]
            decisions = decisions + (self.actions[cand[1]],)

    def simulate(self, root: tuple[Decision, ...], forbidden: Collection[Decision]) -> None:
        """One simulation from the state ``root`` (the pins): select, expand, roll out, back up."""
        decisions = root
        node = self.node(decisions, forbidden)
        path = [node]
        while True:
            while node.untried and node.untried[-1] != STOP and self.actions[node.untried[-1]] in forbidden:
                node.untried.pop()
            if node.untried:
                a = node.untried.pop()
                if a == STOP:
                    reward = self.score(decisions)
                    child_key = ("stop", self.key(decisions))
                    child = self.nodes.setdefault(child_key, Node(untried=[]))
                    node.children[STOP] = child_key
                    path.append(child)
                    break
                decisions = decisions + (self.actions[a],)
                node.children[a] = self.key(decisions)
                child = self.node(decisions, forbidden)
                path.append(child)
                reward = self.rollout(decisions, forbidden)
                break
            if not node.children:
                reward = self.score(decisions)
                break
            a = self.uct(node, forbidden)
            if a == STOP:
                child = self.nodes[node.children[STOP]]
                path.append(child)
                reward = self.score(decisions)
                break
            decisions = decisions + (self.actions[a],)
            node = self.node(decisions, forbidden)
            path.append(node)
        for n in path:
            n.visits += 1
            n.value += reward

    def depth(self, pins: int) -> int:
        """The deepest state the tree holds, in decisions beyond the ``pins`` first."""
        return max((sum(len(gs) for a, gs in k if a != ORDER) for k in self.nodes if k and k[0] != "stop"),
                   default=0) - pins
