"""shard_map regions and explicit sharding mode, rebound on the plan's mesh.

Apply runs a step on the plan's mesh, whose axes are all ``Auto``; the step may have been
traced under another mesh object. A shard_map region is bound on the plan's mesh (the same
axes, perhaps over the devices in another order: ``on_plan_mesh``); its body is evaluated
again (``region``) where the plan places values inside it: a partially manual region's,
whose values take the plan's shardings over the axes the region leaves to the partitioner,
and an explicit-mode step's, whose typed shardings are dropped. An explicit-mode step's ops
run under the plan's (Auto) abstract mesh (``context_mesh``), its own typed shardings
become constraints (``explicit``), and its casts between axis types are identities.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from .._errors import PartexError
from ..tracing._jax import ClosedJaxpr
from ..tracing._program import EXPLICIT_SHARDING_PARAMS, Program
from ._plan_constraints import USER_SHARDING, Constraints

__all__ = ["Regions", "partly_manual"]

# Explicit mode's casts between axis types (the ends of auto_axes / explicit_axes regions):
# on the plan's mesh every axis is Auto, so they are identities.
_MESH_CASTS = {"mesh_cast"}

# evaluate(jaxpr, consts, args, constrain_invars): a jaxpr's outputs, evaluated as apply does
Evaluate = Callable[[Any, Sequence[Any], list, bool], list]
# bind(eqn, op_id, invals): an eqn's outputs, bound as apply binds an op (its operands constrained already)
Bind = Callable[[Any, int | None, list], list]


def partly_manual(eqn) -> bool:
    """A shard_map region that leaves some of its mesh's axes to the partitioner."""
    p = eqn.params
    manual = p.get("newly_manual_axes", p.get("manual_axes", frozenset(p["mesh"].axis_names)))
    return bool(set(p["mesh"].axis_names) - set(manual))


class Regions:
    """The mesh context the step's ops run under, and its shard_map regions on the plan's
    mesh. ``evaluate`` and ``bind`` are the interpreter's."""

    def __init__(self, program: Program, mesh, constraints: Constraints, evaluate: Evaluate, bind: Bind):
        self.program = program
        self.mesh = mesh
        self.constraints = constraints
        self.evaluate = evaluate
        self.bind = bind
        # the abstract mesh the eqns run under (None: the one each was traced under): an
        # explicit-mode step's, the plan's; in a region's body, the region's own
        self.context_mesh = mesh.abstract_mesh if program.explicit_mesh is not None else None

    def explicit(self, eqn, op_id: int | None, invals: list, users: Mapping[int, PartitionSpec | None]) -> list | None:
        """An explicit-mode step's eqn on the plan's mesh, or None for an eqn bound as any
        other: the step's sharding ops that are not the user's (autodiff's, auto_axes') and
        its casts between axis types are dropped, a region is evaluated again, and an op's
        typed result sharding becomes its user spec's constraint (``users[op_id]``), or none."""
        name = eqn.primitive.name
        if name in USER_SHARDING or name in _MESH_CASTS:  # not the user's (autodiff's, auto_axes'): dropped
            return list(invals)
        if name == "shard_map":
            return self.region(eqn, invals)
        typed = [k for k in EXPLICIT_SHARDING_PARAMS if isinstance(eqn.params.get(k), NamedSharding)]
        if not typed:
            return None
        # the op's typed result sharding: a constraint on the plan's mesh, or dropped
        out = self.bind(eqn.replace(params={**eqn.params, **dict.fromkeys(typed)}), op_id, invals)
        if op_id is None or op_id not in users or self.program.ops[op_id].outputs[0] in self.program.manual_values:
            return out  # a region's typed value: per device, as the region computes it
        spec = users[op_id]
        return [self.constraints.user(out[0], spec, op_id), *out[1:]] if spec is not None else out

    def region(self, eqn, invals) -> list:
        """A shard_map region whose body is evaluated again on the plan's mesh (the region's
        manual axes as the region has them): an explicit-mode step's (its typed shardings
        dropped), and a partially manual one's, whose values take the plan's shardings over
        the axes the region leaves to the partitioner."""
        p = eqn.params
        body = p["jaxpr"]
        inner, consts = (body.jaxpr, body.consts) if isinstance(body, ClosedJaxpr) else (body, ())
        partly = partly_manual(eqn)
        constraints = self.constraints

        def per_device(*xs):
            here = jax.sharding.get_abstract_mesh()  # the region's own
            outer, self.context_mesh = self.context_mesh, here
            outer_mesh, constraints.region_mesh = constraints.region_mesh, (here if partly else None)
            try:
                return tuple(self.evaluate(inner, consts, list(xs), partly))
            finally:
                self.context_mesh, constraints.region_mesh = outer, outer_mesh

        manual = p.get("newly_manual_axes", p.get("manual_axes", frozenset(self.mesh.axis_names)))
        region = jax.shard_map(per_device, mesh=self.on_plan_mesh(eqn).params["mesh"], in_specs=tuple(p["in_specs"]),
                               out_specs=tuple(p["out_specs"]), axis_names=set(manual), check_vma=p["check_vma"])
        return list(region(*invals))

    def on_plan_mesh(self, eqn):
        """A shard_map region on the plan's mesh: the same axes (by name and size), perhaps
        over the devices in another order, or with other axis types (an explicit-mode step's).

        Raises ``PartexError`` when the region's axes are not the plan's."""
        region = eqn.params["mesh"]
        plan = self.mesh if isinstance(region, jax.sharding.Mesh) else self.mesh.abstract_mesh
        if region == plan:
            return eqn
        unit = {a for a, n in region.shape.items() if n == 1}
        if {a: n for a, n in region.shape.items() if n > 1} != {a: n for a, n in self.mesh.shape.items() if n > 1}:
            raise PartexError(f"{self.program.ops[self.program.eqn_ops[id(eqn)]].source}: a shard_map region over "
                              f"{dict(region.shape)} cannot run on the plan's mesh {dict(self.mesh.shape)}: "
                              "plan on the region's mesh (mesh='step')")
        if unit or tuple(region.axis_names) != tuple(self.mesh.axis_names):
            # the region's axes (size-1 ones too, as MaxText's meshes have them), in its order,
            # over the plan's devices: each named axis spans the devices the plan's axis does
            order = [list(self.mesh.axis_names).index(a) for a in region.axis_names if a not in unit]
            order += [i for i, a in enumerate(self.mesh.axis_names) if a not in region.shape]
            sizes = tuple(region.shape.values())
            types = (jax.sharding.AxisType.Auto,) * len(sizes)
            if isinstance(region, jax.sharding.Mesh):
                grid = np.asarray(self.mesh.devices).transpose(order).reshape(sizes)
                plan = jax.sharding.Mesh(grid, tuple(region.axis_names), axis_types=types)
            else:
                plan = jax.sharding.AbstractMesh(sizes, tuple(region.axis_names), axis_types=types)
        return eqn.replace(params={**eqn.params, "mesh": plan})

