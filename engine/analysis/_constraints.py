"""The user's own shardings inside the step.

``jax.lax.with_sharding_constraint`` (and what calls it: flax's ``nn.with_logical_constraint``,
MaxText's logical constraints), ``jax.sharding.reshard`` and the ``in_shardings`` /
``out_shardings`` of a ``jit`` called inside the step fix the sharding of a value, and XLA
honours them: its propagation starts from them, and it inserts the collectives that reach
them. partex models them as XLA does (docs/sharding-forms.md, "The step's own shardings"): each dim a user sharding
shards over a mesh axis is a *fixed decision* of that dim's group, ahead of every plan's own
decisions (XLA propagates it to the tensors that share the dim); a dim it leaves replicated
is replicated *in that value only*: its group stays free, and where the plan shards the group
the value is gathered at the constraint and its consumers read it whole (a weight sharded
over data for ZeRO-3 meets a constrained activation as XLA's FSDP does, by an all-gather);
an ``UNCONSTRAINED`` dim leaves its group free. Fixed groups are taken out of the search (the
plan cannot move them) and shown as the user's own pins. ``user_shardings="replace"`` drops
them instead (all but a shard_map region's specs, which its body is written for): the plan places those values like any other, and apply re-places the user's
constraints at the plan's shardings.

A user sharding over another mesh than the plan's (an axis the plan's mesh lacks, or of another
size) cannot be honoured on the plan's mesh: one clear error naming its source line.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from .._decisions import Shard
from .._errors import PartexError

MODES = ("keep", "replace")
# User shardings that are part of the program's meaning, not hints: a shard_map region's
# body is written for the blocks its specs give it, so even ``"replace"`` keeps them.
BINDING = frozenset({"shard_map in_specs", "shard_map out_specs"})


@dataclasses.dataclass(frozen=True, slots=True)
class UserSharding:
    value: int  # the ValueId whose sharding it fixes
    # per dim: the mesh axes sharding it, major to minor (() = replicated), or None (unconstrained)
    spec: tuple[tuple[str, ...] | None, ...]
    mesh: tuple[tuple[str, int], ...]  # the sharding's mesh: (axis, size)
    source: str  # file:line (function) of the call
    kind: str  # sharding_constraint, reshard, jit in_shardings, jit out_shardings
    op: int  # the constraint op (-1 for a jit's in/out shardings)

    def spec_text(self) -> str:
        def one(e):
            if e is None:
                return "UNCONSTRAINED"
            if not e:
                return "None"
            return repr(e[0]) if len(e) == 1 else "(" + ", ".join(map(repr, e)) + ")"
        return "P(" + ", ".join(one(e) for e in self.spec) + ")"

    def mesh_text(self) -> str:
        return ",".join(f"{a}={s}" for a, s in self.mesh)

    def to_json(self) -> dict:
        return {"value": self.value, "spec": [None if e is None else list(e) for e in self.spec],
                "mesh": self.mesh_text(), "source": self.source, "kind": self.kind}


@dataclasses.dataclass(frozen=True, slots=True)
class Fixed:
    """What the user's shardings fix on one mesh."""

    decisions: tuple[Shard, ...] = ()  # in program order
    groups: frozenset[int] = frozenset()  # groups whose sharding is fixed
    by_group: dict = dataclasses.field(default_factory=dict)  # group -> the UserSharding that fixed it
    notes: tuple[str, ...] = ()  # user shardings that disagree on one group (the first wins)
    replicated: dict = dataclasses.field(default_factory=dict)  # value -> dims it holds whole
    # mesh axes no plan's decision may take: a pipeline's stage axis, which the stage dims
    # of the pipelined step hold (``partex.Pipeline``)
    reserved: frozenset[str] = frozenset()


NONE = Fixed()


def user_shardings(program) -> list[UserSharding]:
    """The program's user shardings (see the module docstring), in program order."""
    out = []
    for vid, sharding, source, kind, op in program.user_shardings:
        ndim = len(program.values[vid].shape)
        if ndim == 0:  # a scalar's sharding fixes nothing (JAX reshards a grad's loss seed)
            continue
        unconstrained = program.ops[op].params.get("unconstrained_dims", ()) if op >= 0 else ()
        spec, mesh = _read(sharding, ndim, source, kind)
        spec = tuple(None if d in unconstrained else e for d, e in enumerate(spec))
        out.append(UserSharding(vid, spec, mesh, source, kind.replace("sharding_constraint", "with_sharding_constraint"), op))
    return out


def _read(sharding, ndim: int, source: str, kind: str) -> tuple[tuple, tuple]:
    from jax.sharding import NamedSharding, PartitionSpec

    if isinstance(sharding, NamedSharding):
        mesh = tuple((str(a), int(s)) for a, s in sharding.mesh.shape.items())
        entries = list(sharding.spec) + [None] * (ndim - len(sharding.spec))
        spec = []
        for e in entries[:ndim]:
            if e is PartitionSpec.UNCONSTRAINED:
                spec.append(None)
            elif e is None:
                spec.append(())
            else:
                spec.append(tuple(e) if isinstance(e, (tuple, list)) else (e,))
        return tuple(spec), mesh
    if getattr(sharding, "is_fully_replicated", False):
        return ((),) * ndim, ()
    raise PartexError(f"{source}: {kind} uses a {type(sharding).__name__}; partex reads NamedSharding "
                      "(mesh + PartitionSpec) shardings only: use jax.sharding.NamedSharding there")


def fixed_decisions(items: Sequence[UserSharding], group_of, mesh) -> Fixed:
    """The fixed decisions of ``items`` on ``mesh`` (a MeshSpec); ``group_of(value, dim)``
    gives a dim's decision group (or a negative number for none)."""
    if not items:
        return NONE
    plan_axes = dict(zip(mesh.axes, mesh.sizes))
    decisions: list[Shard] = []
    chosen: dict[int, tuple[tuple[str, ...], UserSharding]] = {}
    replicated: dict[int, set[int]] = {}
    notes = []
    for us in items:
        sizes = dict(us.mesh)
        devices = 1
        for s in sizes.values():
            devices *= s
        if us.mesh and devices != mesh.size:
            raise PartexError(
                f"{us.source}: {us.kind} is over a mesh of {devices} device(s) ({us.mesh_text()}), the plan's "
                f"mesh {mesh.text()} has {mesh.size}: build the step's mesh with the plan's axes and sizes, or "
                "pass user_shardings='replace' (CLI: --user-shardings replace) to let partex re-place it")
        for entry in us.spec:
            for a in entry or ():
                if sizes.get(a, 1) > 1 and plan_axes.get(a) != sizes[a]:
                    have = f"{a}={plan_axes[a]}" if a in plan_axes else f"no axis {a!r}"
                    raise PartexError(
                        f"{us.source}: {us.kind} shards over mesh axis {a}={sizes[a]} (its mesh: {us.mesh_text()}), "
                        f"but the plan's mesh {mesh.text()} has {have}: build the step's mesh with the plan's axes "
                        "and sizes, or pass user_shardings='replace' (CLI: --user-shardings replace) to let partex "
                        "re-place it")
        for d, entry in enumerate(us.spec):
            if entry is None:
                continue
            g = int(group_of(us.value, d))
            if g < 0:
                continue
            axes = tuple(a for a in entry if sizes.get(a, 1) > 1)
            if not axes:  # replicated here: this value only
                replicated.setdefault(us.value, set()).add(d)
                continue
            if g in chosen:
                if chosen[g][0] != axes:
                    first = chosen[g][1]
                    notes.append(f"{us.source}: {us.kind} {us.spec_text()} disagrees with {first.source} "
                                 f"({first.spec_text()}) on one dimension group; partex follows the first")
                continue
            chosen[g] = (axes, us)
            decisions += [Shard(g, a) for a in axes]
    return Fixed(tuple(decisions), frozenset(chosen), {g: us for g, (_, us) in chosen.items()}, tuple(notes),
                 {v: frozenset(ds) for v, ds in replicated.items()})


def plan_spec(us: UserSharding) -> Any:
    """The user's sharding as a PartitionSpec on the plan's mesh (size-1 axes dropped)."""
    from jax.sharding import PartitionSpec

    sizes = dict(us.mesh)
    entries = []
    for e in us.spec:
        if e is None:
            entries.append(PartitionSpec.UNCONSTRAINED)
            continue
        axes = tuple(a for a in e if sizes.get(a, 1) > 1)
        entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*entries)


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise PartexError(f"user_shardings must be 'keep' (honour the step's own shardings) or 'replace' "
                          f"(let the plan re-place them), got {mode!r}")
    return mode
