"""Pattern pricing: the cost of one execution of a pattern under the decisions on its groups.

``pattern_cost`` shards each factor of the pattern (with the corrections XLA's partitioner
forces: ``unheld_factors``, ``scatter_major``, ``whole_mesh_partials``, ``unaligned_minors``,
``unused_first_axis``) and prices its compute (``_pricing``), its collectives (reshards of
operands and results, halos, reductions of partial sums: ``_reshard``, ``_regrouped``) and
its transient buffers. The patterns themselves are compiled once (``_compile``); this is
memoised per pattern and decisions by the façade.

Pricing side: imports ``_records``, ``_pricing``, ``_reshard``, ``_shardings``, ``_kinds``
and the analysis and rule types.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from jaxlib import version as _jaxlib_version

from .._decisions import NO_DIM
from ..analysis._rules import FactorKind
from ._kinds import CollectiveKind
from ._pricing import kernel_seconds
from ._records import HOST_LINK, Coll, Need, Pattern, PatternCost, Tables, Transient
from ._reshard import AG, AR, PERMUTE, RS, coll_time, halo, reshard, shifted_views
from ._shardings import assign, prod, shards, view

REDUCTION = FactorKind.REDUCTION
# XLA's SPMD partitioner before jaxlib 0.12.1 sums a sharded conv's partial filter gradient
# over the whole mesh (``whole_mesh_partials``); 0.12.1 sums it over the axes it is partial
# over, as any other reduction (``tests/test_halo.py`` runs both and checks which holds)
XLA_SUMS_CONV_PARTIALS_OVER_WHOLE_MESH = _jaxlib_version.__version_info__ < (0, 12, 1)
SpecFn = Callable[[int, tuple], list]  # (signature, decisions) -> its sharding (memoised)


def pattern_cost(t: Tables, pat: Pattern, dec, spec: SpecFn) -> PatternCost:
    """(compute s, comm s, collectives, transient buffers, views, work) of one execution
    of the pattern's ops under decisions dec (those on its groups). ``spec``: a value
    signature's sharding under decisions (memoised by the caller)."""
    axis_size = t.axis_size
    fslots = [(g, size) for _, size, g in pat.factors]  # g is NO_DIM unless the factor ties
    fax = assign(fslots, dec, pat.slot_tensors, pat.doubled)
    unheld_factors(pat, dec, fax, spec)
    scatter_major(pat, dec, fax, spec)
    whole_mesh_partials(t, pat, fax)
    unaligned_minors(axis_size, pat, fax)
    shard = shards(axis_size, fax)
    colls: list[Need] = []
    if pat.manual:  # a body's collective moves each device's buffer: its share where the plan shards the body
        n = shards(axis_size, spec(pat.results[0][0], dec)) if pat.results else 1
        colls += [Need(kind, tuple(a for a in axes if a in axis_size), size / n, NO_DIM)
                  for kind, axes, size in pat.manual if any(a in axis_size for a in axes)]
    if pat.host_bytes:  # copies to or from host memory: each device moves its own share of each
        moved = sum(size / shards(axis_size, spec(pat.results[j][0], dec)) for j, size in pat.host_bytes)
        colls.append(Need(CollectiveKind.HOST_TRANSFER, (HOST_LINK,), moved, NO_DIM))
    in_view, out_view = shifted_views(t, pat, dec, colls, spec)
    views: list = []
    local_bytes = _operands(t, pat, dec, fax, in_view, spec, colls, views)
    transient: list[Transient] = []
    local_bytes = _results(t, pat, dec, fax, out_view, spec, colls, views, transient, local_bytes)
    if pat.gather_partials:
        _argmax_index(t, pat, dec, fax, in_view, spec, colls)
    if pat.lookup:
        unused_first_axis(t, pat, dec, fax, spec, colls)
    flops = pat.flops / shard
    if pat.kernel_bytes:
        local_bytes = max(local_bytes, pat.kernel_bytes / shard)
    for k, ratio in pat.halo_flops:
        if fax[k]:
            flops *= ratio
    compute = 0.0 if pat.free else kernel_seconds(t.hw, pat, fax, axis_size, flops, local_bytes)
    work = (0.0, 0.0) if pat.free else (flops, local_bytes)
    comm = 0.0
    out = []
    for c in colls:
        secs = coll_time(t, c.kind, c.axes, c.bytes)
        comm += secs
        out.append(Coll(c.kind, c.axes, c.bytes, secs, c.cause, c.operand, c.view, c.view_bytes))
    return PatternCost(compute, comm, tuple(out), tuple(transient), tuple(views), work)


def _operands(t: Tables, pat: Pattern, dec, fax, in_view, spec: SpecFn, colls: list, views: list) -> float:
    """Each operand's reshard to the sharding the op reads it in, and its halo; appends the
    views; returns the bytes per device the op reads from memory."""
    axis_size, sigs = t.axis_size, t.sigs
    local_bytes = 0.0
    for i, ((sig, fmap), nb) in enumerate(zip(pat.operands, pat.operand_bytes)):
        vspec = spec(sig, dec)
        ospec = in_view.get(i) or view(fax, fmap, pat.minors, "in", i)
        views.append(tuple(tuple(a) for a in ospec))
        if pat.operand_hbm[i]:
            local_bytes += pat.operand_hbm[i] * nb / shards(axis_size, ospec)
        n0 = len(colls)
        if not pat.cheap[i]:
            reshard(axis_size, vspec, ospec, nb * pat.operand_wire[i], sigs[sig], colls)
        key = tuple(tuple(a) for a in ospec)
        held = nb / shards(axis_size, ospec)  # the resharded buffer the op reads
        colls[n0:] = [Need(c.kind, c.axes, c.bytes, c.cause, i, key, held) for c in colls[n0:]]
        # not a reshard of the value (no CSE: XLA exchanges halos per conv)
        halo(axis_size, pat, i, fax, held * pat.operand_wire[i], colls)
    return local_bytes


def _results(t: Tables, pat: Pattern, dec, fax, out_view, spec: SpecFn, colls: list, views: list,
             transient: list, local_bytes: float) -> float:
    """Each result's reduction of partial sums (all-reduce, reduce-scatter, or the gathered
    partials of an argmax) and reshard to its value's sharding; appends the views and the
    transient buffers; returns ``local_bytes`` plus the bytes per device the op writes to
    memory (added in order, as one running sum with the operands')."""
    axis_size, sigs = t.axis_size, t.sigs
    partial = [a for (kind, _, g), axes in zip(pat.factors, fax) if kind == REDUCTION for a in axes]
    pgroup = next((g for (kind, _, g), axes in zip(pat.factors, fax) if kind == REDUCTION and axes), NO_DIM)
    for j, ((sig, fmap), nb) in enumerate(zip(pat.results, pat.result_bytes)):
        vspec = spec(sig, dec)
        ospec = out_view.get(j) or view(fax, fmap, pat.minors, "out", j)
        lb = nb / shards(axis_size, ospec)
        n0 = len(colls)
        if pat.result_hbm[j]:
            local_bytes += lb
        views.append(None if partial else tuple(tuple(a) for a in ospec))
        # The op writes its result at its own (larger) sharding before the reshard; a
        # partial result is a buffer of its own beside the reduced one. XLA combines the
        # reductions of partial results and issues them late, so such a buffer is taken
        # to live as long as the value (an over-estimate on TPU).
        extra = lb if partial else lb - nb / shards(axis_size, vspec)
        if extra > 0:
            transient.append(Transient(j, extra, bool(partial)))
        if pat.layouts[j]:  # the other layouts: copies written beside it, as long as it lives
            held = nb / shards(axis_size, vspec)
            transient.append(Transient(j, pat.layouts[j] * held, False))
            local_bytes += 2 * pat.layouts[j] * held
        if partial and pat.gather_partials:
            gathered = lb * prod(axis_size, partial) * pat.gather_partials
            colls.append(Need(AG, tuple(partial), gathered, pgroup))
            transient.append(Transient(j, gathered, False))
        elif partial:
            regrouped = _regrouped(t, pat, partial, vspec, ospec)
            if regrouped is not None:
                ospec = _regrouped_partials(t, partial, pgroup, vspec, nb, regrouped, colls)
            else:
                ospec = _reduce_partials(t, pat, fax, partial, pgroup, vspec, ospec, lb, colls, transient, j)
        reshard(axis_size, ospec, vspec, nb, sigs[sig], colls)
        w = pat.result_wire[j]
        if w != 1.0:
            colls[n0:] = [Need(c.kind, c.axes, c.bytes * w, c.cause, c.operand, c.view, c.view_bytes)
                          for c in colls[n0:]]
    return local_bytes


def _argmax_index(t: Tables, pat: Pattern, dec, fax, in_view, spec: SpecFn, colls: list) -> None:
    """An argmax's (argmin's) indices: XLA lowers it to a reduce over the operand and an iota
    of its shape (the index dtype), and its partitioner gives the iota the result's sharding
    (on the kept dims; the reduced dim whole), then reshards it to the operand's like any
    operand: an all-to-all where the result keeps the axis the reduced dim is sharded over
    (an MoE router's argmax over experts sharded on `data`, its result on the batch)."""
    (sig, fmap), (rsig, rmap) = pat.operands[0], pat.results[0]
    rv = spec(rsig, dec)
    at = {k: j for j, k in enumerate(rmap)}  # factor -> result dim
    have = [list(rv[at[k]]) if k in at and at[k] < len(rv) else [] for k in fmap]
    want = in_view.get(0) or view(fax, fmap, pat.minors, "in", 0)
    index_bytes = pat.operand_bytes[0] / (pat.gather_partials - 1.0)  # (value, index) bytes per value byte - 1
    reshard(t.axis_size, have, want, index_bytes, t.sigs[sig], colls)


class Regrouped(NamedTuple):
    """How XLA reduces partial results that it computes at a sharding of its own."""

    computed: int  # blocks the partial result is computed in (per device: its bytes / this)
    after: list  # the result's sharding once reduced (the value's axes of the reduction added)
    permute: bool  # each device's block of the value is on another device once reduced


def _regrouped(t: Tables, pat: Pattern, partial, vspec, ospec) -> Regrouped | None:
    """Where the value puts a result dim on an axis the op reduces over (``partial``), XLA's
    gather and dot handlers (a matmul's, a conv's: ``pat.contraction``; a reduce's partials
    are reduced at the op's sharding) group the devices by the block of the reduction each
    holds and compute each group's partial result sharded as the value wants it. A gather
    does so as far as the devices of one group go: min(the value's blocks, devices /
    reduction blocks) blocks, at least the op's own. A dot does so only where the value's
    copies (devices / its blocks) divide into the groups, its blocks whole: a weight
    gradient contracting the batch over `data` and sharded over `data` is all-reduced whole
    and sliced on data=4,model=2, computed in halves over `model` on data=2,model=4.

    Summed, the partials are the same along the reduction's axes: where the computed
    sharding is finer than the op's own (it lies over the group's devices, not the value's
    axes), or where the value puts an axis of the reduction major to one the op already
    shards that dim with, each device's block of the value is on another device. Returns
    that case; and under lowering="cpu" any gather whose value takes some of its row axes:
    XLA sums a gather's masked partials in one all-reduce over all its row axes, not one per
    dim. None: the partials are reduced as ``_reduce_partials`` says, the value's axes of
    the reduction a slice of the result."""
    lookup = pat.lookup == "gather"
    if not (lookup or pat.contraction) or not any(a in axes for axes in vspec for a in partial):
        return None
    axis_size = t.axis_size
    devices, groups, blocks = prod(axis_size, t.axes), prod(axis_size, partial), shards(axis_size, vspec)
    if not lookup and (devices // blocks) % groups:
        return None  # a dot groups its result only on the devices that hold copies of it
    held = shards(axis_size, ospec)
    computed = max(held, min(blocks, devices // groups))
    after = []
    misordered = False
    for d, axes in enumerate(vspec):
        kept = [a for a in ospec[d] if a in axes]
        added = [a for a in axes if a in partial and a not in ospec[d]]
        misordered |= [a for a in axes if a in kept or a in added] != kept + added
        after.append(list(ospec[d]) + added)
    permute = computed > held or misordered
    if not permute and not (lookup and t.lowering == "cpu"):
        return None
    return Regrouped(computed, after, permute)


def _regrouped_partials(t: Tables, partial, pgroup, vspec, nb: float, regrouped: Regrouped, colls: list) -> list:
    """The reduction of partials computed at XLA's own sharding (``_regrouped``): one
    all-reduce over the reduction's axes of the computed blocks, then, where each device's
    block of the value is elsewhere, a collective-permute of that block to it (on every
    backend: the all-reduce is not followed by a slice of its own result, which a
    reduce-scatter could take the place of). Returns the result's sharding after it."""
    colls.append(Need(AR, tuple(partial), nb / regrouped.computed, pgroup))
    if regrouped.permute:
        moved = tuple(a for axes in vspec for a in axes if a in partial)
        colls.append(Need(PERMUTE, moved, nb / shards(t.axis_size, vspec), pgroup))
    return regrouped.after


def _reduce_partials(t: Tables, pat: Pattern, fax, partial, pgroup, vspec, ospec, lb: float, colls: list,
                     transient: list, j: int) -> list:
    """The reduction of result j's partial sums: a reduce-scatter over the axes its value
    is sharded on (under lowering="cpu" an all-reduce per dim they shard, and a slice), an
    all-reduce per reduction factor over the rest; returns the result's sharding after it."""
    axis_size = t.axis_size
    vaxes = {a for axes in vspec for a in axes}
    rs = tuple(a for a in partial if a in vaxes)
    ar = tuple(a for a in partial if a not in vaxes)
    if rs and t.lowering == "cpu":
        # one all-reduce of the whole per dim of the value the axes scatter over (XLA:CPU
        # reduces a weight gradient scattered over data and expert on two dims over data,
        # then over expert)
        for part in (tuple(a for a in axes if a in rs) for axes in vspec):
            if part:
                colls.append(Need(AR, part, lb, pgroup))
        transient.append(Transient(j, lb, False))  # the all-reduced whole, before the slice
    elif rs:
        colls.append(Need(RS, rs, lb, pgroup))
    # XLA sums the partials of each reduction factor with an all-reduce of its own (a
    # matmul contracting batch on data and sequence on model: over model, then over data;
    # a conv's filter gradient: over its spatial dims after the others); the factors' own
    # groups, spatial ones last
    parts: dict[tuple, list[str]] = {}
    owner = {}
    for k, ((kind, _, g), axes, h) in enumerate(zip(pat.factors, fax, pat.halos)):
        if kind == REDUCTION:
            for a in axes:
                owner[a] = (h is not None, k, g)
    for a in ar:
        parts.setdefault(owner[a], []).append(a)
    for (_, _, g), part in sorted(parts.items()):
        colls.append(Need(AR, tuple(part), lb / prod(axis_size, rs), g))
    # after the reduce-scatter the result holds those axes: treat them as present
    ospec = [list(o) for o in ospec]
    for a in rs:
        for d, axes in enumerate(vspec):
            if a in axes:
                ospec[d].append(a)
    return ospec


# ------------------------------------------------------- XLA's partitioner, corrected for

def unheld_factors(pat: Pattern, dec, fax, spec: SpecFn) -> None:
    """A factor sharded over an axis that none of the op's operands and results has on its
    dims -- the step's own shardings hold each of them whole there (an explicit-mode value's
    type, a constraint that replicates it) -- is not sharded by XLA: its partitioner reads
    an op's sharding off its operands' and result's, so it computes that dim whole rather
    than slicing the operands and gathering the result (a broadcast into an explicit-mode
    value typed whole over the vocabulary, the plan sharding the vocabulary elsewhere).
    Such axes are dropped from the factor (in place)."""
    unheld = {k: set(axes) for k, axes in enumerate(fax) if axes}  # factor -> axes no tensor has there yet
    for side, tensors in (("in", pat.operands), ("out", pat.results)):
        for i, (sig, fmap) in enumerate(tensors):
            if not unheld:
                return
            vspec = spec(sig, dec)
            for d, k in enumerate(fmap):
                for f in (k, *pat.minors.get((side, i, d), ())):
                    if f in unheld:
                        unheld[f].difference_update(vspec[d])
                        if not unheld[f]:
                            del unheld[f]
    for k, axes in unheld.items():
        fax[k] = [a for a in fax[k] if a not in axes]


def unaligned_minors(axis_size: dict[str, int], pat: Pattern, fax) -> None:
    """A merged dim's blocks are its minor dims' blocks only where every factor before the
    minor one is sharded all the way (block size 1): a minor factor after a partly
    sharded one is not sharded here (its split-side dim is resharded instead)."""
    for (side, t, d), ms in pat.minors.items():
        fmap = (pat.operands if side == "in" else pat.results)[t][1]
        k = fmap[d]
        full = k < 0 or prod(axis_size, fax[k]) == pat.factors[k][1]
        for m in ms:
            if not full:
                fax[m] = []
            full = full and prod(axis_size, fax[m]) == pat.factors[m][1]


def whole_mesh_partials(t: Tables, pat: Pattern, fax) -> None:
    """XLA's SPMD partitioner (jax 0.12, Shardy and GSPMD alike) all-reduces over *every*
    device, copies included, the partial filter gradient of a conv whose spatial dims are
    sharded, and of a grouped conv (``batch_group_count`` > 1: a depthwise conv's weight
    gradient) whose batch is: with a mesh axis left out of the reduction the gradient
    comes out that many times too large. Such a conv takes the rest of the mesh on its
    batch (the other reduction; each device then holds a distinct partial sum), or, where
    the batch cannot take it, leaves those reductions unsharded (operands gathered). XLA
    from jaxlib 0.12.1 sums them right: nothing forced
    (``XLA_SUMS_CONV_PARTIALS_OVER_WHOLE_MESH``)."""
    if not XLA_SUMS_CONV_PARTIALS_OVER_WHOLE_MESH:
        return
    affected = [k for k, ((kind, _, _), h) in enumerate(zip(pat.factors, pat.halos))
                if fax[k] and kind == REDUCTION and (h is not None or pat.grouped)]
    if not affected:
        return
    axis_size = t.axis_size
    reduced = {a for (kind, _, _), axes in zip(pat.factors, fax) if kind == REDUCTION for a in axes}
    used = {a for axes in fax for a in axes}
    rest = [a for a in t.axes if a not in reduced and axis_size[a] > 1]
    if not rest:
        return
    if not any(a in used for a in rest):
        for k, (kind, size, _) in enumerate(pat.factors):
            if (kind == REDUCTION and pat.halos[k] is None
                    and size % (prod(axis_size, fax[k]) * prod(axis_size, rest)) == 0):
                fax[k] = fax[k] + rest
                return
    for k in affected:
        fax[k] = []


def scatter_major(pat: Pattern, dec, fax, spec: SpecFn) -> None:
    """A partial result scattered over an axis that its value puts *major* to the axes the
    op already shards that dim with cannot be a plain reduce-scatter: XLA computes that
    dim whole (gathering the operands along it) and scatters over all its axes. The
    factor of such a dim is unsharded here (in place)."""
    partial = {a for (kind, _, _), axes in zip(pat.factors, fax) if kind == REDUCTION for a in axes}
    if not partial:
        return
    for sig, fmap in pat.results:
        vspec = spec(sig, dec)
        for d, k in enumerate(fmap):
            if k < 0 or not fax[k]:
                continue
            want = tuple(vspec[d])
            if any(a in partial for a in want) and tuple(fax[k]) != want[:len(fax[k])]:
                fax[k] = []


def unused_first_axis(t: Tables, pat: Pattern, dec, fax, spec: SpecFn, colls: list) -> None:
    """A lookup in shards that leaves the mesh's first axis (of more than one device) out:
    a gather whose indexed operand dims and whose indices are both sharded (an embedding's
    masked lookup, its batch sharded), or a scatter whose indexed dims and whose updates'
    scatter dims are (its gradient). XLA's SPMD partitioner (jax 0.12) then computes the
    lookup with its indexed dims on the first axis instead, moving the smaller of two sets
    of blocks there with a collective-permute: a gather's operand block (a scatter's
    result, at its value's sharding), or its indices' and result's blocks (a scatter's
    indices' and updates'). An axis left out of the op other than the first costs nothing:
    so on every placement over three axes (tests/test_cost_plan.py); over four, XLA also
    moves 2 of 46 placements whose looked-up dims take the first axis and the third or
    fourth, which this does not model."""
    axis_size = t.axis_size
    first = next((a for a in t.axes if axis_size[a] > 1), None)
    if first is None or any(first in axes for axes in fax) or len(pat.operands) != (2 if pat.lookup == "gather" else 3):
        return
    table, index = pat.operands[0][1], pat.operands[1][1]
    if any(k >= 0 and k in table for k in index):
        return  # a batched lookup (take_along_axis): XLA splits it along the batch first, moving nothing

    def block(side: str, i: int, nbytes: float, fmap) -> float:
        return nbytes / shards(axis_size, view(fax, fmap, pat.minors, side, i))

    indices = block("in", 1, pat.operand_bytes[1], index)
    if pat.lookup == "gather":
        rows = [k for k, (kind, _, _) in enumerate(pat.factors) if kind == REDUCTION]
        batch = [k for k in index if k >= 0]
        held = block("in", 0, pat.operand_bytes[0], table)
        looked_up = indices + block("out", 0, pat.result_bytes[0], pat.results[0][1])
    else:
        updates = pat.operands[2][1]
        rows = [k for k in table if k >= 0 and k not in updates and k not in index]
        batch = [k for k, (kind, _, _) in enumerate(pat.factors) if kind == REDUCTION]
        held = pat.result_bytes[0] / shards(axis_size, spec(pat.results[0][0], dec))
        looked_up = indices + block("in", 2, pat.operand_bytes[2], updates)
    axes = tuple(a for k in rows for a in fax[k])
    if not axes or not any(fax[k] for k in batch):
        return
    g = next((pat.factors[k][2] for k in rows if fax[k]), NO_DIM)
    colls.append(Need(PERMUTE, (first, *axes), min(held, looked_up), g))
