"""Memory: the per-device peak of one plan, from the live ranges and the plan's sizes.

``memory_report`` is the peak per device from the values' local sizes, the resharded and
transient buffers, a recompute edit (``Edit``) and the device copies of state kept in host
memory (``Moved``: ``moved_state``, ``state_moves``); ``host_peak`` the host memory's.
Every buffer counts at its sharded size; arguments live throughout, outputs counted whole
(as XLA reports them), donated outputs aliased: an over-estimate rather than an
under-estimate. A region's array that the plan gathers across the boundary is a buffer of
its own (``Liveness.region_pairs``).

Pricing side: imports ``_records``, ``_report`` and the analysis and program types.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..analysis._types import Analysis
from ..tracing._program import NO_PRODUCER
from ._records import Edit, Liveness, Moved
from ._report import HeldBuffer, MemoryReport


def moved_state(program, live: Liveness, inputs: Sequence[int], outputs: Sequence[int]) -> Moved:
    """``Moved`` for state arguments ``inputs`` and their updates ``outputs`` in host memory."""
    p = program
    first = np.full(len(p.values), -1, dtype=np.int64)
    for op in reversed(p.ops):
        first[list(op.inputs)] = op.id
    host = np.zeros(len(p.values), dtype=bool) if live.host is None else live.host.copy()
    cat = dict(zip(live.inputs.tolist(), live.input_cat.tolist()))
    copies: list[tuple[int, int, int, str]] = []  # (value, from, to, category)
    for v in inputs:
        host[v] = True
        if first[v] >= 0:  # an argument nothing reads needs no copy
            copies.append((v, int(first[v]), live.value_end[v], cat[v]))
    for o in outputs:
        host[o] = True
        made = p.values[o].producer
        if made != NO_PRODUCER:
            copies.append((o, made, live.n_ops, live.output_cat.get(o, "activations")))
    cv, ca, cb = (np.array([c[k] for c in copies], dtype=np.int64) for k in range(3))
    return Moved(host, cv, ca, cb, tuple(c[3] for c in copies))


def state_moves(analysis: Analysis, live: Liveness, states: tuple[int, ...]
                ) -> tuple[Moved, list[tuple[np.ndarray, np.ndarray]]]:
    """The memory change of keeping state sets ``states`` in host memory (``moved_state``),
    and per set the values it copies over the host link: (its arguments, their updates)."""
    an = analysis
    back = {i: o for o, i in an.roles.mirror.items()}  # argument -> its update
    sets = []
    for st in states:
        ins = an.state_inputs(st)
        sets.append((np.array(ins, dtype=np.int64), np.array([back[v] for v in ins if v in back], dtype=np.int64)))
    ins = [v for st in states for v in an.state_inputs(st)]
    return moved_state(an.program, live, ins, [back[v] for v in ins if v in back]), sets


def host_peak(live: Liveness, local: np.ndarray, mask: np.ndarray | None = None) -> tuple[float, float]:
    """The most host memory per device the step holds at once: its arguments and results in
    host memory (a donated argument and the result that reuses its buffer once) and the
    peak of its offloaded intermediates; and that peak alone. ``mask``: per value, in host
    memory (default ``live.host``)."""
    mask = live.host if mask is None else mask
    if mask is None:
        return 0.0, 0.0
    hb = np.where(mask, local, 0.0)
    n = live.n_ops + 2
    b = hb[live.mid]
    delta = np.bincount(live.mid_def, weights=b, minlength=n) - np.bincount(live.mid_end, weights=b, minlength=n)
    mids = float(np.cumsum(delta).max()) if len(delta) else 0.0
    alias = 0.0
    if live.alias_pairs:
        ai, ao = live.alias_arrays
        alias = float(hb[ao][np.isclose(hb[ai], hb[ao])].sum())
    mids = max(mids, 0.0)
    return float(hb[live.inputs].sum() + hb[live.outputs].sum()) - alias + mids, mids


def memory_report(live: Liveness, local: np.ndarray, detail: bool, buffers=(), edit: Edit | None = None,
                  moved: Moved | None = None) -> MemoryReport:
    """The per-device peak: arguments + outputs + the peak of the live intermediates, the
    resharded and transient ``buffers`` ((from op, to op, bytes): three arrays), an edit's recomputed
    copies and temporaries and the device copies of state kept in host memory (``moved``)
    - the aliased outputs. ``local``: per value, its bytes per device. Values in host
    memory take none of the device's; ``host`` is their own peak."""
    mask = live.host if moved is None else moved.host
    host, offloaded = host_peak(live, local, mask)
    has_copies = moved is not None and len(moved.copy_v) > 0
    copies = local[moved.copy_v] if moved is not None and has_copies else None
    if mask is not None:
        local = np.where(mask, 0.0, local)
    args = float(local[live.inputs].sum())
    outs = float(local[live.outputs].sum())
    if live.alias_pairs:
        ai, ao = live.alias_arrays
        alias = float(local[ao][np.isclose(local[ai], local[ao])].sum())
    else:
        alias = 0.0
    b = local[live.mid] if live.mid_scale is None else local[live.mid] * live.mid_scale
    n = live.n_ops + 2
    mid_end = live.mid_end if edit is None else edit.mid_end
    delta = (np.bincount(live.mid_def, weights=b, minlength=n)
             - np.bincount(mid_end, weights=b, minlength=n)).astype(np.float64)
    if edit is not None and len(edit.clone_v):
        size = local[edit.clone_v] * edit.clone_n
        delta += np.bincount(edit.clone_a, weights=size, minlength=n) - np.bincount(edit.clone_b, weights=size, minlength=n)
    if edit is not None and len(edit.tmp_v):
        rows = np.bincount(edit.tmp_row, weights=local[edit.tmp_v])
        size = np.maximum.reduceat(rows, edit.tmp_seg)
        delta += np.bincount(edit.tmp_at, weights=size, minlength=n) - np.bincount(edit.tmp_at + 1, weights=size, minlength=n)
    if copies is not None and moved is not None:
        delta += np.bincount(moved.copy_a, weights=copies, minlength=n) - np.bincount(moved.copy_b, weights=copies, minlength=n)
    if live.region_pairs:
        outer, body, at, stop = _region_arrays(live, local)
        own = _gathered(local[outer], local[body])
        if own.any():
            size = local[body][own]
            delta += np.bincount(at[own], weights=size, minlength=n) - np.bincount(stop[own], weights=size, minlength=n)
    if buffers and len(buffers[0]):
        start, stop, size = buffers
        delta += np.bincount(start, weights=size, minlength=n) - np.bincount(stop, weights=size, minlength=n)
    live_bytes = np.cumsum(delta)
    t = int(np.argmax(live_bytes)) if len(live_bytes) else 0
    temps = float(live_bytes[t]) if len(live_bytes) else 0.0
    peak = args + outs + temps - alias
    if not detail:
        return MemoryReport(peak, args, outs, temps, alias, {}, host=host, host_offloaded=offloaded)
    breakdown = _breakdown(live, local, b, mid_end, t, edit)
    held = _held(live, local, b, mid_end, t, edit, buffers)
    if copies is not None and moved is not None:  # a state copy on the device counts as its state
        on = (moved.copy_a <= t) & (moved.copy_b > t)
        for k in np.flatnonzero(on).tolist():
            c = moved.copy_cat[k]
            breakdown[c] = breakdown.get(c, 0.0) + float(copies[k])
        held = tuple(sorted(held + tuple(HeldBuffer(float(copies[k]), int(moved.copy_a[k]), int(moved.copy_b[k]),
                                                    "device copy", int(moved.copy_v[k]))
                                         for k in np.flatnonzero(on).tolist()), key=lambda h: -h.bytes))
    return MemoryReport(peak, args, outs, temps, alias, breakdown, t, held, host, offloaded)


def _region_arrays(live: Liveness, local: np.ndarray) -> tuple[np.ndarray, ...]:
    """The region pairs' (operand, body value, boundary op, end) under a plan's sizes: a
    gathered array crossing a boundary lives to the end of its uses, or, where the next
    boundary its buffer reaches gathers it again into a buffer of its own, to that boundary."""
    outer, body, at, stop, near, nxt = live.region_pairs
    has = nxt >= 0
    if has.any():
        k = nxt[has]
        again = np.zeros(len(nxt), dtype=bool)
        again[has] = _gathered(local[outer[k]], local[body[k]])
        stop = np.where(again, near, stop)
    return outer, body, at, stop


def _gathered(before, after):
    """Where a region's boundary gathers its value (the array across it bigger than the one it
    is read from): a copy of its own. A block sliced from it is read where it lies."""
    return after > before * (1 + 1e-9)


def _held(live: Liveness, local: np.ndarray, b: np.ndarray, mid_end: np.ndarray, t: int,
          edit: Edit | None, buffers) -> tuple[HeldBuffer, ...]:
    """What the peak at op t holds, largest first (the terms memory_report sums there)."""
    at = np.flatnonzero((live.mid_def <= t) & (mid_end > t))
    out = [HeldBuffer(float(size), int(a), int(e), "value", int(v))
           for v, a, e, size in zip(live.mid[at].tolist(), live.mid_def[at].tolist(), mid_end[at].tolist(),
                                    b[at].tolist())]
    if buffers:
        out += [HeldBuffer(float(size), int(a), int(e), "buffer")
                for a, e, size in zip(*(x.tolist() for x in buffers)) if a <= t < e]
    if edit is not None:
        out += [HeldBuffer(float(local[v] * n), int(a), int(e), "recomputed copy", int(v))
                for v, a, e, n in zip(edit.clone_v.tolist(), edit.clone_a.tolist(), edit.clone_b.tolist(),
                                      edit.clone_n.tolist()) if a <= t < e]
        if len(edit.tmp_v):
            sizes = np.maximum.reduceat(np.bincount(edit.tmp_row, weights=local[edit.tmp_v]), edit.tmp_seg)
            out += [HeldBuffer(float(size), int(at), int(at) + 1, "recomputation temporaries")
                    for at, size in zip(edit.tmp_at.tolist(), sizes.tolist()) if at == t]
    if live.region_pairs:
        outer, body, at, stop = _region_arrays(live, local)
        out += [HeldBuffer(float(local[v]), int(a), int(e), "region array", int(v))
                for o, v, a, e in zip(outer.tolist(), body.tolist(), at.tolist(), stop.tolist())
                if a <= t < e and _gathered(local[o], local[v])]
    return tuple(sorted(out, key=lambda h: -h.bytes))


def _breakdown(live: Liveness, local: np.ndarray, b: np.ndarray, mid_end: np.ndarray, t: int,
               edit: Edit | None) -> dict:
    """What the peak at op t holds: parameters, optimizer state, activations, temporaries."""
    at = (live.mid_def <= t) & (mid_end > t)
    acts = float(b[at & live.mid_long].sum())
    tmp = float(b[at & ~live.mid_long].sum())
    if edit is not None and len(edit.clone_v):  # recomputed copies: activations again
        alive = (edit.clone_a <= t) & (edit.clone_b > t)
        acts += float((local[edit.clone_v] * edit.clone_n)[alive].sum())
    cats: dict[str, float] = {}  # category -> bytes (0 where none)
    for vid, c in zip(live.inputs.tolist(), live.input_cat.tolist()):
        cats[c] = cats.get(c, 0) + float(local[vid])
    aliased_out = {o for i, o in live.alias_pairs if math.isclose(local[i], local[o])}
    for vid in live.outputs.tolist():
        if vid in aliased_out:
            continue
        c = live.output_cat.get(vid, "activations")
        cats[c] = cats.get(c, 0) + float(local[vid])
    return {"parameters": cats.get("parameters", 0), "optimizer": cats.get("optimizer", 0),
            "activations": cats.get("activations", 0) + acts, "temporaries": tmp}
