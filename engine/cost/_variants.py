"""Recompute variants: the tables of the program as XLA fuses it under a set of recompute decisions.

A recompute decision changes which values XLA fuses: a residual no longer saved for the
backward pass is fused into its forward readers, and the copy the recomputation makes into
its backward readers, rather than written out and read back. ``variant_reads`` lists the
reads that no longer happen and the values that stand for others; ``recompute_variant``
builds the variant's tables from them (``_tables.variant_tables``), or None where the
decisions change no read. The recompute edit itself (what the decisions change in memory and
time) is ``_recompute``'s.

Building side: imports ``_records``, ``_tables`` and ``partex.analysis._recompute``;
nothing that prices.
"""

from __future__ import annotations

from ..analysis._recompute import LoopPlan, plan_unit
from ._records import Tables
from ._tables import variant_tables


def variant_reads(t: Tables, rc: tuple[tuple[int, str], ...], units, readers
                  ) -> tuple[frozenset[tuple[int, int]], dict[int, int]]:
    """What recompute decisions ``rc`` change in how XLA fuses the program (for
    ``_tables.variant_tables``): the reads that no longer happen (a residual's stacking by
    the forward loop, or, unrolled, its backward reads: the backward reads a copy made
    again) and the backward loop's slices that the recomputation makes again, each with the
    forward value it stands for. ``readers``: per value, the ops that read it."""
    p = t.program
    ignore: set[tuple[int, int]] = set()
    stand_ins: dict[int, int] = {}
    for u, kind in rc:
        unit = units[u]
        for cp in plan_unit(p, unit, kind):
            if isinstance(cp, LoopPlan):
                exit_ = p.ops[unit.copies[0][1] - 1]
                nc = exit_.params["num_carry"]
                ignore |= {(exit_.id, exit_.inputs[nc + j]) for j in cp.dropped}
                enter = p.ops[cp.backward]
                stand_ins.update({enter.outputs[k]: r for k, r in cp.feeds})
            elif cp.at >= 0:
                ignore |= {(o, r) for r in cp.recomputed for o in readers[r] if o >= unit.boundary}
    return frozenset(ignore), stand_ins


def recompute_variant(t: Tables, rc: tuple[tuple[int, str], ...], readers) -> Tables | None:
    """``t`` with its ops priced as XLA fuses the program under recompute decisions ``rc``
    (``variant_reads``, ``variant_tables``); None where they change no read (``t`` prices
    them as they are). ``readers``: per value, the ops that read it."""
    ignore, stand_ins = variant_reads(t, rc, t.analysis.units, readers)
    if not (ignore or stand_ins):
        return None
    return variant_tables(t, ignore, stand_ins)
