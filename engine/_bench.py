"""``Session.bench``: hand plans, the Alpa-style ILP, the MCTS search and the exhaustive
optimum side by side on one session's cost model, one ``BenchRow`` per strategy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ._results import BenchRow

if TYPE_CHECKING:
    from ._session import Session


def bench(s: Session, seconds: float = 60.0, *, ilp_time: float = 30.0, simulations: int | None = None,
          callback: Callable[[Session], None] | None = None, verify: bool = False, exhaustive: int = 3,
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
        xla, xla_fits = out.memory.xla, out.fits
    best = s.best()
    st = s.stats()
    row("mcts", best.decisions if best else (), best.report if best else None,
        best.seconds if best else None, simulations=st.simulations, total_s=st.seconds,
        smallest_memory=st.smallest_memory, xla_memory_bytes=xla, xla_fits=xla_fits,
        memory_ratio=best.report.memory.peak / xla if best and xla else None)  # predicted / XLA
    if s.units:  # the best plan without recompute that the search scored
        dec = s._search.best_without_recompute()
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
            rows[k] = rows[k].with_(xla_memory_bytes=out.memory.xla, memory_ratio=out.memory.ratio,
                                    xla_fits=out.fits)
    return rows
