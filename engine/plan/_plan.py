"""The plan: versioned JSON keyed by pytree paths; ``_planned.apply_plan`` gives real jax.jit
shardings.

A plan records the mesh, the hardware, the ordered decisions (each with an *anchor*: an
input leaf and dim of its group, so that it is found again without the model's axis names),
the PartitionSpec of every input and output leaf, the donated arguments, the predicted
figures and a signature (paths, shapes and dtypes of the inputs) so that applying it to the
wrong function fails with a clear message.

A plan is data: this module imports no JAX, nor any module of partex that does, so a plan
file is read, checked and written without it. What needs JAX takes a plan: ``_planned``'s
``apply_plan`` (the step jitted with its shardings), ``plan_shardings`` and ``shard_inputs``
(a training job's arguments placed as it says).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

from .._decisions import MEMORY_SPACES, RECOMPUTE_KINDS, RESOLUTIONS, Decision, Memory, Recompute, Resolve, slot_kind
from .._errors import PartexError
from .._mesh import Hardware, MeshSpec
from ._specs import SpecJSON, check_spec

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
        """The decision as the plan file writes it: ``{"group", "axis", "pinned"}``, and
        ``"anchor"`` where there is one."""
        d = {"group": self.group, "axis": self.axis, "pinned": self.pinned}
        if self.anchor:
            d["anchor"] = self.anchor
        return d


@dataclasses.dataclass(frozen=True)
class Plan:
    """A sharding plan as its file holds it (see the module doc), frozen: ``load``/``loads``
    read and check one (PartexError naming what is wrong), ``save``/``dumps`` write it.
    ``apply_plan(plan, fn)`` runs a step with it."""

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
        """The plan file's JSON data (``"format": "partex-plan"``, its version, and every field)."""
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
        """The plan file's text: ``to_json`` as indented JSON."""
        return json.dumps(self.to_json(), indent=1)

    def save(self, path: str | os.PathLike) -> None:
        """Write the plan file to ``path``, atomically (never half-written). Returns None."""
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(self.dumps())
        os.replace(tmp, path)  # never leave a half-written plan behind

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Plan":
        """The plan in the file at ``path``, read and checked (``loads``); PartexError for a
        file that cannot be read or is not a valid plan."""
        try:
            with open(path) as f:
                text = f.read()
        except OSError as e:
            raise PartexError(f"cannot read plan {path}: {e.strerror}") from None
        return cls.loads(text, where=str(path))

    @classmethod
    def loads(cls, text: str, where: str = "plan") -> "Plan":
        """The plan in ``text`` (a plan file's content), read and checked (``from_json``);
        ``where`` names it in errors. PartexError for text that is not JSON or not a valid plan."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise PartexError(f"{where} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
                              "was it truncated or edited by hand?") from None
        return cls.from_json(d, where)

    @classmethod
    def from_json(cls, d: Any, where: str = "plan") -> "Plan":
        """The plan in the JSON data ``d`` (``to_json``), checked field by field (format and
        version, the decisions' slots, the specs against the mesh, signature, donation, host
        memory, pipeline); ``where`` names it in the PartexError for anything wrong."""
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

    # ------------------------------------------------------------------ a training job
    def jax_mesh(self, devices=None):
        """The plan's mesh over ``devices`` (default: JAX's, all processes' in a multi-process
        job), Auto axis types, the fast axes within one host or TPU slice (``MeshSpec.jax_mesh``)."""
        return self.mesh.jax_mesh(devices)

    def digest(self) -> str:
        """A short hash of the plan file's content: the same on every process that loads it."""
        return hashlib.sha256(self.dumps().encode()).hexdigest()[:16]


def _hardware_from_json(d: Any) -> Hardware:
    return Hardware.from_json(d, where="plan hardware")
