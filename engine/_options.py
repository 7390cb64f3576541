"""What a user writes for a mesh and for hardware, read into ``MeshSpec`` and ``Hardware``:
the spellings ``Session``, the top-level functions, the CLI and the explorer all accept.

Imports the bottom modules (``_mesh``, ``_errors``) only; ``as_mesh("step", model)`` reads
the analysis it is given, not the analysis package.
"""

from __future__ import annotations

from typing import Mapping

from ._errors import PartexError
from ._mesh import Hardware, MeshSpec, get_hardware, parse_bytes

DEFAULT_HARDWARE = "tpu-v4"
STEP_MESH = "step"  # mesh= the mesh the step's own shardings name


def as_mesh(mesh: str | MeshSpec | Mapping[str, int], model=None) -> MeshSpec:
    """A mesh from what a user writes.

    Args:
      mesh: ``'data=4,model=2'`` (optionally ``name=size@GB/s`` per axis), ``{'data': 4,
        'model': 2}``, a ``MeshSpec``, or ``"step"``: the mesh the step's own shardings name
        (its explicit-mode types, its shard_map regions, its sharding constraints), with
        their axis names.
      model: the ``ModelAnalysis`` whose step ``"step"`` reads (unused otherwise).

    Returns:
      The ``MeshSpec``. Raises ``PartexError`` (one line) for anything else.
    """
    if isinstance(mesh, MeshSpec):
        return mesh
    if mesh == STEP_MESH:
        named = {us.mesh for us in model.analysis.user_shardings if us.mesh} if model is not None else set()
        if not named:
            raise PartexError("mesh='step': the step names no mesh of its own (no explicit-mode shardings, "
                              "shard_map regions or sharding constraints): give one, e.g. mesh='data=4,model=2'")
        if len(named) > 1:
            raise PartexError("mesh='step': the step's own shardings name several meshes ("
                              + "; ".join(",".join(f"{a}={n}" for a, n in m) for m in sorted(named))
                              + "): give the plan's mesh")
        (axes,) = named
        return MeshSpec.create(tuple(a for a, _ in axes), tuple(n for _, n in axes))
    if isinstance(mesh, str):
        return MeshSpec.parse(mesh)
    if isinstance(mesh, Mapping):
        return MeshSpec.create(tuple(mesh), tuple(int(n) for n in mesh.values()))
    raise PartexError(f"mesh must be text like 'data=4,model=2', a dict of axis sizes or a MeshSpec, "
                      f"got {type(mesh).__name__}")


def as_hardware(hardware: str | Hardware | None, memory: str | float | None = None,
                margin: float | None = None) -> Hardware:
    """Hardware from what a user writes.

    Args:
      hardware: a preset name (``'tpu-v4'``; None: ``DEFAULT_HARDWARE``) or a ``Hardware``.
      memory: a per-device budget (``'16GiB'`` or bytes); None or ``""``: the hardware's own.
      margin: the share of the budget kept free; None: the hardware's own (every preset's
        is ``DEFAULT_MARGIN``, 10%).

    Returns:
      The ``Hardware``. Raises ``PartexError`` for anything but a name or a ``Hardware``.
    """
    if hardware is None:
        hardware = DEFAULT_HARDWARE
    hw = get_hardware(hardware) if isinstance(hardware, str) else hardware
    if not isinstance(hw, Hardware):
        raise PartexError(f"hardware must be a preset name or a Hardware, got {type(hardware).__name__}")
    if memory is not None and memory != "":
        hw = hw.replace(memory_budget=parse_bytes(memory))
    if margin is not None:
        hw = hw.replace(memory_margin=float(margin))
    return hw
