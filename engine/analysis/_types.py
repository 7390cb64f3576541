"""The analysis' records: what ``analyze`` (``_analysis``) returns and what the roles
(``_roles``) read and make, apart from the stages that compute them.

``NamedDim``, ``Group`` and ``Conflict`` are the named dimensions, their layer groups and
intra conflicts; ``DimAnalysis`` the named-dimension analysis proper with its lookups (what
``_roles.infer_roles`` reads); ``Roles`` the roles of the inputs and groups;
``Analysis`` all of it with what is built on top (user shardings, recompute units' groups,
titles); ``GroupInfo`` what a view shows of one group. Imports no stage of the analysis.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Mapping

import numpy as np

from .._decisions import MEMORY_SPACES, NO_DIM, STATE_LABELS, STATES, Decision, GroupId, NamedDimId
from ..tracing._program import NO_PRODUCER, OpId, Program, ValueId
from ._constraints import BINDING, Fixed, UserSharding, fixed_decisions
from ._recompute import Unit
from ._rules import Factor


@dataclasses.dataclass(frozen=True, slots=True)
class NamedDim:
    """A named dimension: the (value, dim) nodes the program's ops tie together, one size
    along every tensor it runs through; ``group``: the decision group it belongs to."""

    id: NamedDimId
    label: str
    sizes: tuple[int, ...]  # distinct dim sizes (reshape majors can differ)
    members: int  # number of (value, dim) nodes
    bytes: int  # total bytes of the tensors it touches
    group: GroupId
    loop_axis: bool  # the leading loop axis of scanned xs/ys: not sharded (pipelining)
    inputs: tuple[tuple[str, int], ...]  # (input pytree path, dim) members


@dataclasses.dataclass(frozen=True, slots=True)
class Group:
    """Named dimensions with the same role (one per layer): one decision covers them all."""

    id: GroupId
    label: str
    named_dims: tuple[NamedDimId, ...]
    size: int  # the (largest) dim size
    bytes: int
    decidable: bool  # worth a decision: not a loop axis, not tiny
    # mesh axes no decision on it can use: every dim of it lies in partially manual
    # shard_map regions manual over them
    manual: frozenset[str] = frozenset()


# A conflict's resolution is a decision on its group: Resolve(group, "second"). With no
# such decision a tensor holding two dims of the group shards the first (attention's query
# sequence: K/V are all-gathered); "second" shards the other (the key sequence: Q is gathered
# and the attention output reduce-scattered), "neither" leaves the group unsharded in those
# tensors (attention computed on the whole sequence: Q, K, V gathered).


@dataclasses.dataclass(frozen=True, slots=True)
class Conflict:
    """A value with two dims in one named dimension: sharding that named dimension can shard
    only one of them. Resolving it cuts the named dimension in two and the cut edges become
    communication (for attention: an all-gather of K/V along the sequence)."""

    id: int
    kind: str  # "intra"
    named_dim: NamedDimId
    group: GroupId
    values: tuple[tuple[int, int, int], ...]  # (value id, dim a, dim b) carrying it
    path: tuple[int, ...]  # op ids joining dim a to dim b of the first value
    options: tuple[str, ...]  # the candidate resolutions, for the report


@dataclasses.dataclass(frozen=True)
class GroupInfo:
    """What a view shows about one decision group: its input tensors, the source lines of
    the ops that make its tensors, and its conflicts. ``label`` names the group's decisions
    (plan and session files, pins); ``title`` is what a view shows (``Analysis.titles``)."""

    id: GroupId
    label: str
    size: int
    bytes: int
    layers: int  # named dims in the group (one per layer for layer-local dims)
    tensors: tuple[tuple[str, tuple[int, ...], int], ...]  # (input path, shape, dim), in argument order
    sources: tuple[tuple[str, int], ...]  # (source line, ops) of ops producing its tensors
    conflicts: tuple[dict, ...]  # describe_conflict of its intra conflicts
    title: str = ""  # its readable title (Analysis.titles); the label where empty

    @property
    def shown(self) -> str:
        """What a view shows for the group: its ``title``, else its ``label``."""
        return self.title or self.label



@dataclasses.dataclass(frozen=True)
class DimAnalysis:
    """The named-dimension analysis proper, frozen: the program's named dimensions, their layer
    groups and conflicts (``analyze``'s four stages), with the lookups every later stage uses.
    The roles (``_roles.infer_roles``) and the rest of ``Analysis`` are built on it."""

    program: Program
    factors: tuple[tuple[Factor, ...], ...]  # per op
    node_base: np.ndarray  # [num_values] first node id of each value (read-only)
    node_nd: np.ndarray  # [num_nodes] named dim of each (value, dim) node, NO_DIM if size 1 (read-only)
    named_dims: tuple[NamedDim, ...]
    groups: tuple[Group, ...]
    conflicts: tuple[Conflict, ...]
    cooccur: Mapping[tuple[GroupId, GroupId], int]  # group pair -> bytes of tensors holding both
    unknown_primitives: Mapping[str, int]
    edges: tuple[np.ndarray, np.ndarray, np.ndarray] = dataclasses.field(repr=False)  # (node, node, op) ties
    units: tuple[Unit, ...]  # forward layer stacks a recompute decision can cover (_recompute)

    def static_inputs(self) -> list[tuple[str, str]]:
        """The args' static (non-array) leaves, closed over and left out of every plan:
        (path, what it is)."""
        return [(path, f"{type(v).__name__} {v!r:.40}") for _, path, v in self.program.static_inputs]

    def kernels(self) -> list[dict]:
        """The step's kernels (``pallas_call``) and custom-partitioned ops, one entry per
        call site: ``kind``, ``name``, ``source``, ``count``, how XLA shards it
        (``sharding``) and where partex's cost of it comes from (``cost``)."""
        manual = self.program.manual_values
        seen: dict[tuple, dict] = {}
        for op in self.program.ops:
            if op.primitive not in ("pallas_call", "custom_partitioning"):
                continue
            if op.primitive == "pallas_call":
                body = getattr(op.params.get("jaxpr"), "debug_info", None)
                name = str(op.params.get("name") or getattr(body, "func_name", None) or "kernel")
                est = op.params.get("cost_estimate")
                cost = "its cost_estimate" if est is not None else "its body's FLOPs once per grid step"
                if op.inputs and op.inputs[0] in manual:
                    how = "per device (inside a shard_map region)"
                else:
                    how = ("XLA's partitioner cannot see inside it: its operands are gathered and it runs whole "
                           "on every device (shard it with shard_map, or custom_partitioning with a sharding_rule)")
            else:
                call = op.params.get("call")
                name = getattr(getattr(call, "debug_info", None), "func_name", None) or "custom_partitioning"
                rule = op.params.get("sharding_rule")
                how = (f"sharded by its sharding_rule '{_rule_text(rule)}'" if hasattr(rule, "operand_mappings")
                       else "its sharding_rule is not one partex reads (a function of the mesh): every dim kept whole")
                cost = "the FLOPs of the function it wraps"
            key = (op.primitive, name, op.source)
            entry = seen.setdefault(key, {"kind": op.primitive, "name": name, "source": op.source, "count": 0,
                                          "sharding": how, "cost": cost})
            entry["count"] += 1
        return list(seen.values())

    # ---- lookups
    def nd_of(self, vid: int, dim: int) -> NamedDimId:
        """The named dimension of dim ``dim`` of value ``vid`` (``NO_DIM`` for a dim of size 1)."""
        return int(self.node_nd[self.node_base[vid] + dim])

    def group_of(self, vid: int, dim: int) -> GroupId:
        """The decision group of dim ``dim`` of value ``vid`` (``NO_DIM`` for a dim of size 1)."""
        nd = self.nd_of(vid, dim)
        return NO_DIM if nd == NO_DIM else self.named_dims[nd].group

    def decision_label(self, decision: Decision, arrow: str = "->") -> str:
        """``group->axis`` for a sharding decision, ``group->resolve:second`` for a
        resolution, ``layers ...->recompute:kind`` for a recompute one, ``optimizer
        state->memory:host`` for a memory one: ``decision``'s subject and slot joined by
        ``arrow``."""
        return f"{self.subject_label(decision)}{arrow}{decision.slot}"

    def subject_label(self, decision: Decision) -> str:
        """What ``decision`` decides about: its group's, layer stack's or state set's label."""
        if decision.ON == "unit":
            return self.units[decision.id].label
        if decision.ON == "state":
            return STATE_LABELS[STATES[decision.id]]
        return self.groups[decision.id].label

    def conflicted_groups(self) -> list[int]:
        """Decision groups with an intra conflict: those a resolution decision can take."""
        return sorted({c.group for c in self.conflicts if self.groups[c.group].decidable})

    def unit_by_label(self, label: str) -> Unit | None:
        """The recompute unit (layer stack) called ``label``, or None."""
        return next((u for u in self.units if u.label == label), None)

    def group_by_label(self, label: str) -> Group | None:
        """The group called ``label``, or None."""
        for g in self.groups:
            if g.label == label:
                return g
        return None

    @property
    def decision_groups(self) -> list[Group]:
        """The groups worth a decision (``Group.decidable``), in id order."""
        return [g for g in self.groups if g.decidable]

    def decision_space(self, num_axes: int) -> dict[str, int]:
        """Sizes of the decision space on a mesh of ``num_axes`` axes: (decision groups x
        axes) vs the raw (tensors x dims x axes) of a per-tensor search, as
        ``{"groups", "named_dims", "decisions", "raw_decisions"}``."""
        raw = sum(1 for v in self.program.values for s in v.shape if s > 1)
        return {
            "groups": len(self.decision_groups),
            "named_dims": len(self.named_dims),
            "decisions": len(self.decision_groups) * num_axes,
            "raw_decisions": raw * num_axes,
        }

    def describe_conflict(self, c: Conflict) -> dict[str, Any]:
        """The conflict ``c`` for reading, as JSON data: its named dimension and group by
        label, its first value (name, shape, the two dims, producer, source), how many values
        carry it, the ops joining the two dims, and the resolutions."""
        p = self.program
        vid, a, b = c.values[0]
        v = p.values[vid]
        return {
            "id": c.id,
            "kind": c.kind,
            "named_dim": self.named_dims[c.named_dim].label,
            "group": self.groups[c.group].label,
            "value": v.name or f"%{vid}",
            "shape": list(v.shape),
            "dims": [a, b],
            "producer": (p.ops[v.producer].primitive if v.producer != NO_PRODUCER else "input"),
            "source": (p.ops[v.producer].source if v.producer != NO_PRODUCER else v.name),
            "values": len(c.values),
            "path": [f"{p.ops[o].primitive} @ {p.ops[o].source}" for o in c.path],
            "options": list(c.options),
        }


@dataclasses.dataclass(frozen=True)
class Roles:
    """The roles of a program's inputs and of its analysis' groups (``_roles.infer_roles``:
    its module doc gives the rules)."""

    mirror: Mapping[ValueId, ValueId]  # output leaf -> the input leaf it mirrors
    parameters: frozenset[ValueId]  # input value ids
    optimizer: frozenset[ValueId]
    data: frozenset[ValueId]
    forward_ops: frozenset[OpId]
    param_matmuls: tuple[OpId, ...]
    batch_groups: tuple[GroupId, ...]  # largest first
    pair_groups: tuple[GroupId, ...]  # largest first
    vocab_groups: tuple[GroupId, ...]  # largest first
    expert_groups: tuple[GroupId, ...]  # largest first
    joined_groups: tuple[GroupId, ...]  # vocabulary-like, contracted after a concatenate; largest first
    param_group_bytes: Mapping[GroupId, int]

    @property
    def state(self) -> frozenset[ValueId]:
        return self.parameters | self.optimizer

    def category(self, vid: ValueId) -> str:
        """The memory-breakdown category of an input value."""
        if vid in self.parameters:
            return "parameters"
        if vid in self.optimizer:
            return "optimizer"
        return "activations"


@dataclasses.dataclass(frozen=True)
class Analysis(DimAnalysis):
    """What ``analyze`` returns, frozen: the ``DimAnalysis`` and what is built on it once, after
    it: the roles of inputs and groups (``Roles``), the step's own shardings
    (``_constraints.UserSharding``: with_sharding_constraint, reshard, a called jit's in/out
    shardings, in program order), each recompute unit's local groups and each group's title."""

    roles: Roles
    user_shardings: tuple[UserSharding, ...]
    # per recompute unit, the groups local to its layers (see _unit_groups)
    unit_groups: Mapping[int, frozenset[GroupId]]
    # every group's readable title (see _titles); the label stays each decision's name in files
    titles: Mapping[GroupId, str]
    seconds: float

    def state_inputs(self, state: int) -> tuple[int, ...]:
        """The input values of state set ``state`` (an index into ``STATES``), in input order."""
        members = self.roles.optimizer if STATES[state] == "optimizer" else self.roles.parameters
        return tuple(v for v in self.program.inputs if v in members)

    def movable_states(self) -> tuple[int, ...]:
        """The state sets a ``Memory`` decision may place: those the step has, not already
        all in host memory (the step's own placement)."""
        vals = self.program.values
        return tuple(s for s in range(len(STATES))
                     if (ins := self.state_inputs(s)) and not all(vals[v].host for v in ins))

    def fixed(self, mesh, mode: str = "keep") -> Fixed:
        """What the user's shardings fix on ``mesh`` (``_constraints.Fixed``); PartexError
        if one names a mesh axis the plan's mesh lacks. ``mode="replace"``: only those no plan
        can move (``_constraints.BINDING``: a shard_map region's specs)."""
        items = self.user_shardings if mode == "keep" else [us for us in self.user_shardings if us.kind in BINDING]
        return fixed_decisions(items, self.group_of, mesh)

    def summary(self) -> dict[str, Any]:
        """The counts: ops, values, dims, named dims, decision groups, conflicts, the step's
        own shardings, unknown primitives (by name), and the analysis's seconds."""
        return {
            "ops": self.program.num_ops,
            "values": len(self.program.values),
            "dims": int((self.node_nd != NO_DIM).sum()),
            "named_dims": len(self.named_dims),
            "groups": len(self.decision_groups),
            "conflicts": len(self.conflicts),
            "user_shardings": len(self.user_shardings),
            "unknown_primitives": dict(sorted(self.unknown_primitives.items())),
            "seconds": round(self.seconds, 3),
        }

    def to_json(self) -> dict[str, Any]:
        """``summary`` and every list as JSON data (``partex analyze --json``): named dims,
        groups, conflicts, recompute units, state sets, static inputs, the step's own
        shardings and the group pairs tensors hold together."""
        out = self.summary()
        out["named_dim_list"] = [
            {"id": n.id, "label": n.label, "sizes": list(n.sizes), "members": n.members,
             "bytes": n.bytes, "group": n.group, "loop_axis": n.loop_axis,
             "inputs": [f"{p}:{d}" for p, d in n.inputs[:8]]}
            for n in self.named_dims
        ]
        out["group_list"] = [
            {"id": g.id, "label": g.label, "title": self.titles[g.id], "named_dims": list(g.named_dims),
             "size": g.size,
             "bytes": g.bytes, "decidable": g.decidable}
            for g in self.groups
        ]
        out["conflict_list"] = [self.describe_conflict(c) for c in self.conflicts]
        out["recompute_units"] = [{"id": u.id, "label": u.label, "layers": u.layers, "source": u.where,
                                   "scan": u.loop is not None, "kinds": list(u.kinds)}
                                  for u in self.units]
        vals = self.program.values
        out["state_sets"] = [{"id": st, "role": STATES[st], "label": STATE_LABELS[STATES[st]],
                              "arrays": len(ins := self.state_inputs(st)), "bytes": sum(vals[v].nbytes for v in ins),
                              "spaces": list(MEMORY_SPACES)} for st in self.movable_states()]
        out["static_inputs"] = [{"path": p, "value": v} for p, v in self.static_inputs()]
        out["user_sharding_list"] = [
            {**us.to_json(), "groups": [None if self.group_of(us.value, d) == NO_DIM
                                        else self.groups[self.group_of(us.value, d)].label
                                        for d in range(len(us.spec))]}
            for us in self.user_shardings
        ]
        out["cooccur"] = [
            {"groups": [self.groups[a].label, self.groups[b].label], "bytes": n}
            for (a, b), n in sorted(self.cooccur.items(), key=lambda kv: -kv[1])
        ]
        return out

    def group_infos(self, max_tensors: int = 64, max_sources: int = 8) -> dict[GroupId, GroupInfo]:
        """The ``GroupInfo`` of every decision group, by id: at most ``max_tensors`` input
        tensors and the ``max_sources`` source lines producing most of its tensors."""
        p = self.program
        order = {vid: k for k, vid in enumerate(p.inputs)}
        by_path = {path: vid for vid, path in zip(p.inputs, p.input_paths)}
        sources: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
        gnd = [nd.group for nd in self.named_dims]
        for v in p.values:
            if v.producer == NO_PRODUCER:
                continue
            src = p.ops[v.producer].source
            if not src:
                continue
            base = int(self.node_base[v.id])
            for d in range(len(v.shape)):
                nd = int(self.node_nd[base + d])
                if nd != NO_DIM:
                    sources[gnd[nd]][src] += 1
        conflicts: dict[int, list[dict]] = collections.defaultdict(list)
        for c in self.conflicts:
            conflicts[c.group].append(self.describe_conflict(c))
        out = {}
        titles = self.titles
        for g in self.decision_groups:
            tensors = []
            for nd in g.named_dims:
                for path, dim in self.named_dims[nd].inputs:
                    vid = by_path[path]
                    tensors.append((order[vid], path, tuple(p.values[vid].shape), dim))
            tensors.sort()
            out[g.id] = GroupInfo(g.id, g.label, g.size, g.bytes, len(g.named_dims),
                                  tuple(t[1:] for t in tensors[:max_tensors]),
                                  tuple(sources[g.id].most_common(max_sources)), tuple(conflicts[g.id]),
                                  titles[g.id])
        return out


def _rule_text(rule) -> str:
    """A Shardy sharding rule in its einsum-like notation (``'b f, b f -> b f'``), with
    the factors it keeps whole."""
    def side(ms):
        return ", ".join(" ".join(d if isinstance(d, str) else "(" + " ".join(d) + ")" for d in m) for m in ms)
    text = f"{side(rule.operand_mappings)} -> {side(rule.result_mappings)}"
    kept = tuple(rule.need_replication_factors) + tuple(rule.permutation_factors)
    return text + (f"; {' '.join(kept)} kept whole" if kept else "")
