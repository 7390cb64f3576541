"""XLA's checks and measurements of a session's plans: compiled (``verify``), compiled in
one process (``verify_all``), checked until one fits (``verified_best``), and run on this
machine's devices (``measure``, ``measure_top``).

A MODEL-spec session's plans go to a fresh process (``plan._verify``, ``plan._measure``)
as plan files; a function session's compile and run here. ``SessionChecks`` holds these as
the ``Session``'s methods over a few of its own (``Checked``); ``verify_plan`` and
``verify_specs`` are the CLI's too.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Any, Callable, Iterator, Protocol, Sequence

from ._errors import PartexError
from ._loader import LoadedModel, ModelSpec
from ._mesh import Hardware, format_bytes
from ._results import Measured, VerifyReport
from .plan._measure import measure, measure_loaded
from .plan._plan import Plan
from .plan._planned import resolve_decisions
from .plan._verify import verify, verify_loaded, verify_many
from .planner._search import SearchResult


@contextlib.contextmanager
def plan_files(plans: Sequence[Plan]) -> Iterator[list[str]]:
    """Each plan saved to a temporary file, for a fresh process to read; removed after."""
    paths: list[str] = []
    try:
        for p in plans:
            fd, path = tempfile.mkstemp(prefix="partex-verify-", suffix=".json")
            os.close(fd)
            paths.append(path)
            p.save(path)
        yield paths
    finally:
        for path in paths:
            with contextlib.suppress(OSError):
                os.remove(path)


def verify_specs(plans: Sequence[Plan], spec: ModelSpec, timeout: float) -> list[VerifyReport]:
    """XLA's figures for plans of a MODEL spec, compile-only, all in one fresh process."""
    if not plans:
        return []
    with plan_files(plans) as paths:
        return verify_many(spec.spec, paths, preset=spec.preset, overrides=list(spec.overrides) or None,
                           timeout=timeout)


def verify_plan(plan: Plan, *, spec: ModelSpec | None, model: LoadedModel | None = None, run: bool = False,
                constrain: bool = True, timeout: float = 1800, export: str | None = None,
                explain: bool = False) -> VerifyReport:
    """XLA's figures for a plan: in a fresh process for a MODEL spec, else in this one."""
    if spec is not None:
        with plan_files([plan]) as (path,):
            return verify(spec.spec, path, preset=spec.preset, overrides=list(spec.overrides) or None, run=run,
                          timeout=timeout, constrain=constrain, export=export, explain=explain)
    if model is None:
        raise PartexError("verify needs the function the plan was made for")
    return verify_loaded(model, plan, run=run, constrain=constrain, export=export, explain=explain)


class Checked(Protocol):
    """What ``SessionChecks`` reads of the session it is part of."""

    spec: ModelSpec | None
    model: Any  # ModelAnalysis
    hardware: Hardware

    @property
    def analysis(self) -> Any: ...

    def best(self) -> SearchResult | None: ...

    def best_plan(self) -> Plan | None: ...

    def top_plans(self, k: int = 3) -> list[Plan]: ...

    def plan(self, decisions: Any = None, *, strategy: str | None = None, pinned: Sequence = ()) -> Plan: ...

    def pinned_plan(self, decisions: Sequence, strategy: str) -> Plan: ...

    def mark_infeasible(self, decisions: Sequence, measured_bytes: float) -> None: ...

    def verify(self, plan: Plan | None = None, *, run: bool = False, constrain: bool = True, mark: bool = True,
               timeout: float = 1800, explain: bool = False) -> VerifyReport: ...

    def measure(self, plans: Sequence[Plan] | None = None, *, steps: int = 5, warmup: int = 2,
                labels: Sequence[str] | None = None, timeout: float = 1800) -> list[Measured]: ...


class SessionChecks:
    """The ``Session``'s methods that hand its plans to XLA: compile them and compare with the
    prediction, and run them on this machine's devices."""

    def verify(self: Checked, plan: Plan | None = None, *, run: bool = False, constrain: bool = True,
               mark: bool = True, timeout: float = 1800, explain: bool = False) -> VerifyReport:
        """Compile ``plan`` (default: the best plan) with XLA and compare with the prediction:
        per-device memory, argument bytes and collective bytes by kind (a ``VerifyReport``;
        ``verify --json`` prints its ``to_json()``). With ``run``, also run it (real example
        arrays) and compare the outputs with the unsharded function. A MODEL-spec session
        compiles in a fresh process on simulated CPU devices; a function session compiles
        here, on this process's devices. With ``mark`` (default), a plan XLA puts over the
        budget is marked infeasible and the search's best moves to the next plan that fits
        (``out.marked_infeasible``). With ``explain``, ``out.explain``: XLA's collectives by
        source line, matched to the predicted ones (``matched_fraction``: the share of XLA's
        bytes matched). ``constrain=False`` applies the plan's input and output shardings
        alone (``apply_plan``'s). ``timeout``: seconds a fresh process may take (PartexError
        past it). Returns the ``VerifyReport``; PartexError when no plan is given and none
        fits yet."""
        if plan is None:
            plan = self.best_plan()
            if plan is None:
                raise PartexError("nothing to verify: the search has found no plan that fits yet")
        out = verify_plan(plan, spec=self.spec, model=self.model.model, run=run, constrain=constrain,
                          timeout=timeout, explain=explain)
        marked = mark and not out.fits
        if marked:
            self.mark_infeasible(resolve_decisions(plan, self.analysis), out.xla_memory.get("device", out.memory.xla))
        return out.replace(marked_infeasible=marked)

    def verify_all(self: Checked, plans: Sequence[Plan], *, timeout: float = 1800) -> list[VerifyReport]:
        """Compile ``plans`` with XLA (compile-only; a MODEL-spec session in one fresh
        process, given ``timeout`` seconds) and return ``verify``'s report for each, in
        order. Marks nothing."""
        if self.spec is None:
            return [self.verify(p, mark=False, timeout=timeout) for p in plans]
        return verify_specs(plans, self.spec, timeout)

    def verified_best(self: Checked, tries: int = 5,
                      on_reject: Callable[[SearchResult, VerifyReport], None] | None = None
                      ) -> tuple[SearchResult, VerifyReport]:
        """The best plan checked by XLA: while XLA puts it over the budget, it is marked
        infeasible, ``on_reject(result, report)`` is called, and the next best is checked
        (up to ``tries`` plans). Returns (the ``SearchResult``, its ``VerifyReport``);
        PartexError when none of them fits."""
        for _ in range(tries):
            best = self.best()
            if best is None:
                break
            out = self.verify(self.pinned_plan(best.decisions, "mcts"))
            if not out.marked_infeasible:
                return best, out
            if on_reject is not None:
                on_reject(best, out)
        raise PartexError(f"no plan checked by XLA fits the {format_bytes(self.hardware.budget)} budget after "
                          f"{tries} tries; search longer, raise the memory budget or use a larger mesh")

    def measure(self: Checked, plans: Sequence[Plan] | None = None, *, steps: int = 5, warmup: int = 2,
                labels: Sequence[str] | None = None, timeout: float = 1800) -> list[Measured]:
        """Run plans (default: the best plan) on the local devices for ``warmup`` + ``steps``
        steps and return each one's measured step time (median) and peak device memory
        beside its prediction (``Measured``). A MODEL-spec session runs each plan in a fresh
        process (its peak its own: on a GPU or TPU the devices JAX finds, on the CPU as many
        simulated devices as the mesh has); a function session runs them here, on this
        process's devices. A plan that does not fit the device comes back with ``error``.
        ``labels``: the plans' names in the rows (default: each plan's strategy);
        ``timeout``: seconds each fresh process may take. Returns one ``Measured`` per plan,
        in order."""
        if plans is None:
            best = self.best_plan()
            if best is None:
                raise PartexError("nothing to measure: the search has found no plan that fits yet")
            plans = [best]
        plans = list(plans)
        labels = list(labels) if labels is not None else [p.strategy or f"plan {i + 1}" for i, p in enumerate(plans)]
        if self.spec is not None:
            return measure(self.spec.spec, plans, preset=self.spec.preset, overrides=list(self.spec.overrides),
                           steps=steps, warmup=warmup, labels=labels, timeout=timeout)
        return [measure_loaded(self.model.model, p, steps=steps, warmup=warmup, label=lab)
                for p, lab in zip(plans, labels)]

    def measure_top(self: Checked, k: int = 3, *, steps: int = 5, warmup: int = 2, timeout: float = 1800
                    ) -> list[tuple[Plan, Measured]]:
        """Measure the ``k`` best distinct plans the search found (``top_plans``; ``steps``,
        ``warmup`` and ``timeout`` as ``measure``'s) and return (plan, ``Measured``) pairs,
        fastest measured first (those that did not run last). A plan that ran out of device
        memory is marked infeasible, as a plan XLA puts over the budget is."""
        plans = self.top_plans(k)
        if not plans:
            raise PartexError("nothing to measure: the search has found no plan that fits yet")
        rows = list(zip(plans, self.measure(plans, steps=steps, warmup=warmup, timeout=timeout)))
        for plan, m in rows:
            if m.error is not None:
                self.mark_infeasible(resolve_decisions(plan, self.analysis),
                                     max(m.peak_bytes or 0.0, m.xla_bytes or 0.0, self.hardware.budget * 1.01))
        return sorted(rows, key=lambda r: (r[1].step_time is None, r[1].step_time or 0.0))
