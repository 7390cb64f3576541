"""The plan: versioned JSON keyed by pytree paths, and ``apply`` as real jax.jit shardings.

A plan records the mesh, the hardware, the ordered decisions (each with an *anchor*: an
input leaf and dim of its group, so that it is found again without the model's axis names),
the PartitionSpec of every input and output leaf, the donated arguments, the predicted
figures and a signature (paths, shapes and dtypes of the inputs) so that applying it to the
wrong function fails with a clear message.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
from typing import Any, Callable, Sequence

from ._decisions import RECOMPUTE_KINDS, RESOLUTIONS, Decision, Recompute, Resolve, slot_kind
from ._errors import PartexError
from ._mesh import Hardware, MeshSpec
from ._program import Program, is_array_leaf
from ._recompute import plan_unit
from ._space import anchor_of, from_plan

FORMAT = "partex-plan"
VERSION = 1

SpecJSON = list  # per dim: null | "axis" | ["axis", ...]


@dataclasses.dataclass(frozen=True)
class PlanDecision:
    """A decision as a plan file writes it (``Decision``'s file form): the label of its
    group or layer stack, its slot (a mesh axis, ``resolve:...`` or ``recompute:...``),
    its anchor, whether it was pinned."""

    group: str  # the group's (or layer stack's) label
    axis: str  # the slot
    anchor: str | None = None  # "input/path:dim" of a member of the group; a layer stack's signature
    pinned: bool = False

    @property
    def kind(self) -> type[Decision]:
        """The decision class the slot spells (Shard, Resolve, Recompute)."""
        return slot_kind(self.axis)

    def to_json(self) -> dict:
        d = {"group": self.group, "axis": self.axis, "pinned": self.pinned}
        if self.anchor:
            d["anchor"] = self.anchor
        return d


@dataclasses.dataclass(frozen=True)
class Plan:
    mesh: MeshSpec
    hardware: Hardware
    decisions: tuple[PlanDecision, ...]
    inputs: dict[str, SpecJSON]
    outputs: dict[str, SpecJSON]
    signature: dict[str, list]
    donate: tuple[int, ...] = ()
    predicted: dict = dataclasses.field(default_factory=dict)
    model: dict = dataclasses.field(default_factory=dict)
    strategy: str | None = None
    # the step's own sharding constraints: "keep" (fixed decisions ahead of the plan's) or
    # "replace" (the plan places those values); ``fixed`` lists what they fix, for reading
    user_shardings: str = "keep"
    fixed: tuple[dict, ...] = ()

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict:
        hw = dataclasses.asdict(self.hardware)
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": self.model,
            "strategy": self.strategy,
            "mesh": self.mesh.to_json(),
            "hardware": hw,
            "decisions": [d.to_json() for d in self.decisions],
            "donate": list(self.donate),
            "inputs": self.inputs,
            "outputs": self.outputs,
            "signature": self.signature,
            "predicted": self.predicted,
            "user_shardings": {"mode": self.user_shardings, "fixed": list(self.fixed)},
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)

    def save(self, path: str | os.PathLike) -> None:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(self.dumps())
        os.replace(tmp, path)  # never leave a half-written plan behind

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Plan":
        try:
            with open(path) as f:
                text = f.read()
        except OSError as e:
            raise PartexError(f"cannot read plan {path}: {e.strerror}") from None
        return cls.loads(text, where=str(path))

    @classmethod
    def loads(cls, text: str, where: str = "plan") -> "Plan":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise PartexError(f"{where} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
                              "was it truncated or edited by hand?") from None
        return cls.from_json(d, where)

    @classmethod
    def from_json(cls, d: Any, where: str = "plan") -> "Plan":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise PartexError(f"{where} is not a partex plan: expected \"format\": \"{FORMAT}\"")
        if d.get("version") != VERSION:
            raise PartexError(f"{where} has plan format version {d.get('version')!r}; this partex reads "
                              f"version {VERSION}: re-create it with `partex plan` or `partex search`")
        for key in ("mesh", "hardware", "decisions", "inputs", "outputs", "signature"):
            if key not in d:
                raise PartexError(f"{where} lacks the {key!r} field; re-create it with `partex plan`")
        mesh = MeshSpec.from_json(d["mesh"])
        hw = _hardware_from_json(d["hardware"])
        decisions = []
        for i, x in enumerate(d["decisions"] if isinstance(d["decisions"], list) else [None]):
            if not isinstance(x, dict) or not isinstance(x.get("group"), str) or not isinstance(x.get("axis"), str):
                raise PartexError(f"{where}: decision {i} must be {{\"group\": str, \"axis\": str}}")
            kind = slot_kind(x["axis"])
            value = x["axis"][len(kind.PREFIX):]
            if kind is Resolve:
                if value not in RESOLUTIONS:
                    raise PartexError(f"{where}: decision {i} has conflict resolution {x['axis']!r}; known: "
                                      f"{', '.join(Resolve.PREFIX + r for r in RESOLUTIONS)}")
            elif kind is Recompute:
                if value not in RECOMPUTE_KINDS:
                    raise PartexError(f"{where}: decision {i} has recompute kind {value!r}; known: "
                                      f"{', '.join(RECOMPUTE_KINDS)}")
            else:
                mesh.index(x["axis"])  # unknown axis -> clear error
            decisions.append(PlanDecision(x["group"], x["axis"], x.get("anchor"), bool(x.get("pinned", False))))
        for field in ("inputs", "outputs"):
            if not isinstance(d[field], dict):
                raise PartexError(f"{where}: {field!r} must map pytree paths to PartitionSpecs")
            for path, spec in d[field].items():
                _check_spec(spec, mesh, f"{where}: {field[:-1]} {path}")
        sig = d["signature"]
        if not isinstance(sig, dict) or not isinstance(sig.get("inputs"), list):
            raise PartexError(f"{where}: signature must hold the inputs' paths, shapes and dtypes")
        donate = d.get("donate", [])
        if not isinstance(donate, list) or not all(isinstance(i, int) and i >= 0 for i in donate):
            raise PartexError(f"{where}: donate must be a list of argument indices")
        us = d.get("user_shardings") or {}
        if not isinstance(us, dict) or us.get("mode", "keep") not in ("keep", "replace"):
            raise PartexError(f"{where}: user_shardings must be {{\"mode\": \"keep\" or \"replace\", ...}}")
        return cls(mesh, hw, tuple(decisions), dict(d["inputs"]), dict(d["outputs"]), sig,
                   tuple(donate), d.get("predicted") or {}, d.get("model") or {}, d.get("strategy"),
                   us.get("mode", "keep"), tuple(us.get("fixed") or ()))

    # ------------------------------------------------------------------ apply
    def apply(self, fn: Callable, mesh=None, axis_names=None, constrain: bool = True) -> "PlannedFunction":
        """``fn`` jitted with the plan's shardings and intermediate constraints, on ``mesh``
        (default: the plan's mesh over all of JAX's devices, Auto axis types).
        constrain=False applies the input and output shardings alone (for comparison: XLA's
        propagation then decides every intermediate)."""
        return PlannedFunction(self, fn, mesh, axis_names, constrain)

    # ------------------------------------------------------------------ a training job
    def jax_mesh(self, devices=None):
        """The plan's mesh over JAX's devices (all processes' in a multi-process job), Auto
        axis types, the fast axes within one host or TPU slice (``MeshSpec.jax_mesh``)."""
        return self.mesh.jax_mesh(devices)

    def shardings(self, args: Sequence[Any], mesh=None):
        """The ``NamedSharding`` of every array leaf of ``args`` (a pytree like the planned
        function's arguments: arrays or ``jax.ShapeDtypeStruct``s), ``None`` at static
        leaves: the ``in_shardings`` / ``out_shardings`` of a jitted init that creates the
        parameters and optimizer state already sharded (never whole on one host), or the
        sharding ``jax.make_array_from_process_local_data`` builds a batch for."""
        import jax
        from jax.sharding import NamedSharding

        mesh = mesh if mesh is not None else self.jax_mesh()
        specs = iter(self._leaf_specs(args))
        return jax.tree_util.tree_map(
            lambda x: NamedSharding(mesh, spec_from_json(next(specs))) if is_array_leaf(x) else None,
            tuple(args))

    def shard_inputs(self, args: Sequence[Any], mesh=None):
        """``args`` as global arrays on the plan's mesh: host values (numpy or this process's
        jax arrays) that every process holds alike become ``jax.Array``s sharded as the plan
        says, each process placing only its own devices' shards. Arrays already global, static
        leaves and Python numbers pass as they are."""
        import jax
        import numpy as np

        shardings = self.shardings(args, mesh)
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

    def _leaf_specs(self, args) -> list:
        """The PartitionSpec (JSON) of each array leaf of ``args``, matched in order with the
        plan's signature; a leaf of another shape or dtype is a clear error."""
        import jax
        import jax.numpy as jnp
        import numpy as np

        leaves = [x for x in jax.tree_util.tree_leaves(tuple(args)) if is_array_leaf(x)]
        sig = self.signature.get("inputs", [])
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
            out.append(self.inputs.get(path, []))
        return out

    def digest(self) -> str:
        """A short hash of the plan file's content: the same on every process that loads it."""
        return hashlib.sha256(self.dumps().encode()).hexdigest()[:16]


def _hardware_from_json(d: Any) -> Hardware:
    if not isinstance(d, dict):
        raise PartexError("plan hardware must be an object of figures")
    fields = {f.name for f in dataclasses.fields(Hardware)}
    unknown = set(d) - fields
    if unknown:
        raise PartexError(f"plan hardware has unknown field(s) {sorted(unknown)}")
    try:
        hw = Hardware(**{k: d[k] for k in d})
    except TypeError as e:
        raise PartexError(f"plan hardware is incomplete: {e}") from None
    hw.validate()
    return hw


def _check_spec(spec, mesh: MeshSpec, where: str) -> None:
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


def spec_from_json(spec: SpecJSON):
    from jax.sharding import PartitionSpec as P

    return P(*[None if e is None else e if isinstance(e, str) else tuple(e) for e in spec])


def _spec_axes(entry) -> list[str]:
    return [] if entry is None else [entry] if isinstance(entry, str) else list(entry)


def signature_of(program) -> dict[str, list]:
    vals = program.values
    return {
        "inputs": [[p, list(vals[v].shape), str(vals[v].dtype)] for v, p in zip(program.inputs, program.input_paths)],
        "outputs": [[p, list(vals[v].shape), str(vals[v].dtype)] for v, p in zip(program.outputs, program.output_paths)],
    }


def check_signature(plan: Plan, program) -> None:
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


def check_divisible(plan: Plan, program) -> None:
    vals = program.values
    for vid, path in zip(program.inputs, program.input_paths):
        spec = plan.inputs.get(path)
        if spec is None:
            continue
        shape = vals[vid].shape
        if len(spec) > len(shape):
            raise PartexError(f"plan spec for {path} has {len(spec)} entries but the leaf has rank {len(shape)}")
        for d, entry in enumerate(spec):
            n = math.prod(plan.mesh.axis_size(a) for a in _spec_axes(entry))
            if shape[d] % n:
                raise PartexError(
                    f"mesh axis {'x'.join(_spec_axes(entry))} of size {n} does not divide dim {d} "
                    f"(size {shape[d]}) of {path}"
                )


class PlannedFunction:
    """The plan applied to a function: traced and jitted on first use (or ``lower``)."""

    def __init__(self, plan: Plan, fn: Callable, mesh=None, axis_names=None, constrain: bool = True):
        self.plan = plan
        self.constrain = constrain
        self.fn = fn
        self._mesh = mesh
        self.axis_names = axis_names
        self._jitted = None
        self.program: Program | None = None  # traced by build()
        self.num_constraints = (0, 0)

    @property
    def mesh(self):
        if self._mesh is None:
            self._mesh = self.plan.mesh.jax_mesh()
        return self._mesh

    def build(self, args: Sequence[Any]):
        if self._jitted is not None and self.program is not None and self.program.static_mismatch(args) is None:
            return self._jitted
        import jax
        from jax.sharding import NamedSharding

        from ._analysis import analyze
        from ._apply import constrained_function
        from .cost import CostModel
        from ._loader import axis_names_by_value
        from ._program import trace

        check_processes(self.plan)
        mesh = self.mesh
        if tuple(mesh.axis_names) != self.plan.mesh.axes or tuple(mesh.devices.shape) != self.plan.mesh.sizes:
            raise PartexError(f"the mesh given ({dict(zip(mesh.axis_names, mesh.devices.shape))}) is not the "
                              f"plan's ({self.plan.mesh.text()})")
        program = trace(self.fn, args)
        check_signature(self.plan, program)
        check_divisible(self.plan, program)
        an = analyze(program, axis_names_by_value(program, self.axis_names))
        decisions = resolve_decisions(self.plan, an)
        cm = CostModel(an, self.plan.mesh, self.plan.hardware, donate=self.plan.donate,
                       user_shardings=self.plan.user_shardings)
        check_consistent(self.plan, program, cm, decisions)
        value_specs, operand_specs = constraint_specs(cm, decisions) if self.constrain else ({}, {})
        self.num_constraints = (len(value_specs), len(operand_specs))
        self.program = program
        in_sh = [NamedSharding(mesh, spec_from_json(self.plan.inputs.get(p, []))) for p in program.input_paths]
        out_sh = [NamedSharding(mesh, spec_from_json(self.plan.outputs.get(p, []))) for p in program.output_paths]
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
                                        input_specs=input_specs)
            return jax.jit(body, in_shardings=tuple(in_tree), out_shardings=out_tree,
                           donate_argnums=() if promote else donate)

        self._jitted, self._promoted = jitted(), lambda: jitted(promote=True)
        return self._jitted

    def float32(self, args: Sequence[Any]):
        """The planned step computing in float32 what it computes in bfloat16 / float16 (the
        same ops at the same shardings; see ``constrained_function``): verify's numerics."""
        self.build(args)
        return self._promoted()

    def __call__(self, *args):
        from ._program import dynamic_args

        jitted = self.build(args)
        program = self.program
        assert program is not None  # build() traced it
        _check_global(program, args)
        return program.full_outputs(jitted(*dynamic_args(args)))

    def lower(self, *args):
        from ._program import dynamic_args

        jitted = self.build(args)
        return jitted.lower(*dynamic_args(args))


_AGREEMENTS = itertools.count()  # every process applies its plans in the same order
AGREE_TIMEOUT_S = 300


def check_processes(plan: Plan) -> None:
    """In a multi-process job every process must apply the same plan with the same number of
    devices (else each would compile another program, and their collectives would wait on
    one another for ever): each posts its plan's digest and device count to JAX's
    coordination service and reads the others', and a difference is a clear error on all."""
    import jax

    if jax.process_count() == 1:
        return
    from jax._src import distributed

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
    import jax

    if jax.process_count() == 1:
        return
    leaves = [x for x in jax.tree_util.tree_leaves(tuple(args)) if is_array_leaf(x)]
    for path, x in zip(program.input_paths, leaves):
        if hasattr(x, "shape") and not (isinstance(x, jax.Array) and not x.is_fully_addressable):
            raise PartexError(f"argument {path} is a value of this process only; a job of {jax.process_count()} "
                              "processes takes global arrays: plan.shard_inputs(args) for values every process "
                              "holds alike, jax.make_array_from_process_local_data(plan.shardings(args)[...], "
                              "local) for a batch each process loads for itself")


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
            if _norm(have) != _norm(want):
                raise PartexError(f"the plan was modified: {what} {path} has spec {have} but its decisions "
                                  f"give {want}; edit the decisions (or pins), not the specs, and re-create it")


def _norm(spec) -> list:
    out = [tuple(_spec_axes(e)) for e in spec]
    while out and not out[-1]:
        out.pop()
    return out


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


def decision_json(an, decision: Decision, pinned: bool) -> PlanDecision:
    """A decision as its plan file writes it: the group's (or layer stack's) label, its
    slot, its anchor."""
    name = an.groups[decision.id].label if decision.ON_GROUP else an.units[decision.id].label
    return PlanDecision(name, decision.slot, anchor_of(an, decision), pinned)


def default_donate(program) -> tuple[int, ...]:
    """The arguments every leaf of which is state: an input some output mirrors (same shape
    and dtype, and the output depends on it), i.e. the parameters and optimizer state a
    training step returns updated."""
    from ._roles import state_inputs

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
    from ._constraints import plan_spec

    keep = cm.user_shardings == "keep"
    # replaced: no constraint of the user's; the plan's own constraint on the value places it
    return {us.op: plan_spec(us) if keep else None for us in cm.analysis.user_shardings() if us.op >= 0}


def fixed_json(cm) -> tuple[dict, ...]:
    """The decisions the step's own shardings fix, for the plan file and the views."""
    an = cm.analysis
    return tuple({"group": an.groups[d.group].label, "axis": d.axis, "source": cm.fixed.by_group[d.group].source,
                  "kind": cm.fixed.by_group[d.group].kind} for d in cm.fixed.decisions)


def make_plan(model_analysis, mesh: MeshSpec, hardware: Hardware, decisions, *, strategy=None,
              pinned=(), donate=None, cost_model=None, user_shardings: str = "keep") -> Plan:
    """Build a Plan from decisions on an analysed model."""
    from .cost import CostModel

    program = model_analysis.program
    an = model_analysis.analysis
    if donate is None:
        donate = default_donate(program)
    cm = cost_model or CostModel(an, mesh, hardware, donate=donate, user_shardings=user_shardings)
    decisions = [d for d in decisions if not d.ON_GROUP or d.id not in cm.fixed.groups]
    specs = cm.value_specs(decisions)
    report = cm.evaluate(decisions, detail=True)
    pinned = set(pinned)
    m = model_analysis.model
    return Plan(
        mesh=mesh,
        hardware=hardware,
        decisions=tuple(decision_json(an, d, d in pinned) for d in decisions),
        inputs={p: spec_to_json(specs[v]) for v, p in zip(program.inputs, program.input_paths)},
        outputs={p: spec_to_json(specs[v]) for v, p in zip(program.outputs, program.output_paths)},
        signature=signature_of(program),
        donate=tuple(donate),
        predicted=report.to_json(),
        model={"name": m.name, "preset": m.preset},
        strategy=strategy,
        user_shardings=cm.user_shardings,
        fixed=fixed_json(cm),
    )
