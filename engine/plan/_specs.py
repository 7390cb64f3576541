"""PartitionSpecs as plan files write them, and the checks of a plan against a traced step.

A spec in JSON is a list with one entry per dim: null, a mesh axis, or a list of mesh axes.
Everything here is pure (no JAX): ``_plan`` (the file) and ``_planned`` (a plan bound to a
step) both use it, and it imports neither: the checks read a plan through ``PlanFields``.
"""

from __future__ import annotations

import math
from typing import Mapping, Protocol, Sequence

from .._errors import PartexError
from .._mesh import MeshSpec

SpecJSON = list  # per dim: null | "axis" | ["axis", ...]


class PlanFields(Protocol):
    """What the checks read of a plan (``_plan.Plan`` has them)."""

    @property
    def mesh(self) -> MeshSpec: ...

    @property
    def inputs(self) -> Mapping[str, SpecJSON]: ...  # input leaf path -> its spec

    @property
    def signature(self) -> Mapping[str, list]: ...  # see signature_of


def check_spec(spec, mesh: MeshSpec, where: str) -> None:
    if not isinstance(spec, list):
        raise PartexError(f"{where}: a PartitionSpec must be a list (one entry per dim), got {spec!r}")
    seen = set()
    for entry in spec:
        axes = [] if entry is None else [entry] if isinstance(entry, str) else entry
        if not isinstance(axes, list) or not all(isinstance(a, str) for a in axes):
            raise PartexError(f"{where}: spec entries must be null, an axis name or a list of axis names")
        for a in axes:
            mesh.index(a)
            if a in seen:
                raise PartexError(f"{where}: mesh axis {a!r} is used twice in one PartitionSpec")
            seen.add(a)


def spec_to_json(spec: Sequence[Sequence[str]]) -> SpecJSON:
    return [None if not axes else axes[0] if len(axes) == 1 else list(axes) for axes in spec]


def spec_axes(entry) -> list[str]:
    return [] if entry is None else [entry] if isinstance(entry, str) else list(entry)


def signature_of(program) -> dict[str, list]:
    """The step's input and output leaves ([path, shape, dtype]) and its positional
    arguments' names (``args``: every argument, one without array leaves too, as ``None``
    or an empty optimizer state is: an export matches arguments to specs by them)."""
    vals = program.values
    return {
        "inputs": [[p, list(vals[v].shape), str(vals[v].dtype)] for v, p in zip(program.inputs, program.input_paths)],
        "outputs": [[p, list(vals[v].shape), str(vals[v].dtype)] for v, p in zip(program.outputs, program.output_paths)],
        "args": list(program.arg_names),
    }


def check_signature(plan: PlanFields, program) -> None:
    mine = signature_of(program)["inputs"]
    theirs = plan.signature.get("inputs", [])
    for k, (a, b) in enumerate(zip(mine, theirs)):
        if list(a) != list(b):
            raise PartexError(
                f"the plan does not match this function: input {k} is {a[0]} {tuple(a[1])} {a[2]} here "
                f"but {b[0]} {tuple(b[1])} {b[2]} in the plan"
            )
    if len(mine) != len(theirs):
        which = mine[len(theirs)][0] if len(mine) > len(theirs) else theirs[len(mine)][0]
        raise PartexError(f"the plan does not match this function: it has {len(theirs)} input leaves, "
                          f"the function {len(mine)} (first unmatched: {which})")


def check_divisible(plan: PlanFields, program) -> None:
    vals = program.values
    for vid, path in zip(program.inputs, program.input_paths):
        spec = plan.inputs.get(path)
        if spec is None:
            continue
        shape = vals[vid].shape
        if len(spec) > len(shape):
            raise PartexError(f"plan spec for {path} has {len(spec)} entries but the leaf has rank {len(shape)}")
        for d, entry in enumerate(spec):
            n = math.prod(plan.mesh.axis_size(a) for a in spec_axes(entry))
            if shape[d] % n:
                raise PartexError(
                    f"mesh axis {'x'.join(spec_axes(entry))} of size {n} does not divide dim {d} "
                    f"(size {shape[d]}) of {path}"
                )


def norm_spec(spec) -> list:
    out = [tuple(spec_axes(e)) for e in spec]
    while out and not out[-1]:
        out.pop()
    return out
