"""The report's rows: the plan's collectives, and what it moves over the host link.

``collective_rows`` lists the plan's collectives as ``CollectiveCost`` rows, one per pattern
and kind (a recomputation's in line, none of them hidden). ``host_link`` prices what the
step copies between host and device memory -- the residuals an ``offload`` keeps there, the
state a ``Memory`` decision keeps there -- as the seconds of it the step waits for, with its
rows (one per offloading unit, one per state set).

Pricing side: imports ``_records``, ``_report``, ``_kinds``, the state labels of
``_decisions`` and the analysis' NO_DIM.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

import numpy as np

from .._decisions import STATE_LABELS, STATES
from .._decisions import NO_DIM
from ._kinds import CollectiveKind
from ._records import HOST_LINK, Edit, Tables
from ._report import CollectiveCost


def collective_rows(t: Tables, colls, dup_count, extra=(), exposed=None) -> Iterable[CollectiveCost]:
    """The collectives, one row per pattern and kind; ``extra``: (pattern, collectives,
    executions) of the ops a recompute runs again (in line: none hidden); ``exposed``:
    (pattern, collective) -> seconds per step the step waits for it (None: all of it)."""
    p = t.program
    groups = t.analysis.groups
    rows = [(pi, cl, None) for pi, cl in colls] + list(extra)
    for pi, cl, n in rows:
        pat = t.patterns[pi]
        op = p.ops[pat.ops[0]]
        for k, c in enumerate(cl):
            count = int(pat.weight) - dup_count.get((pi, k), 0) if n is None else int(n)
            if count <= 0:
                continue
            g = c.cause if c.cause < len(groups) else t.views[c.cause - len(groups)][0]
            cause = groups[g].label if c.cause != NO_DIM else "-"
            hidden = 0.0
            if exposed is not None and n is None:
                hidden = max(0.0, c.time * count - exposed.get((pi, k), 0.0))
            yield CollectiveCost(c.kind, tuple(c.axes), c.bytes, count, c.time * count, op.id, op.source, cause,
                                 tuple(pat.ops), int(c.operand), hidden)


class HostLink(NamedTuple):
    """What one plan's step moves over the host link."""

    offloaded: float | None  # bytes per device the offloaded residuals hold in host memory (None: no offload)
    hidable: float  # seconds that may run under compute
    tail: float  # seconds waited for whole: the state's updates copied out at the end of the step
    wait: float  # seconds of ``hidable`` the step waits for
    rows: tuple[CollectiveCost, ...]  # the transfers' rows (``detail`` only)


def host_link(t: Tables, edit: Edit | None, local: np.ndarray, states: tuple[int, ...], sets,
              compute: float, overlap: bool, detail: bool) -> HostLink:
    """Host transfers run over the host link beside the compute (the forward's and the
    backward's): only what outlasts the compute is waited for. Offloaded residuals are
    copied out as the forward pass makes them and back as the backward pass reads them;
    state kept in host memory is copied in ahead of where the step first reads it
    (prefetched as a weight's gather is), and its update out once it is made: at the end of
    the step, with nothing left to run under, waited for whole. ``local``: per value, its
    bytes per device; ``sets``: per state set of ``states``, (its arguments, their updates)
    (``_memory.state_moves``); ``compute``: the step's compute seconds; ``overlap``: the
    transfers run under compute."""
    secs = t.hw.host_seconds
    host = None
    offloaded = None
    hidable = 0.0  # seconds that may run under compute
    if edit is not None and len(edit.host_v):
        host = local[edit.host_v] * edit.host_n
        offloaded = float(host.sum())
        hidable += sum(secs(float(b), True) + secs(float(b), False) for b in host)
    state_io = [(secs(float(local[i].sum()), False), secs(float(local[o].sum()), True)) for i, o in sets]
    hidable += sum(i for i, _ in state_io)
    tail = sum(o for _, o in state_io)
    wait = 0.0
    rows: tuple[CollectiveCost, ...] = ()
    if hidable or tail:
        wait = (max(0.0, hidable - compute) if overlap else hidable)
        if detail:
            rows = (*(_offload_rows(t, edit, host, np.array([secs(float(b), True) + secs(float(b), False)
                                                             for b in host]), wait, hidable)
                      if edit is not None and host is not None else ()),
                    *_state_rows(t, states, state_io, [float(local[i].sum() + local[o].sum()) / 2 for i, o in sets],
                                 wait, hidable))
    return HostLink(offloaded, hidable, tail, wait, rows)


def _offload_rows(t: Tables, edit: Edit, host: np.ndarray, secs: np.ndarray, wait: float, total: float
                  ) -> Iterable[CollectiveCost]:
    """One host-transfer row per offloading unit (out and back: two per layer), the
    time the step waits for (of ``total`` host-link seconds) spread over them by their
    seconds."""
    for u in dict.fromkeys(edit.host_unit):
        own = np.array([x == u for x in edit.host_unit])
        unit = t.analysis.units[u]
        s = float(secs[own].sum())
        nbytes = float(host[own].sum()) / max(1, unit.layers)
        op = unit.copies[0][0]
        yield CollectiveCost(CollectiveKind.HOST_TRANSFER, (HOST_LINK,), nbytes, 2 * max(1, unit.layers), s, op,
                             t.program.ops[op].source, f"{unit.label} offload",
                             hidden=s - wait * s / total if total > 0 else 0.0)


def _state_rows(t: Tables, states: tuple[int, ...], io: list[tuple[float, float]], nbytes: list[float], wait: float,
                hidable: float) -> Iterable[CollectiveCost]:
    """One host-transfer row per state set kept in host memory (its copy in and its
    update's out); of the copies in, the time the step waits for (of ``hidable``
    host-link seconds that may run under compute) spread by their seconds; the copies
    out waited for whole."""
    an, p = t.analysis, t.program
    for st, (t_in, t_out), size in zip(states, io, nbytes):
        first = an.state_inputs(st)[0]
        op = next((o.id for o in p.ops if first in o.inputs), 0)
        yield CollectiveCost(CollectiveKind.HOST_TRANSFER, (HOST_LINK,), size,
                             2, t_in + t_out, op, p.ops[op].source if p.ops else "",
                             f"{STATE_LABELS[STATES[st]]} in host memory",
                             hidden=t_in - wait * t_in / hidable if hidable > 0 else 0.0)
