"""Workspace: the memory ops hold beyond their values, under one plan.

``Tables.workspace`` lists, per op that has one (``_kernels.Workspace``, through
``_facts.op_workspace``), the parts of its workspace: sized by an operand or a result, held
while the op runs or made before it. ``workspace_buffers`` sizes them under a plan and places
them in program order, as the (from op, to op, bytes) buffers ``_memory.memory_report`` adds:
an operand's part as the op reads the operand (its view: a kernel run whole reads its
operands gathered), a result's part as the result's value is laid out; a part the op makes
before it runs from when its operand is ready (a recomputed operand: from where the
recomputation makes it; a result's: from the step's start); an op a recomputation runs again
holds its workspace there too.

Pricing side: imports ``_records``' types and ``_shardings``.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ._records import Edit, Tables
from ._shardings import shards


def workspace_buffers(t: Tables, local: np.ndarray, edit: Edit | None, views_of: Callable[[int], tuple],
                      spec_of: Callable[[int], list]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ops' workspaces (``Tables.workspace``) as buffers (from op, to op, bytes) under a
    plan: ``local`` per value its bytes per device, ``edit`` the plan's recompute edit,
    ``views_of(op)`` the shardings the op reads its operands in, ``spec_of(value)`` the
    value's own sharding.

    A loop's copy of an operand (``Workspace.copies``) is no buffer where the loop takes the
    operand's own: one the op reads resharded (a copy already) or an intermediate nothing
    reads after the op. A part other ops compute alike (``Workspace.common``) is one buffer
    where they read their operand alike, from the first such op through the last."""
    p = t.program
    ops, slots, scales, fixed, early, copies, keys = t.workspace
    sizes = np.empty(len(ops), dtype=np.float64)
    through = ops.copy()
    outer = set(p.inputs) | set(p.outputs)
    made: dict = {}  # (common key, the operand's sharding there) -> the entry that makes it
    for k, (o, slot, copy, key) in enumerate(zip(ops.tolist(), slots.tolist(), copies.tolist(), keys.tolist())):
        op = p.ops[o]
        if slot < 0:
            sizes[k] = local[op.outputs[-1 - slot]]
            continue
        v = op.inputs[slot]
        held = views_of(o)[slot]
        sizes[k] = t.nbytes[v] / shards(t.axis_size, held)
        if copy and (held != tuple(tuple(a) for a in spec_of(v))
                     or (v not in outer and t.live.value_end[v] <= o + 1)):
            sizes[k] = 0.0  # the loop takes the operand's own buffer
        if key >= 0:
            first = made.setdefault((key, held), k)
            if first != k:
                through[first] = o
                sizes[k] = 0.0
    sizes = sizes * scales + fixed
    remade: dict[int, list[int]] = {}  # a value the recomputation makes again -> where
    if edit is not None:
        for v, a in zip(edit.clone_v.tolist(), edit.clone_a.tolist()):
            remade.setdefault(v, []).append(a)
    ready = np.zeros(len(ops), dtype=np.int64)
    for k, (o, slot) in enumerate(zip(ops.tolist(), slots.tolist())):
        if slot >= 0:
            v = p.ops[o].inputs[slot]
            ready[k] = max([p.values[v].producer, 0, *(a for a in remade.get(v, ()) if a <= o)])
    # an early part from when it is ready through its op; a result's until its op, which
    # makes the result there
    start = np.where(early, ready, ops)
    stop = np.where(early & (slots < 0), ops, through + 1)
    if edit is not None and len(edit.work_op):
        # run again at the recompute point, its operands' copies made there
        again = np.concatenate([np.flatnonzero(ops == o) for o in edit.work_op.tolist()])
        at = np.repeat(edit.work_at, [np.count_nonzero(ops == o) for o in edit.work_op.tolist()])
        start = np.concatenate((start, np.where(early[again] & (slots[again] < 0), 0, at)))
        stop = np.concatenate((stop, np.where(early[again] & (slots[again] < 0), at, at + 1)))
        sizes = np.concatenate((sizes, sizes[again]))
    return start, stop, sizes
