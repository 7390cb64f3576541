"""Collectives: their ring (alpha-beta) time, and the ones a reshard needs.

``coll_time`` prices one collective (``_pricing.collective_seconds``), and the pure
functions that list collectives as ``Need``s (``_records``): ``reshard`` (a buffer from one
sharding to another: all-gather, all-to-all, collective-permute), ``halo`` (a conv's,
slice's or pad's neighbour rows) and ``shifted_views`` (concatenate and split along a
sharded dim). Each reads the tables (``Tables``: mesh axes, their sizes, bandwidths and
latencies; value signatures) and appends to a list it is given.

Pricing side: imports ``_records``, ``_pricing``, ``_kinds``, ``_shardings`` and
``_analysis``' NO_DIM.
"""

from __future__ import annotations

from .._decisions import NO_DIM
from ._kinds import CollectiveKind
from ._pricing import collective_seconds
from ._records import Need, Tables
from ._shardings import prod, shards

AR, AG, RS = CollectiveKind.ALL_REDUCE, CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER
A2A, PERMUTE = CollectiveKind.ALL_TO_ALL, CollectiveKind.COLLECTIVE_PERMUTE


def coll_time(t: Tables, kind: CollectiveKind, axes: tuple[str, ...], nbytes: float) -> float:
    """Seconds of one execution over ``axes`` (``_pricing.collective_seconds``): without a
    measured table, the ring (alpha-beta) time, the (n-1)/n share of the bytes over the
    slowest axis's links plus a latency per hop, twice for an all-reduce. An all-to-all's
    bytes are the local buffer: (n-1)/n^2 of the full tensor crosses."""
    return collective_seconds(t, kind, axes, nbytes)


def reshard(axis_size: dict[str, int], have, want, nbytes: float, sig, colls: list) -> None:
    """Collectives to turn a buffer sharded as ``have`` into ``want`` (per dim axes)."""
    hv = {a: d for d, axes in enumerate(have) for a in axes}
    wv = {a: d for d, axes in enumerate(want) for a in axes}
    if hv == wv:
        return
    moved = tuple(a for a in hv if a in wv and wv[a] != hv[a])
    kept = [a for a in hv if a in wv and wv[a] == hv[a]]
    gathered = tuple(a for a in hv if a not in wv)
    # Dropping a major axis of a dim while keeping a minor one reorders the blocks: XLA
    # first permutes them (a collective-permute of the local buffer) so that the kept axes
    # are major, then gathers the dropped ones.
    for d, axes in enumerate(have):
        w = set(want[d]) if d < len(want) else set()
        keep = [a for a in axes if a in w]
        if keep and tuple(keep) != tuple(axes[:len(keep)]):
            g = sig[d][0] if d < len(sig) else NO_DIM
            colls.append(Need(PERMUTE, tuple(axes), nbytes / prod(axis_size, hv), g))
            break
    if moved:
        local = nbytes / prod(axis_size, hv)
        g = sig[hv[moved[0]]][0] if hv[moved[0]] < len(sig) else NO_DIM
        colls.append(Need(A2A, moved, local, g))
    if gathered:
        after = nbytes / prod(axis_size, kept + list(moved))
        g = sig[hv[gathered[0]]][0] if hv[gathered[0]] < len(sig) else NO_DIM
        colls.append(Need(AG, gathered, after, g))


def halo(axis_size: dict[str, int], pat, i: int, fax, local: float, colls: list) -> None:
    """An operand sharded along a conv's spatial dim or a slice's or pad's cut dim: each
    device receives the rows its block reads beyond its own from its neighbours (XLA: a
    collective-permute each way)."""
    for k, h in enumerate(pat.halos):
        if h is None or h.operand != i or not fax[k]:
            continue
        n = prod(axis_size, fax[k])
        left, right = h.rows(n)
        if left + right:
            colls.append(Need(PERMUTE, tuple(fax[k]), local * (left + right) * n / h.size, pat.factors[k][2]))


def misaligned(offset: int, size: int, total: int, n: int) -> float:
    """The largest fraction of a device's block of a piece [offset, offset+size) of a dim of
    ``total`` split n ways that sits on another device's block of the whole."""
    worst = 0.0
    for j in range(n):
        lo, hi = offset + j * size / n, offset + (j + 1) * size / n
        overlap = max(0.0, min(hi, (j + 1) * total / n) - max(lo, j * total / n))
        worst = max(worst, 1 - overlap / (size / n))
    return worst


def shifted_views(t: Tables, pat, dec, colls: list, spec) -> tuple[dict, dict]:
    """Concatenate and split along a sharded dim, as XLA partitions them: pieces sharded
    like the whole are moved by an all-to-all (concatenate) or, where a piece's blocks do
    not line up with the whole's, a collective-permute (split); a piece sharded where the
    whole is not is gathered; an unsharded piece of a sharded whole is sliced locally.
    Returns the views of the operands and of the results that differ from the factors'
    (operand index -> spec, result index -> spec). ``spec``: (signature, decisions) -> its
    sharding (memoised by the caller)."""
    if pat.shift is None:
        return {}, {}
    axis_size, sigs = t.axis_size, t.sigs
    kind, d, sizes = pat.shift
    total = sum(sizes)

    def own(sig):
        return [list(a) for a in spec(sig, dec)]

    if kind == "concatenate":
        axes = spec(pat.results[0][0], dec)[d]
        if not axes:
            return {}, {}  # an unsharded result: gather the pieces (the general path)
        in_view = {}
        for i, ((sig, _), nb) in enumerate(zip(pat.operands, pat.operand_bytes)):
            sp = spec(sig, dec)
            in_view[i] = own(sig)
            if sp[d] == axes:
                colls.append(Need(A2A, tuple(axes), nb / shards(axis_size, sp), sigs[sig][d][0]))
            elif sp[d]:
                rest = [a for k, x in enumerate(sp) if k != d for a in x]
                colls.append(Need(AG, tuple(sp[d]), nb / prod(axis_size, rest), sigs[sig][d][0]))
        return in_view, {0: own(pat.results[0][0])}
    whole = spec(pat.operands[0][0], dec)
    out_view = {}
    offset = 0
    for j, ((sig, _), nb) in enumerate(zip(pat.results, pat.result_bytes)):
        sp = spec(sig, dec)
        out_view[j] = own(sig)
        if sp[d]:
            frac = misaligned(offset, sizes[j], total, prod(axis_size, sp[d]))
            if frac > 1e-9:
                colls.append(Need(PERMUTE, tuple(sp[d]), frac * nb / shards(axis_size, sp), sigs[sig][d][0]))
        elif whole[d]:
            rest = [a for k, x in enumerate(sp) if k != d for a in x]
            colls.append(Need(AG, tuple(whole[d]), nb / prod(axis_size, rest), sigs[sig][d][0]))
        offset += sizes[j]
    return {0: own(pat.operands[0][0])}, out_view
