"""Exports a training job can use without partex: ``specs`` (the mesh and the PartitionSpecs
of the step's inputs and outputs, as a standalone Python or JSON file) and ``flax-rules``
(the plan as a logical-name -> mesh-axes rule list for flax's ``nn.logical_axis_rules`` or
MaxText's ``logical_axis_rules``).

Neither carries the plan's intermediate constraints or recompute decisions: with specs alone
XLA's propagation places every intermediate; with rules alone the model's own
``nn.with_logical_constraint`` calls place the activations they name. ``compare`` measures
what that costs (XLA's memory and collectives of the export alone beside the full plan's).

Rules follow flax's semantics (``flax.linen.logical_to_mesh_axes``): for each array, rules
are read in order and a rule assigns its mesh axes to the dim of its logical name unless an
earlier rule took those axes for another dim of the same array. So one rule list can give
``embed -> data`` on the weights (ZeRO) while ``batch -> data``, ranked first, keeps the
activations' ``embed`` whole, as the plan does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import Any, Mapping, Sequence

from .._decisions import Memory, Recompute
from .._errors import PartexError
from .._loader import axis_names_by_value
from .._mesh import format_bytes
from ..analysis._analysis import analyze
from ..cost import KINDS, CostModel
from ..tracing._program import StaticSplit, abstract, dynamic_args, trace
from ._plan import Plan
from ._planned import resolve_decisions, spec_from_json
from ._specs import spec_to_json

FORMATS = ("specs", "flax-rules", "explicit")
LOGICAL_MARK = "partex.logical:"  # checkpoint_name marking an activation's logical names while tracing

Axes = tuple  # mesh axes of one dim; () = not sharded


# --------------------------------------------------------------------------- flax's semantics

def logical_spec(names: Sequence[str | None], rules: Sequence[tuple[str, Axes]]) -> list[Axes]:
    """The mesh axes of each dim of an array with logical ``names`` under ``rules``, as
    ``flax.linen.logical_to_mesh_axes`` gives them (a dim no rule assigns: not sharded)."""
    out: list[Axes | None] = [None] * len(names)
    used: set[str] = set()
    for name, axes in rules:
        if name not in names:
            continue
        d = list(names).index(name)
        if out[d] is None and not (set(axes) & used):
            out[d] = tuple(axes)
            used |= set(axes)
    return [a if a is not None else () for a in out]


def flax_rules_value(rules: Sequence[tuple[str, Axes]]) -> list[tuple[str, Any]]:
    """Rules as flax takes them: (name, None | "axis" | ("axis", ...))."""
    return [(n, None if not a else a[0] if len(a) == 1 else tuple(a)) for n, a in rules]


@contextlib.contextmanager
def rules_context(rules: Sequence[tuple[str, Axes]], mesh):
    """Trace under ``rules`` on ``mesh``: flax's ``nn.logical_axis_rules`` (when flax is
    installed) and ``jax.set_mesh``, as a flax training script runs its step."""
    import jax

    with jax.set_mesh(mesh), contextlib.ExitStack() as stack:
        try:
            import flax.linen as nn
        except ImportError:
            nn = None
        if nn is not None:
            stack.enter_context(nn.logical_axis_rules(flax_rules_value(rules)))
        yield


@contextlib.contextmanager
def _marking_logical_constraints():
    """While tracing: flax's ``nn.with_logical_constraint`` leaves a ``checkpoint_name``
    carrying the logical names where it would constrain (no mesh, no rules needed), so the
    program shows which activations the model names, and how."""
    try:
        import flax.linen as nn
        from flax.linen import spmd
    except ImportError:
        yield
        return
    from jax.ad_checkpoint import checkpoint_name

    def mark(axis_resources, x, *args, **kwargs):
        names = [n if isinstance(n, str) else None for n in tuple(axis_resources)]
        if len(names) != getattr(x, "ndim", -1):
            return x
        return checkpoint_name(x, LOGICAL_MARK + json.dumps(names))

    saved = spmd._with_sharding_constraint_one_fallback
    spmd._with_sharding_constraint_one_fallback = mark
    try:  # with_logical_constraint does nothing without some rules in force
        with nn.logical_axis_rules([("partex.unused", None)]):
            yield
    finally:
        spmd._with_sharding_constraint_one_fallback = saved


# --------------------------------------------------------------------------- the rules

@dataclasses.dataclass
class RulesExport:
    """The plan as logical-axis rules, and how much of it the rules carry."""

    rules: list[tuple[str, Axes]]
    matched: float  # share of the named arrays' bytes (input leaves and named activations)
    #                 whose every named dim the rules shard as the plan does
    conflicts: list[dict]  # names the plan shards two ways: what the rules give, what differs
    unnamed: list[str]  # planned-sharded dims of input leaves with no logical name
    lost: list[str]  # what rules cannot say (recompute decisions, unnamed intermediates)
    activations: int  # activations the model names (nn.with_logical_constraint)

    def flax(self) -> list[tuple[str, Any]]:
        """The rules as ``nn.logical_axis_rules`` takes them."""
        return flax_rules_value(self.rules)

    def to_json(self) -> dict:
        """The rules and their figures as JSON data (``"format": "partex-flax-rules"``; an
        unsharded name's axes as null)."""
        return {"format": "partex-flax-rules", "rules": [[n, list(a) or None] for n, a in self.rules],
                "matched_fraction": self.matched, "conflicts": self.conflicts, "unnamed": self.unnamed,
                "lost": self.lost, "named_activations": self.activations}


def flax_rules(plan: Plan, model) -> RulesExport:
    """Logical-axis rules that shard every named array as ``plan`` does, as far as one
    rule list can: ``model`` (a LoadedModel) gives the function, its example args and the
    logical names of its inputs (``axis_names``); the model's own
    ``nn.with_logical_constraint`` calls give those of its activations."""
    if model.axis_names is None:
        raise PartexError("flax-rules needs the logical axis names of the step's inputs (axis_names, e.g. "
                          "flax's nn.get_partition_spec of the state); this model gives none: export specs instead")
    with _marking_logical_constraints():
        program = trace(model.fn, model.args)
    names = {vid: tuple(n) for vid, n in axis_names_by_value(program, model.axis_names).items()}
    an = analyze(program, names)
    sharding = dataclasses.replace(plan, decisions=tuple(d for d in plan.decisions
                                                         if d.kind is not Recompute and d.kind is not Memory))
    cm = CostModel(an, plan.mesh, plan.hardware, donate=plan.donate, user_shardings=plan.user_shardings)
    specs = cm.value_specs(resolve_decisions(sharding, an))
    # the named arrays: input leaves, and the operands of the marks left by flax's constraints
    arrays: list[tuple[tuple, list[Axes], int, str | None]] = []  # (names, axes, bytes, where: path or source)
    for vid, n in names.items():
        arrays.append((n, [tuple(a) for a in specs[vid]], program.values[vid].nbytes, program.values[vid].name))
    acts = 0
    for op in program.ops:
        mark = op.params.get("name") if op.primitive == "name" else None
        if isinstance(mark, str) and mark.startswith(LOGICAL_MARK):
            vid = op.inputs[0]
            producer = program.values[vid].producer
            where = program.ops[producer].source if producer >= 0 else program.values[vid].name
            arrays.append((tuple(json.loads(mark[len(LOGICAL_MARK):])), [tuple(a) for a in specs[vid]],
                           program.values[vid].nbytes, where))
            acts += 1
    rules = _choose_rules(arrays)
    matched, conflicts = _agreement(arrays, rules)
    unnamed = sorted({f"{path}:{d}" for vid, path in zip(program.inputs, program.input_paths)
                      for d, a in enumerate(specs[vid]) if a and not (names.get(vid) and d < len(names[vid])
                                                                      and names[vid][d])})
    lost = [f"recompute of {d.group} ({d.axis})" for d in plan.decisions if d.kind is Recompute]
    lost += [f"{d.group} in host memory ({d.axis}: its arrays in pinned_host between steps, copied where the "
             "step reads them)" for d in plan.decisions if d.kind is Memory]
    lost.append("the plan's constraints on intermediates the model does not name (XLA's propagation places them)")
    return RulesExport(rules, matched, conflicts, unnamed, lost, acts)


def _choose_rules(arrays) -> list[tuple[str, Axes]]:
    """Rules (one per logical name, in order) maximising the bytes of named arrays that come
    out sharded as the plan shards them: start from each name's most common mesh axes
    (by bytes), ranked by bytes, then improve by changing one name's axes or ranking it
    higher, first improvement first, until neither helps."""
    votes: dict[str, dict[Axes, int]] = {}
    for names, axes, nbytes, _ in arrays:
        for n, a in zip(names, axes):
            if n:
                votes.setdefault(n, {}).setdefault(a, 0)
                votes[n][a] += nbytes
    weight = {n: sum(v.values()) for n, v in votes.items()}

    def first(n):
        sharded = {a: b for a, b in votes[n].items() if a}
        return max(sharded, key=lambda a: (sharded[a], a)) if sharded else ()

    rules = sorted(((n, first(n)) for n in votes), key=lambda r: (-weight[r[0]], r[0]))
    best = _score(arrays, rules)
    improved = True
    while improved:
        improved = False
        candidates = []
        for i, (n, a) in enumerate(rules):
            candidates += [rules[:i] + [(n, alt)] + rules[i + 1:] for alt in sorted(votes[n]) if alt != a]
            rest = rules[:i] + rules[i + 1:]
            candidates += [rest[:j] + [rules[i]] + rest[j:] for j in range(i)]  # ranked higher
        for c in candidates:
            s = _score(arrays, c)
            if s > best:
                rules, best, improved = c, s, True
                break
    return rules


def _score(arrays, rules) -> int:
    return sum(nbytes for names, axes, nbytes, _ in arrays if _same(logical_spec(names, rules), axes))


def _same(got: list[Axes], want: list[Axes]) -> bool:
    return [tuple(a) for a in got] == [tuple(a) for a in want]


def _agreement(arrays, rules) -> tuple[float, list[dict]]:
    total = sum(b for *_, b, _ in arrays) or 1
    matched = _score(arrays, rules) / total
    by_name: dict[str, dict] = {}
    for names, axes, nbytes, where in arrays:
        got = logical_spec(names, rules)
        for n, a, g in zip(names, axes, got):
            if n and tuple(a) != tuple(g):
                c = by_name.setdefault(n, {"name": n, "rules_give": dict(rules).get(n, ()), "arrays": 0, "bytes": 0,
                                           "plan_gives": {}, "example": where})
                c["arrays"] += 1
                c["bytes"] += nbytes
                c["plan_gives"][",".join(a) or "-"] = c["plan_gives"].get(",".join(a) or "-", 0) + 1
    out = []
    for c in sorted(by_name.values(), key=lambda c: -c["bytes"]):
        c["rules_give"] = ",".join(c["rules_give"]) or "-"
        out.append(c)
    return matched, out


# --------------------------------------------------------------------------- the functions

def rules_in_shardings(program, names: dict, rules, mesh) -> list:
    """The NamedSharding of each input leaf under ``rules`` (unnamed leaves replicated)."""
    from jax.sharding import NamedSharding

    out = []
    for vid, path in zip(program.inputs, program.input_paths):
        n = names.get(vid) or ()
        spec = spec_from_json(spec_to_json(logical_spec(n, rules))) if n else spec_from_json([])
        shape = program.values[vid].shape
        for d, axes in enumerate(spec):
            axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
            size = 1
            for a in axes:
                size *= mesh.shape[a]
            if shape[d] % size:
                raise PartexError(f"the rules shard dim {d} of {path} (size {shape[d]}, logical name {n[d]!r}) over "
                                  f"{'x'.join(axes)} ({size}), which does not divide it")
        out.append(NamedSharding(mesh, spec))
    return out


class RulesFunction:
    """``fn`` as a flax job runs it with the exported rules and nothing of partex's: jitted
    with the rules' input shardings, traced under the rules on the mesh (the model's own
    ``nn.with_logical_constraint`` calls place the activations they name)."""

    def __init__(self, fn, args, axis_names, rules, mesh, donate: Sequence[int] = ()):
        import jax

        self.mesh, self.rules = mesh, rules
        self.program = trace(fn, args)
        names = {vid: tuple(n) for vid, n in axis_names_by_value(self.program, axis_names).items()}
        shardings = rules_in_shardings(self.program, names, rules, mesh)
        self.split = StaticSplit(fn, args)
        # the state donated as the plan donates it (a training script does): the figures then
        # differ from the plan's by the shardings alone
        self.jitted = jax.jit(self.split, in_shardings=tuple(jax.tree_util.tree_unflatten(self.program.in_tree,
                                                                                         shardings)),
                              donate_argnums=tuple(i for i in donate if i < len(args)))

    def lower(self, *args):
        import jax

        with rules_context(self.rules, self.mesh):
            return self.jitted.lower(*jax.tree_util.tree_map(abstract, dynamic_args(args)))


# --------------------------------------------------------------------------- files

def specs_json(plan: Plan) -> dict:
    out = {"format": "partex-specs", "model": plan.model, "strategy": plan.strategy, "mesh": plan.mesh.to_json(),
           "arg_names": arg_names(plan), "inputs": plan.inputs, "outputs": plan.outputs,
           "donate": list(plan.donate)}
    if plan.host_inputs or plan.host_outputs:
        out["host_memory"] = {"inputs": list(plan.host_inputs), "outputs": list(plan.host_outputs),
                              "note": HOST_NOTE}
    if plan.pipeline is not None:
        out["pipeline"] = {**plan.pipeline, "note": pipeline_note(plan)}
    return out


def pipeline_note(plan: Plan) -> str:
    """What a pipelined plan needs beyond PartitionSpecs, in words."""
    p = plan.pipeline or {}
    sched = "circular, %d rounds" % p.get("repeats", 1) if p.get("schedule") == "circular" else "GPipe"
    return (f"the plan runs layer stack {p.get('stack')} as a pipeline over mesh axis {p.get('axis')} "
            f"({p.get('microbatches')} microbatches, {sched}"
            + (f", each stage recomputing ({p['recompute']})" if p.get("recompute") else "") + "): its specs are "
            "those of the pipelined step, whose loops run the stages, rotate the activations over that axis and "
            "split the batch into microbatches. With these specs alone jax.jit runs the step as written (no "
            "pipeline: the stacked weights' layer dim sharded over the axis, gathered as the layers need them); "
            "to run the pipeline, use partex.apply_plan(plan, step), which makes it of the step, model code unchanged")


# what a plan's memory decisions need beyond PartitionSpecs
HOST_NOTE = ("the plan keeps these leaves in host memory between steps (its memory:host decisions): specs "
             "alone place them on the device; to keep them on the host the step must copy each to the device "
             "where it reads it and its update back (jax.device_put to jax.memory.Space.Device / .Host, as "
             "MaxText's optimizer_memory_host_offload does), or run the step with partex.apply_plan")


def arg_names(plan: Plan) -> list[str]:
    """The step's positional argument names, in order: the plan's signature names every
    argument (one without array leaves too); older plans, from their input paths."""
    if plan.signature.get("args"):
        return list(plan.signature["args"])
    out: list[str] = []
    for path, *_ in plan.signature.get("inputs", []):
        head = path.split("/")[0]
        if head not in out:
            out.append(head)
    return out


def _header(plan: Plan, what: str, comparison: Mapping[str, Any] | None) -> list[str]:
    m = plan.model or {}
    name = m.get("spec") or m.get("name") or "the model"
    lines = [f"{what} of partex's plan for {name} ({plan.strategy or 'searched'}) on mesh "
             f"{plan.mesh.text()}" + (f", slow (cross-host) axes: {', '.join(plan.mesh.slow_axes())}"
                                     if plan.mesh.slow_axes() else "") + "."]
    if plan.pipeline is not None:
        lines += ["", "Not carried: the pipeline. " + pipeline_note(plan)[0].upper() + pipeline_note(plan)[1:] + "."]
    if comparison:
        lines += ["", "What this export alone costs, measured by partex with XLA "
                  f"({comparison['devices']} devices, {comparison['platform']}):"] + comparison_table(comparison)
    else:
        lines += ["", "Not measured: `partex export ... --model MODEL` compiles both and shows what is lost."]
    return lines


def specs_python(plan: Plan, comparison: Mapping[str, Any] | None = None) -> str:
    """A standalone Python module (needs only jax) with the mesh and the specs."""
    doc = _header(plan, "PartitionSpecs of the inputs and outputs", comparison) + [
        "", "Only the step's inputs and outputs: XLA's sharding propagation places every intermediate.",
        *(["", "Not carried: host memory. " + HOST_NOTE[0].upper() + HOST_NOTE[1:] + ": "
            + ", ".join(plan.host_inputs) + "."] if plan.host_inputs else []),
        "", "    import jax, plan_specs as ps",
        "    mesh = ps.mesh()",
        "    step = jax.jit(train_step, in_shardings=ps.in_shardings(mesh, *args),",
        "                   out_shardings=ps.out_shardings(mesh, jax.eval_shape(train_step, *args)),",
        "                   donate_argnums=ps.DONATE)"]
    spec = specs_json(plan)
    body = [
        '"""' + "\n".join(doc) + '\n"""', "",
        "import math", "",
        "import jax",
        "from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P", "",
        f"MESH_AXES = {tuple(plan.mesh.axes)!r}",
        f"MESH_SHAPE = {tuple(plan.mesh.sizes)!r}",
        f"SLOW_AXES = {tuple(plan.mesh.slow_axes())!r}  # across hosts/slices (DCN, InfiniBand)",
        f"ARG_NAMES = {tuple(spec['arg_names'])!r}",
        f"DONATE = {tuple(plan.donate)!r}", "",
        "INPUTS = {", *[f"    {p!r}: P({_spec_args(s)})," for p, s in plan.inputs.items()], "}",
        "OUTPUTS = {", *[f"    {p!r}: P({_spec_args(s)})," for p, s in plan.outputs.items()], "}", "",
        _MESH_CODE, _SHARDINGS_CODE]
    return "\n".join(body) + "\n"


def _spec_args(spec) -> str:
    return ", ".join("None" if e is None else repr(e) if isinstance(e, str) else repr(tuple(e)) for e in spec)


_MESH_CODE = '''
def mesh(devices=None):
    """The plan's mesh over every process's devices, the fast axes within one host (one TPU
    slice), the slow ones across them."""
    devices = list(devices if devices is not None else jax.devices())
    types = (AxisType.Auto,) * len(MESH_AXES)
    tpu = devices[0].platform == "tpu"
    granules = {d.slice_index if tpu else d.process_index for d in devices}
    if len(granules) == 1:
        return jax.make_mesh(MESH_SHAPE, MESH_AXES, axis_types=types, devices=devices)
    from jax.experimental import mesh_utils

    dcn, rest = [1] * len(MESH_AXES), len(granules)
    order = sorted(range(len(MESH_AXES)), key=lambda i: MESH_AXES[i] not in SLOW_AXES)
    for i in order:
        dcn[i] = math.gcd(MESH_SHAPE[i], rest)
        rest //= dcn[i]
    ici = [s // d for s, d in zip(MESH_SHAPE, dcn)]
    grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, process_is_granule=not tpu,
                                                allow_split_physical_axes=True)
    return Mesh(grid, MESH_AXES, axis_types=types)


'''

_SHARDINGS_CODE = '''
def _key(k):
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k).strip("[]().'\\"")


def _shardings(mesh, prefix, tree, specs):
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    paths = ["/".join([prefix] + [_key(k) for k in path]) for path, _ in flat]
    return treedef.unflatten([NamedSharding(mesh, specs.get(p, P())) for p in paths])


def in_shardings(mesh, *args):
    """jax.jit's in_shardings for the step's args (arrays or ShapeDtypeStructs)."""
    return tuple(_shardings(mesh, name, a, INPUTS) for name, a in zip(ARG_NAMES, args))


def out_shardings(mesh, outputs):
    """jax.jit's out_shardings for the step's results (e.g. jax.eval_shape(step, *args))."""
    return _shardings(mesh, "out", outputs, OUTPUTS)
'''


def rules_python(plan: Plan, export: RulesExport, comparison: Mapping[str, Any] | None = None) -> str:
    doc = _header(plan, "Logical-axis rules", comparison) + [
        "", f"The rules shard {export.matched:.0%} of the named arrays' bytes as the plan does"
        + (f" ({len(export.conflicts)} names the plan shards two ways: see CONFLICTS)" if export.conflicts else "")
        + ".", "Not carried: " + "; ".join(export.lost) + ".",
        "", "    import flax.linen as nn, jax, plan_rules as pr",
        "    mesh = jax.make_mesh(pr.MESH_SHAPE, pr.MESH_AXES)",
        "    with jax.set_mesh(mesh), nn.logical_axis_rules(pr.RULES):",
        "        shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract_state), mesh, pr.RULES)",
        "        step = jax.jit(train_step, in_shardings=(shardings, batch_shardings))",
        "", "MaxText: pass RULES as logical_axis_rules (override_logical_axis_rules=True)."]
    body = ['"""' + "\n".join(doc) + '\n"""', "",
            "import math", "", "import jax", "from jax.sharding import AxisType, Mesh", "",
            f"MESH_AXES = {tuple(plan.mesh.axes)!r}",
            f"MESH_SHAPE = {tuple(plan.mesh.sizes)!r}",
            f"SLOW_AXES = {tuple(plan.mesh.slow_axes())!r}  # across hosts/slices (DCN, InfiniBand)",
            "RULES = [", *[f"    ({n!r}, {v!r})," for n, v in flax_rules_value(export.rules)], "]",
            f"CONFLICTS = {json.dumps(export.conflicts, indent=1)}", "", _MESH_CODE]
    return "\n".join(body) + "\n"


# --------------------------------------------------------------------------- explicit mode

# ops whose result sharding explicit mode takes as ``out_sharding=`` (jnp.einsum / jnp.dot /
# jnp.matmul / jax.lax.dot_general, jnp.reshape)
_OUT_SHARDING_OPS = {"dot_general": "out_sharding=", "reshape": "out_sharding="}


def explicit_annotations(plan: Plan, model) -> list[dict]:
    """Where a step in explicit sharding mode needs an annotation to compute as ``plan`` does,
    in program order: each forward matmul (or reshape) the plan constrains, with the
    ``out_sharding=`` it takes; each forward value the plan reshards (its sharding differs
    from its operand's), with the ``jax.sharding.reshard`` it takes; and each operand a forward
    op reads at another sharding than its value's (a ZeRO weight, gathered where it is used),
    with the ``reshard`` of that operand before the op. Explicit mode infers every
    other forward value's sharding from these, and the backward pass's from the forward's.
    ``model``: a LoadedModel (the function and its example args)."""
    from ..analysis._rules import PSEUDO_OPS
    from ._planned import bind, constraint_specs

    bound = bind(plan, model.fn, model.args, model.axis_names)
    program = bound.program
    value_specs, _ = constraint_specs(bound.cost_model, bound.decisions)  # the values apply constrains
    planned = bound.cost_model.value_specs(bound.decisions)
    specs = {v: spec_to_json(planned[v]) for v in value_specs}
    views = {k: spec_to_json(v) for k, v in bound.cost_model.operand_specs(bound.decisions).items() if k[1] >= 0}
    specs.update({v: plan.inputs.get(program.values[v].path, []) for v in program.inputs})
    out, seen = [], set()
    for op in program.ops:
        if "transpose(" in op.scope or op.primitive in PSEUDO_OPS:
            continue
        for i, v in enumerate(op.inputs):  # an operand the op reads resharded (a ZeRO weight, gathered)
            if (op.id, i) in views:
                key = (op.source, f"reshard operand {i}", json.dumps(views[(op.id, i)]))
                if key not in seen:
                    seen.add(key)
                    out.append({"where": op.source, "op": op.primitive, "how": key[1], "spec": views[(op.id, i)],
                                "shape": list(program.values[v].shape)})
        if not op.outputs or op.outputs[0] not in specs:
            continue
        v = op.outputs[0]
        want = specs[v]
        if op.primitive in _OUT_SHARDING_OPS:
            how = _OUT_SHARDING_OPS[op.primitive]
        else:
            same_rank = [specs.get(i) for i in op.inputs if len(program.values[i].shape) == len(want)]
            if not any(axes for axes in want) or not same_rank or any(s == want for s in same_rank):
                continue
            how = "reshard"
        key = (op.source, how, json.dumps(want))
        if key in seen:
            continue
        seen.add(key)
        out.append({"where": op.source, "op": op.primitive, "how": how, "spec": want,
                    "shape": list(program.values[v].shape)})
    return out


def explicit_python(plan: Plan, annotations: Sequence[Mapping[str, Any]],
                    comparison: Mapping[str, Any] | None = None) -> str:
    """A standalone module for running the step in explicit sharding mode as ``plan`` does:
    the mesh (Explicit axes), the inputs' shardings, and the annotations to write."""
    doc = _header(plan, "Explicit sharding mode", comparison) + [
        "", "Run the step on mesh() (Explicit axes) with its arguments placed by in_shardings, and",
        "write each of ANNOTATIONS at its line: `out_sharding=P(...)` on that matmul / reshape,",
        "`x = jax.sharding.reshard(x, P(...))` on that value, or (\"reshard operand i\") on the op's",
        "i-th operand before it. Explicit mode infers the rest.",
        "", "    import jax, plan_explicit as pe",
        "    mesh = pe.mesh()",
        "    with jax.set_mesh(mesh):",
        "        args = jax.device_put(args, pe.in_shardings(mesh, *args))",
        "        out = jax.jit(train_step, donate_argnums=pe.DONATE)(*args)"]
    spec = specs_json(plan)
    rows = [f"    ({a['where']!r}, {a['how']!r}, P({_spec_args(a['spec'])})),  # {a['op']} {tuple(a['shape'])}"
            for a in annotations]
    body = [
        '"""' + "\n".join(doc) + '\n"""', "",
        "import math", "",
        "import jax",
        "from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P", "",
        f"MESH_AXES = {tuple(plan.mesh.axes)!r}",
        f"MESH_SHAPE = {tuple(plan.mesh.sizes)!r}",
        f"SLOW_AXES = {tuple(plan.mesh.slow_axes())!r}  # across hosts/slices (DCN, InfiniBand)",
        f"ARG_NAMES = {tuple(spec['arg_names'])!r}",
        f"DONATE = {tuple(plan.donate)!r}", "",
        "INPUTS = {", *[f"    {p!r}: P({_spec_args(s)})," for p, s in plan.inputs.items()], "}",
        "OUTPUTS = {", *[f"    {p!r}: P({_spec_args(s)})," for p, s in plan.outputs.items()], "}", "",
        "# (source line, what to write there, the PartitionSpec)",
        "ANNOTATIONS = [", *rows, "]", "",
        _MESH_CODE.replace("(AxisType.Auto,)", "(AxisType.Explicit,)"), _SHARDINGS_CODE]
    return "\n".join(body) + "\n"


def export_text(plan: Plan, fmt: str, model=None, comparison: Mapping[str, Any] | None = None,
                as_json: bool = False) -> str:
    """The file ``partex export`` writes: ``specs`` or ``flax-rules`` (which needs ``model``,
    a LoadedModel, for the logical names), as standalone Python or as JSON; ``comparison``
    (verify's side by side) goes into its header / a "comparison" field."""
    if fmt == "specs":
        if as_json:
            return json.dumps({**specs_json(plan), "comparison": comparison}, indent=1)
        return specs_python(plan, comparison)
    if fmt == "flax-rules":
        if model is None:
            raise PartexError("flax-rules needs the plan's model for its logical axis names: give --model MODEL "
                              "(the module:attr or file.py:attr the plan was made from)")
        rules = flax_rules(plan, model)
        if as_json:
            piped = {"pipeline": {**plan.pipeline, "note": pipeline_note(plan)}} if plan.pipeline else {}
            return json.dumps({**rules.to_json(), "mesh": plan.mesh.to_json(), **piped, "comparison": comparison},
                              indent=1)
        return rules_python(plan, rules, comparison)
    if fmt == "explicit":
        if model is None:
            raise PartexError("the explicit export needs the plan's model to find the lines to annotate: give "
                              "--model MODEL (the module:attr or file.py:attr the plan was made from)")
        annotations = explicit_annotations(plan, model)
        if as_json:
            return json.dumps({**specs_json(plan), "annotations": annotations, "comparison": comparison}, indent=1)
        return explicit_python(plan, annotations, comparison)
    raise PartexError(f"unknown export format {fmt!r}; valid: {', '.join(FORMATS)}")


# --------------------------------------------------------------------------- side by side

def comparison_table(c: Mapping[str, Any]) -> list[str]:
    """The side-by-side lines: XLA's memory and collective bytes, full plan vs export alone."""
    full, alone = c["plan"], c["export"]
    w = max(len(c["format"]) + 6, 12)
    rows = [f"  {'':<22}{'full plan':>12}  {c['format'] + ' alone':>{w}}",
            f"  {'memory per device':<22}{format_bytes(full['memory']):>12}  {format_bytes(alone['memory']):>{w}}"]
    rows.append(f"  {'fits ' + format_bytes(c['budget']):<22}{'yes' if full['fits'] else 'NO':>12}  "
                f"{'yes' if alone['fits'] else 'NO':>{w}}")
    for k in KINDS:
        a, b = full["collectives"].get(k, 0), alone["collectives"].get(k, 0)
        if a or b:
            rows.append(f"  {k:<22}{format_bytes(a):>12}  {format_bytes(b):>{w}}")
    if "numerics" in alone:
        n = alone["numerics"]
        rows.append(f"  {'numerics (max rel err)':<22}{full.get('numerics', {}).get('max_rel_err', float('nan')):>12.1e}"
                    f"  {n['max_rel_err']:>{w}.1e}")
    return rows
