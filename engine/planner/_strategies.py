"""Hand-written strategies expressed as decisions: the baselines partex must beat.

Every strategy is built on the roles the program's structure gives its groups
(``_roles.py``), never on labels or pytree paths:

- ``replicated``: nothing sharded.
- ``dp``: the batch groups on the data axis.
- ``megatron``: dp + tensor parallelism on the model axis: the Megatron pair groups
  (attention heads, the FFN hidden dim; a plain MLP's hidden layer, a convnet's channels),
  then the vocabulary-like groups (the LM head's vocabulary, the embedding table's rows).
- ``zero3``: megatron + ZeRO-3 over the data axis (the fsdp axis on bigger meshes): for each
  parameter leaf, largest first, that has no dim on that axis yet, the group of its largest
  dim that is still undecided (and divisible by the axis) goes on it: parameters, gradients
  and optimizer state sharded, gathered before use (in a transformer: d_model).
- ``expert`` (MoE): the expert groups on the data axis ahead of the batch (expert
  parallelism), with the tensor-parallel groups but the experts on the model axis.
- ``<strategy>+remat``: the strategy with every forward layer stack fully rematerialised
  (``jax.checkpoint`` around each layer, as long-sequence training runs use).

Within each kind, groups go largest first (the earlier decision keeps the axis where two
meet in one tensor), and a decision is kept only where the mesh axis size divides the
group's size.

Axis roles come from the user's mesh, not the model: the axis named "data" (else the first)
is the data axis, the one named "model" or "tensor" (else the last) the model axis. On a
one-axis mesh megatron's model decisions fall on that axis too. On meshes of three or four
axes the hand plans are MaxText's: the batch over every axis but the model axis (data, then
fsdp, ...), and ZeRO-3 over the axis named "fsdp" (else the largest of those between data and
model), the parameters replicated over the data axis (pure data parallelism, as over DCN).
"""

from __future__ import annotations

from typing import Callable, Iterable

from .._decisions import Decision, Recompute, Shard
from .._errors import PartexError
from .._mesh import MeshSpec
from ..analysis._types import NO_DIM, Analysis, GroupId
from ..analysis._constraints import NONE as NO_FIXED
from ..analysis._constraints import Fixed


def _axes(mesh: MeshSpec) -> tuple[str, str]:
    data = "data" if "data" in mesh.axes else mesh.axes[0]
    model = next((a for a in ("model", "tensor") if a in mesh.axes and (a == "model" or mesh.axis_size(a) > 1)),
                 mesh.axes[-1])
    return data, model


def _inner(mesh: MeshSpec) -> list[str]:
    """The axes of size > 1 between the data and model axes, where the mesh has three or more
    such axes (MaxText's fsdp, seq, ...); none on two (a mesh's size-1 axes take no role)."""
    data, model = _axes(mesh)
    big = [a for a, n in zip(mesh.axes, mesh.sizes) if n > 1]
    return [a for a in big if a not in (data, model)] if len(big) > 2 else []


def _batch_axes(mesh: MeshSpec) -> list[str]:
    """The axes the batch goes on: the data axis, then the inner ones."""
    return [_axes(mesh)[0]] + _inner(mesh)


def _fsdp_axis(mesh: MeshSpec) -> str:
    """The axis ZeRO-3 shards the parameters over: "fsdp", else the largest inner axis,
    else the data axis."""
    inner = _inner(mesh)
    if "fsdp" in inner:
        return "fsdp"
    return max(inner, key=mesh.axis_size) if inner else _axes(mesh)[0]


def _on(an: Analysis, mesh: MeshSpec, groups: Iterable[GroupId], axis: str) -> list[Shard]:
    """Shard(group, axis) for the groups whose size the axis divides."""
    n = mesh.axis_size(axis)
    return [Shard(g, axis) for g in groups if an.groups[g].size % n == 0 and axis not in an.groups[g].manual]


def _dp(an: Analysis, mesh: MeshSpec) -> list[Shard]:
    return [d for axis in _batch_axes(mesh) for d in _on(an, mesh, an.roles.batch_groups, axis)]


def _tp(an: Analysis, mesh: MeshSpec) -> list[Shard]:
    _, model = _axes(mesh)
    r = an.roles
    return _on(an, mesh, r.pair_groups + r.vocab_groups, model)


def _megatron(an: Analysis, mesh: MeshSpec) -> list[Shard]:
    return _dp(an, mesh) + _tp(an, mesh)


def _zero3(an: Analysis, mesh: MeshSpec, fixed: Fixed = NO_FIXED) -> list[Shard]:
    data = _fsdp_axis(mesh)
    n = mesh.axis_size(data)
    dec = _megatron(an, mesh)
    # the step's own shardings come first (the cost model places them ahead of any plan's):
    # a parameter dim they fix is taken, and one they put on data needs nothing more
    decided = {d.group for d in dec} | set(fixed.groups)
    on_data = {d.group for d in (*dec, *fixed.decisions) if d.axis == data}
    decidable = {g.id for g in an.decision_groups}
    p = an.program
    r = an.roles
    params = sorted((v for v in p.inputs if v in r.parameters), key=lambda v: -p.values[v].nbytes)
    for vid in params:
        shape = p.values[vid].shape
        gs = [an.group_of(vid, d) for d in range(len(shape))]
        if any(g in on_data for g in gs):
            continue
        # its largest dim still free to take the data axis
        for d in sorted(range(len(shape)), key=lambda d: -shape[d]):
            g = gs[d]
            if (g != NO_DIM and g in decidable and g not in decided and an.groups[g].size % n == 0
                    and data not in an.groups[g].manual):
                dec.append(Shard(g, data))
                decided.add(g)
                on_data.add(g)
                break
    return dec


def _expert(an: Analysis, mesh: MeshSpec) -> list[Shard]:
    data, _ = _axes(mesh)
    experts = an.roles.expert_groups
    if not experts:
        raise PartexError("the expert strategy needs an expert dimension: a parameter dim that "
                          "is a batch dim of a matmul with the activations (a mixture-of-experts "
                          "model); use dp, megatron or zero3 for this model")
    tp = [d for d in _tp(an, mesh) if d.group not in experts]
    return _on(an, mesh, experts, data) + _dp(an, mesh) + tp


# name -> (analysis, mesh, what the step's own shardings fix) -> decisions
STRATEGIES: dict[str, Callable[[Analysis, MeshSpec, Fixed], list[Shard]]] = {
    "replicated": lambda an, mesh, fixed: [],
    "dp": lambda an, mesh, fixed: _dp(an, mesh),
    "megatron": lambda an, mesh, fixed: _megatron(an, mesh),
    "zero3": _zero3,
    "expert": lambda an, mesh, fixed: _expert(an, mesh),
}


REMAT = "+remat"  # a strategy with every layer stack fully rematerialised (jax.checkpoint per layer)


def strategy_decisions(name: str, an: Analysis, mesh: MeshSpec, fixed: Fixed = NO_FIXED) -> list[Decision]:
    """The hand strategy ``name``'s decisions; ``fixed``: what the step's own shardings fix
    on ``mesh`` (``_constraints.Fixed``)."""
    base = name[:-len(REMAT)] if name.endswith(REMAT) else name
    if fixed.reserved:  # the hand plans on the axes a decision may take
        keep = [i for i, a in enumerate(mesh.axes) if a not in fixed.reserved]
        mesh = MeshSpec(tuple(mesh.axes[i] for i in keep), tuple(mesh.sizes[i] for i in keep),
                        None if mesh.bandwidth is None else tuple(mesh.bandwidth[i] for i in keep),
                        None if mesh.latency is None else tuple(mesh.latency[i] for i in keep))
    if base not in STRATEGIES:
        raise PartexError(f"unknown strategy {name!r}; valid: {', '.join(STRATEGIES)}, each optionally "
                          f"with {REMAT} (every layer stack fully rematerialised)")
    dec: list[Decision] = list(STRATEGIES[base](an, mesh, fixed))
    if base != name:
        if not an.units:
            raise PartexError(f"strategy {name!r} needs a layer stack to recompute, and this step has none "
                              "(it has no repeated layers, or it takes no gradients)")
        dec = dec + [Recompute(u.id, "full") for u in an.units]
    return dec


def baseline_names(an: Analysis) -> list[str]:
    names = ["replicated", "dp", "megatron", "zero3"]
    if an.roles.expert_groups:
        names.append("expert")
    if an.units:  # the hand plans as users run them at long sequences: remat every layer
        names += [n + REMAT for n in names if n != "replicated"]
    return names
