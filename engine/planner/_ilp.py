"""An Alpa-style ILP baseline: one sharding strategy per decision group, pairwise
resharding/interaction costs on the edges between groups that meet in tensors, and a memory
constraint, solved with ``scipy.optimize.milp`` (HiGHS).

Alpa chooses one strategy per op with resharding costs on the producer/consumer edges. partex
decides per *group* (named dimensions with one role, see ``_analysis``), so the ILP does too:

- a binary x[g, s] per decision group g and strategy s: unsharded, one mesh axis, or (on a
  mesh with 2+ axes) an ordered pair of axes (major, minor); exactly one s per group;
  strategies the group's size is not divisible by are skipped;
- the objective and the memory row are linearised from the analytic cost model by finite
  differences around a reference plan (first: everything replicated): the change of the
  step time / peak memory when one group alone switches to s, plus, for the groups that
  co-occur in the most bytes of tensors, the interaction of two switches
  ``f(both) - f(g alone) - f(h alone) + f(ref)``, carried by a continuous y[g,s,h,t] in
  [0, 1] tied to x[g,s]·x[h,t] (y >= x_gs + x_ht - 1, y <= x_gs, y <= x_ht: exact for binary
  x, whatever the signs of its time and memory coefficients);
- memory: ``m(ref) + Σ Δm·x + Σ I_m·y <= budget - margin``. Peak memory is a max over
  live ranges, not a sum, so the row is an approximation: every solution is re-scored with
  the true cost model, and one that does not fit is cut off (a no-good cut) and the margin
  grows by its overshoot before solving again;
- the objective is the step time with every collective exposed (compute + communication:
  additive over decisions, as Alpa's is); each solution is scored with the true cost model
  (collectives overlapping compute where the hardware does: ``Hardware.overlap``);
- the best plan (by the true cost model) is then used as the new reference and the model
  re-linearised around it, with a trust region (at most k groups change strategy, default
  2), a few rounds while the true step time improves: one expansion around "replicated"
  misses the interactions of 3+ groups (its predicted step times can even go negative),
  while near the reference the terms are exact (k = 2: single and pair moves of
  co-occurring groups are evaluated exactly).

Each layer stack of the forward pass (``_recompute``) is one more choice: save, or one
recompute kind, linearised like a group's strategies (with its interactions with the two
biggest groups).

Decisions come out ordered by group bytes, biggest first (the batch-like activation groups
keep their axis where two groups meet in one tensor), a pair strategy as two consecutive
decisions (major axis first).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from typing import Any, NamedTuple, Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from .._decisions import MEMORY_SPACES, Decision, Memory, Recompute, Shard
from ..analysis._types import Group
from ..cost import CostModel, CostReport

Strategy = tuple[str, ...]  # mesh axes sharding the group, major to minor (a layer stack: its recompute kind); () = none

_STATUS = {0: "optimal", 1: "time_limit", 2: "infeasible", 3: "unbounded", 4: "error"}


@dataclasses.dataclass(frozen=True)
class ILPResult:
    """The Alpa-style ILP baseline's plan (``Session.ilp``): its decisions, the cost model's
    report of them, the solver's status and the solve's size and seconds."""

    decisions: tuple[Decision, ...]  # ordered decisions for CostModel.evaluate
    report: CostReport | None  # the true cost-model evaluation (None: no fitting plan)
    status: str  # "optimal", "time_limit", "infeasible", "unbounded", "error"
    solve_seconds: float
    build_seconds: float
    variables: int  # of the largest MILP solved
    constraints: int
    evaluations: int = 0  # cost-model evaluations made
    solves: int = 0  # MILPs solved (memory rounds x re-linearisations)
    predicted_time: float | None = None  # the linear model's step time for the result
    message: str = ""

    def to_json(self) -> dict:
        """Every field as JSON data (decisions as ``Decision.to_json``, the report as ``CostReport.to_json``)."""
        return {
            "decisions": [d.to_json() for d in self.decisions],
            "status": self.status,
            "solve_seconds": self.solve_seconds,
            "build_seconds": self.build_seconds,
            "variables": self.variables,
            "constraints": self.constraints,
            "evaluations": self.evaluations,
            "solves": self.solves,
            "predicted_time": self.predicted_time,
            "message": self.message,
            "report": self.report.to_json() if self.report is not None else None,
        }


# the most strategy pairs the groups' pair terms may take (30 pairs of 5 x 5 on two axes)
PAIR_TERMS = 1500


def group_strategies(size: int, axes: Sequence[str], axis_size: dict[str, int]) -> list[Strategy]:
    """Unsharded, each axis, and each ordered pair of axes, where ``size`` divides."""
    out: list[Strategy] = [()]
    out += [(a,) for a in axes if size % axis_size[a] == 0]
    if len(axes) >= 2:
        out += [(a, b) for a, b in itertools.permutations(axes, 2)
                if size % (axis_size[a] * axis_size[b]) == 0]
    return out


@dataclasses.dataclass(frozen=True)
class _UnitChoice:
    """A layer stack's recompute, or where a set of the step's state lives, as the ILP's
    one more choice."""

    id: int  # -1 - the unit's id; -1 - (number of units) - the state set's


@dataclasses.dataclass
class _Linear:
    """The model linearised around a reference plan."""

    ref: dict[int, Strategy]
    t0: float
    m0: float
    xs: list[tuple[int, Strategy]]  # variable k -> (group, strategy)
    ct: np.ndarray  # per x: Δ time
    cm: np.ndarray  # per x: Δ memory
    ys: list[tuple[int, int]]  # y variable -> (x index, x index)
    yt: np.ndarray  # per y: time interaction
    ym: np.ndarray  # per y: memory interaction


class _Rows:
    """The MILP's constraint rows, added one at a time: lo <= sum(vals * x[cols]) <= hi."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.lo: list[float] = []
        self.hi: list[float] = []

    def add(self, cols: list[int], vals: list[float], lo: float, hi: float) -> None:
        self.rows += [len(self.lo)] * len(cols)
        self.cols += cols
        self.vals += vals
        self.lo.append(lo)
        self.hi.append(hi)


class _ILP:
    def __init__(self, cm: CostModel, budget: float, max_pairs: int):
        self.cm = cm
        self.budget = budget
        an = cm.analysis
        groups = sorted(an.decision_groups, key=lambda g: (-g.bytes, g.id))
        axes = tuple(a for a in cm.mesh.axes if a not in cm.fixed.reserved)
        self.strategies = {g.id: group_strategies(g.size, axes, cm.axis_size) for g in groups}
        self.groups: list[Group | _UnitChoice] = list(groups)  # and the layer stacks' choices, below
        ids = set(self.strategies)
        pairs = [(a, b) for (a, b), n in an.cooccur.items() if a in ids and b in ids and a != b and n > 0]
        pairs.sort(key=lambda p: (-an.cooccur[p], p))
        # only pairs where both groups have a choice
        pairs = [p for p in pairs if len(self.strategies[p[0]]) > 1 and len(self.strategies[p[1]]) > 1]
        # each layer stack's recompute is one more choice (key -1 - unit): save or one kind,
        # its interaction with the two biggest groups' strategies linearised too
        # (beside the groups' own pairs, which they do not displace)
        big = [g.id for g in self.groups if len(self.strategies[g.id]) > 1][:2]
        # at most max_pairs pairs, and at most PAIR_TERMS strategy pairs in all: on meshes of
        # three or four axes a group has 10 or 17 strategies, and as many pair terms as on two
        # axes (5 each) would leave HiGHS no plan within its limit
        self.pairs, terms = [], 0
        for a, b in pairs[:max_pairs]:
            n = len(self.strategies[a]) * len(self.strategies[b])
            if self.pairs and terms + n > PAIR_TERMS:
                break
            self.pairs.append((a, b))
            terms += n
        for u in cm.units:
            self.groups.append(_UnitChoice(-1 - u.id))
            self.strategies[-1 - u.id] = [(), *((k,) for k in u.kinds)]  # save, or one recompute kind
            self.pairs += [(-1 - u.id, g) for g in big]
        self._state_base = -1 - len(cm.units)  # a state set's key: this - its id
        for st in an.movable_states():  # device memory, or one other space
            self.groups.append(_UnitChoice(self._state_base - st))
            self.strategies[self._state_base - st] = [(), *((m,) for m in MEMORY_SPACES)]
        self.rank = {g.id: k for k, g in enumerate(self.groups)}
        self._cache: dict[tuple, CostReport] = {}
        self.evaluations = 0

    # ---------------------------------------------------------------- plans
    def decisions(self, plan: dict[int, Strategy]) -> tuple[Decision, ...]:
        out: list[Decision] = []
        for g in self.groups:  # a unit's key is -1 - its id, a state set's below the units'
            out += [Shard(g.id, a) if g.id >= 0 else Recompute(-1 - g.id, a) if g.id > self._state_base
                    else Memory(self._state_base - g.id, a) for a in plan.get(g.id, ())]
        return tuple(out)

    def evaluate(self, plan: dict[int, Strategy], overlap: bool | None = None) -> CostReport:
        """The plan's cost; ``overlap=False``: with every collective exposed (the sum the
        linearisation differences: additive, as Alpa's model is)."""
        overlap = self.cm.hw.overlap if overlap is None else overlap
        key = (tuple(sorted((g, s) for g, s in plan.items() if s)), overlap)
        r = self._cache.get(key)
        if r is None:
            self.evaluations += 1
            r = self._cache[key] = self.cm.evaluate(list(self.decisions(plan)), overlap=overlap)
        return r

    # ---------------------------------------------------------------- linearisation
    def linearise(self, ref: dict[int, Strategy]) -> _Linear:
        base = self.evaluate(ref, overlap=False)
        t0, m0 = base.step_time, base.memory.peak
        xs: list[tuple[int, Strategy]] = []
        ct, cmem = [], []
        index: dict[tuple[int, Strategy], int] = {}
        single: dict[tuple[int, Strategy], tuple[float, float]] = {}
        for g in self.groups:
            for s in self.strategies[g.id]:
                index[(g.id, s)] = len(xs)
                xs.append((g.id, s))
                if s == ref.get(g.id, ()):
                    ct.append(0.0)
                    cmem.append(0.0)
                    continue
                r = self.evaluate({**ref, g.id: s}, overlap=False)
                dt, dm = r.step_time - t0, r.memory.peak - m0
                single[(g.id, s)] = (dt, dm)
                ct.append(dt)
                cmem.append(dm)
        ys: list[tuple[int, int]] = []
        yt, ym = [], []
        tol_t = 1e-9 * max(t0, 1e-12)
        tol_m = 1e-9 * max(m0, 1.0)
        for g, h in self.pairs:
            for s in self.strategies[g]:
                if s == ref.get(g, ()):
                    continue
                for t in self.strategies[h]:
                    if t == ref.get(h, ()):
                        continue
                    r = self.evaluate({**ref, g: s, h: t}, overlap=False)
                    it = r.step_time - t0 - single[(g, s)][0] - single[(h, t)][0]
                    im = r.memory.peak - m0 - single[(g, s)][1] - single[(h, t)][1]
                    if abs(it) <= tol_t and abs(im) <= tol_m:
                        continue
                    ys.append((index[(g, s)], index[(h, t)]))
                    yt.append(it)
                    ym.append(im)
        return _Linear(dict(ref), t0, m0, xs, np.array(ct), np.array(cmem), ys, np.array(yt), np.array(ym))

    # ---------------------------------------------------------------- the MILP
    def solve(self, lin: _Linear, margin: float, cuts: list[list[int]], time_limit: float,
              max_changes: int | None = None, objective: str = "time"):
        nx, ny = len(lin.xs), len(lin.ys)
        n = nx + ny
        tscale = max(lin.t0, 1e-12)
        mscale = max(self.budget, 1.0)
        if objective == "time":
            c = np.concatenate([lin.ct, lin.yt]) / tscale
        else:  # peak memory (finding a plan that fits)
            c = np.concatenate([lin.cm, lin.ym]) / mscale
        rows = _Rows()
        # one strategy per group
        by_group: list[list[int]] = [[] for _ in self.groups]
        for k, (g, _) in enumerate(lin.xs):
            by_group[self.rank[g]].append(k)
        for ks in by_group:
            rows.add(ks, [1.0] * len(ks), 1.0, 1.0)
        # y = x_a * x_b
        for j, (a, b) in enumerate(lin.ys):
            y = nx + j
            rows.add([y, a, b], [1.0, -1.0, -1.0], -1.0, np.inf)  # y - xa - xb >= -1
            rows.add([y, a], [1.0, -1.0], -np.inf, 0.0)  # y - xa <= 0
            rows.add([y, b], [1.0, -1.0], -np.inf, 0.0)  # y - xb <= 0
        # memory
        mem = np.concatenate([lin.cm, lin.ym]) / mscale
        nz = np.flatnonzero(mem)
        rows.add(nz.tolist(), mem[nz].tolist(), -np.inf,
                 (self.budget - margin - lin.m0) / mscale if objective == "time" else np.inf)
        # no-good cuts: plans that the true model says do not fit
        for cut in cuts:
            rows.add(cut, [1.0] * len(cut), -np.inf, len(cut) - 1.0)
        # trust region: at most max_changes groups leave their reference strategy
        if max_changes is not None:
            keep = [k for k, (g, st) in enumerate(lin.xs) if lin.ref.get(g, ()) == st]
            rows.add(keep, [1.0] * len(keep), len(self.groups) - float(max_changes), np.inf)
        A = coo_matrix((rows.vals, (rows.rows, rows.cols)), shape=(len(rows.lo), n)).tocsr()
        integrality = np.concatenate([np.ones(nx), np.zeros(ny)])
        # per-row bounds as arrays, as scipy takes them (its stubs say float)
        constraints = LinearConstraint(A, np.array(rows.lo), np.array(rows.hi))  # pyright: ignore[reportArgumentType]
        res = milp(c, integrality=integrality, bounds=Bounds(0.0, 1.0), constraints=constraints,
                   options={"time_limit": max(time_limit, 1e-3), "disp": False})
        status = _STATUS.get(res.status, "error")
        plan = None
        pred = None
        if res.x is not None:
            x = res.x[:nx]
            plan = {}
            for k in np.flatnonzero(x > 0.5):
                g, s = lin.xs[k]
                plan[g] = s
            if res.fun is not None:
                pred = (lin.t0 + float(res.fun) * tscale if objective == "time"
                        else lin.m0 + float(res.fun) * mscale)
        return status, plan, pred, n, len(rows.lo), res.message

    def cut_of(self, lin: _Linear, plan: dict[int, Strategy]) -> list[int]:
        return [k for k, (g, s) in enumerate(lin.xs) if plan.get(g, ()) == s]


def solve_ilp(cost_model: CostModel, *, time_limit: float = 30.0, budget: float | None = None,
              max_pairs: int = 30, memory_rounds: int = 5, relinearise: int = 8,
              trust_region: int = 2) -> ILPResult:
    """Solve the Alpa-style ILP over partex's decision groups.

    time_limit: seconds of MILP solving in all (HiGHS' ``time_limit`` per solve, from what is
      left); building the model (cost-model evaluations) is not counted.
    budget: per-device memory budget in bytes; default ``cost_model.hw.budget``.
    max_pairs: the co-occurring group pairs (by bytes) that get pairwise interaction terms
      (fewer where their strategy pairs pass ``PAIR_TERMS``: meshes of more axes).
    memory_rounds: solves per linearisation when the true peak overshoots the budget.
    relinearise: at most this many extra rounds, each linearised around the best plan so far
      and limited to ``trust_region`` groups changing strategy (2: the pair terms make such a
      move exact for co-occurring groups); when a round does not improve, regions of 1 and
      trust_region + 1 are tried before stopping.

    The first MILP is the plain one: linearised around "replicated", minimum step time
    subject to the memory row, in at most half the time. If it finds no plan that fits, a feasibility phase minimises
    the linearised peak memory instead (re-linearised around its own solutions, while the
    true peak drops) until a plan fits; the time rounds then start from that plan.

    status: "optimal" (every MILP solved to optimality; the plan is the best, by the true
    cost model, of their solutions and the replicated plan), "time_limit" (a solve stopped at
    the limit; the best plan so far, if any), "infeasible" (no plan found that fits).
    """
    explicit = budget is not None
    budget = float(cost_model.hw.limit if budget is None else budget)
    d = _Rounds(_ILP(cost_model, budget, max_pairs), budget, time_limit, memory_rounds)
    rep0 = d.evaluate({})
    d.consider({}, rep0, rep0.step_time)  # replicated, where it fits
    # the first round has half the time: where its solves find no plan in it (a mesh of many
    # axes gives HiGHS many more binaries), the memory phase has the rest to find one that fits
    d.time_round({}, None, time_limit / 2)
    if d.best is None:
        stopped, d.timed_out = d.timed_out, False
        d.feasibility(rep0.memory.peak, relinearise, trust_region)
        d.timed_out |= stopped
    # local rounds: re-linearised around the best plan, a trust region on the changes; on a
    # stall, the other region sizes are tried before stopping
    sizes = [trust_region] + [k for k in (1, trust_region + 1) if k != trust_region]
    k = 0
    for _ in range(relinearise):
        if d.best is None or trust_region <= 0 or d.timed_out or k >= len(sizes):
            break
        k = 0 if d.time_round(d.best.plan, sizes[k]) else k + 1
    return d.result(explicit)


class _Best(NamedTuple):
    step_time: float
    plan: dict[int, Strategy]
    report: CostReport
    predicted: float | None  # the linear model's step time (None: from the memory phase)


class _Rounds:
    """The MILP rounds of ``solve_ilp`` over one ``_ILP``: the best plan that fits so far,
    the plans cut off for not fitting, and the time spent building and solving."""

    def __init__(self, ilp: _ILP, budget: float, time_limit: float, memory_rounds: int):
        self.ilp, self.budget, self.time_limit, self.memory_rounds = ilp, budget, time_limit, memory_rounds
        self.best: _Best | None = None
        self.bad: list[dict[int, Strategy]] = []  # plans that do not fit: cut off
        self.lowest = math.inf  # the lowest true peak of the MILP solutions
        self.build = self.solve = 0.0
        self.nvars = self.ncons = self.solves = 0
        self.timed_out = False
        self.deadline: float | None = None  # set by the first solve: building is not counted
        self.statuses: list[str] = []
        self.messages: list[str] = []

    def consider(self, plan, rep: CostReport, pred) -> bool:
        """Keep ``plan`` if it fits and is faster than the best; whether it was kept."""
        if rep.memory.peak > self.budget or not rep.memory.host <= self.ilp.cm.hw.host_limit or (self.best and rep.step_time >= self.best.step_time * (1 - 1e-9)):
            return False
        self.best = _Best(rep.step_time, dict(plan), rep, pred)
        return True

    def evaluate(self, plan) -> CostReport:
        t = time.perf_counter()
        rep = self.ilp.evaluate(plan)
        self.build += time.perf_counter() - t
        self.lowest = min(self.lowest, rep.memory.peak)
        return rep

    def linearise(self, ref) -> _Linear:
        t = time.perf_counter()
        lin = self.ilp.linearise(ref)
        self.build += time.perf_counter() - t
        return lin

    def run(self, lin: _Linear, margin: float, max_changes, objective: str, cap: float | None = None):
        """One MILP in the time left (at most ``cap`` seconds): (plan, predicted), or (None, None)."""
        if self.deadline is None:
            self.deadline = time.perf_counter() + self.time_limit
        left = self.deadline - time.perf_counter()
        if cap is not None:
            left = min(left, cap)
        if left <= 0:
            self.timed_out = True
            return None, None
        cuts = [self.ilp.cut_of(lin, p) for p in self.bad]
        t = time.perf_counter()
        status, plan, pred, nv, nc, msg = self.ilp.solve(lin, margin, cuts, left, max_changes, objective)
        self.solve += time.perf_counter() - t
        self.solves += 1
        self.nvars, self.ncons = max(self.nvars, nv), max(self.ncons, nc)
        self.statuses.append(status)
        self.messages.append(msg)
        self.timed_out |= status == "time_limit"
        return plan, pred

    def time_round(self, ref, max_changes, cap: float | None = None) -> bool:
        """Minimise step time around ref (each solve at most ``cap`` seconds); True if the
        best plan improved."""
        lin = self.linearise(ref)
        margin = 0.0
        for _ in range(self.memory_rounds):
            plan, pred = self.run(lin, margin, max_changes, "time", cap)
            if plan is None:
                return False
            rep = self.evaluate(plan)
            if rep.memory.peak <= self.budget:
                return self.consider(plan, rep, pred)
            # does not fit: cut it off and tighten the memory row by the overshoot
            self.bad.append(plan)
            margin += rep.memory.peak - self.budget
            if self.timed_out:
                return False
        return False

    def feasibility(self, peak: float, relinearise: int, trust_region: int) -> None:
        """Minimise peak memory (re-linearised around its own solutions, while the true peak
        drops) until a plan fits."""
        ref: dict[int, Strategy] = {}
        for k in range(relinearise + 1):
            plan, _ = self.run(self.linearise(ref), 0.0, None if k == 0 else trust_region, "memory")
            if plan is None:
                break
            rep = self.evaluate(plan)
            if self.consider(plan, rep, None) or rep.memory.peak >= peak or self.timed_out:
                break
            ref, peak = plan, rep.memory.peak

    def result(self, explicit: bool) -> ILPResult:
        """The result; ``explicit``: the budget was given (the report is judged against it)."""
        msg = self.messages[-1] if self.messages else "time limit before the first solve"
        common: dict[str, Any] = dict(solve_seconds=self.solve, build_seconds=self.build, variables=self.nvars,
                                      constraints=self.ncons, evaluations=self.ilp.evaluations, solves=self.solves,
                                      message=msg)
        if self.best is None:
            status = "time_limit" if self.timed_out else "infeasible"
            if self.statuses and self.statuses[-1] in ("unbounded", "error"):
                status = self.statuses[-1]
            elif status == "infeasible":
                common["message"] = (f"no plan found within the memory budget {self.budget / 2**30:.4g} GiB "
                                     f"(lowest peak reached {self.lowest / 2**30:.4g} GiB); last solve: {msg}")
            return ILPResult((), None, status, predicted_time=None, **common)
        rep = self.best.report
        if explicit and rep.budget != self.budget:
            rep = dataclasses.replace(rep, budget=self.budget, fits=rep.memory.peak <= self.budget
                                      and rep.memory.host <= self.ilp.cm.hw.host_limit)
        return ILPResult(self.ilp.decisions(self.best.plan), rep, "time_limit" if self.timed_out else "optimal",
                         predicted_time=self.best.predicted, **common)
