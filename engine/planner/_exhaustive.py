"""Exhaustive search of a small decision space: every plan with at most k decisions per mesh
axis, scored on the same cost model, so that the MCTS and the ILP can be checked against the
true optimum of that space.

A plan is, per mesh axis, an ordered sequence of decision groups. Order within an axis
matters only between two groups that *conflict* on it (a tensor holds dims of both, so the
earlier decision keeps the axis); sequences that order every conflicting pair alike give the
same shardings and are enumerated once. Different axes commute (the search's transposition
table makes the same assumption). Each layer stack's recompute (save or one kind) is one more
independent choice.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from typing import Callable, Sequence

from .._decisions import Decision, Memory, Recompute, Shard
from .._decisions import NO_DIM
from ..cost import CostModel, CostReport


@dataclasses.dataclass(frozen=True)
class ExhaustiveResult:
    """The optimum over every plan of a bounded space (``Session.exhaustive``): the best plan
    that fits and its report, how many plans were scored of how many, and the seconds."""

    decisions: tuple[Decision, ...]  # the best plan that fits (empty: replicated or none)
    report: CostReport | None  # None when no plan fits
    plans: int  # plans scored
    space: int  # plans in the space
    seconds: float
    projected_s: float = 0.0  # the time the whole space would take, as measured on the first plans

    @property
    def complete(self) -> bool:
        """True when every plan of the space was scored (the optimum is the true one)."""
        return self.plans == self.space


def conflicts(cm: CostModel) -> set[frozenset[int]]:
    """Pairs of groups that some tensor holds dims of both of (a value, or a tensor an op's
    factors span): on one axis, their order decides which keeps it."""
    pairs: set[frozenset[int]] = set()

    def add(groups) -> None:
        gs = sorted({g for g in groups if g != NO_DIM})
        pairs.update(frozenset(p) for p in itertools.combinations(gs, 2))

    for sig in cm.sigs:
        add(g for g, _ in sig)
    for pat in cm.patterns:
        by_tensor: dict[int, list[int]] = {}
        for (_, _, g), ts in zip(pat.factors, pat.slot_tensors):
            for t in ts:
                by_tensor.setdefault(t, []).append(g)
        for groups in by_tensor.values():
            add(groups)
    return pairs


def axis_sequences(groups: Sequence[int], k: int, clash: set[frozenset[int]]) -> list[tuple[int, ...]]:
    """Every sequence of at most k distinct groups, one per ordering of its conflicting pairs."""
    out: list[tuple[int, ...]] = [()]
    for r in range(1, min(k, len(groups)) + 1):
        for combo in itertools.combinations(groups, r):
            seen = set()
            for perm in itertools.permutations(combo):
                key = frozenset((perm[i], perm[j]) for i in range(r) for j in range(i + 1, r)
                                if frozenset((perm[i], perm[j])) in clash)
                if key not in seen:
                    seen.add(key)
                    out.append(perm)
    return out


def space(cm: CostModel, actions: Sequence[Decision], per_axis: int) -> list[list[tuple[Decision, ...]]]:
    """The independent choices a plan makes, each as its options: per mesh axis, its
    decision sequences; per layer stack with recompute actions, saving or one kind; per
    state set, device memory or another space."""
    clash = conflicts(cm)
    shards = [d for d in actions if isinstance(d, Shard)]
    axes = [a for a in cm.mesh.axes if any(d.axis == a for d in shards)]
    slots: list[list[tuple[Decision, ...]]] = [[tuple(Shard(g, a) for g in seq)
              for seq in axis_sequences([d.group for d in shards if d.axis == a], per_axis, clash)]
             for a in axes]
    recompute: dict[int, list[Decision]] = {}
    placed: dict[int, list[Decision]] = {}
    for d in actions:
        if isinstance(d, Recompute):
            recompute.setdefault(d.unit, []).append(d)
        elif isinstance(d, Memory):
            placed.setdefault(d.state, []).append(d)
    slots += [[(), *((d,) for d in ds)] for _, ds in sorted(recompute.items())]
    slots += [[(), *((d,) for d in ds)] for _, ds in sorted(placed.items())]
    return slots


def space_size(cm: CostModel, actions: Sequence[Decision], per_axis: int) -> int:
    return math.prod(len(s) for s in space(cm, actions, per_axis))


def exhaustive(cm: CostModel, actions: Sequence[Decision], per_axis: int = 3, *,
               seconds: float | None = None, callback: Callable[[int, int], None] | None = None) -> ExhaustiveResult:
    """Score every plan of at most ``per_axis`` decisions per mesh axis (``actions``: the
    (group, axis) pairs allowed); the fastest that fits the budget wins. ``seconds`` bounds
    the time: a space projected to take longer is left after its first plans (the result
    says how many it scored and ``projected_s``)."""
    return exhaustive_limits(cm, actions, [cm.hw.limit], per_axis, seconds=seconds, callback=callback)[0]


def exhaustive_limits(cm: CostModel, actions: Sequence[Decision], limits: Sequence[float], per_axis: int = 3, *,
                      seconds: float | None = None,
                      callback: Callable[[int, int], None] | None = None) -> list[ExhaustiveResult]:
    """``exhaustive`` for several memory limits at once (each plan is scored once): the
    fastest plan whose predicted peak is within each limit. With ``seconds``, it stops as
    soon as the plans scored so far project the whole space past it (checked every 512)."""
    slots = space(cm, actions, per_axis)
    total = math.prod(len(s) for s in slots)
    t0 = time.perf_counter()
    best: list[tuple[float, tuple[Decision, ...], CostReport] | None] = [None] * len(limits)
    n = 0
    for combo in itertools.product(*slots):
        decisions = tuple(d for part in combo for d in part)
        r = cm.evaluate(decisions)
        n += 1
        for k, limit in enumerate(limits):
            b = best[k]
            if r.memory.peak <= limit and r.memory.host <= cm.hw.host_limit and (
                    b is None or r.step_time < b[0] * (1 - 1e-9)):
                best[k] = (r.step_time, decisions, r)
        if n % 512 == 0:
            if callback is not None:
                callback(n, total)
            if seconds is not None and (time.perf_counter() - t0) * total / n > seconds:
                break
    dt = time.perf_counter() - t0
    return [ExhaustiveResult(b[1] if b else (), b[2] if b else None, n, total, dt, dt * total / max(n, 1))
            for b in best]
