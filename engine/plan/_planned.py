"""A plan bound to a traced step, and applied: the JAX half of ``_plan``.

``bind`` traces the step, checks the plan against it (signature, divisibility, the specs its
decisions give), analyses it and finds the plan's decisions there: a ``BoundPlan``.
``apply_plan`` gives a ``PlannedFunction``, which jits the step with the plan's shardings from
that binding, and verify reads the same binding (``PlannedFunction.bound``), so a plan is
traced and analysed once. ``plan_shardings`` and ``shard_inputs`` place a training job's
arguments as the plan says.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from .._decisions import Decision
from .._errors import PartexError
from .._loader import LoadedModel, ModelAnalysis, axis_names_by_value
from ..analysis._analysis import analyze
from ..analysis._types import Analysis
from ..analysis._constraints import plan_spec
from ..analysis._recompute import plan_unit
from ..analysis._roles import state_inputs
from ..analysis._space import from_plan
from ..cost import CostModel
from ..tracing._program import HOST_MEMORY_KINDS, Program, dynamic_args, is_array_leaf, trace
from ._apply import constrained_function
from ._pipeline_decision import Pipeline, pipelined
from ._plan import Plan
from ._specs import SpecJSON, check_divisible, check_signature, norm_spec, spec_to_json


def spec_from_json(spec: SpecJSON) -> PartitionSpec:
    return PartitionSpec(*[None if e is None else e if isinstance(e, str) else tuple(e) for e in spec])


@dataclasses.dataclass(frozen=True)
class BoundPlan:
    """A plan on one traced step: the program, its analysis, the plan's decisions found there
    (by anchor, then label) and the cost model that gives their shardings."""
    plan: Plan
    program: Program
    analysis: Analysis
    decisions: tuple[Decision, ...]
    cost_model: CostModel

    def priced(self, lowering: str) -> CostModel:
        """A cost model of the same analysis and plan that prices collectives as ``lowering``
        (``"cpu"``, ``"tpu"``) lowers them: verify's prediction of what XLA compiles here."""
        plan = self.plan
        return CostModel(self.analysis, plan.mesh, plan.hardware, donate=plan.donate, lowering=lowering,
                         user_shardings=plan.user_shardings)


def bind(plan: Plan, fn: Callable, args: Sequence[Any], axis_names=None) -> BoundPlan:
    """Trace ``fn(*args)``, check that ``plan`` is for it (input signature, divisible specs,
    input and output specs that its decisions give) and find its decisions in the analysis."""
    program = trace(fn, args)
    an = None
    if plan.pipeline is not None:  # the step as the plan runs it: its stack pipelined
        written = ModelAnalysis(LoadedModel(getattr(fn, "__name__", "fn"), fn, tuple(args), axis_names), program,
                                analyze(program, axis_names_by_value(program, axis_names)), 0.0)
        piped = pipelined(written, Pipeline.from_json(plan.pipeline), plan.mesh)
        program, an = piped.program, piped.analysis
    check_signature(plan, program)
    check_divisible(plan, program)
    if an is None:
        an = analyze(program, axis_names_by_value(program, axis_names))
    decisions = tuple(resolve_decisions(plan, an))
    cm = CostModel(an, plan.mesh, plan.hardware, donate=plan.donate, user_shardings=plan.user_shardings)
    check_consistent(plan, program, cm, decisions)
    return BoundPlan(plan, program, an, decisions, cm)


def apply_plan(plan: Plan, fn: Callable, mesh=None, axis_names=None, constrain: bool = True) -> PlannedFunction:
    """``fn`` jitted with ``plan``'s shardings, donation and intermediate constraints, on
    ``mesh`` (default: the plan's mesh over all of JAX's devices, Auto axis types): a
    ``PlannedFunction``, traced and compiled on its first call (or ``lower``), where a plan
    made for another function, or edited out of step with its decisions, is a PartexError.
    ``axis_names``: the inputs' logical axis names, as the plan was made with.
    constrain=False applies the input and output shardings alone (for comparison: XLA's
    propagation then decides every intermediate)."""
    return PlannedFunction(plan, fn, mesh, axis_names, constrain)


class PlannedFunction:
    """The plan applied to a function (``apply_plan``): traced and jitted on first use (or
    ``lower``). ``plan``, ``fn``, ``mesh``, ``axis_names`` and ``constrain`` as ``apply_plan``'s.
    Called as ``fn`` is, it returns ``fn``'s outputs, computed with the plan's shardings."""

    def __init__(self, plan: Plan, fn: Callable, mesh=None, axis_names=None, constrain: bool = True):
        self.plan = plan
        self.constrain = constrain
        self.fn = fn
        self._mesh = mesh
        self.axis_names = axis_names
        self._jitted = None
        self.bound: BoundPlan | None = None  # by build(): the plan on the traced step
        self.num_constraints = (0, 0)
        self._host: frozenset[int] = frozenset()  # values the plan keeps in host memory (by build)

    @property
    def program(self) -> Program | None:
        """The traced step (after ``build``)."""
        return self.bound.program if self.bound is not None else None

    @property
    def mesh(self):
        """The ``jax.sharding.Mesh`` the step runs on: the one given, else the plan's mesh over
        JAX's devices (``Plan.jax_mesh``)."""
        if self._mesh is None:
            self._mesh = self.plan.mesh.jax_mesh()
        return self._mesh

    def build(self, args: Sequence[Any]):
        """Trace ``fn`` on ``args`` (the step's positional arguments) and jit it with the plan
        (once: again only when the static arguments change). Returns the jitted callable;
        PartexError for a mesh that is not the plan's, or a plan made for another function."""
        if self._jitted is not None and self.program is not None and self.program.static_mismatch(args) is None:
            return self._jitted
        check_processes(self.plan)
        mesh = self.mesh
        if tuple(mesh.axis_names) != self.plan.mesh.axes or tuple(mesh.devices.shape) != self.plan.mesh.sizes:
            raise PartexError(f"the mesh given ({dict(zip(mesh.axis_names, mesh.devices.shape))}) is not the "
                              f"plan's ({self.plan.mesh.text()})")
        bound = bind(self.plan, self.fn, self._as_traced(args), self.axis_names)
        program, cm, decisions = bound.program, bound.cost_model, bound.decisions
        value_specs, operand_specs = constraint_specs(cm, decisions) if self.constrain else ({}, {})
        self.num_constraints = (len(value_specs), len(operand_specs))
        self.bound = bound
        # an argument or result the step keeps in host memory stays there (its memory kind),
        # and so does state the plan keeps there (its memory decisions)
        host = cm.host_state_values(decisions)
        self._host = host
        kind = lambda v: "pinned_host" if program.values[v].host or v in host else None  # noqa: E731
        in_sh = [NamedSharding(mesh, spec_from_json(self.plan.inputs.get(p, [])), memory_kind=kind(v))
                 for p, v in zip(program.input_paths, program.inputs, strict=True)]
        out_sh = [NamedSharding(mesh, spec_from_json(self.plan.outputs.get(p, [])), memory_kind=kind(v))
                  for p, v in zip(program.output_paths, program.outputs, strict=True)]
        in_tree = jax.tree_util.tree_unflatten(program.in_tree, in_sh)
        out_tree = jax.tree_util.tree_unflatten(program.out_tree, out_sh)
        # static (non-array) leaves are closed over: the jitted body takes the array leaves
        donate = tuple(i for i in self.plan.donate if i < len(args))
        specs = (value_specs, operand_specs, user_specs(cm))
        recompute = recompute_plans(cm, decisions) if self.constrain else ()
        vs = cm.value_specs(decisions)
        input_specs = {v: spec_from_json(spec_to_json(vs[v])) for cp in recompute for v in getattr(cp, "weights", ())}

        def jitted(promote: bool = False):
            body = constrained_function(program, mesh, *specs, promote=promote, recompute=recompute,
                                        input_specs=input_specs, host_state=host)
            return jax.jit(body, in_shardings=tuple(in_tree), out_shardings=out_tree,
                           donate_argnums=() if promote else donate)

        if program.explicit_mesh is not None or any(program.values[v].host or v in host for v in program.inputs):
            # typed arguments, and those in host memory, moved to the plan's shardings first
            self._jitted = _Untyping(jitted(), self._untyped)
            self._promoted = lambda: _Untyping(jitted(promote=True), self._untyped)
        else:
            self._jitted, self._promoted = jitted(), lambda: jitted(promote=True)
        return self._jitted

    def _as_traced(self, args: Sequence[Any]) -> Sequence[Any]:
        """``args`` as the step is traced on: an argument the plan keeps in host memory as a
        device array's type (the step reads it on the device: apply copies it there)."""
        host = set(self.plan.host_inputs)
        if not host:
            return args
        leaves, tree = jax.tree_util.tree_flatten(tuple(args))
        paths = iter(p for p, _, _ in self.plan.signature.get("inputs", []))
        out = [_on_device(x) if is_array_leaf(x) and next(paths) in host else x for x in leaves]
        return jax.tree_util.tree_unflatten(tree, out)

    def float32(self, args: Sequence[Any]):
        """The planned step computing in float32 what it computes in bfloat16 / float16 (the
        same ops at the same shardings; see ``constrained_function``): verify's numerics.
        Built (``build``) on ``args``; returns the jitted callable."""
        self.build(args)
        return self._promoted()

    def __call__(self, *args):
        jitted = self.build(args)
        program = self.program
        assert program is not None  # build() traced it
        _check_global(program, args)
        return program.full_outputs(jitted(*dynamic_args(args)))

    def lower(self, *args):
        """The planned step lowered on ``args`` (arrays or ``jax.ShapeDtypeStruct``s), as
        ``jax.jit(...).lower`` gives it (``.compile()``, ``.as_text()``)."""
        jitted = self.build(args)
        return jitted.lower(*dynamic_args(args))

    def _untyped(self, args):
        """An explicit-mode step's arguments on the plan's mesh: their typed shardings (on the
        step's own mesh) moved to the plan's input shardings, which are not typed; and an
        argument in host memory moved to its plan sharding there."""
        program = self.program
        if program is None:
            return args
        leaves, tree = jax.tree_util.tree_flatten(tuple(args))
        mesh = self.mesh
        out = []
        for x, path, v in zip(leaves, program.input_paths, program.inputs, strict=True):
            host = program.values[v].host or v in self._host
            if program.explicit_mesh is None and not host:
                out.append(x)
                continue
            sharding = NamedSharding(mesh, spec_from_json(self.plan.inputs.get(path, [])),
                                     memory_kind="pinned_host" if host else None)
            if isinstance(x, jax.ShapeDtypeStruct):
                out.append(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding, weak_type=x.weak_type))
            elif (isinstance(getattr(x, "sharding", None), NamedSharding) or (host and isinstance(x, jax.Array))) \
                    and x.sharding != sharding:
                out.append(jax.device_put(x, sharding))  # typed on the step's mesh, or placed otherwise
            else:
                out.append(x)
        return jax.tree_util.tree_unflatten(tree, out)


def _on_device(x) -> jax.ShapeDtypeStruct:
    """``x``'s type in device memory: an explicit-mode argument keeps its typed sharding (the
    step was analysed with it, and its fixed decisions come from it), in the device's memory."""
    sharding = getattr(x, "sharding", None)
    if isinstance(sharding, NamedSharding) and not sharding.mesh.are_all_axes_auto:
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding.with_memory_kind("device"))
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype)


class _Untyping:
    """An explicit-mode step's (or one with arguments in host memory) jitted plan: called (or
    lowered) on the arguments as the user holds them, typed on the step's own mesh or placed
    in host memory by the user, it first moves them to the plan's shardings."""

    def __init__(self, jitted, untyped: Callable):
        self.jitted, self.untyped = jitted, untyped

    def __call__(self, *args):
        return self.jitted(*self.untyped(args))

    def lower(self, *args):
        return self.jitted.lower(*self.untyped(args))


_AGREEMENTS = itertools.count()  # every process applies its plans in the same order
AGREE_TIMEOUT_S = 300


def check_processes(plan: Plan) -> None:
    """In a multi-process job every process must apply the same plan with the same number of
    devices (else each would compile another program, and their collectives would wait on
    one another for ever): each posts its plan's digest and device count to JAX's
    coordination service and reads the others', and a difference is a clear error on all."""
    if jax.process_count() == 1:
        return
    from ..tracing._jax import distributed  # JAX's coordination client: internal, read only in a multi-process job

    client = distributed.global_state.client
    if client is None:  # process_count() > 1 comes from jax.distributed.initialize, which makes it
        raise PartexError("a multi-process job without JAX's coordination service: call "
                          "jax.distributed.initialize() before applying a plan")
    key = f"partex/apply/{next(_AGREEMENTS)}"
    me = {"plan": plan.digest(), "devices": jax.local_device_count(), "mesh": plan.mesh.text()}
    client.key_value_set(f"{key}/{jax.process_index()}", json.dumps(me))
    every = []
    for p in range(jax.process_count()):
        try:
            every.append(json.loads(client.blocking_key_value_get(f"{key}/{p}", AGREE_TIMEOUT_S * 1000)))
        except Exception:  # the coordination service's deadline: the other process never came
            raise PartexError(f"process {p} did not apply a plan within {AGREE_TIMEOUT_S} s: every process of "
                              "the job must run the same training script") from None
    counts = [e["devices"] for e in every]
    if len(set(counts)) > 1:
        raise PartexError("the processes hold different numbers of devices (" +
                          ", ".join(f"process {p}: {n}" for p, n in enumerate(counts)) +
                          "); start every process with the same number")
    for p, e in enumerate(every):
        if e["plan"] != me["plan"]:
            raise PartexError(f"process {p} applies another plan than process {jax.process_index()} "
                              f"(mesh {e['mesh']} vs {me['mesh']}, digest {e['plan']} vs {me['plan']}): "
                              "give every process the same plan file")


def _check_global(program, args) -> None:
    """In a multi-process job, jit's arguments must be global arrays: a host value is a
    clear error here, naming the leaf and the two ways to make one."""
    if jax.process_count() == 1:
        return
    leaves = [x for x in jax.tree_util.tree_leaves(tuple(args)) if is_array_leaf(x)]
    for path, x in zip(program.input_paths, leaves):
        if hasattr(x, "shape") and not (isinstance(x, jax.Array) and not x.is_fully_addressable):
            raise PartexError(f"argument {path} is a value of this process only; a job of {jax.process_count()} "
                              "processes takes global arrays: partex.shard_inputs(plan, args) for values every "
                              "process holds alike, jax.make_array_from_process_local_data("
                              "partex.plan_shardings(plan, args)[...], local) for a batch each process loads for "
                              "itself")


def check_consistent(plan: Plan, program, cm, decisions) -> None:
    """The input/output specs must be what the decisions give: a plan edited by hand in one
    place and not the other would apply shardings its constraints contradict."""
    specs = cm.value_specs(decisions)
    for vids, paths, stored, what in ((program.inputs, program.input_paths, plan.inputs, "input"),
                                      (program.outputs, program.output_paths, plan.outputs, "output")):
        for vid, path in zip(vids, paths):
            want = spec_to_json(specs[vid])
            have = stored.get(path)
            if have is None:
                raise PartexError(f"the plan has no PartitionSpec for {what} {path}; re-create it")
            if norm_spec(have) != norm_spec(want):
                raise PartexError(f"the plan was modified: {what} {path} has spec {have} but its decisions "
                                  f"give {want}; edit the decisions (or pins), not the specs, and re-create it")


def recompute_plans(cm, decisions) -> tuple:
    """The ``_recompute.CopyPlan`` of every layer the decisions recompute or re-gather."""
    return tuple(cp for u, kind in cm.recompute_of(decisions)
                 for cp in plan_unit(cm.program, cm.units[u], kind))


def constraint_specs(cm, decisions):
    """The sharding constraints apply inserts: every intermediate value of rank >= 1 at its
    planned sharding, and each op operand whose consumer view differs from its value's."""
    _s = spec_from_json
    p = cm.program
    inputs = set(p.inputs)
    vspecs = cm.value_specs(decisions)
    value_specs = {vid: _s(spec_to_json(spec)) for vid, spec in vspecs.items()
                   if vid not in inputs and len(spec) >= 1 and p.values[vid].producer >= 0}
    operand_specs = {k: _s(spec_to_json(spec)) for k, spec in cm.operand_specs(decisions).items()}
    return value_specs, operand_specs


def resolve_decisions(plan: Plan, an) -> list[Decision]:
    """The plan's decisions on this analysis, found by anchor first, then by label."""
    return from_plan(an, plan.decisions)


def default_donate(program) -> tuple[int, ...]:
    """The arguments every leaf of which is state: an input some output mirrors (same shape
    and dtype, and the output depends on it), i.e. the parameters and optimizer state a
    training step returns updated."""
    state = state_inputs(program)
    donate = []
    k = 0
    for a, sub in enumerate(program.in_tree.children()):
        leaves = program.inputs[k:k + sub.num_leaves]
        k += sub.num_leaves
        if leaves and all(v in state for v in leaves):
            donate.append(a)
    return tuple(donate)


def user_specs(cm) -> dict:
    """The PartitionSpec apply gives each of the step's own sharding constraints (by op):
    the user's on the plan's mesh when kept, the plan's sharding of that value when replaced."""
    keep = cm.user_shardings == "keep"
    # replaced: no constraint of the user's; the plan's own constraint on the value places it
    return {us.op: plan_spec(us) if keep else None for us in cm.analysis.user_shardings if us.op >= 0}


def fixed_json(cm) -> tuple[dict, ...]:
    """The decisions the step's own shardings fix, for the plan file and the views."""
    an = cm.analysis
    return tuple({"group": an.groups[d.group].label, "axis": d.axis, "source": cm.fixed.by_group[d.group].source,
                  "kind": cm.fixed.by_group[d.group].kind} for d in cm.fixed.decisions)


# --------------------------------------------------------------------------- a training job

def plan_shardings(plan: Plan, args: Sequence[Any], mesh=None):
    """The ``NamedSharding`` of every array leaf of ``args`` (a pytree like the planned
    function's arguments: arrays or ``jax.ShapeDtypeStruct``s), ``None`` at static leaves, on
    ``mesh`` (default: ``plan.jax_mesh()``): the ``in_shardings`` / ``out_shardings`` of a
    jitted init that creates the parameters and optimizer state already sharded (never whole
    on one host), or the sharding ``jax.make_array_from_process_local_data`` builds a batch
    for. PartexError when ``args`` are not the plan's function's."""
    mesh = mesh if mesh is not None else plan.jax_mesh()
    specs = iter(_leaf_specs(plan, args))
    paths = iter(p for p, _, _ in plan.signature.get("inputs", []))
    host = set(plan.host_inputs)

    def kind(x):  # an argument the plan or the user keeps in host memory is there
        k = getattr(getattr(x, "sharding", None), "memory_kind", None)
        return "pinned_host" if next(paths) in host else k if k in HOST_MEMORY_KINDS else None

    return jax.tree_util.tree_map(
        lambda x: NamedSharding(mesh, spec_from_json(next(specs)), memory_kind=kind(x)) if is_array_leaf(x)
        else None, tuple(args))


def shard_inputs(plan: Plan, args: Sequence[Any], mesh=None):
    """``args`` as global arrays on the plan's mesh (or ``mesh``): host values (numpy or this
    process's jax arrays) that every process holds alike become ``jax.Array``s sharded as the
    plan says (``plan_shardings``), each process placing only its own devices' shards. Arrays
    already global, static leaves and Python numbers pass as they are."""
    shardings = plan_shardings(plan, args, mesh)
    multi = jax.process_count() > 1

    def put(x, sh):
        if sh is None or not hasattr(x, "shape"):
            return x
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return x  # already global
        if not multi:
            return jax.device_put(x, sh)
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sh, lambda index: host[index])

    return jax.tree_util.tree_map(put, tuple(args), shardings, is_leaf=lambda x: x is None)


def _leaf_specs(plan: Plan, args) -> list:
    """The PartitionSpec (JSON) of each array leaf of ``args``, matched in order with the
    plan's signature; a leaf of another shape or dtype is a clear error."""
    leaves = [x for x in jax.tree_util.tree_leaves(tuple(args)) if is_array_leaf(x)]
    sig = plan.signature.get("inputs", [])
    if len(leaves) != len(sig):
        raise PartexError(f"the arguments have {len(leaves)} array leaves, the plan's function {len(sig)}: "
                          "pass the same pytree the plan was made for")
    out = []
    for x, (path, shape, dtype) in zip(leaves, sig):
        have, dt = tuple(np.shape(x)), getattr(x, "dtype", None)
        typed = dt is not None and not jnp.issubdtype(dt, jax.dtypes.extended)  # not a PRNG key
        if have != tuple(shape) or (typed and str(dt) != dtype):
            raise PartexError(f"argument leaf {path} is {have} {dt or ''} here but {tuple(shape)} {dtype} "
                              "in the plan")
        out.append(plan.inputs.get(path, []))
    return out
