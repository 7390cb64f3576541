"""Hand-written strategies expressed as decisions: the baselines partex must beat.

- ``replicated``: nothing sharded.
- ``dp``: the batch (dim 0 of every leaf of the last argument) on the data axis.
- ``megatron``: dp + tensor parallelism on the model axis: attention heads, the FFN hidden
  dim and the vocabulary (for convnets the channels, for plain MLPs the hidden layer).
- ``zero3``: megatron + the parameters' remaining large dim (d_model) on the data axis:
  parameters, gradients and optimizer state sharded over data, gathered before use.
- ``expert`` (MoE): the experts on the data axis ahead of the batch (expert parallelism),
  with the tensor-parallel dims on the model axis.

Axis roles: the first mesh axis is "data", the last "model" (by name if the mesh has axes so
named). On a one-axis mesh megatron's model decisions fall on that axis too.
"""

from __future__ import annotations

import collections
from typing import Callable

from ._analysis import NO_DIM, Analysis
from ._errors import PartexError
from ._mesh import MeshSpec

Decision = tuple[int, str]

# Tensor-parallel labels, in decision order: attention heads, FFN / MLP hidden dims, the
# vocabulary; for convnets the output channels of the convolutions.
_TP_LABELS = ("heads", "ffn", "hidden", "vocab", "channels")


def base_label(label: str) -> str:
    return label.split("#", 1)[0]


def groups_labelled(an: Analysis, *labels: str) -> list[int]:
    return [g.id for g in an.decision_groups if base_label(g.label) in labels]


def batch_groups(an: Analysis) -> list[int]:
    """Groups of dim 0 of every leaf of the last positional argument (the batch), largest
    first (a graph's edges before its nodes: the bigger tensors keep the axis)."""
    p = an.program
    last = p.input_paths[-1].split("/")[0] if p.input_paths else ""
    out = []
    decidable = {g.id for g in an.decision_groups}
    for vid, path in zip(p.inputs, p.input_paths):
        if path.split("/")[0] == last and p.values[vid].shape:
            g = an.group_of(vid, 0)
            if g != NO_DIM and g in decidable and g not in out:
                out.append(g)
    return sorted(out, key=lambda g: -an.groups[g].bytes)


def param_group_bytes(an: Analysis) -> collections.Counter:
    """Bytes of the first argument's (parameters') leaves per group of their dims."""
    p = an.program
    first = p.input_paths[0].split("/")[0] if p.input_paths else ""
    c: collections.Counter = collections.Counter()
    for vid, path in zip(p.inputs, p.input_paths):
        if path.split("/")[0] != first:
            continue
        for d in range(len(p.values[vid].shape)):
            g = an.group_of(vid, d)
            if g != NO_DIM:
                c[g] += p.values[vid].nbytes
    return c


def _axes(mesh: MeshSpec) -> tuple[str, str]:
    data = "data" if "data" in mesh.axes else mesh.axes[0]
    model = "model" if "model" in mesh.axes else mesh.axes[-1]
    return data, model


def _dp(an, mesh):
    data, _ = _axes(mesh)
    return [(g, data) for g in batch_groups(an)]


def _tp(an, mesh):
    _, model = _axes(mesh)
    return [(g, model) for lab in _TP_LABELS for g in groups_labelled(an, lab)]


def _megatron(an, mesh):
    return _dp(an, mesh) + _tp(an, mesh)


def _zero3(an, mesh):
    data, _ = _axes(mesh)
    dec = _megatron(an, mesh)
    taken = {g for g, a in dec if a == data} | set(batch_groups(an))
    pb = param_group_bytes(an)
    decidable = {g.id for g in an.decision_groups}
    ranked = [g for g, _ in pb.most_common() if g not in taken and g in decidable]
    if ranked:
        lab = base_label(an.groups[ranked[0]].label)
        dec += [(g, data) for g in groups_labelled(an, lab) if g not in taken]
    return dec


def _expert(an, mesh):
    data, model = _axes(mesh)
    experts = groups_labelled(an, "experts")
    if not experts:
        raise PartexError("the expert strategy needs an 'experts' dimension (a mixture-of-experts model)")
    tp = [(g, a) for g, a in _tp(an, mesh) if g not in experts]
    return [(g, data) for g in experts] + _dp(an, mesh) + tp


STRATEGIES: dict[str, Callable[[Analysis, MeshSpec], list[Decision]]] = {
    "replicated": lambda an, mesh: [],
    "dp": _dp,
    "megatron": _megatron,
    "zero3": _zero3,
    "expert": _expert,
}


def strategy_decisions(name: str, an: Analysis, mesh: MeshSpec) -> list[Decision]:
    if name not in STRATEGIES:
        raise PartexError(f"unknown strategy {name!r}; valid: {', '.join(STRATEGIES)}")
    return STRATEGIES[name](an, mesh)


def baseline_names(an: Analysis) -> list[str]:
    names = ["replicated", "dp", "megatron", "zero3"]
    if groups_labelled(an, "experts"):
        names.append("expert")
    return names
