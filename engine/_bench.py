"""``Session.bench``: hand plans, the Alpa-style ILP, the MCTS search and the exhaustive
optimum side by side on one session's cost model, one ``BenchRow`` per strategy.

``SessionBench`` holds the ``Session``'s methods for the baselines beside the search (the
ILP, the exhaustive optimum, the bench) over what a session offers (``Benched``); this
module imports no session.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, overload

from ._mesh import Hardware
from ._options import as_hardware
from ._results import BenchRow, SearchStats, VerifyReport
from .cost import CostModel
from .planner._exhaustive import ExhaustiveResult, exhaustive, exhaustive_limits, space_size
from .planner._ilp import ILPResult, solve_ilp


class Benched(Protocol):
    """What the bench needs of a session (``partex.Session`` is one): its hand plans, the
    ILP, the search, the exhaustive optimum, its plans and XLA's check of them."""

    hardware: Hardware

    @property
    def units(self) -> Any: ...

    @property
    def cost_model(self) -> CostModel: ...

    @property
    def actions(self) -> Sequence: ...

    def baselines(self) -> dict: ...

    def ilp(self, time_limit: float = 30.0) -> Any: ...

    def step(self, n: int = 1) -> Any: ...

    def run(self, seconds: float, callback: Any = None) -> Any: ...

    def best(self) -> Any: ...

    def stats(self) -> SearchStats: ...

    def best_without_recompute(self) -> Any: ...

    def verified_best(self) -> tuple[Any, VerifyReport]: ...

    def exhaustive_size(self, per_axis: int = 3) -> int: ...

    def exhaustive(self, per_axis: int = 3, *, seconds: float | None = None) -> Any: ...

    def plan(self, decisions: Any = None, *, strategy: str | None = None) -> Any: ...

    def verify_all(self, plans: Sequence[Any]) -> list[VerifyReport]: ...


class SessionBench:
    """The ``Session``'s methods that score plans beside its search: the ILP, the exhaustive
    optimum, and the bench of them all."""

    def ilp(self: Benched, time_limit: float = 30.0) -> ILPResult:
        """The Alpa-style ILP baseline's plan on this session's cost model, ``time_limit``
        seconds of MILP solving in all (an ``ILPResult``: decisions, report, status, solve
        seconds)."""
        return solve_ilp(self.cost_model, time_limit=time_limit)

    def exhaustive_size(self: Benched, per_axis: int = 3) -> int:
        """How many plans of at most ``per_axis`` decisions per mesh axis ``exhaustive``
        would score."""
        return space_size(self.cost_model, self.actions, per_axis)

    @overload
    def exhaustive(self, per_axis: int = 3, *, seconds: float | None = None,
                   budgets: None = None) -> ExhaustiveResult: ...

    @overload
    def exhaustive(self, per_axis: int = 3, *, seconds: float | None = None,
                   budgets: Sequence[str | float]) -> list[ExhaustiveResult]: ...

    def exhaustive(self, per_axis: int = 3, *, seconds: float | None = None,
                   budgets: Sequence[str | float] | None = None) -> ExhaustiveResult | list[ExhaustiveResult]:
        """The true optimum over every plan of at most ``per_axis`` decisions per mesh axis
        (the actions the search takes): an ``ExhaustiveResult``. With ``budgets`` (per-device
        memory budgets, the hardware's margin kept free of each), one result per budget from
        one pass. ``seconds``: give up once the first plans project the space past it."""
        me: Benched = self  # type: ignore[assignment]
        if budgets is None:
            return exhaustive(me.cost_model, me.actions, per_axis, seconds=seconds)
        limits = [as_hardware(me.hardware, b).limit for b in budgets]
        return exhaustive_limits(me.cost_model, me.actions, limits, per_axis, seconds=seconds)

    def bench(self: Benched, seconds: float = 60.0, *, ilp_time: float = 30.0, simulations: int | None = None,
              callback: Callable[[Any], None] | None = None, verify: bool = False,
              exhaustive: int = 3, exhaustive_limit: int = 200_000,
              exhaustive_seconds: float | None = None) -> list[BenchRow]:
        """Hand plans, the Alpa-style ILP and the MCTS search side by side, on this cost
        model: one row per strategy (step time, MFU, memory, fits, search seconds); where
        the step has layer stacks to recompute, the hand plans again with every layer
        rematerialised (``+remat``) and the best plan without recompute that the search
        scored (``mcts-no-remat``). The search runs ``simulations`` simulations if given
        (reproducible), else ``seconds``. Where the space of plans with at most
        ``exhaustive`` decisions per mesh axis holds at most ``exhaustive_limit`` plans, an
        ``exhaustive`` row gives its optimum (0: no such row); a larger space gets the row
        with its size and no plan, and so does a space whose first plans project it past
        ``exhaustive_seconds`` (``projected_s``). ``ilp_time``: the ILP's ``time_limit``.
        With ``verify``, XLA checks the search's best plan (``verified_best``) and compiles
        every other row's plan, each row gaining XLA's memory and fits. ``callback(session)``
        as ``run``'s. Returns the ``BenchRow``s."""
        return bench(self, seconds, ilp_time=ilp_time, simulations=simulations, callback=callback, verify=verify,
                     exhaustive=exhaustive, exhaustive_limit=exhaustive_limit, exhaustive_seconds=exhaustive_seconds)


def bench(s: Benched, seconds: float = 60.0, *, ilp_time: float = 30.0, simulations: int | None = None,
          callback: Callable[[Any], None] | None = None, verify: bool = False, exhaustive: int = 3,
          exhaustive_limit: int = 200_000, exhaustive_seconds: float | None = None) -> list[BenchRow]:
    """``Session.bench`` (its docstring says what each row is), on the session ``s``."""
    rows: list[BenchRow] = []

    def row(name, decisions, report, search_s, **extra):
        rows.append(BenchRow.make(name, decisions, report, search_s, **extra))

    for name, c in s.baselines().items():
        row(name, c.decisions, c.report, 0.0)
    ilp = s.ilp(ilp_time)
    row("ilp", ilp.decisions, ilp.report, ilp.solve_seconds, status=ilp.status, build_s=ilp.build_seconds)
    if simulations is not None:
        s.step(simulations)
    else:
        s.run(seconds, callback=callback)
    xla = xla_fits = None
    if verify and s.best() is not None:
        _, out = s.verified_best()
        xla, xla_fits = out.xla_memory.get("device", out.memory.xla), out.fits  # XLA's device part
    best = s.best()
    st = s.stats()
    row("mcts", best.decisions if best else (), best.report if best else None,
        best.seconds if best else None, simulations=st.simulations, total_s=st.seconds,
        smallest_memory=st.smallest_memory, xla_memory_bytes=xla, xla_fits=xla_fits,
        memory_ratio=best.report.memory.peak / xla if best and xla else None)  # predicted / XLA
    if s.units:  # the best plan without recompute that the search scored
        dec = s.best_without_recompute()
        row("mcts-no-remat", dec or (), s.cost_model.evaluate(dec, detail=True) if dec else None, None)
    if exhaustive > 0:
        size = s.exhaustive_size(exhaustive)
        if size <= exhaustive_limit:
            ex = s.exhaustive(exhaustive, seconds=exhaustive_seconds)
            if ex.complete:
                row("exhaustive", ex.decisions, ex.report, ex.seconds, plans=ex.plans, space=ex.space,
                    per_axis=exhaustive, complete=True)
            else:
                row("exhaustive", (), None, None, plans=ex.plans, space=ex.space, per_axis=exhaustive,
                    complete=False, projected_s=ex.projected_s)
        else:
            row("exhaustive", (), None, None, plans=0, space=size, per_axis=exhaustive, complete=False)
    if verify:  # every other row's plan too, compile-only, in one process
        others = [k for k, r in enumerate(rows) if r.strategy != "mcts" and r.memory_bytes is not None]
        outs = s.verify_all([s.plan(list(rows[k].decisions), strategy=rows[k].strategy) for k in others])
        for k, out in zip(others, outs):
            rows[k] = rows[k].with_(xla_memory_bytes=out.xla_memory.get("device", out.memory.xla),
                                    memory_ratio=out.memory.ratio, xla_fits=out.fits)
    return rows
