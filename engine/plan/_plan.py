"""The plan: versioned JSON keyed by pytree paths; ``apply`` gives real jax.jit shardings.

A plan records the mesh, the hardware, the ordered decisions (each with an *anchor*: an
input leaf and dim of its group, so that it is found again without the model's axis names),
the PartitionSpec of every input and output leaf, the donated arguments, the predicted
figures and a signature (paths, shapes and dtypes of the inputs) so that applying it to the
wrong function fails with a clear message.

A plan is data: this module imports no JAX, so a plan file is read, checked and written
without it. What needs JAX (``apply``, ``shardings``, ``shard_inputs``) imports ``_planned``
(a plan bound to a traced step) and JAX when called.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .._decisions import MEMORY_SPACES, RECOMPUTE_KINDS, RESOLUTIONS, Decision, Memory, Recompute, Resolve, slot_kind
from .._errors import PartexError
from .._mesh import Hardware, MeshSpec
from ._specs import SpecJSON, check_spec

if TYPE_CHECKING:
    from ._planned import PlannedFunction

FORMAT = "partex-plan"
VERSION = 1


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
    # the argument and result leaves (pytree paths) the plan keeps in host memory (its
    # ``memory:host`` decisions): passed and returned in pinned host memory
    host_inputs: tuple[str, ...] = ()
    host_outputs: tuple[str, ...] = ()
    # a layer stack run as a pipeline (``partex.Pipeline.to_json``): the step the decisions,
    # specs and signature are of is the pipelined one, which apply makes again
    pipeline: dict | None = None

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict:
        hw = self.hardware.to_json()
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
            "host_memory": {"inputs": list(self.host_inputs), "outputs": list(self.host_outputs)},
            **({"pipeline": self.pipeline} if self.pipeline is not None else {}),
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
            elif kind is Memory:
                if value not in MEMORY_SPACES:
                    raise PartexError(f"{where}: decision {i} has memory space {value!r}; known: "
                                      f"{', '.join(MEMORY_SPACES)}")
            else:
                mesh.index(x["axis"])  # unknown axis -> clear error
            decisions.append(PlanDecision(x["group"], x["axis"], x.get("anchor"), bool(x.get("pinned", False))))
        for field in ("inputs", "outputs"):
            if not isinstance(d[field], dict):
                raise PartexError(f"{where}: {field!r} must map pytree paths to PartitionSpecs")
            for path, spec in d[field].items():
                check_spec(spec, mesh, f"{where}: {field[:-1]} {path}")
        sig = d["signature"]
        if not isinstance(sig, dict) or not isinstance(sig.get("inputs"), list):
            raise PartexError(f"{where}: signature must hold the inputs' paths, shapes and dtypes")
        donate = d.get("donate", [])
        if not isinstance(donate, list) or not all(isinstance(i, int) and i >= 0 for i in donate):
            raise PartexError(f"{where}: donate must be a list of argument indices")
        us = d.get("user_shardings") or {}
        if not isinstance(us, dict) or us.get("mode", "keep") not in ("keep", "replace"):
            raise PartexError(f"{where}: user_shardings must be {{\"mode\": \"keep\" or \"replace\", ...}}")
        hm = d.get("host_memory") or {}
        paths = {k: hm.get(k) or [] for k in ("inputs", "outputs")} if isinstance(hm, dict) else None
        if paths is None or not all(isinstance(v, list) and all(isinstance(p, str) and p in d[k] for p in v)
                                    for k, v in paths.items()):
            raise PartexError(f"{where}: host_memory must list the input and output paths kept in host memory "
                              "({\"inputs\": [...], \"outputs\": [...]}), each a path of the plan's inputs/outputs")
        pipe = d.get("pipeline")
        if pipe is not None:
            if not isinstance(pipe, dict) or not {"stack", "axis", "microbatches"} <= set(pipe) \
                    or not isinstance(pipe["microbatches"], int) or pipe["axis"] not in mesh.axes:
                raise PartexError(f"{where}: pipeline must be {{\"stack\": str, \"axis\": a mesh axis, "
                                  "\"microbatches\": int, \"schedule\": str}")
        return cls(mesh, hw, tuple(decisions), dict(d["inputs"]), dict(d["outputs"]), sig,
                   tuple(donate), d.get("predicted") or {}, d.get("model") or {}, d.get("strategy"),
                   us.get("mode", "keep"), tuple(us.get("fixed") or ()), tuple(paths["inputs"]), tuple(paths["outputs"]),
                   pipe)

    # ------------------------------------------------------------------ apply
    def apply(self, fn: Callable, mesh=None, axis_names=None, constrain: bool = True) -> "PlannedFunction":
        """``fn`` jitted with the plan's shardings and intermediate constraints, on ``mesh``
        (default: the plan's mesh over all of JAX's devices, Auto axis types).
        constrain=False applies the input and output shardings alone (for comparison: XLA's
        propagation then decides every intermediate)."""
        from ._planned import PlannedFunction  # JAX, only when a plan is applied

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

        from ..tracing._program import HOST_MEMORY_KINDS, is_array_leaf  # JAX, only when a plan is applied
        from ._planned import spec_from_json  # likewise

        mesh = mesh if mesh is not None else self.jax_mesh()
        specs = iter(self._leaf_specs(args))
        paths = iter(p for p, _, _ in self.signature.get("inputs", []))
        host = set(self.host_inputs)

        def kind(x):  # an argument the plan or the user keeps in host memory is there
            k = getattr(getattr(x, "sharding", None), "memory_kind", None)
            return "pinned_host" if next(paths) in host else k if k in HOST_MEMORY_KINDS else None

        return jax.tree_util.tree_map(
            lambda x: NamedSharding(mesh, spec_from_json(next(specs)), memory_kind=kind(x)) if is_array_leaf(x)
            else None, tuple(args))

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

        from ..tracing._program import is_array_leaf  # JAX, only when a plan is applied

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
    return Hardware.from_json(d, where="plan hardware")
