"""Shardings from ordered decisions: which mesh axes each dim of a value or factor of an op takes.

Owns the decision triple the cost package works on -- ``(group, mesh axis, axis size)``,
made by ``CostModel._decisions`` only, a conflict's resolution carrying size 0 and its
resolution (``SECOND``, ``NEITHER``) for axis -- and the pure functions over it: ``assign``
(axes to slots), ``view`` (a tensor's sharding as an op computes it), ``prod``/``shards``
(device counts) and ``mask`` (the groups a table row depends on, as a bitmask). Shared by
both sides (building and pricing): imports ``_decisions`` (``NO_DIM``, the resolutions) only.
"""

from __future__ import annotations

from typing import Sequence

from .._decisions import NO_DIM, RESOLUTIONS

Spec = tuple[tuple[str, ...], ...]  # per dim: the mesh axes sharding it, major to minor
Sig = tuple[tuple[int, int], ...]  # a value signature: (group or NO_DIM, size) per dim
Triple = tuple[int, str, int]  # (group, mesh axis or resolution, axis size; 0: a resolution)
SECOND, NEITHER = RESOLUTIONS  # a resolution triple's axis (its size 0 tells it from a mesh axis)


def mask(groups) -> int:
    m = 0
    for g in groups:
        if g != NO_DIM:
            m |= 1 << g
    return m


def prod(axis_size: dict[str, int], axes) -> int:
    n = 1
    for a in axes:
        n *= axis_size[a]
    return n


def shards(axis_size: dict[str, int], spec) -> int:
    """The number of blocks a buffer sharded as spec is cut into."""
    n = 1
    for axes in spec:
        for a in axes:
            n *= axis_size[a]
    return n


def assign(slots: Sequence[tuple[int, int]], decisions: Sequence[Triple],
           slot_tensors: Sequence[tuple[int, ...]] | None = None, doubled=None) -> list[list[str]]:
    """Give mesh axes to slots (dims of a value or factors of an op) by ordered decisions.

    slots: (group, size) each; group NO_DIM never shards. slot_tensors: for op factors, the
    tensors (operands and results) each factor spans; None means all slots are dims of one
    tensor. A decision shards every slot of its group that the axis divides, unless a tensor
    holding that slot already uses the axis (then the earlier decision keeps it: an axis
    conflict; or the first such dim keeps it: an intra conflict). A resolution decision
    (axis size 0) on the group changes that: ``SECOND`` lets the last such dim keep it,
    ``NEITHER`` none (``doubled``: group -> the op's tensors holding two of its dims).
    """
    out: list[list[str]] = [[] for _ in slots]
    size_of = [1] * len(slots)
    resolved = {g: axis for g, axis, n in decisions if not n} if any(not d[2] for d in decisions) else {}
    order = range(len(slots))
    if slot_tensors is None:
        used: set[str] = set()
        for g, axis, n in decisions:
            if axis in used or not n:
                continue
            ks = order
            how = resolved.get(g)
            if how is not None and sum(sg == g for sg, _ in slots) > 1:
                if how == NEITHER:
                    continue
                ks = reversed(order)
            for k in ks:
                sg, size = slots[k]
                if sg == g and size % (size_of[k] * n) == 0:
                    out[k].append(axis)
                    size_of[k] *= n
                    used.add(axis)
                    break
        return out
    tensor_used: dict[int, set[str]] = {}
    for g, axis, n in decisions:
        if not n:
            continue
        how = resolved.get(g)
        skip = doubled.get(g, ()) if how == NEITHER and doubled else ()
        for k in (reversed(order) if how == SECOND else order):
            sg, size = slots[k]
            if sg != g or size % (size_of[k] * n):
                continue
            ts = slot_tensors[k]
            if any(axis in tensor_used.get(t, ()) for t in ts) or any(t in skip for t in ts):
                continue
            out[k].append(axis)
            size_of[k] *= n
            for t in ts:
                tensor_used.setdefault(t, set()).add(axis)
    return out


def view(fax, fmap, minors, side: str, t: int) -> list[list[str]]:
    """A tensor's sharding as an op computes it: each dim takes its factor's axes, a reshape's
    merged dim its major factor's and then its minor factors'."""
    out = []
    for d, k in enumerate(fmap):
        axes = list(fax[k]) if k >= 0 else []
        for m in minors.get((side, t, d), ()):
            axes += fax[m]
        out.append(axes)
    return out
