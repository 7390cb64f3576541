"""Apply: re-evaluate a traced ``Program`` with sharding constraints inserted.

Input shardings alone leave every intermediate to XLA's sharding propagation, which decides
badly (docs/plans.md, "Plans, apply and verify"). ``constrained_function`` interprets the
program's jaxpr again, calling ``jax.lax.with_sharding_constraint`` on every value the plan
constrains (``value_specs``, keyed by ValueId) and on op operands as one op consumes them
(``operand_specs``, keyed by (OpId, operand index)) — also inside ``scan`` / ``while`` /
``cond`` bodies, which are rebuilt with ``lax.scan`` / ``lax.while_loop`` / ``lax.switch``.

Call-like eqns that the tracer inlined (``jit``, ``custom_jvp_call``, ``custom_vjp_call``,
...) are interpreted inline, so constraints on their inner values apply; their custom
differentiation rules are dropped (apply runs on an already-differentiated step).
``checkpoint`` (remat) eqns are kept as ``checkpoint`` eqns around a re-traced body
(``tracing._jax.Call``).

The interpreter here evaluates; its parts each hold one concern: ``_plan_constraints`` places the
plan's constraints, ``_promote`` computes 16-bit floats in float32, ``_recomputation``
binds recomputations and copies values to and from host memory, ``_regions`` rebinds
shard_map regions and explicit sharding mode on the plan's mesh.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Collection, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import PartitionSpec

from .._errors import PartexError
from ..analysis._pipeline_stacks import ROWS
from ..tracing._jax import ClosedJaxpr, called_jaxpr, is_remat, jcore, pe, source_info_util
from ..tracing._program import Program, scan_counts
from ._plan_constraints import USER_SHARDING, Constraints
from ._micro import bind_rows
from ._pipelined_scan import pipelined_scan
from ._promote import abstract, promoted, widen
from ._recomputation import LoopUnit, Recomputation, to_host
from ._regions import Regions, partly_manual

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
    its stage axis (``_pipelined_scan.pipelined_scan``), their bodies as the plan constrains
    them, on one microbatch.

    The result takes and returns the same pytrees as the traced function. It is not jitted:
    wrap it in ``jax.jit(..., in_shardings=..., out_shardings=..., donate_argnums=...)``.
    """
    return _Interpreter(program, mesh, value_specs, operand_specs, user_specs, promote, recompute,
                        input_specs, host_state, pipelines).function()


@dataclasses.dataclass(frozen=True, slots=True)
class Microbatch:
    """A pipelined layer loop's body while it is evaluated: its ops run on one microbatch."""

    # op id -> how its params size the whole batch (``LoopBatch.resize``): (param, dims) pairs,
    # or one (ROWS, each operand's and result's batch dim) for a custom_partitioning op
    resize: Mapping[int, tuple]
    microbatches: int

    def resized(self, eqn, op_id: int):
        """``eqn`` with the params that size op ``op_id``'s batch sized for a microbatch."""
        params = dict(eqn.params)
        for k, dims in self.resize[op_id]:
            params[k] = tuple(n // self.microbatches if d in dims else n for d, n in enumerate(params[k]))
        return eqn.replace(params=params)


class _Interpreter:
    """The program's jaxpr evaluated again with the plan's constraints (module docstring).
    Evaluation recurses (``eval`` binds an eqn, a loop or branch rebuilds its body, which
    calls ``eval``); the parts it calls on hold the plan's constraints (``constraints``), its
    recomputations with one trace's saved values (``rc``), and the mesh context of regions
    (``regions``)."""

    def __init__(self, program, mesh, value_specs, operand_specs, user_specs=None, promote=False, recompute=(),
                 input_specs=None, host_state=(), pipelines=()):
        self.program = program
        self.promote = promote
        self.var_ids = program.var_ids
        self.eqn_ops = program.eqn_ops
        # pipelined layer loops, by their enter op (``PipelineRun``)
        self.pipelines = {lb.enter: run for run in pipelines for lb in (run.stack.forward, run.stack.backward)}
        self.micro: Microbatch | None = None  # set while a pipelined body is evaluated
        self.constraints = Constraints(program, mesh, value_specs, operand_specs, user_specs)
        self.regions = Regions(program, mesh, self.constraints, self.eval, self._bind)
        self.rc = Recomputation(program, recompute, host_state, self.constraints, input_specs, promote,
                                self._bind_again)
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
            self.rc.start()  # a fresh trace: the recompute points ahead, nothing recomputed yet
            # an explicit-mode step runs on the plan's mesh, whose axes are Auto: the plan's
            # constraints place its values, and its own typed shardings become constraints
            context_mesh = self.regions.context_mesh
            context = (jax.sharding.use_abstract_mesh(context_mesh) if context_mesh is not None
                       else contextlib.nullcontext())
            with context:
                outs = self.eval(closed.jaxpr, closed.consts, leaves, constrain_invars=True)
            for k in self.rc.host_outs:
                outs[k] = to_host(outs[k])
            return jax.tree_util.tree_unflatten(program.out_tree, outs)

        constrained.__name__ = "partex_constrained"
        return constrained

    # ------------------------------------------------------------------ the interpreter
    def eval(self, jaxpr, consts, args, constrain_invars: bool | Sequence[bool]) -> list:
        """Evaluate ``jaxpr``; ``constrain_invars`` says which invars get their value spec
        (False for invars that alias a value already constrained outside: inlined call
        operands, loop consts)."""
        env: dict[Any, Any] = {}

        widen_ = widen if self.promote else (lambda x: x)
        rc, constraints, regions = self.rc, self.constraints, self.regions
        trace = rc.trace
        recomputed, retaken, pending = trace.recomputed, trace.retaken, trace.pending
        var_ids, keep, host_args = self.var_ids, rc.keep, rc.host_args

        def read(atom, op_id=None):
            if isinstance(atom, jcore.Literal):
                return widen_(atom.val)
            if recomputed or retaken:
                vid = var_ids.get(id(atom))
                if vid in recomputed:
                    return recomputed[vid]
                # a weight re-taken for the backward pass: its ops read the new one, the
                # optimizer after it the argument as it came (a call's operands as they
                # are: the ops inside decide)
                if vid in retaken and op_id is not None and op_id <= retaken[vid][1]:
                    return retaken[vid][0]
            if host_args:
                vid = var_ids.get(id(atom))
                if vid in host_args:  # state in host memory: its device copy, made at the first read
                    return rc.on_device(vid, env[atom])
            return env[atom]

        def store(var, x):
            env[var] = x
            if keep:
                vid = var_ids.get(id(var))
                if vid in keep:
                    rc.made(vid, x)

        for var, c in zip(jaxpr.constvars, consts):
            store(var, constraints.value(var, widen_(c)))
        if isinstance(constrain_invars, bool):
            constrain_invars = [constrain_invars] * len(jaxpr.invars)
        if len(args) != len(jaxpr.invars):
            raise PartexError(
                f"expected {len(jaxpr.invars)} array arguments, got {len(args)}"
            )
        for var, x, c in zip(jaxpr.invars, args, constrain_invars):
            x = widen_(x)
            # (an argument in host memory is placed by its input sharding; its copy constrained)
            store(var, constraints.value(var, x) if c and var_ids.get(id(var)) not in host_args else x)

        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            op_id = self.eqn_ops.get(id(eqn))
            if op_id in pending:
                with _eqn_context(eqn, regions.context_mesh):
                    rc.recompute(pending.pop(op_id))
            if op_id in rc.ops:
                trace.eqns[op_id] = eqn
            invals = [read(a, op_id) for a in eqn.invars]
            handler = _STRUCTURED.get(name)
            # Outputs of structured / inlined eqns are constrained where they are made (after
            # the loop; inside the called body), ordinary ones here.
            constrain_outs = False
            with _eqn_context(eqn, regions.context_mesh):
                if handler is not None and op_id is not None:
                    outs = handler(self, eqn, op_id, invals)
                elif op_id is None and is_remat(name) and "jaxpr" in eqn.params:
                    outs = self.remat(eqn, invals)
                elif op_id is None and (called := called_jaxpr(eqn)) is not None:
                    outs = self.inline(called, invals)
                else:
                    outs = self.bind(eqn, op_id, invals)
                    constrain_outs = True
                # in the eqn's context: the constraint (and the collectives XLA makes of it)
                # carries the source line of the op that produced the value
                for var, x in zip(eqn.outvars, outs):
                    if isinstance(var, jcore.DropVar):
                        continue
                    store(var, constraints.value(var, x) if constrain_outs else x)
        return [read(a) for a in jaxpr.outvars]

    def bind(self, eqn, op_id, invals) -> list:
        """Bind ``eqn`` (op ``op_id``; None: an eqn of no op) on ``invals``, its operands and
        results constrained; the step's own sharding ops, shard_map regions and an
        explicit-mode step's typed shardings as the plan has them."""
        constraints = self.constraints
        if self.micro is not None and op_id in self.micro.resize:  # sized for the whole batch: for a microbatch
            resize = self.micro.resize[op_id]
            if resize[0][0] == ROWS:  # a custom_partitioning op: its function traced again for the rows
                invals = [constraints.operand(op_id, i, x) for i, x in enumerate(invals)]
                out = bind_rows(eqn.params, invals, resize[0][1], self.program.ops[op_id].source)
                return [constraints.operand(op_id, -1 - j, x) for j, x in enumerate(out)]
            eqn = self.micro.resized(eqn, op_id)
        if op_id is not None:
            invals = [constraints.operand(op_id, i, x) for i, x in enumerate(invals)]
        name = eqn.primitive.name
        users = constraints.user_specs if constraints.user_specs is not None and op_id is not None else {}
        if op_id in users and name in USER_SHARDING:
            spec = users[op_id]
            if spec is None:
                return list(invals)
            return [constraints.user(invals[0], spec, op_id)]
        if self.program.explicit_mesh is not None:
            out = self.regions.explicit(eqn, op_id, invals, users)
            if out is not None:
                return out
        if name == "shard_map":
            eqn = self.regions.on_plan_mesh(eqn)
            # promoted, the body is evaluated again here, its eqns widened (shard_map binds
            # its jaxpr as a function, out of reach of the params promotion rewrites)
            if partly_manual(eqn) or self.promote:
                return self.regions.region(eqn, invals)
        return self._bind(eqn, op_id, invals)

    def _bind(self, eqn, op_id, invals) -> list:
        params = eqn.primitive.get_bind_params(eqn.params)
        if self.promote:
            promote = promoted(eqn, params[1] if isinstance(params, tuple) else params, self.program, self._evaluate)
            if promote is None:  # rounding to 16 bits, skipped
                return list(invals[:1])
            params = (params[0], promote) if isinstance(params, tuple) else promote
        if isinstance(params, tuple):  # older JAX: (subfuns, params)
            subfuns, params = params
            out = eqn.primitive.bind(*subfuns, *invals, **params)
        else:
            out = eqn.primitive.bind(*invals, **params)
        out = list(out) if eqn.primitive.multiple_results else [out]
        if op_id is not None:  # results the op writes at a coarser sharding than their values'
            out = [self.constraints.operand(op_id, -1 - j, x) for j, x in enumerate(out)]
        return out

    def _bind_again(self, eqn, op_id: int, invals) -> list:
        """A forward op bound again (a recomputation's), in its eqn's context."""
        with _eqn_context(eqn, self.regions.context_mesh):
            return self.bind(eqn, op_id, invals)

    def _evaluate(self, jaxpr, consts, args) -> list:
        """``jaxpr`` evaluated on ``args``, none of which is constrained again."""
        return self.eval(jaxpr, consts, args, constrain_invars=False)

    def inline(self, inner, invals) -> list:
        """Evaluate a called jaxpr (``called_jaxpr`` of the eqn) in place."""
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
        closed = jax.make_jaxpr(body)(*[abstract(v.aval, self.promote, np.shape(x))
                                        for v, x in zip(inner.invars, invals)])
        new_jaxpr = pe.convert_constvars_jaxpr(closed.jaxpr)
        params: dict[str, Any] = dict(eqn.params, jaxpr=new_jaxpr)
        prevent_cse = params.get("prevent_cse")
        if isinstance(prevent_cse, tuple):
            params["prevent_cse"] = (False,) * len(closed.consts) + prevent_cse
        return list(eqn.primitive.bind(*closed.consts, *invals, **params))

    # ------------------------------------------------------------------ loops / branches
    def scan(self, eqn, enter_id, invals) -> list:
        p = eqn.params
        nc, ncarry = scan_counts(p)
        body = p["jaxpr"]
        consts = invals[:nc]
        exit_ = self.constraints.exit
        # scan_enter's operands are carry + xs (the consts alias the outer values)
        rest = [None if x is None else self.constraints.operand(enter_id, i, x) for i, x in enumerate(invals[nc:])]
        carry, xs = rest[:ncarry], rest[ncarry:]
        mask = [False] * nc + [True] * (len(invals) - nc)
        unit = LoopUnit(self.rc, enter_id, ncarry, xs)  # the loop's part in a recomputation
        xs = unit.operands(xs)

        def f(c, x, consts=consts):
            x = unit.slices(c, x)
            outs = self.eval(body.jaxpr, body.consts, [*consts, *c, *x], mask)
            outs = [exit_(enter_id, i, o) for i, o in enumerate(outs)]
            return outs[:ncarry], unit.stacked(outs[ncarry:])

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
        ys = unit.outputs(ys, len(eqn.outvars) - ncarry)
        outs = [*carry_out, *ys]
        return [None if o is None else self.constraints.value(v, o) for v, o in zip(eqn.outvars, outs)]

    def _pipelined(self, eqn, enter_id, pipe, f, consts, carry, xs) -> tuple[list, list]:
        """The layer loop ``eqn`` run as ``pipe`` says (``_pipelined_scan.pipelined_scan``),
        its body ``f`` with the consts it is given (a microbatch of those with the batch)."""
        lb = pipe.stack.forward if pipe.stack.forward.enter == enter_id else pipe.stack.backward
        const_batch = [lb.consts.get(self.var_ids.get(id(v), -1)) if not isinstance(v, jcore.Literal) else None
                       for v in eqn.invars[:len(consts)]]
        def body(cs, c, x):
            outer, self.micro = self.micro, Microbatch(lb.resize, pipe.microbatches)
            try:
                return f(c, x, consts=cs)
            finally:
                self.micro = outer

        place = self.constraints.place
        carry_out, ys = pipelined_scan(
            body, consts, carry, xs, length=int(eqn.params["length"]),
            reverse=bool(eqn.params["reverse"]), stages=pipe.stages, microbatches=pipe.microbatches, axis=pipe.axis,
            const_batch=const_batch, carry_batch=lb.carry, xs_batch=lb.xs, ys_batch=lb.ys, xs_skewed=lb.skewed or None,
            constrain=lambda x, spec: place(x, spec, f"a pipeline stage's value of op {enter_id}"),
            repeats=pipe.repeats)
        return carry_out, ys

    def while_(self, eqn, enter_id, invals) -> list:
        p = eqn.params
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cj, bj = p["cond_jaxpr"], p["body_jaxpr"]
        cconsts, bconsts = invals[:cn], invals[cn:cn + bn]
        init = [self.constraints.operand(enter_id, i, x) for i, x in enumerate(invals[cn + bn:])]
        ncarry = len(init)

        def cond_fun(c):
            (pred,) = self.eval(cj.jaxpr, cj.consts, [*cconsts, *c], [False] * cn + [True] * ncarry)
            return pred

        def body_fun(c):
            outs = self.eval(bj.jaxpr, bj.consts, [*bconsts, *c], [False] * bn + [True] * ncarry)
            return [self.constraints.exit(enter_id, i, o) for i, o in enumerate(outs)]

        outs = jax.lax.while_loop(cond_fun, body_fun, init)
        return [self.constraints.value(v, o) for v, o in zip(eqn.outvars, outs)]

    def cond(self, eqn, enter_id, invals) -> list:
        branches = eqn.params["branches"]
        index = self.constraints.operand(enter_id, 0, invals[0])
        ops = invals[1:]
        nout = len(eqn.outvars)

        def make(bi, br):
            def branch(*xs):
                outs = self.eval(br.jaxpr, br.consts, list(xs), constrain_invars=False)
                return [self.constraints.exit(enter_id, bi * nout + i, o) for i, o in enumerate(outs)]
            return branch

        outs = jax.lax.switch(index, [make(bi, br) for bi, br in enumerate(branches)], *ops)
        return [self.constraints.value(v, o) for v, o in zip(eqn.outvars, outs)]


_STRUCTURED: dict[str, Callable[[_Interpreter, Any, int, list], list]] = {
    "scan": _Interpreter.scan,
    "while": _Interpreter.while_,
    "cond": _Interpreter.cond,
}


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
