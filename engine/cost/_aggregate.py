"""Aggregates: the summed costs of the patterns that depend on the same groups.

Patterns whose groups form the same bitmask see the same decisions, so a plan's cost is a
sum over masks of one memoised ``Aggregate`` each (keyed by the mask and the decisions on
its groups): changing one decision re-prices only the masks holding its group. Owns
``Aggregate`` and ``aggregate``; pure over the tables and a pattern-cost function (the
façade's memoised one). Imports nothing of partex at run time.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable

import numpy as np

if TYPE_CHECKING:
    from ._patterns import PatternCost
    from ._tables import Tables


@dataclasses.dataclass(slots=True, eq=False)
class Aggregate:
    """Costs of a set of patterns that depend on the same groups, under some decisions;
    per step (each pattern's one execution times its executions)."""

    compute: float  # seconds
    comm: float  # seconds, before CSE
    resharded: list  # [(pattern, collectives)] of the patterns that reshard an operand
    transients: list  # [(op, until op, bytes)]: buffers beside the values
    colls: list  # [(pattern, collectives)] of the patterns with any collective
    per: np.ndarray  # per pattern: one execution's compute seconds
    # per pattern of ``resharded``: (pattern, its operand reshards' Coll.reshard_key()s):
    # what the plan's CSE depends on (CostModel._common_reshards' memo key)
    reshard_keys: tuple
    # the overlap schedule's view of the collectives (overlap.schedule_of): built on the
    # first overlapped evaluation that uses this aggregate, then kept with it
    schedule: tuple | None = None


def aggregate(t: "Tables", pis, rel, pattern_cost: Callable[[int, tuple], "PatternCost"]) -> Aggregate:
    """The aggregate of patterns ``pis`` under the decisions ``rel`` on their groups."""
    compute = comm = 0.0
    resharded, transients, colls = [], [], []
    ops = t.program.ops
    value_end = t.live.value_end
    cu = t.combined_until
    per = np.empty(len(pis))  # one execution's compute, per pattern
    for n, pi in enumerate(pis):
        pat = t.patterns[pi]
        c, m, cl, tr, *_ = pattern_cost(pi, rel)
        per[n] = c
        compute += c * pat.weight
        comm += m * pat.weight
        if tr:
            # a partial result waits for XLA:CPU's combined reduction (liveness.cpu_combined)
            transients += [(o, max(value_end[ops[o].outputs[j]], int(cu[o]) if cu is not None and waits else -1),
                            extra) for o in pat.ops for j, extra, waits in tr]
        if cl:
            colls.append((pi, cl))
            if any(x.operand >= 0 for x in cl):
                resharded.append((pi, cl))
    reshard_keys = tuple((pi, tuple(x.reshard_key() for x in cl if x.operand >= 0)) for pi, cl in resharded)
    return Aggregate(compute, comm, resharded, transients, colls, per, reshard_keys)
