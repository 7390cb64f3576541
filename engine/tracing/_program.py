"""Tracing: a JAX function + example args -> one flat ``Program``.

Nested call jaxprs (``jit``, ``custom_jvp_call``, ``custom_vjp_call``, ``remat``,
``closed_call``) are inlined: their inner variables *are* the outer values. ``scan``,
``while`` and ``cond`` keep a body that is analysed once. The body sits between two
pseudo-ops, ``<loop>_enter`` and ``<loop>_exit``, whose factor rules tie the loop-carried
values (and the stacked ``xs``/``ys`` minus their leading loop axis) to the body's inputs and
outputs. Body ops carry ``trip`` = the number of times they run (the product of the
enclosing loops' lengths), which the cost model multiplies by.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import os
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from .._errors import PartexError
from ._jax import CALLS, ClosedJaxpr, called_jaxpr, is_remat, jcore, jdtypes, pe, source_info_util
from ._rotate import map_jaxprs, rotations

Shape = tuple[int, ...]
ValueId = int
OpId = int

# Sentinel producer of values with no defining op (inputs, constants, literals).
NO_PRODUCER = -1
# The top-level region: ops not inside any loop or branch.
TOP_REGION = 0


def scan_counts(params: dict) -> tuple[int, int]:
    """(number of consts, number of carries) of a ``scan`` eqn: JAX <= 0.10 gives them as
    ``num_consts``/``num_carry``; 0.11+ as the groups (consts, carry, xs) of ``ft_in``."""
    if "num_consts" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    consts, carry, _ = params["ft_in"].unpack()
    return len(list(consts)), len(list(carry))


@dataclasses.dataclass(frozen=True, slots=True)
class Value:
    """One value of the program: an input, a constant or an op's result, with its shape,
    dtype, the op that makes it and, for an input, its pytree path."""

    id: ValueId
    shape: Shape
    dtype: np.dtype
    producer: OpId  # NO_PRODUCER for inputs / constants / literals
    name: str | None = None  # pytree path for inputs and outputs
    # bits per element where ``dtype`` cannot say (0: its itemsize): 4 for int4 / float4, whose
    # numpy dtype is a byte; a typed PRNG key's words (64 for key<fry>, 128 for key<rbg>)
    bits: int = 0
    # in host memory (its type's memory space: an array ``device_put`` to ``pinned_host``, a
    # residual a checkpoint policy offloads, a parameter kept on the host): not on the device
    host: bool = False

    @property
    def path(self) -> str:
        """The pytree path of an input or output (the tracer names every one; other values have none)."""
        if self.name is None:
            raise ValueError(f"value %{self.id} is neither an input nor an output of the step: it has no pytree path")
        return self.name

    @property
    def nbytes(self) -> int:
        """Its size in bytes, unsharded (sub-byte types by their ``bits``, rounded up)."""
        n = int(math.prod(self.shape))
        return (n * self.bits + 7) // 8 if self.bits else n * self.dtype.itemsize

    def replace(self, **kw) -> "Value":
        """A copy with the fields ``kw`` names changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **kw)


@dataclasses.dataclass(frozen=True, slots=True)
class Op:
    """One op of the program: its primitive and parameters, the values it reads and makes,
    the region it runs in and its source line."""

    id: OpId
    primitive: str
    params: dict
    inputs: tuple[ValueId, ...]
    outputs: tuple[ValueId, ...]
    source: str
    region: int = TOP_REGION
    trip: int = 1  # how many times the op runs per step (enclosing loop lengths)
    scope: str = ""  # JAX's name stack where it was traced (``jvp(model)/layer_0/attn``)

    def replace(self, **kw) -> "Op":
        """A copy with the fields ``kw`` names changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **kw)


@dataclasses.dataclass(frozen=True, slots=True)
class Region:
    """A loop or branch body. ``enter``/``exit`` are the pseudo-op ids around it."""

    id: int
    kind: str  # "top", "scan", "while", "cond"
    parent: int
    trip: int
    enter: OpId = -1
    exit: OpId = -1


@dataclasses.dataclass
class Program:
    """A traced step as one flat program (``trace``): its values and ops in program order,
    the loop and branch bodies as regions, and the inputs and outputs with their pytrees."""

    values: list[Value]
    ops: list[Op]
    regions: list[Region]
    inputs: list[ValueId]  # flattened example args, in order
    outputs: list[ValueId]  # flattened results, in order
    input_paths: list[str]
    output_paths: list[str]
    in_tree: Any
    out_tree: Any
    closed_jaxpr: Any  # the jaxpr it came from (apply re-evaluates it)
    var_ids: dict[int, ValueId]  # id(jaxpr Var) -> ValueId, over all nested jaxprs
    constants: dict[ValueId, Any]  # ValueId -> concrete constant
    # id(jaxpr eqn) -> the op it became (for scan/while/cond: the ``_enter`` pseudo-op;
    # the region's ``exit`` gives the other end). Inlined call eqns have no entry.
    eqn_ops: dict[int, OpId] = dataclasses.field(default_factory=dict)
    # The user's own shardings inside the step, in program order: (value, sharding, source,
    # kind, op) for ``with_sharding_constraint`` / ``reshard`` (op: the constraint op) and
    # the ``in_shardings`` / ``out_shardings`` of a ``jit`` called inside (op: -1).
    user_shardings: list[tuple[ValueId, Any, str, str, OpId]] = dataclasses.field(default_factory=list)
    # The args' static (non-array) leaves, closed over when traced: (flat index in the whole
    # args' tree, path, value); ``full_tree`` is that whole tree (``in_tree`` lacks them).
    static_inputs: tuple[tuple[int, str, Any], ...] = ()
    full_tree: Any = None
    static_outputs: tuple[tuple[int, str, Any], ...] = ()  # likewise of the results
    arg_names: tuple[str, ...] = ()  # the first segment of the input paths, per argument
    full_out_tree: Any = None
    # Values the step's own ``jax.checkpoint`` calls read through their optimisation barrier
    # (``prevent_cse``): each call's operands, where it is inlined.
    barrier_reads: frozenset[ValueId] = frozenset()
    # The mesh of a step in explicit sharding mode (its types carry shardings; apply and the
    # unsharded run trace it under this mesh's context), else None.
    explicit_mesh: Any = None
    # The values of ``shard_map`` bodies: per-device code, at the shapes each device holds;
    # apply leaves them as written (the region's own specs place what crosses it).
    manual_values: frozenset[ValueId] = frozenset()
    # Those of partially manual regions (``axis_names=`` a subset of the mesh), with the mesh
    # axes their region is manual over: the partitioner shards them over the others, as a
    # plan's decisions on those axes say. The values of fully manual regions are not here.
    manual_axes: Mapping[ValueId, frozenset[str]] = dataclasses.field(default_factory=dict)

    @property
    def num_ops(self) -> int:
        """How many ops the program has (pseudo-ops included)."""
        return len(self.ops)

    def dynamic_leaves(self, full_leaves: Sequence[Any]) -> list:
        """``full_leaves`` (one per leaf of the whole args' tree) with the static leaves' left
        out: a list in the order of the traced inputs."""
        static = {k for k, _, _ in self.static_inputs}
        return [x for k, x in enumerate(full_leaves) if k not in static]

    def static_mismatch(self, args: Sequence[Any]) -> str | None:
        """Why ``args``' static leaves are not those it was traced with (None: they are)."""
        if not self.static_inputs:
            return None
        try:
            leaves = self.full_tree.flatten_up_to(tuple(args))
        except (ValueError, TypeError) as e:
            return f"arguments do not match the traced function's: {e}"
        for k, path, value in self.static_inputs:
            if not _same(leaves[k], value):
                return f"static argument {path} is {leaves[k]!r:.60}, traced with {value!r:.60}"
        return None

    def full_outputs(self, out):
        """``out``, the traced results (``out_tree``), with the static leaves the function
        returned put back: what the function itself returns."""
        if not self.static_outputs:
            return out
        return _with_static(self.full_out_tree, self.static_outputs, out)

    def value(self, vid: ValueId) -> Value:
        """The value whose id is ``vid``."""
        return self.values[vid]


# --------------------------------------------------------------------------- paths

def _key_str(k) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k).strip("[]().'\"")


def path_str(prefix: str, path: Sequence[Any]) -> str:
    parts = [prefix] if prefix else []
    parts += [_key_str(k) for k in path]
    return "/".join(parts)


def arg_names(fn: Callable, n: int) -> list[str]:
    """Names for the positional args: the function's parameter names where known."""
    try:
        params = [
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"arg{i}" for i in range(n)]


def _same(a, b) -> bool:
    try:
        return bool(a is b or a == b)
    except Exception:  # a value without a truthy ==: compare as jit's static args hash
        return False


def is_array_leaf(x) -> bool:
    """A leaf jit passes as an array: an array (or ShapeDtypeStruct) or a Python number."""
    return (hasattr(x, "shape") and hasattr(x, "dtype")) or _is_scalar(x)


def flatten_args(fn: Callable, args: Sequence[Any]) -> tuple[list[str], Any, list[tuple[int, str, Any]]]:
    """The pytree paths of the example args' array leaves, the args' whole tree, and their
    *static* leaves: those that are not arrays (a string, an enum, a config object inside
    the state), as (flat index, path, value), left out as jit's static arguments are."""
    names = arg_names(fn, len(args))
    paths, static = [], []
    k = 0
    for name, arg in zip(names, args):
        for path, leaf in jax.tree_util.tree_flatten_with_path(arg)[0]:
            p = path_str(name, path)
            if is_array_leaf(leaf):
                paths.append(p)
            else:
                static.append((k, p, leaf))
            k += 1
    return paths, jax.tree_util.tree_structure(tuple(args)), static


def _strip_static(tree):
    """``tree`` with its static (non-array) leaves taken out (None in their place)."""
    return jax.tree_util.tree_map(lambda x: x if is_array_leaf(x) else None, tree)


def _with_static(full_tree, static: Sequence[tuple[int, str, Any]], dynamic):
    """The whole tree again from the dynamic leaves of ``dynamic`` and the ``static`` ones."""
    fixed = {k: v for k, _, v in static}
    leaves = iter(jax.tree_util.tree_leaves(dynamic))
    full = [fixed[k] if k in fixed else next(leaves) for k in range(full_tree.num_leaves)]
    return jax.tree_util.tree_unflatten(full_tree, full)


def dynamic_args(args: Sequence[Any]) -> tuple:
    """``args`` with their static (non-array) leaves taken out: the pytree the traced
    program's inputs mirror (``Program.in_tree``)."""
    return tuple(_strip_static(tuple(args)))


class StaticSplit:
    """``fn`` as a function of the array leaves of its args and results only: the static
    (non-array) leaves of ``args`` are put back before it runs, and those of its results
    taken out (``outputs``: (flat index, path, value), ``out_tree``: the whole results'
    tree, known once it has been traced)."""

    def __init__(self, fn: Callable, args: Sequence[Any]):
        self.fn = fn
        self.paths, self.in_tree, self.inputs = flatten_args(fn, args)
        self.args = dynamic_args(args)
        self.outputs: list[tuple[int, str, Any]] = []
        self.out_tree = None
        self.mesh = explicit_mesh(self.args)  # an explicit-mode step's mesh (its context)

    def run_context(self):
        """The context to call ``jax.jit(self)`` in: an explicit-mode step's own mesh (as the
        user runs it under ``jax.set_mesh``; its typed shardings name that mesh's devices)."""
        if isinstance(self.mesh, jax.sharding.Mesh) and jax.sharding.get_abstract_mesh().empty:
            return jax.set_mesh(self.mesh)
        return contextlib.nullcontext()

    def placed(self, fn: Callable) -> Callable:
        """``fn`` (a function of these array leaves, ``jax.jit(self)``) called with each leaf
        placed at its example's typed sharding first: an explicit-mode step runs on its
        arguments as the user placed them (their shardings are part of its types: JAX 0.12.1
        refuses, e.g., an embedding lookup's gradient scatter whose operands are all unsharded
        but its updates typed). A step without typed arguments: ``fn`` itself."""
        if self.mesh is None:
            return fn
        leaves, tree = jax.tree_util.tree_flatten(self.args)
        own = [x.sharding if isinstance(getattr(x, "sharding", None), jax.sharding.NamedSharding)
               and x.sharding.mesh == self.mesh else None for x in leaves]

        def run(*args):
            flat = jax.tree_util.tree_leaves(args)
            return fn(*jax.tree_util.tree_unflatten(
                tree, [x if sh is None else jax.device_put(x, sh) for x, sh in zip(flat, own)]))

        return run

    def __call__(self, *args):
        with mesh_context(self.mesh):
            out = self.fn(*_with_static(self.in_tree, self.inputs, args))
        flat, self.out_tree = jax.tree_util.tree_flatten_with_path(out)
        self.outputs = [(k, path_str("out", p), x) for k, (p, x) in enumerate(flat) if not is_array_leaf(x)]
        return _strip_static(out) if self.outputs else out


# --------------------------------------------------------------------------- tracing

def _is_scalar(x) -> bool:
    return isinstance(x, (bool, int, float, complex))


def abstract(x) -> jax.ShapeDtypeStruct:
    """An example leaf as JAX's jit sees it: an array's shape and dtype; a Python number (a
    step counter in a train state) a weakly typed scalar, as ``jax.jit`` passes it; a static
    leaf as it is."""
    if not is_array_leaf(x):
        return x
    if _is_scalar(x):
        return jax.ShapeDtypeStruct((), jax.numpy.result_type(x), weak_type=True)
    sharding = getattr(x, "sharding", None)
    if _explicitly_typed(sharding) or _host_kind(sharding):
        # explicit sharding mode: the sharding is part of the type; an array in host memory:
        # its memory space is (the step moves it to the device where it reads it)
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


HOST_MEMORY_KINDS = ("pinned_host", "unpinned_host")


def _host_kind(sharding) -> bool:
    return getattr(sharding, "memory_kind", None) in HOST_MEMORY_KINDS


def in_host_memory(aval) -> bool:
    """Whether a value of type ``aval`` lives in host memory (its memory space)."""
    try:
        space = getattr(aval, "memory_space", None)
    except ValueError:  # a concrete array's: JAX asks for jax.typeof(x).memory_space
        return False
    return getattr(space, "name", "") == "Host"


def _bits(raw, dtype: np.dtype) -> int:
    """Bits per element of a JAX dtype: sub-byte types (int4, float4) their own width, a typed
    PRNG key its key data's (``key<rbg>``: four uint32 words)."""
    if jdtypes.issubdtype(raw, jdtypes.prng_key):
        return 8 * int(getattr(raw, "itemsize", dtype.itemsize))
    try:
        return int(jdtypes.itemsize_bits(raw))
    except Exception:  # a dtype jax does not size: as numpy does
        return 8 * dtype.itemsize


def has_explicit_axes(mesh) -> bool:
    """Whether ``mesh`` (a Mesh or AbstractMesh) has an ``AxisType.Explicit`` axis: arrays on
    it carry their sharding in their type (jax's explicit sharding mode)."""
    from jax.sharding import AxisType

    return any(t == AxisType.Explicit for t in getattr(mesh, "axis_types", ()) or ())


def _explicitly_typed(sharding) -> bool:
    return isinstance(sharding, jax.sharding.NamedSharding) and has_explicit_axes(sharding.mesh)


def explicit_mesh(args: Sequence[Any]):
    """The mesh of the first example leaf whose sharding is explicitly typed, or None: a step
    in explicit sharding mode is traced and run with that mesh as its context, as the user
    runs it under ``jax.set_mesh``."""
    for x in jax.tree_util.tree_leaves(tuple(args)):
        sharding = getattr(x, "sharding", None)
        if isinstance(sharding, jax.sharding.NamedSharding) and has_explicit_axes(sharding.mesh):
            return sharding.mesh
    return None


def _explicit_region_mesh(jaxpr):
    """The mesh of the first eqn traced under a mesh with Explicit axes (an ``explicit_axes``
    region), or None."""
    for eqn in jaxpr.eqns:
        ctx = getattr(getattr(eqn, "ctx", None), "cur_abstract_mesh", None)
        if ctx is not None and has_explicit_axes(ctx):
            return ctx
        for sub in jcore.jaxprs_in_params(eqn.params):
            found = _explicit_region_mesh(sub)
            if found is not None:
                return found
    return None


def mesh_context(mesh):
    """``mesh``'s abstract mesh as the tracing context (``jax.sharding.use_abstract_mesh``,
    which also works inside ``jax.jit``), unless a mesh context is already set or ``mesh`` is
    None."""
    if mesh is None or not jax.sharding.get_abstract_mesh().empty:
        return contextlib.nullcontext()
    return jax.sharding.use_abstract_mesh(getattr(mesh, "abstract_mesh", mesh))


def make_jaxpr(fn: Callable, args: Sequence[Any]):
    """``jax.make_jaxpr`` with JAX's own message turned into a PartexError."""
    abstract_args = jax.tree_util.tree_map(abstract, tuple(args))
    try:
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*abstract_args)
    except PartexError:
        raise
    except Exception as e:  # JAX raises many types; report its message verbatim.
        msg = str(e).strip().splitlines()
        first = next((m for m in msg if m.strip()), type(e).__name__)
        raise PartexError(
            f"the function failed to trace: {type(e).__name__}: {first}"
        ) from e
    return closed, out_shape


def trace(fn: Callable, args: Sequence[Any]) -> Program:
    """Trace ``fn(*args)`` into a flat Program. Static (non-array) leaves of ``args`` and of
    the results are closed over, not traced: the program's inputs and outputs are the array
    leaves (``in_tree``/``out_tree`` are the trees without the static leaves;
    ``static_inputs``/``static_outputs`` list them)."""
    args = tuple(args)
    split = StaticSplit(fn, args)
    context = jax.sharding.get_abstract_mesh()
    explicit = split.mesh if split.mesh is not None else (context if has_explicit_axes(context) else None)
    closed, out_shape = make_jaxpr(split, split.args)
    closed = unshare(rotations(dce(closed)))
    if explicit is None:  # an explicit_axes region inside an Auto-mode step
        explicit = _explicit_region_mesh(closed.jaxpr)
    out_leaves_paths, out_tree = jax.tree_util.tree_flatten_with_path(out_shape)
    out_paths = [path_str("out", p) for p, _ in out_leaves_paths]
    program = _Tracer(closed, explicit=explicit is not None).run(
        split.paths, out_paths, jax.tree_util.tree_structure(split.args), out_tree)
    program.explicit_mesh = explicit
    program.static_inputs, program.full_tree = tuple(split.inputs), split.in_tree
    program.static_outputs, program.full_out_tree = tuple(split.outputs), split.out_tree
    program.arg_names = tuple(arg_names(fn, len(args)))
    return program


def unshare(closed):
    """Give every nested jaxpr occurrence its own Vars: jit caches its trace, so two call
    sites of one jitted helper share a jaxpr object, and id(var)-keyed maps (var_ids,
    eqn_ops) would send both sites to the last one's values."""
    seen: set[int] = set()

    def fresh_closed(cj):
        return ClosedJaxpr(fresh(cj.jaxpr), cj.consts)

    def param(p):
        return map_jaxprs(p, fresh_closed, fresh)

    def fresh(jaxpr):
        first = id(jaxpr) not in seen
        seen.add(id(jaxpr))
        m = {}

        def v(x):
            if isinstance(x, jcore.Literal):
                return x
            if isinstance(x, jcore.DropVar):
                return x if first else jcore.DropVar(x.aval)
            if first:
                return x
            if x not in m:
                m[x] = jcore.Var(x.aval)
            return m[x]

        eqns = []
        for e in jaxpr.eqns:
            params = {k: param(p) for k, p in e.params.items()}
            eqns.append(e.replace(invars=[v(a) for a in e.invars],
                                  outvars=[v(a) for a in e.outvars], params=params)
                        if not first or params != e.params else e)
        return jaxpr.replace(constvars=[v(x) for x in jaxpr.constvars],
                             invars=[v(x) for x in jaxpr.invars],
                             outvars=[v(x) for x in jaxpr.outvars], eqns=eqns)

    return fresh_closed(closed)


def dce(closed):
    """Drop dead code (make_jaxpr keeps it; it would make isolated named dims), keeping
    every input so the argument list is unchanged."""
    jaxpr, _ = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars), instantiate=True)
    if len(jaxpr.constvars) != len(closed.jaxpr.constvars):
        return closed
    return ClosedJaxpr(jaxpr, closed.consts)


class _Tracer:
    def __init__(self, closed, explicit: bool = False):
        self.closed = closed
        self.values: list[Value] = []
        self.ops: list[Op] = []
        self.regions: list[Region] = [Region(TOP_REGION, "top", -1, 1)]
        self.var_ids: dict[int, ValueId] = {}
        self.constants: dict[ValueId, Any] = {}
        self._summaries: dict[Any, str] = {}
        self.eqn_ops: dict[int, OpId] = {}
        self.user_shardings: list[tuple[ValueId, Any, str, str, OpId]] = []
        self.scope = ""  # the name stack of the eqn being walked, through inlined calls
        self.barrier_reads: set[ValueId] = set()
        self.manual_values: set[ValueId] = set()  # the values of shard_map bodies
        self.manual_axes: dict[ValueId, frozenset[str]] = {}  # ... of partially manual ones: their manual axes
        self.explicit = explicit  # the step is in explicit sharding mode (its types carry shardings)

    # ---- values
    def new_value(self, aval, producer: OpId = NO_PRODUCER, name: str | None = None) -> ValueId:
        shape = tuple(int(d) for d in getattr(aval, "shape", ()))
        raw = getattr(aval, "dtype", np.float32)
        try:
            dtype = np.dtype(raw)
        except TypeError:  # extended dtypes (PRNG keys): their words, as one uint64 per element
            dtype = np.dtype(np.uint64)
        bits = _bits(raw, dtype)
        vid = len(self.values)
        self.values.append(Value(vid, shape, dtype, producer, name, bits if bits != 8 * dtype.itemsize else 0,
                                 in_host_memory(aval)))
        return vid

    def read(self, atom) -> ValueId:
        if isinstance(atom, jcore.Literal):
            vid = self.new_value(atom.aval)
            self.constants[vid] = atom.val
            return vid
        return self.var_ids[id(atom)]

    def bind(self, var, vid: ValueId) -> None:
        self.var_ids[id(var)] = vid

    def bind_consts(self, closed) -> None:
        for var, c in zip(closed.jaxpr.constvars, closed.consts):
            vid = self.new_value(var.aval, name=f"const/{len(self.constants)}")
            self.constants[vid] = c
            self.bind(var, vid)

    # ---- ops
    def source(self, eqn) -> str:
        si = eqn.source_info
        key = id(si.traceback) if si.traceback is not None else None
        s = self._summaries.get(key) if key is not None else None
        if s is None:
            try:
                s = source_info_util.summarize(si)
            except Exception:  # source info is best-effort provenance only
                s = ""
            if not s.strip():
                s = f"<{si.name_stack or eqn.primitive.name}>"
            if key is not None:
                self._summaries[key] = s
        return s

    def emit(self, primitive, params, inputs, out_avals, source, region, trip, out_vars=()) -> Op:
        oid = len(self.ops)
        outs = []
        for i, aval in enumerate(out_avals):
            vid = self.new_value(aval, producer=oid)
            if i < len(out_vars):
                self.bind(out_vars[i], vid)
            outs.append(vid)
        op = Op(oid, primitive, params, tuple(inputs), tuple(outs), source, region, trip, self.scope)
        self.ops.append(op)
        return op

    # ---- driver
    def run(self, in_paths, out_paths, in_tree, out_tree) -> Program:
        jaxpr = self.closed.jaxpr
        self.bind_consts(self.closed)
        inputs = []
        for var, p in zip(jaxpr.invars, in_paths):
            vid = self.new_value(var.aval, name=p)
            self.bind(var, vid)
            inputs.append(vid)
            sharding = getattr(var.aval, "sharding", None)
            if self.explicit and _explicitly_typed(sharding):  # the input's type: the user's sharding
                self.user_shardings.append((vid, _typed(sharding), f"the input {p}", "explicit input", -1))
        self.walk(jaxpr, TOP_REGION, 1)
        outputs = [self.read(v) for v in jaxpr.outvars]
        for vid, p in zip(outputs, out_paths):
            if self.values[vid].name is None:
                self.values[vid] = self.values[vid].replace(name=p)
        return Program(
            self.values, self.ops, self.regions, inputs, outputs, list(in_paths),
            list(out_paths), in_tree, out_tree, self.closed, self.var_ids, self.constants,
            self.eqn_ops, self.user_shardings, barrier_reads=frozenset(self.barrier_reads),
            manual_values=frozenset(self.manual_values), manual_axes=dict(self.manual_axes),
        )

    def walk(self, jaxpr, region: int, trip: int) -> None:
        outer = self.scope
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            handler = _STRUCTURED.get(name)
            self.scope = _join_scope(outer, str(eqn.source_info.name_stack))
            if handler is not None:
                handler(self, eqn, region, trip)
            elif name in CALLS and (called := called_jaxpr(eqn)) is not None:
                self.inline(eqn, called, region, trip)
            else:
                inputs = [self.read(a) for a in eqn.invars]
                op = self.emit(
                    name, dict(eqn.params), inputs, [v.aval for v in eqn.outvars],
                    self.source(eqn), region, trip, eqn.outvars,
                )
                self.eqn_ops[id(eqn)] = op.id
                self._user_sharding(eqn, op)
        self.scope = outer

    def _user_sharding(self, eqn, op: Op) -> None:
        """Record the sharding the eqn fixes on its result, if the user's: a sharding
        constraint's, a reshard's, or in explicit sharding mode an ``out_sharding=`` (the
        result's type). A reshard to a mesh without explicit axes (the entry of an
        ``auto_axes`` region) fixes nothing: the region is the partitioner's to place."""
        name = eqn.primitive.name
        key = _USER_SHARDING_PARAM.get(name)
        if key is None and self.explicit:
            key = next((k for k in EXPLICIT_SHARDING_PARAMS if _explicitly_typed(eqn.params.get(k))), None)
            name = "out_sharding"
        sharding = eqn.params.get(key) if key is not None else None
        if sharding is None:
            return
        if self.explicit and isinstance(sharding, jax.sharding.NamedSharding):
            if not has_explicit_axes(sharding.mesh):
                return
            sharding = _typed(sharding)
        self.user_shardings.append((op.outputs[0], sharding, _call_site(eqn), name, op.id))

    def inline(self, eqn, inner, region: int, trip: int) -> None:
        """Trace the jaxpr the eqn calls (``inner``: ``called_jaxpr(eqn)``) in place."""
        if isinstance(inner, ClosedJaxpr):
            self.bind_consts(inner)
            inner = inner.jaxpr
        for var, atom in zip(inner.invars, eqn.invars):
            self.bind(var, self.read(atom))
        if is_remat(eqn.primitive.name) and eqn.params.get("prevent_cse"):
            self.barrier_reads.update(self.read(a) for a in eqn.invars if not isinstance(a, jcore.Literal))
        scope = self.scope
        self.scope = _join_scope(scope, eqn.params.get("name", "") if _names_scope(eqn) else "")
        self.walk(inner, region, trip)
        self.scope = scope
        for outer, atom in zip(eqn.outvars, inner.outvars):
            self.bind(outer, self.read(atom))
        # a jit called inside the step: its in/out shardings are the user's own too
        for key, atoms in (("in_shardings", eqn.invars), ("out_shardings", eqn.outvars)):
            for sharding, atom in zip(eqn.params.get(key, ()) or (), atoms):
                if _is_sharding(sharding) and not isinstance(atom, (jcore.Literal, jcore.DropVar)):
                    self.user_shardings.append((self.read(atom), sharding, _call_site(eqn), f"jit {key}", -1))

    def new_region(self, kind: str, parent: int, trip: int) -> int:
        rid = len(self.regions)
        self.regions.append(Region(rid, kind, parent, trip))
        return rid

    def close_region(self, rid: int, enter: OpId, exit_: OpId) -> None:
        self.regions[rid] = dataclasses.replace(self.regions[rid], enter=enter, exit=exit_)


def _names_scope(eqn) -> bool:
    """A ``jit`` call names a scope (its function's name) as JAX's name stack does."""
    return eqn.primitive.name in ("jit", "pjit") and isinstance(eqn.params.get("name"), str)


def _join_scope(outer: str, inner: str) -> str:
    return f"{outer}/{inner}" if outer and inner else outer or inner


_ENGINE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Primitives that fix their result's sharding, and the param that holds it.
_USER_SHARDING_PARAM = {"sharding_constraint": "sharding", "reshard": "dst_sharding"}
# The params by which an op in explicit sharding mode types its result's sharding
# (``dot_general``'s ``out_sharding=``, ``broadcast_in_dim``'s / ``iota``'s / ``reshape``'s ``sharding``).
EXPLICIT_SHARDING_PARAMS = ("out_sharding", "sharding")


def _typed(sharding):
    """An explicitly typed sharding as the constraint it is: a dim it leaves unsharded is
    replicated over the mesh's explicit axes; where the mesh also has auto axes, the
    partitioner may still shard that dim over them, so it is left unconstrained."""
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    if AxisType.Auto not in sharding.mesh.axis_types:  # (a region's Manual axes: per device, not the plan's)
        return sharding
    entries = [PartitionSpec.UNCONSTRAINED if e is None else e for e in sharding.spec]
    return NamedSharding(sharding.mesh, PartitionSpec(*entries))


def _call_site(eqn) -> str:
    """Where the user asked for a sharding: the innermost user frame, and the first frame
    of another file that called it (a library's wrapper, e.g. flax's logical constraint or
    MaxText's compat shim, is not the line the user wrote)."""
    try:
        frames = list(source_info_util.user_frames(eqn.source_info.traceback))
    except Exception:  # source info is best-effort provenance only
        frames = []
    if not frames:
        return f"<{eqn.primitive.name}>"
    out = source_info_util._summarize_frame(frames[0])
    caller = next((f for f in frames[1:] if f.file_name != frames[0].file_name
                   and not f.file_name.startswith(_ENGINE_DIR)), None)  # partex's own frames: not the caller
    return out if caller is None else f"{out} <- {source_info_util._summarize_frame(caller)}"


def _is_sharding(x) -> bool:
    """A real sharding (not jit's UNSPECIFIED / None / AUTO placeholders)."""
    return isinstance(x, jax.sharding.Sharding)


# --------------------------------------------------------------------------- loops

def _scan(t: _Tracer, eqn, region: int, trip: int) -> None:
    p = eqn.params
    body = p["jaxpr"]
    (nc, ncarry), length = scan_counts(p), int(p["length"])
    operands = [t.read(a) for a in eqn.invars]
    src = t.source(eqn)
    rid = t.new_region("scan", region, trip * length)
    t.bind_consts(body)
    bj = body.jaxpr
    # Consts are the same tensors inside and out: alias them.
    for var, vid in zip(bj.invars[:nc], operands[:nc]):
        t.bind(var, vid)
    info = {"num_carry": ncarry, "length": length, "reverse": p["reverse"]}
    enter = t.emit(
        "scan_enter", info, operands[nc:], [v.aval for v in bj.invars[nc:]], src, rid,
        trip * length, bj.invars[nc:],
    )
    t.walk(bj, rid, trip * length)
    body_outs = [t.read(a) for a in bj.outvars]
    carry_in = list(enter.outputs[:ncarry])
    exit_ = t.emit(
        "scan_exit", info, body_outs + carry_in, [v.aval for v in eqn.outvars], src, region,
        trip, eqn.outvars,
    )
    t.close_region(rid, enter.id, exit_.id)
    t.eqn_ops[id(eqn)] = enter.id


def _while(t: _Tracer, eqn, region: int, trip: int) -> None:
    p = eqn.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    operands = [t.read(a) for a in eqn.invars]
    cconsts, bconsts, carry = operands[:cn], operands[cn:cn + bn], operands[cn + bn:]
    src = t.source(eqn)
    # The trip count of a while loop is unknown statically: count the body once.
    rid = t.new_region("while", region, trip)
    cj, bj = p["cond_jaxpr"], p["body_jaxpr"]
    t.bind_consts(cj)
    t.bind_consts(bj)
    for var, vid in zip(cj.jaxpr.invars[:cn], cconsts):
        t.bind(var, vid)
    for var, vid in zip(bj.jaxpr.invars[:bn], bconsts):
        t.bind(var, vid)
    body_carry = bj.jaxpr.invars[bn:]
    enter = t.emit("while_enter", {}, carry, [v.aval for v in body_carry], src, rid, trip, body_carry)
    for var, vid in zip(cj.jaxpr.invars[cn:], enter.outputs):
        t.bind(var, vid)
    t.walk(cj.jaxpr, rid, trip)
    t.walk(bj.jaxpr, rid, trip)
    body_outs = [t.read(a) for a in bj.jaxpr.outvars]
    exit_ = t.emit(
        "while_exit", {}, body_outs + list(enter.outputs), [v.aval for v in eqn.outvars], src,
        region, trip, eqn.outvars,
    )
    t.close_region(rid, enter.id, exit_.id)
    t.eqn_ops[id(eqn)] = enter.id


def _cond(t: _Tracer, eqn, region: int, trip: int) -> None:
    branches = eqn.params["branches"]
    operands = [t.read(a) for a in eqn.invars]
    src = t.source(eqn)
    # Branches are analysed one after the other; the cost model counts them all
    # (an over-estimate, which is the safe side).
    rid = t.new_region("cond", region, trip)
    enter = t.emit("cond_enter", {}, operands[:1], [], src, rid, trip)
    outs: list[ValueId] = []
    for br in branches:
        t.bind_consts(br)
        for var, vid in zip(br.jaxpr.invars, operands[1:]):
            t.bind(var, vid)
        t.walk(br.jaxpr, rid, trip)
        outs += [t.read(a) for a in br.jaxpr.outvars]
    exit_ = t.emit(
        "cond_exit", {"branches": len(branches)}, outs, [v.aval for v in eqn.outvars], src,
        region, trip, eqn.outvars,
    )
    t.close_region(rid, enter.id, exit_.id)
    t.eqn_ops[id(eqn)] = enter.id


def _shard_map(t: _Tracer, eqn, region: int, trip: int) -> None:
    """A ``shard_map`` region: its body is per-device code, traced at the shapes each device
    holds, between ``shard_map_enter`` (the operands, global, to the body's inputs) and
    ``shard_map_exit`` (the body's outputs to the results). The body's values are the
    region's (``Program.manual_values``): a fully manual region's are the user's own, a
    partially manual one's (``Program.manual_axes``) the plan shards over the axes the region
    leaves to the partitioner. The region's ``in_specs``/``out_specs`` are the user's
    shardings of the values crossing it."""
    p = eqn.params
    operands = [t.read(a) for a in eqn.invars]
    src = t.source(eqn)
    body = p["jaxpr"]
    closed = body if isinstance(body, ClosedJaxpr) else None
    bj = closed.jaxpr if closed is not None else body
    if closed is not None:
        t.bind_consts(closed)
    mesh = p["mesh"]
    manual = tuple(a for a in mesh.axis_names if a in p.get("newly_manual_axes", p.get("manual_axes", mesh.axis_names)))
    debug = getattr(bj, "debug_info", None)
    info = {"name": getattr(debug, "func_name", None) or "shard_map",
            "mesh": tuple((str(a), int(s)) for a, s in mesh.shape.items()), "manual": manual,
            "in_specs": tuple(_spec_axes(sp, len(t.values[v].shape)) for sp, v in zip(p["in_specs"], operands))}
    first = len(t.values)
    enter = t.emit("shard_map_enter", info, operands, [v.aval for v in bj.invars], src, region, trip, bj.invars)
    t.walk(bj, region, trip)
    body_outs = [t.read(a) for a in bj.outvars]
    info = dict(info, out_specs=tuple(_spec_axes(sp, len(v.aval.shape)) for sp, v in zip(p["out_specs"], eqn.outvars)))
    exit_ = t.emit("shard_map_exit", info, body_outs, [v.aval for v in eqn.outvars], src, region, trip, eqn.outvars)
    body_values = range(first, exit_.outputs[0] if exit_.outputs else len(t.values))
    # a value of a region inside this one is manual over both regions' axes
    every = frozenset(mesh.axis_names)
    inner = {v: t.manual_axes.get(v, every) if v in t.manual_values else frozenset() for v in body_values}
    t.manual_values.update(body_values)
    for v, axes in inner.items():
        axes = axes | frozenset(manual)
        if axes < every:
            t.manual_axes[v] = axes
        else:
            t.manual_axes.pop(v, None)
    t.eqn_ops[id(eqn)] = enter.id
    auto = len(manual) < len(mesh.axis_names)
    site = _call_site(eqn)
    for vid, axes in zip(operands, enter.params["in_specs"]):
        t.user_shardings.append((vid, _region_sharding(mesh, axes, auto), site, "shard_map in_specs", -1))
    for vid, axes in zip(exit_.outputs, info["out_specs"]):
        t.user_shardings.append((vid, _region_sharding(mesh, axes, auto), site, "shard_map out_specs", -1))


def _spec_axes(spec, ndim: int) -> tuple[tuple[str, ...], ...]:
    """A region's PartitionSpec as the mesh axes of each dim (() unsharded)."""
    entries = list(spec) + [None] * (ndim - len(spec))
    return tuple(() if e is None else tuple(e) if isinstance(e, (tuple, list)) else (e,) for e in entries[:ndim])


def _region_sharding(mesh, axes, auto: bool):
    """The sharding a region's spec gives the value crossing it: a dim it leaves unsharded is
    whole over the region's manual axes, and free over the others (a partially manual region)."""
    from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec

    unsharded = PartitionSpec.UNCONSTRAINED if auto else None
    if auto:  # UNCONSTRAINED needs Auto axes: the region's mesh as such (only its axes and sizes are read)
        mesh = AbstractMesh(tuple(mesh.shape.values()), tuple(mesh.shape), axis_types=(AxisType.Auto,) * len(mesh.shape))
    return NamedSharding(mesh, PartitionSpec(*[(a if len(a) > 1 else a[0]) if a else unsharded for a in axes]))


_STRUCTURED: dict[str, Callable[[_Tracer, Any, int, int], None]] = {
    "scan": _scan,
    "while": _while,
    "cond": _cond,
    "shard_map": _shard_map,
}
