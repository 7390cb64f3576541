"""The plan's sharding constraints, placed on values as apply evaluates the step.

A constraint is JAX's own ``with_sharding_constraint`` (``tracing._jax``) with a
``NamedSharding`` on the plan's mesh -- inside a partially manual shard_map region's body, on
the region's mesh (``region_mesh``), its manual axes as such. A constraint JAX refuses is
partex's bug and keeps JAX's error whole, with a note naming the value; one of the step's own
shardings that cannot be applied on the plan's mesh is the user's error (``PartexError``).
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from .._errors import PartexError
from ..tracing._jax import with_sharding_constraint
from ..tracing._program import Program

__all__ = ["USER_SHARDING", "Constraints"]

# The step's own sharding ops: rebound on the plan's mesh, or dropped (``user_specs``).
USER_SHARDING = {"sharding_constraint", "reshard"}


def _explicit_context() -> bool:
    """Whether the ops bound now run under a mesh whose axes are all ``Explicit`` (an
    ``explicit_axes`` region of an Auto-mode step), where ``with_sharding_constraint`` is an
    assert (JAX >= 0.12.1) and a sharding is given with ``reshard``."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and all(t == AxisType.Explicit for t in mesh.axis_types)


class Constraints:
    """The constraints of one plan: ``value_specs`` (by value id), ``operand_specs`` (by
    (op id, operand index); a negative index -1 - j is result j), ``user_specs`` (the step's
    own sharding ops, by op id; None: each keeps the user's spec)."""

    def __init__(self, program: Program, mesh, value_specs: Mapping[int, PartitionSpec],
                 operand_specs: Mapping[tuple[int, int], PartitionSpec],
                 user_specs: Mapping[int, PartitionSpec | None] | None):
        self.program = program
        self.mesh = mesh
        self.value_specs = dict(value_specs)
        self.operand_specs = dict(operand_specs)
        self.user_specs = None if user_specs is None else dict(user_specs)
        # a partially manual region's mesh while its body is evaluated (None: the plan's)
        self.region_mesh: jax.sharding.AbstractMesh | None = None
        self._shardings: dict[Any, NamedSharding] = {}
        # exit pseudo-op id of every structured eqn's region, by its enter op id
        self._exit_of = {r.enter: r.exit for r in program.regions if r.enter >= 0}

    def place(self, x, spec: PartitionSpec, what: str):
        """``x`` constrained to ``spec``; ``what`` names it in the note on JAX's error."""
        try:
            # in a partially manual region's body: on the region's mesh (its manual axes as such)
            mesh = self.mesh if self.region_mesh is None else self.region_mesh
            sh = self._shardings.get((mesh, spec))
            if sh is None:
                sh = self._shardings[(mesh, spec)] = NamedSharding(mesh, spec)
            return with_sharding_constraint(x, sh)
        except Exception as e:  # a constraint partex made and JAX refused: partex's bug, keep it whole
            e.add_note(f"partex: while constraining {what} (shape {tuple(jax.numpy.shape(x))}) to {spec}")
            raise

    def user(self, x, spec: PartitionSpec, op_id: int | None):
        """``x`` constrained to ``spec``, the step's own sharding of op ``op_id``, on the plan's mesh."""
        try:
            if _explicit_context():  # an explicit_axes region's: a typed sharding, which with_sharding_constraint only asserts
                return jax.sharding.reshard(x, spec)
            return with_sharding_constraint(x, NamedSharding(self.mesh, spec))
        except Exception as e:
            where = self.program.ops[op_id].source if op_id is not None else "the step"
            raise PartexError(f"{where}: the step's own sharding {spec} cannot be "
                              f"applied on the plan's mesh: {type(e).__name__}: {e}") from e

    def value(self, var, x):
        """``x``, the value of jaxpr variable ``var``, constrained to its value spec."""
        vid = self.program.var_ids.get(id(var))
        if vid is None or self._as_written(vid):
            return x
        spec = self.value_specs.get(vid)
        if spec is None:
            return x
        v = self.program.values[vid]
        return self.place(x, spec, f"value {vid} ({v.name or 'intermediate'})")

    def _as_written(self, vid: int) -> bool:
        """A fully manual region's value: per device, as the region computes it (a partially
        manual one's the plan shards over the axes the region leaves to the partitioner)."""
        return vid in self.program.manual_values and vid not in self.program.manual_axes

    def operand(self, op_id: int, i: int, x):
        """``x`` as operand ``i`` of op ``op_id`` consumes it (i = -1 - j: as it writes result j)."""
        spec = self.operand_specs.get((op_id, i))
        if spec is None:
            return x
        prim = self.program.ops[op_id].primitive
        what = f"operand {i}" if i >= 0 else f"result {-1 - i}"
        return self.place(x, spec, f"{what} of op {op_id} ({prim})")

    def exit(self, enter_id: int, i: int, x):
        """``x``, output ``i`` of the body of the loop or branch entered at op ``enter_id``, as
        the body's exit pseudo-op carries, stacks or returns it."""
        exit_id = self._exit_of.get(enter_id)
        return x if exit_id is None else self.operand(exit_id, i, x)
