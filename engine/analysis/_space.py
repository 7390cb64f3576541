"""The decision space of one analysed model on one mesh: the decisions a plan can take,
and the one way from what a user writes to a ``Decision``.

A user (the CLI, the explorer, a plan file, a script) names a decision by a group — its id,
its label or an anchor ``input/path:dim`` (an input leaf and a dim of it) — or a layer
stack (its id, label or anchor), or a set of the step's state (``optimizer``,
``parameters``), and a slot: a mesh axis, ``resolve:<resolution>``, ``recompute:<kind>`` or
``memory:<space>``. ``DecisionSpace.decision`` turns that into a typed decision or says
in one line what is wrong; ``check_takeable`` says whether the search may take it (pins);
``from_plan`` reads a plan file's decisions by anchor first, then by label. The search's
candidate actions (``actions``) and the order of its tree keys' slots (``slots``) live
here too, so that a new kind of decision is added to the space in one place.

Imports the analysis' types, the decisions and the mesh; nothing above them.
"""

from __future__ import annotations

from typing import Collection, Iterable, Sequence

import numpy as np

from .._decisions import (MEMORY_SPACES, RECOMPUTE_KINDS, RESOLUTIONS, STATE_LABELS, STATES, Decision, Memory,
                          Recompute, Resolve, Shard, slot_kind)
from .._errors import PartexError
from .._mesh import MeshSpec
from ._types import Analysis, Group

GroupRef = int | str  # a group id, its label, or an anchor "input/path:dim"


def unit_anchor(u) -> str:
    """A recompute unit's anchor: its layers' signature and count."""
    if u.block is None:  # a scan: its source line and length
        return f"scan:{u.where}x{u.layers}"
    return f"layers:{u.block.key}x{u.block.count}"


def group_at(an: Analysis, anchor: str) -> int | None:
    """The group of an anchor "input/path:dim" (an input leaf and a dim of it), or None."""
    path, sep, dim = anchor.rpartition(":")
    vid = dict(zip(an.program.input_paths, an.program.inputs)).get(path) if sep else None
    if vid is None or not dim.isdigit() or int(dim) >= len(an.program.values[vid].shape):
        return None
    g = an.group_of(vid, int(dim))
    return g if g >= 0 else None


def group_anchor(an: Analysis, gid: int) -> str | None:
    """An input leaf and dim in group gid (largest leaf first)."""
    p = an.program
    best = None
    for vid, path in zip(p.inputs, p.input_paths):
        v = p.values[vid]
        for d in range(len(v.shape)):
            if an.group_of(vid, d) == gid and (best is None or v.nbytes > best[0]):
                best = (v.nbytes, f"{path}:{d}")
    return best[1] if best else None


def state_anchor(state: int) -> str:
    """A state set's anchor: its role."""
    return f"state:{STATES[state]}"


def anchor_of(an: Analysis, decision: Decision) -> str | None:
    """Where a plan file anchors a decision: its layer stack's signature, its state set's
    role, or an input dim of its group."""
    if isinstance(decision, Recompute):
        return unit_anchor(an.units[decision.unit])
    if isinstance(decision, Memory):
        return state_anchor(decision.state)
    return group_anchor(an, decision.id)


class DecisionSpace:
    """The decisions of ``analysis`` on ``mesh``, less the groups the step's own shardings
    fix (``fixed``, a ``_constraints.Fixed``).

    ``actions``: the search's candidates, in its order: each decidable group on each mesh
    axis (of size > 1) that divides one of its sizes; each layer stack's recompute kinds;
    each set of the step's state in host memory; each conflicted group's resolutions. ``slots``: every slot in a fixed order (the mesh
    axes, then the recompute and resolution slots), the order of a search tree key.
    """

    def __init__(self, analysis: Analysis, mesh: MeshSpec, fixed):
        self.an = analysis
        self.mesh = mesh
        self.fixed = fixed
        self.units = analysis.units
        actions: list[Decision] = []
        for g in analysis.decision_groups:
            if g.id in fixed.groups:  # the user's own sharding fixes it
                continue
            sizes = {s for nd in g.named_dims for s in analysis.named_dims[nd].sizes}
            for a, n in zip(mesh.axes, mesh.sizes):
                if n > 1 and any(s % n == 0 for s in sizes) and a not in g.manual and a not in fixed.reserved:
                    actions.append(Shard(g.id, a))
        for u in self.units:  # one recompute kind per layer stack of the forward pass
            actions += [Recompute(u.id, k) for k in u.kinds]
        for st in analysis.movable_states():  # the optimizer state, the parameters in host memory
            actions += [Memory(st, m) for m in MEMORY_SPACES]
        self.conflicted = tuple(g for g in analysis.conflicted_groups() if g not in fixed.groups)
        for g in self.conflicted:  # a conflict's other resolutions, once the group is sharded
            actions += [Resolve(g, r) for r in RESOLUTIONS]
        self.actions: tuple[Decision, ...] = tuple(actions)
        # every slot, in a search tree key's order, with the decision it makes of an id
        kinds: list[tuple[type[Decision], str]] = [(Shard, a) for a in mesh.axes]
        kinds += [(Recompute, k) for k in RECOMPUTE_KINDS] + [(Resolve, r) for r in RESOLUTIONS]
        kinds += [(Memory, m) for m in MEMORY_SPACES]
        self._kinds: dict[str, tuple[type[Decision], str]] = {cls.PREFIX + v: (cls, v) for cls, v in kinds}
        self.slots: tuple[str, ...] = tuple(self._kinds)

    def make(self, slot: str, id: int) -> Decision:
        """The decision on ``id`` in one of this space's slots (a search tree key's entry)."""
        cls, value = self._kinds[slot]
        return cls(id, value)  # type: ignore[call-arg]

    def on_group(self, slot: str) -> bool:
        """Whether a slot's decisions name decision groups (else layer stacks or state sets)."""
        return self._kinds[slot][0].ON_GROUP

    def id_count(self, slot: str) -> int:
        """How many ids a slot's decisions may name (groups, layer stacks or state sets)."""
        on = self._kinds[slot][0].ON
        return len(self.an.groups) if on == "group" else len(self.units) if on == "unit" else len(STATES)

    def legal(self, decisions: Sequence[Decision], forbidden: Collection[Decision]) -> list[int]:
        """The indices of the actions a plan of ``decisions`` may take next: not taken, not
        forbidden, one recompute kind per layer stack, one memory space per state set, one
        resolution per group, of a group the plan shards."""
        taken = set(decisions)
        recomputed = {d.unit for d in decisions if isinstance(d, Recompute)}  # one kind per stack
        placed = {d.state for d in decisions if isinstance(d, Memory)}  # one space per state set
        resolved = {d.group for d in decisions if isinstance(d, Resolve)}  # one resolution per group ...
        sharded = {d.group for d in decisions if isinstance(d, Shard)}  # ... of a group the plan shards
        return [i for i, d in enumerate(self.actions) if d not in taken and d not in forbidden
                and not (isinstance(d, Recompute) and d.unit in recomputed)
                and not (isinstance(d, Memory) and d.state in placed)
                and not (isinstance(d, Resolve) and (d.group in resolved or d.group not in sharded))]

    # ------------------------------------------------------------------ what users name
    def group(self, ref: GroupRef) -> Group:
        """A group by id, label, or anchor ``input/path:dim`` (an input leaf and dim in it)."""
        an = self.an
        if isinstance(ref, (int, np.integer)) and not isinstance(ref, bool):
            if 0 <= ref < len(an.groups):
                return an.groups[int(ref)]
            raise PartexError(f"no decision group {ref}; there are {len(an.groups)}")
        if isinstance(ref, str):
            g = an.group_by_label(ref)
            if g is not None:
                return g
            gid = group_at(an, ref)
            if gid is not None:
                return an.groups[gid]
            raise PartexError(f"unknown dimension {ref!r}; known: {', '.join(g.label for g in an.groups)} "
                              "(or name an input leaf and dim, e.g. params/w1:1)")
        raise PartexError(f"a dimension is a group id, a label or 'path:dim', got {type(ref).__name__}")

    def unit(self, ref: GroupRef):
        """A layer stack (recompute unit) by id, label or anchor."""
        if not self.units:
            raise PartexError("this step has no layer stack to recompute (recompute needs a differentiated "
                              "step with a stack of layers, unrolled or under scan)")
        if isinstance(ref, (int, np.integer)) and not isinstance(ref, bool) and 0 <= ref < len(self.units):
            return self.units[int(ref)]
        u = next((u for u in self.units if u.label == str(ref) or unit_anchor(u) == str(ref)), None)
        if u is None:
            raise PartexError(f"unknown layer stack {ref!r}; known: {', '.join(x.label for x in self.units)}")
        return u

    def state(self, ref: GroupRef) -> int:
        """A state set (``STATES``) by id, role (``optimizer``, ``parameters``), label or anchor."""
        if isinstance(ref, (int, np.integer)) and not isinstance(ref, bool) and 0 <= ref < len(STATES):
            s = int(ref)
        else:
            names = {**{r: k for k, r in enumerate(STATES)}, **{STATE_LABELS[r]: k for k, r in enumerate(STATES)},
                     **{state_anchor(k): k for k in range(len(STATES))}}
            if str(ref) not in names:
                raise PartexError(f"unknown state set {ref!r}; known: {', '.join(STATES)}")
            s = names[str(ref)]
        if not self.an.state_inputs(s):
            raise PartexError(f"this step has no {STATE_LABELS[STATES[s]]} (no input it returns updated "
                              f"{'and the loss does not read' if STATES[s] == 'optimizer' else 'that the loss reads'})")
        return s

    def decision(self, ref: GroupRef, slot: str) -> Decision:
        """The decision a user names: ``ref`` a group (id, label, anchor), for
        ``recompute:<kind>`` a layer stack, for ``memory:<space>`` a state set; ``slot`` a
        mesh axis, ``resolve:<resolution>``, ``recompute:<kind>`` or ``memory:<space>``. A sharding on any group the mesh axis exists for (the
        cost model prices any); a resolution or recompute only where the model has one."""
        if not isinstance(slot, str):
            raise PartexError(f"a decision's axis is text (a mesh axis, resolve:..., recompute:... or memory:...), "
                              f"got {type(slot).__name__}")
        kind = slot_kind(slot)
        value = slot[len(kind.PREFIX):]
        if kind is Recompute:
            if value not in RECOMPUTE_KINDS:
                raise PartexError(f"unknown recompute kind {value!r}; known: {', '.join(RECOMPUTE_KINDS)}")
            u = self.unit(ref)
            if value not in u.kinds:
                raise PartexError(f"{u.label} is a layer stack under scan, whose weights every iteration gathers "
                                  f"anew: its recompute kinds are {', '.join(u.kinds)}")
            return Recompute(u.id, value)
        if kind is Memory:
            if value not in MEMORY_SPACES:
                raise PartexError(f"unknown memory space {value!r}; known: {', '.join(MEMORY_SPACES)} "
                                  "(device memory, the default, needs no decision)")
            s = self.state(ref)
            if s not in self.an.movable_states():
                raise PartexError(f"the step's {STATE_LABELS[STATES[s]]} is in host memory already (its own placement)")
            return Memory(s, value)
        if kind is Resolve:
            g = self.group(ref)
            if value not in RESOLUTIONS:
                raise PartexError(f"unknown conflict resolution {value!r}; known: {', '.join(RESOLUTIONS)} "
                                  "(the default shards each tensor's first dim in the group)")
            if g.id not in self.an.conflicted_groups():
                raise PartexError(f"dimension {g.label!r} has no conflict to resolve (no tensor holds two of its dims)")
            if g.id in self.fixed.groups:
                raise PartexError(f"dimension {g.label!r} is fixed by the step's own sharding")
            return Resolve(g.id, value)
        self.mesh.index(slot)  # unknown axis -> PartexError
        return Shard(self.group(ref).id, slot)

    def adopt(self, d: Decision) -> Decision:
        """Another space's decision of the same model (another mesh, say), checked here."""
        return self.decision(d.id, d.slot)

    def decisions(self, items: Iterable[Decision | tuple[GroupRef, str]]) -> list[Decision]:
        """[(group or layer stack, slot)] -> decisions; a Decision passes as it is."""
        return [d if isinstance(d, Decision) else self.decision(*d) for d in items]

    def check_takeable(self, d: Decision) -> None:
        """Raise, in one line, where the search may not take ``d`` (a pin): a sharding of a
        group the step's own sharding fixes, of a group no axis may shard, or on an axis
        that divides none of its sizes."""
        if not isinstance(d, Shard):
            return
        g = self.an.groups[d.group]
        if g.id in self.fixed.groups:
            us = self.fixed.by_group[g.id]
            raise PartexError(f"dimension {g.label!r} is fixed by the step's own {us.kind} at {us.source}; "
                              "use user_shardings='replace' (CLI: --user-shardings replace) to let partex place it")
        if not g.decidable:
            raise PartexError(f"dimension {g.label!r} is not shardable (a loop axis or too small)")
        if d.axis in g.manual:
            raise PartexError(f"dimension {g.label!r} lies inside shard_map regions manual over {d.axis!r}: "
                              f"only the axes they leave to the partitioner can shard it")
        if d.axis in self.fixed.reserved:
            raise PartexError(f"mesh axis {d.axis!r} holds the pipeline's stages alone: no dimension may be sharded "
                              "over it")
        if d not in self.actions:
            raise PartexError(f"mesh axis {d.axis!r} (size {self.mesh.axis_size(d.axis)}) does not divide "
                              f"dimension {g.label!r} (size {g.size})")

    def in_range(self, d: Decision) -> bool:
        """Whether ``d`` names a group or stack of this model and a slot of this mesh (a
        file's decision checked before use)."""
        return d.slot in self._kinds and 0 <= d.id < self.id_count(d.slot)


def from_plan(an: Analysis, decisions: Sequence) -> list[Decision]:
    """A plan file's decisions (``PlanDecision``: group label, slot, anchor) -> typed
    decisions, each found by its anchor first, then by its label."""
    units = an.units
    out: list[Decision] = []
    for d in decisions:
        kind = slot_kind(d.axis)
        if kind is Recompute:
            u = next((u for u in units if unit_anchor(u) == d.anchor), None) \
                or next((u for u in units if u.label == d.group), None)
            if u is None:
                raise PartexError(f"plan decision recomputes {d.group!r}, a layer stack this function does not "
                                  f"have; its stacks: {', '.join(u.label for u in units) or 'none'}")
            out.append(Recompute(u.id, d.axis[len(Recompute.PREFIX):]))
            continue
        if kind is Memory:
            s = next((k for k, r in enumerate(STATES) if state_anchor(k) == d.anchor or STATE_LABELS[r] == d.group), None)
            if s is None or not an.state_inputs(s):
                raise PartexError(f"plan decision places {d.group!r}, state this function does not have")
            out.append(Memory(s, d.axis[len(Memory.PREFIX):]))
            continue
        gid = group_at(an, d.anchor) if d.anchor else None
        if gid is None:
            g = an.group_by_label(d.group)
            if g is None:
                raise PartexError(f"plan decision names group {d.group!r}, which this function does not have; "
                                  f"its groups: {', '.join(x.label for x in an.decision_groups)}")
            gid = g.id
        out.append(kind(gid, d.axis[len(kind.PREFIX):]))  # type: ignore[call-arg]
    return out
