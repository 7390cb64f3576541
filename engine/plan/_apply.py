"""Apply: re-evaluate a traced ``Program`` with sharding constraints inserted.

Input shardings alone leave every intermediate to XLA's sharding propagation, which decides
badly (DESIGN.md, "Plan export, apply, verify"). ``constrained_function`` interprets the
program's jaxpr again, calling ``jax.lax.with_sharding_constraint`` on every value the plan
constrains (``value_specs``, keyed by ValueId) and on op operands as one op consumes them
(``operand_specs``, keyed by (OpId, operand index)) — also inside ``scan`` / ``while`` /
``cond`` bodies, which are rebuilt with ``lax.scan`` / ``lax.while_loop`` / ``lax.switch``.

Call-like eqns that the tracer inlined (``jit``, ``custom_jvp_call``, ``custom_vjp_call``,
...) are interpreted inline, so constraints on their inner values apply; their custom
differentiation rules are dropped (apply runs on an already-differentiated step).
``checkpoint`` (remat) eqns are kept as ``checkpoint`` eqns around a re-traced body: inlining
them would drop the optimisation barrier that stops XLA from CSE-ing the recomputation away,
and with it the memory the remat saves.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Collection, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core as jcore
from jax._src import source_info_util
from jax._src.interpreters import partial_eval as pe

# JAX's own, whatever a library has put at jax.lax.with_sharding_constraint (MaxText's tunix
# adapter swaps in a shim that swallows errors and retries with reshard)
from jax._src.pjit import with_sharding_constraint as _with_sharding_constraint
from jax.sharding import NamedSharding, PartitionSpec

from .._errors import PartexError
from ..analysis._pipeline import ROWS
from ..analysis._recompute import LoopPlan, shard_map_spans
from ..tracing._program import EXPLICIT_SHARDING_PARAMS, ClosedJaxpr, Program, scan_counts
from ._micro import bind_rows
from ._pipeline import pipelined_scan

__all__ = ["constrained_function"]

# Call primitives whose called jaxpr the tracer inlines, and the param holding it.
_CALL_PARAM = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
}
# Remat: rebound as itself (with a re-traced body), not inlined.
_REMAT = {"checkpoint", "remat2"}


def constrained_function(
    program: Program,
    mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh,
    value_specs: Mapping[int, PartitionSpec],
    operand_specs: Mapping[tuple[int, int], PartitionSpec] = {},
    user_specs: Mapping[int, PartitionSpec | None] | None = None,
    promote: bool = False,
    recompute: Sequence[Any] = (),
    input_specs: Mapping[int, PartitionSpec] | None = None,
    host_state: Collection[int] = (),
    pipelines: Sequence[Any] = (),
) -> Callable:
    """A function equivalent to the traced one, with sharding constraints inserted.

    ``value_specs[v]`` constrains value ``v`` right after it is produced (an input: at
    entry; a loop body's carry / per-iteration slice: at the start of every iteration).
    ``operand_specs[(op, i)]`` constrains operand ``i`` of op ``op`` as that op consumes it,
    leaving the value seen by its other consumers alone; ``operand_specs[(op, -1 - j)]``
    constrains result ``j`` as the op writes it, before its value's own constraint. For the pseudo-ops around a loop or
    branch body, ``(<kind>_enter, i)`` constrains the operand entering the loop and
    ``(<kind>_exit, i)`` the body output ``i`` before it is carried / stacked / returned.

    The step's own ``with_sharding_constraint`` / ``reshard`` ops are rebound on ``mesh``:
    ``user_specs[op]`` is the spec each gets (None: dropped, the plan places the value); by
    default the user's spec as it is (its mesh must then be ``mesh``'s).

    ``promote``: compute in float32 what the step computes in bfloat16 or float16 (inputs,
    constants, casts, matmul accumulators; ``reduce_precision`` is skipped), matmuls and
    convolutions at full float32 precision (GPUs take TF32 by default), the same ops in
    the same shardings: verify compares a plan's numerics so, where 16-bit rounding would
    hide a misplaced shard in noise.

    ``recompute``: ``_recompute.CopyPlan``s. Before op ``at`` of each, the saved values it
    names (and the weights, and the backward values it waits for) pass through one
    ``jax.lax.optimization_barrier``; its forward ops are bound again on the barrier's
    results, with their constraints, and every later read of a recomputed value or a weight
    takes the new one (an input re-taken so keeps ``input_specs[v]``). The barrier keeps XLA from CSE-ing the recomputation (or the
    weight's reshard) with the forward's, and from starting it before the backward pass
    reaches it. ``_recompute.LoopPlan``s (layers under ``scan``): the forward loop stops
    stacking the residuals recomputed and stacks the values the recomputation reads instead;
    every iteration of the backward loop binds the forward body's ops again on their slices
    (through a barrier with its carry) before its own body.

    ``host_state``: arguments and results kept in host memory (a plan's memory decisions):
    an argument comes in host memory and is copied to the device where the step first reads
    it (its value spec applied to the copy); such a result is copied to host memory where
    it is returned.

    ``pipelines``: ``PipelineRun``s: both loops of each layer stack run as a pipeline over
    its stage axis (``_pipeline.pipelined_scan``), their bodies as the plan constrains them,
    on one microbatch.

    The result takes and returns the same pytrees as the traced function. It is not jitted:
    wrap it in ``jax.jit(..., in_shardings=..., out_shardings=..., donate_argnums=...)``.
    """
    return _Interpreter(program, mesh, value_specs, operand_specs, user_specs, promote, recompute,
                        input_specs, host_state, pipelines).function()


_LOW = frozenset({np.dtype(jnp.bfloat16), np.dtype(np.float16)})
_DTYPE_PARAMS = ("new_dtype", "dtype", "preferred_element_type")


def is_low(dtype) -> bool:
    """A 16-bit float dtype (bfloat16, float16): what ``promote`` computes in float32."""
    try:
        return np.dtype(dtype) in _LOW
    except TypeError:  # not a numpy dtype (a PRNG key type)
        return False


def _to_host(x):
    """A copy of ``x`` in host memory (an offloaded residual)."""
    return jax.device_put(x, jax.memory.Space.Host)


def _to_device(x):
    """``x`` back in device memory."""
    return jax.device_put(x, jax.memory.Space.Device)


def _widen(x):
    """x in float32 if it is a 16-bit float, else as it is."""
    dtype = getattr(x, "dtype", None)
    return x.astype(np.float32) if dtype is not None and is_low(dtype) else x


# The step's own sharding ops (see _constraints): rebound on the plan's mesh, or dropped.
USER_SHARDING = {"sharding_constraint", "reshard"}
# Explicit mode's casts between axis types (the ends of auto_axes / explicit_axes regions):
# on the plan's mesh every axis is Auto, so they are identities.
_MESH_CASTS = {"mesh_cast"}


class _Interpreter:
    """The program's jaxpr evaluated again with the plan's constraints (module docstring).
    One class of ~400 lines, for a stated reason: evaluation recurses (``eval`` binds an eqn,
    a loop or branch rebuilds its body, which calls ``eval``), and every level reads and
    writes the same per-run state built here (the recomputations' saved and re-taken values,
    the loops' stacked outputs); split into parts, each would take all of it."""

    def __init__(self, program, mesh, value_specs, operand_specs, user_specs=None, promote=False, recompute=(),
                 input_specs=None, host_state=(), pipelines=()):
        self.program = program
        # pipelined layer loops, by their enter op (``PipelineRun``)
        self.pipelines = {lb.enter: run for run in pipelines for lb in (run.stack.forward, run.stack.backward)}
        self._micro: tuple[dict, int] | None = None  # in a pipelined body: (its ops' resizes, microbatches)
        host_state = set(host_state)
        self.host_args = host_state & set(program.inputs)  # copied to the device at their first read
        self.host_outs = [k for k, v in enumerate(program.outputs) if v in host_state]
        self.on_device: dict[int, Any] = {}  # host arguments' device copies, by value
        loops = [lp for lp in recompute if isinstance(lp, LoopPlan)]
        recompute = [cp for cp in recompute if not isinstance(cp, LoopPlan)]
        self.recompute = tuple(cp for cp in recompute if cp.at >= 0)
        self.loops_f = {lp.forward: lp for lp in loops}  # scan units, by their forward loop's enter op
        self.loops_b = {lp.backward: lp for lp in loops}  # ... and by their backward loop's
        self.loop_saved: dict[int, tuple] = {}  # forward enter op -> (its new stacked outputs, its operands)
        self.input_specs = dict(input_specs or {})
        self.rc_at: dict[int, list] = {}
        self.rc_ops = {o for cp in (*recompute, *loops) for o in cp.ops}
        self.rc_keep = {v for cp in recompute for v in (*cp.leaves, *cp.weights, *cp.anchors)} \
            | {v for lp in loops for v in lp.leaves}
        # ``offload``: residuals copied to host memory where they are made, back at ``at``
        self.to_host = {v for cp in self.recompute for v in cp.offloaded}
        self.rc_keep |= self.to_host
        self.eqn_of: dict[int, Any] = {}  # forward ops a recompute binds again
        # XLA:CPU expands optimisation barriers early and runs CSE after: there the saved
        # values a recomputation reads are made distinct from the forward's (_distinct)
        self.distinct = isinstance(mesh, jax.sharding.Mesh) and mesh.devices.flat[0].platform == "cpu"
        self.by_vid: dict[int, Any] = {}  # the values a recompute reads, as made
        self.override: dict[int, Any] = {}  # recomputed values, by value
        self.on_host: dict[int, Any] = {}  # offloaded values' host copies, by value
        self.retaken: dict[int, tuple[Any, int]] = {}  # weight -> (re-taken value, last op reading it)
        self.promote = promote
        self.mesh = mesh
        self.value_specs = dict(value_specs)
        self.operand_specs = dict(operand_specs)
        self.user_specs = None if user_specs is None else dict(user_specs)
        # an explicit-mode step's ops run under the plan's (Auto) mesh, not the one they were traced under
        self.context_mesh = mesh.abstract_mesh if program.explicit_mesh is not None else None
        self.var_ids = program.var_ids
        self.eqn_ops = program.eqn_ops
        self._shardings: dict[Any, NamedSharding] = {}
        self._region_mesh = None  # a partially manual region's mesh while its body is evaluated
        # exit pseudo-op id of every structured eqn's region, by its enter op id
        self._exit_of = {r.enter: r.exit for r in program.regions if r.enter >= 0}
        n_in = len(program.closed_jaxpr.jaxpr.invars)
        if n_in != len(program.inputs):
            raise PartexError(
                f"program has {len(program.inputs)} inputs but its jaxpr {n_in}: retrace it"
            )

    # ------------------------------------------------------------------ entry point
    def function(self) -> Callable:
        program = self.program
        closed = program.closed_jaxpr

        def constrained(*args):
            try:
                leaves = program.in_tree.flatten_up_to(tuple(args))
            except (ValueError, TypeError) as e:
                raise PartexError(
                    f"arguments do not match the traced function's: {e}"
                ) from e
            # a fresh trace: the recompute points ahead, nothing recomputed yet
            self.rc_at = {}
            for cp in self.recompute:
                self.rc_at.setdefault(cp.at, []).append(cp)
            self.eqn_of, self.by_vid, self.override, self.retaken, self.loop_saved = {}, {}, {}, {}, {}
            self.on_host, self.on_device = {}, {}
            # an explicit-mode step runs on the plan's mesh, whose axes are Auto: the plan's
            # constraints place its values, and its own typed shardings become constraints
            context = (jax.sharding.use_abstract_mesh(self.context_mesh) if self.context_mesh is not None
                       else contextlib.nullcontext())
            with context:
                outs = self.eval(closed.jaxpr, closed.consts, leaves, constrain_invars=True)
            for k in self.host_outs:
                outs[k] = _to_host(outs[k])
            return jax.tree_util.tree_unflatten(program.out_tree, outs)

        constrained.__name__ = "partex_constrained"
        return constrained

    # ------------------------------------------------------------------ constraints
    def _constrain(self, x, spec: PartitionSpec, what: str):
        try:
            # in a partially manual region's body: on the region's mesh (its manual axes as such)
            mesh = self.mesh if self._region_mesh is None else self._region_mesh
            sh = self._shardings.get((mesh, spec))
            if sh is None:
                sh = self._shardings[(mesh, spec)] = NamedSharding(mesh, spec)
            return _with_sharding_constraint(x, sh)
        except Exception as e:  # a constraint partex made and JAX refused: partex's bug, keep it whole
            e.add_note(f"partex: while constraining {what} (shape {tuple(jax.numpy.shape(x))}) to {spec}")
            raise

    def _user_constrain(self, x, spec: PartitionSpec, op_id: int | None):
        try:
            return _with_sharding_constraint(x, NamedSharding(self.mesh, spec))
        except Exception as e:
            where = self.program.ops[op_id].source if op_id is not None else "the step"
            raise PartexError(f"{where}: the step's own sharding {spec} cannot be "
                              f"applied on the plan's mesh: {type(e).__name__}: {e}") from e

    def constrain_var(self, var, x):
        vid = self.var_ids.get(id(var))
        if vid is None or self._as_written(vid):
            return x
        spec = self.value_specs.get(vid)
        if spec is None:
            return x
        v = self.program.values[vid]
        return self._constrain(x, spec, f"value {vid} ({v.name or 'intermediate'})")

    def _as_written(self, vid: int) -> bool:
        """A fully manual region's value: per device, as the region computes it (a partially
        manual one's the plan shards over the axes the region leaves to the partitioner)."""
        return vid in self.program.manual_values and vid not in self.program.manual_axes

    def constrain_operand(self, op_id: int, i: int, x):
        spec = self.operand_specs.get((op_id, i))
        if spec is None:
            return x
        prim = self.program.ops[op_id].primitive
        what = f"operand {i}" if i >= 0 else f"result {-1 - i}"
        return self._constrain(x, spec, f"{what} of op {op_id} ({prim})")

    # ------------------------------------------------------------------ the interpreter
    def eval(self, jaxpr, consts, args, constrain_invars: bool | Sequence[bool]) -> list:
        """Evaluate ``jaxpr``; ``constrain_invars`` says which invars get their value spec
        (False for invars that alias a value already constrained outside: inlined call
        operands, loop consts)."""
        env: dict[Any, Any] = {}

        widen = _widen if self.promote else (lambda x: x)
        override, retaken = self.override, self.retaken
        var_ids, keep, by_vid = self.var_ids, self.rc_keep, self.by_vid
        host_args = self.host_args

        def read(atom, op_id=None):
            if isinstance(atom, jcore.Literal):
                return widen(atom.val)
            if override or retaken:
                vid = var_ids.get(id(atom))
                if vid in override:
                    return override[vid]
                # a weight re-taken for the backward pass: its ops read the new one, the
                # optimizer after it the argument as it came (a call's operands as they
                # are: the ops inside decide)
                if vid in retaken and op_id is not None and op_id <= retaken[vid][1]:
                    return retaken[vid][0]
            if host_args:
                vid = var_ids.get(id(atom))
                if vid in host_args:  # state in host memory: its device copy, made at the first read
                    return self._on_device(vid, env[atom])
            return env[atom]

        def store(var, x):
            env[var] = x
            if keep:
                vid = var_ids.get(id(var))
                if vid in keep:
                    by_vid[vid] = x
                    if vid in self.to_host:
                        self.on_host[vid] = _to_host(x)

        for var, c in zip(jaxpr.constvars, consts):
            store(var, self.constrain_var(var, widen(c)))
        if isinstance(constrain_invars, bool):
            constrain_invars = [constrain_invars] * len(jaxpr.invars)
        if len(args) != len(jaxpr.invars):
            raise PartexError(
                f"expected {len(jaxpr.invars)} array arguments, got {len(args)}"
            )
        for var, x, c in zip(jaxpr.invars, args, constrain_invars):
            x = widen(x)
            # (an argument in host memory is placed by its input sharding; its copy constrained)
            store(var, self.constrain_var(var, x) if c and var_ids.get(id(var)) not in host_args else x)

        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            op_id = self.eqn_ops.get(id(eqn))
            if op_id in self.rc_at:
                with _eqn_context(eqn, self.context_mesh):
                    self._recompute(self.rc_at.pop(op_id))
            if op_id in self.rc_ops:
                self.eqn_of[op_id] = eqn
            invals = [read(a, op_id) for a in eqn.invars]
            handler = _STRUCTURED.get(name)
            # Outputs of structured / inlined eqns are constrained where they are made (after
            # the loop; inside the called body), ordinary ones here.
            constrain_outs = False
            with _eqn_context(eqn, self.context_mesh):
                if handler is not None and op_id is not None:
                    outs = handler(self, eqn, op_id, invals)
                elif op_id is None and name in _REMAT and "jaxpr" in eqn.params:
                    outs = self.remat(eqn, invals)
                elif op_id is None and (called := _called_jaxpr(eqn)) is not None:
                    outs = self.inline(called, invals)
                else:
                    outs = self.bind(eqn, op_id, invals)
                    constrain_outs = True
                # in the eqn's context: the constraint (and the collectives XLA makes of it)
                # carries the source line of the op that produced the value
                for var, x in zip(eqn.outvars, outs):
                    if isinstance(var, jcore.DropVar):
                        continue
                    store(var, self.constrain_var(var, x) if constrain_outs else x)
        return [read(a) for a in jaxpr.outvars]

    def _distinct_leaves(self, cp, names, ys) -> list:
        """XLA:CPU: the values a recomputation (or a re-gather) reads, made distinct from the
        forward's and dependent on a backward value it waits for (``_distinct``), so that
        neither CSE nor the scheduler moves it back into the forward pass. The dependency is
        a scalar zero reduced from that value (a 4-byte all-reduce where it is sharded)."""
        got = dict(zip(names, ys))
        anchor = next((got[a] for a in cp.anchors if _kind(got[a]) in ("f", "i", "u")), None)
        zero = None if anchor is None else _zero_of(anchor)
        anchors = set(cp.anchors)
        return [y if v in anchors else _distinct(y, zero) for v, y in zip(names, ys)]

    def _on_device(self, vid: int, x):
        """The device copy of argument ``vid``, in host memory as ``x``: made once, where
        the step first reads it, with the argument's value spec."""
        y = self.on_device.get(vid)
        if y is None:
            y = _to_device(x)
            spec = self.value_specs.get(vid)
            if spec is not None:
                y = self._constrain(y, spec, f"argument {vid} copied from host memory")
            y = self.on_device[vid] = y
        return y

    def _kept(self, vid: int):
        """A value a recomputation or loop reads as it was made (an argument in host memory:
        its device copy)."""
        return self.on_device.get(vid, self.by_vid[vid])

    def _recompute(self, plans) -> None:
        """Bind the forward ops of ``plans`` again, on their saved values passed through one
        optimisation barrier; later reads take the recomputed values and the re-taken weights."""
        specs = self.value_specs
        for cp in plans:
            for v in cp.offloaded:  # back from host memory for the backward pass (and the recomputation)
                spec = specs.get(v)
                back = _to_device(self.on_host[v])
                self.override[v] = self._constrain(back, spec, f"offloaded value {v}") if spec is not None else back
            names = list(dict.fromkeys((*cp.leaves, *cp.weights, *cp.anchors)))
            xs = [self.override[v] if v in self.override else
                  self.retaken[v][0] if v in self.retaken else self._kept(v) for v in names]
            ys = jax.lax.optimization_barrier(tuple(xs))
            if self.distinct:
                ys = self._distinct_leaves(cp, names, ys)
            local = {}
            for v, y in zip(names, ys):
                spec = specs.get(v) or self.input_specs.get(v)
                local[v] = self._constrain(y, spec, f"saved value {v}") if spec is not None else y
            for w in cp.weights:
                self.retaken[w] = (local[w], cp.until)
            self._rebind(cp.ops, local)
            for v in cp.recomputed:
                self.override[v] = local[v]

    def _rebind(self, ops, local: dict) -> None:
        """Bind the forward ops ``ops`` again, in order, on the values in ``local`` (by value
        id; the step's constants otherwise); their results, constrained, go to ``local``."""
        program, specs = self.program, self.value_specs
        # a shard_map region is bound whole with its enter op: its results are the exit's
        regions = (shard_map_spans(program, ops[0], ops[-1] + 1) or {}) if ops else {}
        skip = -1
        for o in ops:
            if o <= skip:
                continue
            results = program.ops[o].outputs
            if o in regions:
                skip = regions[o]
                results = program.ops[skip].outputs
            eqn = self.eqn_of[o]
            invals = []
            for a in eqn.invars:
                if isinstance(a, jcore.Literal):
                    invals.append(_widen(a.val) if self.promote else a.val)
                    continue
                vid = self.var_ids[id(a)]
                x = local.get(vid)
                if x is None:  # a constant of the step
                    x = program.constants[vid]
                    x = _widen(x) if self.promote else x
                invals.append(x)
            with _eqn_context(eqn, self.context_mesh):
                outs = self.bind(eqn, o, invals)
            for vid, x in zip(results, outs):
                spec = specs.get(vid)
                local[vid] = self._constrain(x, spec, f"recomputed value {vid}") if spec is not None else x

    def _loop_leaves(self, lp: LoopPlan, carry, xs, extra) -> dict:
        """In the backward loop's body: the values the recomputation reads (``xs``: the
        loop's own slices; ``extra``: those of the values the forward loop stacked for it and
        of its xs operands), through one optimisation barrier with the loop's carry (the
        cotangent it waits for)."""
        names = [*lp.stacked, *(v for v, _ in self.loop_saved[lp.forward][1])]
        vals = [_to_device(x) if k in lp.host_stacked else x for k, x in enumerate(extra)]
        ncarry = self.program.ops[lp.backward].params["num_carry"]
        for v, i in lp.reuse:
            names.append(v)
            vals.append(xs[i - ncarry])
        consts = [v for v in lp.leaves if v not in names]
        names += consts
        vals += [self._kept(v) for v in consts]  # the forward loop's consts, as it read them
        ys = jax.lax.optimization_barrier((tuple(vals), tuple(carry)))[0]
        specs = self.value_specs
        return {v: self._constrain(y, specs[v], f"saved value {v}") if specs.get(v) is not None else y
                for v, y in zip(names, ys)}

    def bind(self, eqn, op_id, invals) -> list:
        if self._micro is not None and op_id in self._micro[0]:  # sized for the whole batch: for a microbatch
            resize, m = self._micro[0][op_id], self._micro[1]
            if resize[0][0] == ROWS:  # a custom_partitioning op: its function traced again for the rows
                invals = [self.constrain_operand(op_id, i, x) for i, x in enumerate(invals)]
                out = bind_rows(eqn.params, invals, resize[0][1], self.program.ops[op_id].source)
                return [self.constrain_operand(op_id, -1 - j, x) for j, x in enumerate(out)]
            params = dict(eqn.params)
            for k, dims in resize:
                params[k] = tuple(n // m if d in dims else n for d, n in enumerate(params[k]))
            eqn = eqn.replace(params=params)
        if op_id is not None:
            invals = [self.constrain_operand(op_id, i, x) for i, x in enumerate(invals)]
        name = eqn.primitive.name
        users = self.user_specs if self.user_specs is not None and op_id is not None else {}
        user = op_id in users
        if user and name in USER_SHARDING:
            spec = users[op_id]
            if spec is None:
                return list(invals)
            return [self._user_constrain(invals[0], spec, op_id)]
        if self.program.explicit_mesh is not None:
            if name in USER_SHARDING or name in _MESH_CASTS:  # not the user's (autodiff's, auto_axes'): dropped
                return list(invals)
            if name == "shard_map":
                return self._region(eqn, invals)
            typed = [k for k in EXPLICIT_SHARDING_PARAMS if isinstance(eqn.params.get(k), NamedSharding)]
            if typed:  # the op's typed result sharding: a constraint on the plan's mesh, or dropped
                out = self._bind(eqn.replace(params={**eqn.params, **dict.fromkeys(typed)}), op_id, invals)
                if not user or self.program.ops[op_id].outputs[0] in self.program.manual_values:
                    return out  # a region's typed value: per device, as the region computes it
                spec = users[op_id]
                return [self._user_constrain(out[0], spec, op_id), *out[1:]] if spec is not None else out
        if name == "shard_map":
            eqn = self._on_plan_mesh(eqn)
            if self._partly_manual(eqn):
                return self._region(eqn, invals)
        return self._bind(eqn, op_id, invals)

    @staticmethod
    def _partly_manual(eqn) -> bool:
        p = eqn.params
        manual = p.get("newly_manual_axes", p.get("manual_axes", frozenset(p["mesh"].axis_names)))
        return bool(set(p["mesh"].axis_names) - set(manual))

    def _region(self, eqn, invals) -> list:
        """A shard_map region whose body is evaluated again on the plan's mesh (the region's
        manual axes as the region has them): an explicit-mode step's (its typed shardings
        dropped), and a partially manual one's, whose values take the plan's shardings over
        the axes the region leaves to the partitioner."""
        p = eqn.params
        body = p["jaxpr"]
        inner, consts = (body.jaxpr, body.consts) if isinstance(body, ClosedJaxpr) else (body, ())
        partly = self._partly_manual(eqn)

        def per_device(*xs):
            here = jax.sharding.get_abstract_mesh()  # the region's own
            outer, self.context_mesh = self.context_mesh, here
            outer_mesh, self._region_mesh = self._region_mesh, (here if partly else None)
            try:
                return tuple(self.eval(inner, consts, list(xs), constrain_invars=partly))
            finally:
                self.context_mesh, self._region_mesh = outer, outer_mesh

        manual = p.get("newly_manual_axes", p.get("manual_axes", frozenset(self.mesh.axis_names)))
        region = jax.shard_map(per_device, mesh=self._on_plan_mesh(eqn).params["mesh"], in_specs=tuple(p["in_specs"]),
                               out_specs=tuple(p["out_specs"]), axis_names=set(manual), check_vma=p["check_vma"])
        return list(region(*invals))

    def _on_plan_mesh(self, eqn):
        """A shard_map region on the plan's mesh: the same axes (by name and size), perhaps
        over the devices in another order, or with other axis types (an explicit-mode step's)."""
        region = eqn.params["mesh"]
        plan = self.mesh if isinstance(region, jax.sharding.Mesh) else self.mesh.abstract_mesh
        if region == plan:
            return eqn
        unit = {a for a, n in region.shape.items() if n == 1}
        if {a: n for a, n in region.shape.items() if n > 1} != {a: n for a, n in self.mesh.shape.items() if n > 1}:
            raise PartexError(f"{self.program.ops[self.eqn_ops[id(eqn)]].source}: a shard_map region over "
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

    def _bind(self, eqn, op_id, invals) -> list:
        params = eqn.primitive.get_bind_params(eqn.params)
        if self.promote:
            promoted = self._promoted(eqn, params[1] if isinstance(params, tuple) else params)
            if promoted is None:  # rounding to 16 bits, skipped
                return list(invals[:1])
            params = (params[0], promoted) if isinstance(params, tuple) else promoted
        if isinstance(params, tuple):  # older JAX: (subfuns, params)
            subfuns, params = params
            out = eqn.primitive.bind(*subfuns, *invals, **params)
        else:
            out = eqn.primitive.bind(*invals, **params)
        out = list(out) if eqn.primitive.multiple_results else [out]
        if op_id is not None:  # results the op writes at a coarser sharding than their values'
            out = [self.constrain_operand(op_id, -1 - j, x) for j, x in enumerate(out)]
        return out

    def _promoted(self, eqn, params: dict) -> dict | None:
        """The eqn's params computing in float32 where they name a 16-bit float."""
        name = eqn.primitive.name
        if name == "reduce_precision":
            return None
        if name == "bitcast_convert_type" and any(is_low(v.aval.dtype) for v in (*eqn.invars, *eqn.outvars)):
            raise PartexError(f"{self.program.ops[self.eqn_ops[id(eqn)]].source if id(eqn) in self.eqn_ops else name}: "
                              "the step bitcasts a 16-bit float, which cannot be computed in float32")
        out = {}
        for k, v in params.items():
            if k in _DTYPE_PARAMS and v is not None and is_low(v):
                v = np.dtype(np.float32)
            elif k == "precision" and name in ("dot_general", "conv_general_dilated"):
                # float32 in float32: not TF32 / bf16 passes, which GPUs and TPUs take by default
                v = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
            elif isinstance(v, (ClosedJaxpr, jcore.Jaxpr)):  # a reduction's computation (scatter-add)
                v = self._promoted_jaxpr(v)
            out[k] = v
        return out

    def _promoted_jaxpr(self, j):
        inner = j.jaxpr if isinstance(j, ClosedJaxpr) else j
        consts = getattr(j, "consts", ())
        if not any(is_low(v.aval.dtype) for v in (*inner.invars, *inner.outvars)):
            return j
        closed = jax.make_jaxpr(lambda *xs: self.eval(inner, consts, list(xs), constrain_invars=False))(
            *[_sds(v.aval, promote=True) for v in inner.invars])
        return closed if isinstance(j, ClosedJaxpr) else closed.jaxpr

    def inline(self, inner, invals) -> list:
        """Evaluate a called jaxpr (``_called_jaxpr`` of the eqn) in place."""
        if isinstance(inner, ClosedJaxpr):
            return self.eval(inner.jaxpr, inner.consts, invals, constrain_invars=False)
        return self.eval(inner, (), invals, constrain_invars=False)

    def remat(self, eqn, invals) -> list:
        """Re-trace the checkpointed body with its constraints; bind ``checkpoint`` again."""
        inner = eqn.params["jaxpr"]
        if isinstance(inner, ClosedJaxpr):
            inner, inner_consts = inner.jaxpr, inner.consts
        else:
            inner_consts = ()

        def body(*xs):
            return self.eval(inner, inner_consts, list(xs), constrain_invars=False)

        # the operands' own shapes: in a pipelined body, a microbatch's (the ops inside
        # resized as the body's are)
        closed = jax.make_jaxpr(body)(*[_sds(v.aval, self.promote, np.shape(x)) for v, x in zip(inner.invars, invals)])
        new_jaxpr = pe.convert_constvars_jaxpr(closed.jaxpr)
        params: dict[str, Any] = dict(eqn.params, jaxpr=new_jaxpr)
        prevent_cse = params.get("prevent_cse")
        if isinstance(prevent_cse, tuple):
            params["prevent_cse"] = (False,) * len(closed.consts) + prevent_cse
        return list(eqn.primitive.bind(*closed.consts, *invals, **params))

    # ------------------------------------------------------------------ loops / branches
    def _exit_operand(self, enter_id: int, i: int, x):
        exit_id = self._exit_of.get(enter_id)
        return x if exit_id is None else self.constrain_operand(exit_id, i, x)

    def scan(self, eqn, enter_id, invals) -> list:
        p = eqn.params
        nc, ncarry = scan_counts(p)
        body = p["jaxpr"]
        consts = invals[:nc]
        # scan_enter's operands are carry + xs (the consts alias the outer values)
        rest = [None if x is None else self.constrain_operand(enter_id, i, x) for i, x in enumerate(invals[nc:])]
        carry, xs = rest[:ncarry], rest[ncarry:]
        mask = [False] * nc + [True] * (len(invals) - nc)
        fwd, bwd = self.loops_f.get(enter_id), self.loops_b.get(enter_id)
        xs_leaves: list = []  # set when fwd is not None, read only then
        fed: dict[int, int] = {}  # set when bwd is not None, read only then
        if fwd is not None:  # leaves the backward loop slices again: of the forward loop's xs operands
            xs_leaves = [(v, xs[k - ncarry]) for k, v in enumerate(self.program.ops[enter_id].outputs)
                         if k >= ncarry and v in fwd.leaves and v not in dict(fwd.reuse)]
        n_xs = len(xs)
        if bwd is not None:  # the residuals it recomputes are not stacked: their slices are made anew
            fed = {i - ncarry: v for i, v in bwd.feeds}
            stacked, xs_leaves_b = self.loop_saved[bwd.forward]
            xs = [x for x in xs if x is not None] + list(stacked) + [x for _, x in xs_leaves_b]

        def f(c, x, consts=consts):
            if bwd is not None and bwd.ops:
                it = iter(x[:n_xs - len(fed)])
                full = [None if k in fed else next(it) for k in range(n_xs)]
                full = [_to_device(y) if k + ncarry in bwd.host_in else y for k, y in enumerate(full)]
                local = self._loop_leaves(bwd, c, full, x[n_xs - len(fed):])
                self._rebind(bwd.ops, local)
                x = [local[fed[k]] if k in fed else full[k] for k in range(n_xs)]
            elif bwd is not None:  # slices of stacks kept in host memory (nothing recomputed)
                x = [_to_device(y) if k + ncarry in bwd.host_in else y for k, y in enumerate(x)]
            outs = self.eval(body.jaxpr, body.consts, [*consts, *c, *x], mask)
            outs = [self._exit_operand(enter_id, i, o) for i, o in enumerate(outs)]
            carry, ys = outs[:ncarry], outs[ncarry:]
            if fwd is not None:
                ys = [_to_host(y) if j in fwd.host_ys else y for j, y in enumerate(ys)]
                ys = [y for j, y in enumerate(ys) if j not in fwd.dropped] + [
                    _to_host(self._kept(v)) if k in fwd.host_stacked else self._kept(v)
                    for k, v in enumerate(fwd.stacked)]
            return carry, ys

        kw = {}
        if "_split_transpose" in p:
            kw["_split_transpose"] = p["_split_transpose"]
        pipe = self.pipelines.get(enter_id)
        if pipe is not None:
            carry_out, ys = self._pipelined(eqn, enter_id, pipe, f, consts, carry, xs)
        else:
            carry_out, ys = jax.lax.scan(
                f, carry, xs, length=int(p["length"]), reverse=bool(p["reverse"]),
                unroll=p.get("unroll", 1), **kw,
            )
        if fwd is not None:  # the dropped outputs are None: the backward loop makes them anew
            n_ys = len(eqn.outvars) - ncarry
            made = iter(ys[:len(ys) - len(fwd.stacked)])
            self.loop_saved[enter_id] = (ys[len(ys) - len(fwd.stacked):], xs_leaves)
            ys = [None if j in fwd.dropped else next(made) for j in range(n_ys)]
        outs = [*carry_out, *ys]
        return [None if o is None else self.constrain_var(v, o) for v, o in zip(eqn.outvars, outs)]

    def _pipelined(self, eqn, enter_id, pipe, f, consts, carry, xs) -> tuple[list, list]:
        """The layer loop ``eqn`` run as ``pipe`` says (``_pipeline.pipelined_scan``), its
        body ``f`` with the consts it is given (a microbatch of those with the batch)."""
        lb = pipe.stack.forward if pipe.stack.forward.enter == enter_id else pipe.stack.backward
        const_batch = [lb.consts.get(self.var_ids.get(id(v), -1)) if not isinstance(v, jcore.Literal) else None
                       for v in eqn.invars[:len(consts)]]
        def body(cs, c, x):
            outer, self._micro = self._micro, (lb.resize, pipe.microbatches)
            try:
                return f(c, x, consts=cs)
            finally:
                self._micro = outer

        carry_out, ys = pipelined_scan(
            body, consts, carry, xs, length=int(eqn.params["length"]),
            reverse=bool(eqn.params["reverse"]), stages=pipe.stages, microbatches=pipe.microbatches, axis=pipe.axis,
            const_batch=const_batch, carry_batch=lb.carry, xs_batch=lb.xs, ys_batch=lb.ys, xs_skewed=lb.skewed or None,
            constrain=lambda x, spec: self._constrain(x, spec, f"a pipeline stage's value of op {enter_id}"),
            repeats=pipe.repeats)
        return carry_out, ys

    def while_(self, eqn, enter_id, invals) -> list:
        p = eqn.params
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cj, bj = p["cond_jaxpr"], p["body_jaxpr"]
        cconsts, bconsts = invals[:cn], invals[cn:cn + bn]
        init = [self.constrain_operand(enter_id, i, x) for i, x in enumerate(invals[cn + bn:])]
        ncarry = len(init)

        def cond_fun(c):
            (pred,) = self.eval(cj.jaxpr, cj.consts, [*cconsts, *c], [False] * cn + [True] * ncarry)
            return pred

        def body_fun(c):
            outs = self.eval(bj.jaxpr, bj.consts, [*bconsts, *c], [False] * bn + [True] * ncarry)
            return [self._exit_operand(enter_id, i, o) for i, o in enumerate(outs)]

        outs = jax.lax.while_loop(cond_fun, body_fun, init)
        return [self.constrain_var(v, o) for v, o in zip(eqn.outvars, outs)]

    def cond(self, eqn, enter_id, invals) -> list:
        branches = eqn.params["branches"]
        index = self.constrain_operand(enter_id, 0, invals[0])
        ops = invals[1:]
        nout = len(eqn.outvars)

        def make(bi, br):
            def branch(*xs):
                outs = self.eval(br.jaxpr, br.consts, list(xs), constrain_invars=False)
                return [self._exit_operand(enter_id, bi * nout + i, o) for i, o in enumerate(outs)]
            return branch

        outs = jax.lax.switch(index, [make(bi, br) for bi, br in enumerate(branches)], *ops)
        return [self.constrain_var(v, o) for v, o in zip(eqn.outvars, outs)]


_STRUCTURED: dict[str, Callable[[_Interpreter, Any, int, list], list]] = {
    "scan": _Interpreter.scan,
    "while": _Interpreter.while_,
    "cond": _Interpreter.cond,
}


def _kind(x) -> str:
    """The numpy kind of ``x``'s dtype ("f", "i", "u", ...); "" for JAX's extended dtypes (a
    typed PRNG key's ``key<fry>``), which numpy cannot represent and arithmetic cannot touch."""
    if jnp.issubdtype(x.dtype, jax.dtypes.extended):
        return ""
    return np.dtype(x.dtype).kind


def _zero_of(x):
    """An integer zero computed from all of ``x`` that XLA cannot fold (``clamp(0, bits,
    0)``, reduced): NaN-safe, and nothing that reads it can run before ``x`` is made."""
    dtype = np.dtype(x.dtype)
    bits = jax.lax.bitcast_convert_type(x, np.dtype(f"int{8 * dtype.itemsize}")) if dtype.kind == "f" else x
    z = jax.lax.clamp(np.zeros((), bits.dtype), bits, np.zeros((), bits.dtype))
    return jax.numpy.max(z) if z.ndim else z


def _distinct(x, zero=None):
    """``x`` exactly, as a value XLA cannot prove equal to ``x``: plus an integer zero it
    cannot fold (``zero``, else ``clamp(0, bits, 0)`` of its own bits), so that CSE keeps a
    recomputation that reads it apart from the forward's (XLA:CPU runs CSE after expanding
    optimisation barriers) and, with ``zero`` from a backward value, the scheduler cannot
    start it before that value is made."""
    if _kind(x) not in ("f", "i", "u"):
        return x
    dtype = np.dtype(x.dtype)
    if dtype.kind == "f" and dtype.itemsize not in (2, 4, 8):
        return x
    if zero is None:
        bits = jax.lax.bitcast_convert_type(x, np.dtype(f"int{8 * dtype.itemsize}")) if dtype.kind == "f" else x
        zero = jax.lax.clamp(np.zeros((), bits.dtype), bits, np.zeros((), bits.dtype))
    return x + jax.lax.convert_element_type(zero, dtype)


def _called_jaxpr(eqn):
    key = _CALL_PARAM.get(eqn.primitive.name)
    if key is not None:
        return eqn.params.get(key)
    for k in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        j = eqn.params.get(k)
        if isinstance(j, (ClosedJaxpr, jcore.Jaxpr)):
            return j
    return None


def _sds(aval, promote: bool = False, shape=None):
    dtype = np.float32 if promote and is_low(aval.dtype) else aval.dtype
    return jax.ShapeDtypeStruct(aval.shape if shape is None else tuple(shape), dtype,
                                weak_type=getattr(aval, "weak_type", False))


class _eqn_context:
    """The eqn's source info (for HLO metadata) and its context (compute type etc.); with
    ``mesh`` (an AbstractMesh), that mesh instead of the one the eqn was traced under (an
    explicit-mode step's, on the plan's mesh)."""

    def __init__(self, eqn, mesh=None):
        self.eqn = eqn
        self.mesh = mesh
        self.stack = []

    def __enter__(self):
        eqn = self.eqn
        try:
            name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
            cms = [
                source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack),
                eqn.ctx.manager,
            ]
        except AttributeError:  # best effort: provenance only
            cms = []
        if self.mesh is not None:
            cms.append(jax.sharding.use_abstract_mesh(self.mesh))
        for cm in cms:
            cm.__enter__()
            self.stack.append(cm)
        return self

    def __exit__(self, *exc):
        while self.stack:
            self.stack.pop().__exit__(*exc)
        return False
