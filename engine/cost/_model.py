"""``CostModel``: the façade that scores plans, memoising what the pure modules compute.

A plan is an ordered list of decisions. ``_decisions``, ``recompute_of`` and ``states_of``
turn them into what the package works on -- sharding triples (``_shardings``), sorted
(unit, kind) recompute pairs and the state sets kept in host memory -- and are the only code
here that reads a decision's form. Everything else is a function of the tables
(``_tables``, built once per analysis, mesh and hardware; a recompute variant's by
``_variants``) and those: the façade holds the memo tables (per signature, per pattern, per
aggregate, per CSE key, per recompute edit, per recompute variant) and sums.

Pricing side, the top of the package: imports the building modules that make the tables,
every pricing module and the decision, mesh and analysis types.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Iterable, Sequence

import numpy as np

from .._decisions import Decision, Memory, Recompute, Resolve, Shard
from .._mesh import Hardware, MeshSpec
from ..analysis._types import Analysis
from ..analysis._constraints import check_mode
from ..analysis._recompute import value_readers
from ._aggregate import aggregate
from ._cse import ReadClasses, Reshards, common_reshards, read_classes
from ._facts import facts_of
from ._memory import memory_report, state_moves
from ._overlap import Timeline, build_timeline, overlapped
from ._patterns import pattern_cost
from ._pricing import copy_seconds
from ._records import Edit, Moved, PatternCost
from ._recompute import build_edit, extra_cost
from ._report import CostReport
from ._rows import collective_rows, host_link
from ._shardings import Spec, assign, shards
from ._tables import build_tables
from ._variants import recompute_variant
from ._workspace import workspace_buffers

# A decision's form is read by _decisions, recompute_of and states_of only.

LOWERINGS = ("tpu", "gpu", "cpu")


class CostModel:
    """Scores plans for one analysed program on one mesh and hardware."""

    def __init__(self, analysis: Analysis, mesh: MeshSpec, hardware: Hardware,
                 donate: Iterable[int] | None = None, lowering: str | None = None, user_shardings: str = "keep",
                 reserve: Iterable[str] = (), work_flops: float | None = None):
        """lowering: how XLA compiles the step (``LOWERINGS``): "tpu" (real reduce-scatters,
        elementwise chains fused into their readers), "gpu" (the same, and what XLA GPU keeps
        beside: ``_fusion.fused_values``' float32 upcasts, the cuBLAS workspace) or "cpu"
        (XLA:CPU lowers a reduce-scatter to an all-reduce of the whole partial result and a
        local slice, which takes a second full-size buffer; used to compare with XLA on
        simulated devices).
        user_shardings: "keep" (the step's own sharding constraints are fixed decisions ahead
        of every plan's, as XLA honours them; see _constraints) or "replace".
        reserve: mesh axes no decision may take (``Fixed.reserved``: a pipeline's stages').
        work_flops: the step's useful FLOPs, where the program computes more (a pipelined step
        computes in its bubble too): the ideal and the MFU count these (default: the program's)."""
        if lowering is None:
            lowering = hardware.lowering
        if lowering not in LOWERINGS:
            raise ValueError(f"lowering must be one of {', '.join(LOWERINGS)}, got {lowering!r}")
        self.user_shardings = check_mode(user_shardings)
        self.fixed = analysis.fixed(mesh, user_shardings)
        if reserve:
            self.fixed = dataclasses.replace(self.fixed, reserved=frozenset(reserve))
        self.lowering = lowering
        self.donate = tuple(donate or ())  # the inputs whose buffers the step's outputs may reuse
        self.analysis = analysis
        self.mesh = mesh
        self.hw = hardware
        self.program = analysis.program
        self.units = analysis.units
        self.tables = t = build_tables(analysis, mesh, hardware, donate, lowering, self.fixed)
        self.work_flops = t.total_flops if work_flops is None else float(work_flops)
        self.axis_size = t.axis_size
        self.sigs = t.sigs
        self.patterns = t.patterns
        # group -> [(its view id in partially manual regions, their manual axes)] (_tables.region_groups)
        self._views: dict[int, list[tuple[int, frozenset[str]]]] = {}
        for k, (g, manual) in enumerate(t.views):
            self._views.setdefault(g, []).append((len(analysis.groups) + k, manual))
        # memo tables, keyed by what each result depends on (a mask's decisions, ...)
        self._sig_cache: dict = {}  # (signature, decisions) -> its sharding
        self._pat_cache: dict = {}  # (pattern, decisions) -> PatternCost
        self._agg_cache: dict = {}  # (mask, decisions) -> Aggregate; (rc, mask, decisions) -> extra cost
        self._factor_cache: dict = {}  # (mask, decisions) -> the signatures' shard counts
        self._reshard_cache: dict = {}  # (the plan's operand reshards, rc) -> Reshards
        # (the aggregates', the reshards' and the timeline's ids) -> (those objects, seconds,
        # exposed): plans that differ only where no collective changes (recompute, a group
        # without any) share one schedule. The objects are kept in the value so their ids
        # stay theirs.
        self._overlap_cache: dict = {}
        self._cse_memo: dict = {}  # (read class, rc, its patterns' reshards) -> its CSE (_cse)
        self._classes: ReadClasses | None = None  # built on the first plan with an operand reshard
        self._edits: dict = {}  # recompute decisions -> Edit
        self._moves: dict = {}  # state sets in host memory -> (Moved, per set its arguments and updates)
        self._tl: Timeline | None = None  # built on the first overlapped evaluation
        self._readers: list | None = None  # per value, its readers: built on the first edit
        # recompute decisions -> the cost model of the program as XLA fuses it under them
        # (``_variant``); None on such a variant itself, whose ``_base`` is this model
        self._variants: dict | None = {}
        self._base: CostModel = self

    # ------------------------------------------------------------------ decisions
    # The only two methods that read decisions: into the triples and pairs the package works on.
    def _decisions(self, decisions: Sequence[Decision]) -> list[tuple[int, str, int]]:
        """The sharding decisions, as (group, axis, axis size); recompute decisions left out,
        a conflict's resolution as (group, resolution, 0) (``_shardings.assign`` reads it;
        it shards nothing)."""
        fixed = self.fixed
        placed: list[Shard | Resolve] = [d for d in decisions if isinstance(d, (Shard, Resolve))]
        if fixed.groups:  # the user's shardings first; a plan cannot move a group they fix
            placed = [*fixed.decisions, *(d for d in placed if d.group not in fixed.groups)]
        out = [(d.group, d.axis, self.axis_size[d.axis]) if isinstance(d, Shard) else (d.group, d.resolution, 0)
               for d in placed]
        if self._views:  # each group as partially manual regions see it, after the group's own
            out = [t for g, a, n in out
                   for t in [(g, a, n)] + [(v, a, n) for v, manual in self._views.get(g, ()) if a not in manual]]
        return out

    @staticmethod
    def recompute_of(decisions: Sequence[Decision]) -> tuple[tuple[int, str], ...]:
        """The recompute decisions, as sorted (unit, kind); the last one for a unit counts."""
        out = {d.unit: d.kind for d in decisions if isinstance(d, Recompute)}
        return tuple(sorted(out.items()))

    @staticmethod
    def states_of(decisions: Sequence[Decision]) -> tuple[int, ...]:
        """The state sets the plan keeps in host memory, sorted."""
        return tuple(sorted({d.state for d in decisions if isinstance(d, Memory)}))

    def host_state_values(self, decisions: Sequence[Decision]) -> frozenset[int]:
        """The arguments and results the plan's memory decisions keep in host memory."""
        states = self.states_of(decisions)
        return frozenset(v for ins, outs in self._moved(states)[1] for v in (*ins.tolist(), *outs.tolist())) \
            if states else frozenset()

    # ------------------------------------------------------------------ memoised pieces
    def sig_spec(self, sig: int, dec: Sequence[tuple[int, str, int]]) -> list[list[str]]:
        """A value signature's sharding (per dim, its mesh axes) under decision triples."""
        m = self.tables.sig_mask[sig]
        rel = tuple(d for d in dec if (m >> d[0]) & 1)
        key = (sig, rel)
        r = self._sig_cache.get(key)
        if r is None:
            r = self._sig_cache[key] = assign(self.sigs[sig], rel)
        return r

    def _pattern_cost(self, pi: int, dec) -> PatternCost:
        same = self.tables.same_pattern
        if same is not None and same[pi] >= 0:  # a variant's pattern the program has too: its cost
            return self._base._pattern_cost(int(same[pi]), dec)
        m = self.tables.pat_mask[pi]
        rel = tuple(d for d in dec if (m >> d[0]) & 1)
        key = (pi, rel)
        r = self._pat_cache.get(key)
        if r is None:
            r = self._pat_cache[key] = pattern_cost(self.tables, self.patterns[pi], rel, self.sig_spec)
        return r

    def _op_views(self, o: int, dec) -> tuple:
        """The shardings op ``o`` reads its operands in (and writes its results in) under ``dec``."""
        pi = int(self.tables.op_pattern[o])
        m = self.tables.pat_mask[pi]
        return self._pattern_cost(pi, tuple(d for d in dec if (m >> d[0]) & 1)).views

    def _value_readers(self) -> list:
        if self._readers is None:
            self._readers = value_readers(self.program)
        return self._readers

    def _edit(self, rc: tuple[tuple[int, str], ...]) -> Edit:
        e = self._edits.get(rc)
        if e is None:
            e = self._edits[rc] = build_edit(self.tables, rc, self.units, self._value_readers())
        return e

    def _moved(self, states: tuple[int, ...]) -> tuple[Moved, list[tuple[np.ndarray, np.ndarray]]]:
        """The memory change of keeping ``states`` in host memory, and per set the values it
        copies over the host link: (its arguments, their updates) (``_memory.state_moves``)."""
        r = self._moves.get(states)
        if r is None:
            r = self._moves[states] = state_moves(self.analysis, self.tables.live, states)
        return r

    def _variant(self, rc: tuple[tuple[int, str], ...]) -> CostModel:
        """This cost model with its ops priced as XLA fuses the program under recompute
        decisions ``rc`` (``_variants``), its memo tables of the patterns its own and those
        of the program's patterns this model's (``_base``). Memoised; the edit (``_edit``)
        is the variant's own. On XLA:CPU, which neither duplicates nor rematerialises fused
        values, and where the decisions change no read, this model itself."""
        if self._variants is None or self.lowering == "cpu":
            return self
        v = self._variants.get(rc)
        if v is None:
            tables = recompute_variant(self.tables, rc, self._value_readers())
            v = self
            if tables is not None:
                v = copy.copy(self)
                v._base = self
                v.tables = tables
                v.patterns = tables.patterns
                v._pat_cache, v._agg_cache, v._reshard_cache, v._overlap_cache = {}, {}, {}, {}
                v._cse_memo, v._classes, v._edits, v._tl, v._variants = {}, None, {}, None, None
            self._variants[rc] = v
        return v

    def _extra(self, edit: Edit, dec, detail: bool) -> tuple[float, float, list]:
        """(compute s, comm s, collectives) of the ops a recompute runs again."""
        compute = comm = 0.0
        colls = []
        for m, items in edit.extra:
            rel = tuple(d for d in dec if (m >> d[0]) & 1)
            key = (edit.rc, m, rel)
            r = self._agg_cache.get(key)
            if r is None:
                r = self._agg_cache[key] = extra_cost(items, rel, self._pattern_cost)
            compute += r[0]
            comm += r[1]
            if detail:
                colls += r[2]
        return compute, comm, colls

    def _timeline(self) -> Timeline:
        if self._tl is None:
            self._tl = build_timeline(self.tables)
        return self._tl

    def _local_bytes(self, dec) -> np.ndarray:
        """Per value, its bytes per device (shard counts memoised per group mask), in whole
        bytes as XLA lays a buffer out: a shard of int4[6] over 2 devices (three int4) takes 2."""
        t = self.tables
        sig_factor = np.empty(len(self.sigs), dtype=np.float64)
        for m, sigs in t.sig_masks:
            rel = tuple(d for d in dec if (m >> d[0]) & 1)
            f = self._factor_cache.get((m, rel))
            if f is None:
                f = self._factor_cache[(m, rel)] = np.array([shards(t.axis_size, self.sig_spec(si, rel)) for si in sigs])
            sig_factor[sigs] = f
        return np.ceil(t.nbytes / sig_factor[t.vsig])

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, decisions: Sequence[Decision], detail: bool = False, overlap: bool | None = None) -> CostReport:
        """The plan's step time, memory and (``detail``) collectives. ``overlap``: schedule
        collectives under compute (default: as the hardware does; False: every collective
        exposed, the step a sum: additive over decisions, as the ILP linearises it)."""
        rc = self.recompute_of(decisions)
        if rc and self._variants is not None:
            variant = self._variant(rc)
            if variant is not self:
                return variant.evaluate(decisions, detail, overlap)
        t = self.tables
        if overlap is None:
            overlap = self.hw.overlap
        dec = self._decisions(decisions)
        edit = self._edit(rc) if rc else None
        local = self._local_bytes(dec)
        # time: patterns that depend on the same groups share one memoised aggregate
        compute = comm = 0.0
        colls, transients, aggs, reshard_keys = [], [], [], []
        cache = self._agg_cache
        for m, pis in t.mask_groups:
            rel = tuple(d for d in dec if (m >> d[0]) & 1)
            agg = cache.get((m, rel))
            if agg is None:
                agg = cache[(m, rel)] = aggregate(t, pis, rel, self._pattern_cost)
            aggs.append(agg)
            compute += agg.compute
            comm += agg.comm
            if agg.resharded:
                reshard_keys += agg.reshard_keys
            if agg.transients:
                transients += agg.transients
            if detail:
                colls += agg.colls
        extra_colls = []
        xc = xm = 0.0
        if edit is not None:
            xc, xm, extra_colls = self._extra(edit, dec, detail)
            # the saved slices the recomputation reads through its barrier: each copied out
            xc += sum(copy_seconds(self.hw, float(local[v])) * n for v, n in zip(edit.barrier_v, edit.barrier_n))
            compute += xc
            comm += xm
        common = self._common_reshards(aggs, reshard_keys, rc, t.user_late if edit is None else edit.late)
        buffers = common.buffers
        if transients:
            buffers = tuple(np.concatenate((x, np.array(y, dtype=x.dtype)))
                            for x, y in zip(buffers, zip(*transients)))
        if t.workspace:
            work = workspace_buffers(t, local, edit, lambda o: self._op_views(o, dec),
                                     lambda v: self.sig_spec(int(t.vsig[v]), dec))
            buffers = tuple(np.concatenate((x, y)) for x, y in zip(buffers, work))
        comm -= common.saved
        step = compute + comm
        exposed = None
        if overlap and comm > 0:
            # the recomputation's ops run as one block, their collectives in line
            tl = self._timeline()
            okey = (*map(id, aggs), id(common), id(tl))
            hit = self._overlap_cache.get(okey)
            if hit is None or (detail and hit[2] is None):
                secs, exposed = overlapped(t, tl, aggs, common.dup_ops, common.hoisted)
                # the exposed seconds per collective are read for detail only: kept for that
                self._overlap_cache[okey] = (aggs, common, tl), secs, exposed if detail else None
            else:
                secs, exposed = hit[1], hit[2]
            step = min(step, secs + xc + xm)
        ideal = self.work_flops / (self.mesh.size * self.hw.peak_flops)
        states = self.states_of(decisions)
        moves = self._moved(states) if states else None
        # XLA:CPU keeps every array in device memory whatever its memory space: there state
        # kept in host memory is state on the device (its copies still made)
        mem = memory_report(t.live, local, detail, buffers, edit,
                            moves[0] if moves and self.lowering != "cpu" else None)
        # offloaded residuals and state kept in host memory: copies over the host link
        link = host_link(t, edit, local, states, moves[1] if moves else [], compute, overlap, detail)
        if link.offloaded is not None:
            mem = dataclasses.replace(mem, host=mem.host + link.offloaded)
        if link.hidable or link.tail:
            comm += link.hidable + link.tail
            step += link.wait + link.tail
        report_colls = ()
        if detail:
            report_colls = tuple(collective_rows(t, colls, common.dup, extra_colls, exposed)) + link.rows
        return CostReport(step, compute, comm, ideal, (ideal / step) if step > 0 else 0.0, mem,
                          self.hw.budget, self.hw.fits(mem.peak, mem.host), report_colls, max(0.0, compute + comm - step))

    def _common_reshards(self, aggs, reshard_keys: list, rc, late) -> Reshards:
        """The plan's operand reshards after CSE, memoised on what they depend on: the
        reshards (pattern, kind, axes, bytes, operand, view) and the recompute decisions
        (which fix the weights re-taken in the backward pass)."""
        rkey = (tuple(reshard_keys), rc)
        common = self._reshard_cache.get(rkey)
        if common is None:
            resharded = [x for agg in aggs for x in agg.resharded]
            if self._classes is None:
                self._classes = read_classes(self.tables)
            common = self._reshard_cache[rkey] = common_reshards(self.tables, self._classes, resharded, late,
                                                                 self._cse_memo, rc)
        return common

    # ------------------------------------------------------------------ per op and per value
    def op_costs(self, decisions: Sequence[Decision]) -> np.ndarray:
        """Per op of the program: [compute seconds, FLOPs per device] per step under
        ``decisions`` (every trip of a loop body; a recomputation's copies not included)."""
        dec = self._decisions(decisions)
        per = np.zeros((len(self.patterns), 2))
        for m, pis in self.tables.mask_groups:
            rel = tuple(d for d in dec if (m >> d[0]) & 1)
            for pi in pis:
                pc = self._pattern_cost(pi, rel)
                per[pi] = pc.compute, pc.work[0]
        trips = np.fromiter((op.trip for op in self.program.ops), dtype=np.float64, count=len(self.program.ops))
        return per[self.tables.op_pattern] * trips[:, None]

    def work(self, decisions: Sequence[Decision], loops_once: bool = False) -> tuple[float, float]:
        """(FLOPs, bytes of operands and results) per device per step under ``decisions``,
        recomputed ops included; ``loops_once``: a loop body's ops counted once, not once per
        trip (XLA's HloCostAnalysis counts a while body once)."""
        dec = self._decisions(decisions)
        flops = nbytes = 0.0
        for m, pis in self.tables.mask_groups:
            rel = tuple(d for d in dec if (m >> d[0]) & 1)
            for pi in pis:
                f, b = self._pattern_cost(pi, rel).work
                pat = self.patterns[pi]
                n = len(pat.ops) if loops_once else pat.weight
                flops += f * n
                nbytes += b * n
        rc = self.recompute_of(decisions)
        if rc:
            for m, items in self._edit(rc).extra:
                rel = tuple(d for d in dec if (m >> d[0]) & 1)
                for pi, _, n in items:
                    f, b = self._pattern_cost(pi, rel).work
                    if loops_once:  # the copies' trips: a recomputed loop body runs once more
                        n = min(n, len(self.patterns[pi].ops))
                    flops += f * n
                    nbytes += b * n
        return flops, nbytes

    def value_specs(self, decisions: Sequence[Decision]) -> dict[int, Spec]:
        dec = self._decisions(decisions)
        vsig = self.tables.vsig
        return {v.id: tuple(tuple(a) for a in self.sig_spec(int(vsig[v.id]), dec))
                for v in self.program.values}

    def operand_specs(self, decisions: Sequence[Decision]) -> dict[tuple[int, int], Spec]:
        """(op, operand index) -> the sharding the op consumes the operand in, where it
        differs from the value's own sharding (the resharding points); and, for the ops
        whose cost facts say ``write_at_view``, (op, -1 - j) -> the sharding the op writes
        result j in, where coarser than the value's."""
        dec = self._decisions(decisions)
        out = {}
        for op, pi in zip(self.program.ops, self.tables.op_pattern.tolist()):
            pat = self.patterns[pi]
            views = self._pattern_cost(pi, dec).views
            for i, ((sig, _), view) in enumerate(zip(pat.operands, views)):
                if tuple(tuple(a) for a in self.sig_spec(sig, dec)) != view:
                    out[(op.id, i)] = view
            if facts_of(op.primitive).write_at_view:
                for j, ((sig, _), view) in enumerate(zip(pat.results, views[len(pat.operands):])):
                    if view is not None and tuple(tuple(a) for a in self.sig_spec(sig, dec)) != view:
                        out[(op.id, -1 - j)] = view
        return out
