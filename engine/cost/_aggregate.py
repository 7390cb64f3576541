"""Aggregates: the summed costs of the patterns that depend on the same groups.

Patterns whose groups form the same bitmask see the same decisions, so a plan's cost is a
sum over masks of one memoised ``Aggregate`` each (keyed by the mask and the decisions on
its groups): changing one decision re-prices only the masks holding its group.
``aggregate`` sums them, pure over the tables and a pattern-cost function (the façade's
memoised one).

Pricing side: imports ``_records`` only.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ._records import Aggregate, PatternCost, Tables


def aggregate(t: Tables, pis, rel, pattern_cost: Callable[[int, tuple], PatternCost]) -> Aggregate:
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
            # a partial result waits for XLA:CPU's combined reduction (_fusion.cpu_combined)
            transients += [(o, max(value_end[ops[o].outputs[j]], int(cu[o]) if cu is not None and waits else -1),
                            extra) for o in pat.ops for j, extra, waits in tr]
        if cl:
            colls.append((pi, cl))
            if any(x.operand >= 0 for x in cl):
                resharded.append((pi, cl))
    reshard_keys = tuple((pi, tuple(x.reshard_key() for x in cl if x.operand >= 0)) for pi, cl in resharded)
    return Aggregate(compute, comm, resharded, transients, colls, per, reshard_keys)
