"""What a plan decides: one frozen type per kind of decision.

- ``Shard(group, axis)``: the decision group's dims are sharded over a mesh axis.
- ``Resolve(group, resolution)``: a conflicted group (a tensor holding two of its dims)
  shards its ``"second"`` dim there, or ``"neither"`` (module docstring of ``_analysis``).
- ``Recompute(unit, kind)``: a layer stack (a recompute unit) is rematerialised in the
  backward pass: ``"regather"``, ``"dots"`` or ``"full"``, or its matmul outputs are saved in
  host memory and the rest recomputed, ``"offload"``, or each layer's input is and the whole
  layer recomputed, ``"full_offload"`` (``_recompute``).
- ``Memory(state, space)``: a set of the step's state (``STATES``: the optimizer state, the
  parameters) is kept in another memory space between steps, ``"host"``: the step copies
  each array to the device where it first reads it and its update back (MaxText's
  ``optimizer_memory_host_offload``, ``parameter_memory_host_offload``).

Decisions are hashable and totally ordered. In files (plans, sessions, search states) a
decision is a pair ``[id, slot]`` whose slot is the mesh axis, ``"resolve:<resolution>"``
``"recompute:<kind>"`` or ``"memory:<space>"``; ``slot`` and ``decision_of`` convert, and nothing else reads or
writes that spelling. A decision's order and hash are those of its pair: sorted plans
follow the file format's order, and the search's sets iterate as its pairs would.

A new kind of decision (pipeline stages, say) is a new class here with its slot
prefix in ``_PREFIXED``. This module imports nothing of partex: every stage may use it.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar, Iterable, Sequence

GroupId = int  # a decision group's index in ``Analysis.groups``
NamedDimId = int
NO_DIM = -1  # the group (and named dim) of a size-1 dim: never sharded, in none

RESOLUTIONS = ("second", "neither")
RECOMPUTE_KINDS = ("regather", "dots", "full", "offload", "full_offload")  # "save" (the default) is no decision
LOOP_RECOMPUTE_KINDS = ("dots", "full", "offload", "full_offload")  # under scan every iteration gathers its weights anew
# what each recompute kind does to a layer stack, in words (the explorer's and the CLI's)
RECOMPUTE_WHAT = {"regather": "weights gathered again in the backward pass",
                  "dots": "matmul outputs saved, the rest recomputed in the backward pass",
                  "full": "every layer recomputed from its input in the backward pass",
                  "offload": "matmul outputs kept in host memory, the rest recomputed in the backward pass",
                  "full_offload": "every layer recomputed in the backward pass from its input, kept in host memory"}
# the sets of step state a ``Memory`` decision places, by id (the roles ``partex.analysis``
# gives the step's inputs), and the memory spaces it places them in ("device", the default,
# is no decision)
STATES = ("optimizer", "parameters")
STATE_LABELS = {"optimizer": "optimizer state", "parameters": "parameters"}
MEMORY_SPACES = ("host",)


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Decision(abc.ABC):
    """One decision of a plan. ``id`` is a decision group's id (``Shard``, ``Resolve``), a
    recompute unit's (``Recompute``) or a state set's (``Memory``); ``slot`` is its second
    field in files."""

    PREFIX: ClassVar[str] = ""  # the slot's prefix in files ("" for a mesh axis)
    #: what the id names: a decision group, a recompute unit or a state set (``STATES``)
    ON: ClassVar[str] = "group"
    #: whether the id names a decision group
    ON_GROUP: ClassVar[bool] = True
    # (id, slot), made once: the search hashes and compares decisions in its inner loops
    _pair: tuple[int, str] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_pair", (self.id, self.slot))

    @property
    @abc.abstractmethod
    def id(self) -> int:
        """The decision group's id, the recompute unit's or the state set's."""

    @property
    @abc.abstractmethod
    def value(self) -> str:
        """The axis, resolution, kind or memory space (the slot without its prefix)."""

    @property
    def slot(self) -> str:
        """The decision's second field in files: ``PREFIX`` + ``value`` (a mesh axis, ``resolve:second``)."""
        return self.PREFIX + self.value

    def pair(self) -> tuple[int, str]:
        """(id, slot): the decision as files spell it, and its sort key."""
        return self._pair

    def to_json(self) -> list:
        """``[id, slot]``: the decision as files spell it (``decision_of`` reads it back)."""
        return [self.id, self.slot]

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._pair == other._pair  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._pair)

    def __lt__(self, other: "Decision") -> bool:
        return self._pair < other._pair

    def __le__(self, other: "Decision") -> bool:
        return self._pair <= other._pair

    def __gt__(self, other: "Decision") -> bool:
        return self._pair > other._pair

    def __ge__(self, other: "Decision") -> bool:
        return self._pair >= other._pair

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id}, {self.value!r})"


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)
class Shard(Decision):
    """Shard decision group ``group``'s dims over mesh axis ``axis``."""

    group: int
    axis: str

    @property
    def id(self) -> int:
        return self.group

    @property
    def value(self) -> str:
        return self.axis

    @property
    def slot(self) -> str:
        return self.axis


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)
class Resolve(Decision):
    """Resolve group ``group``'s conflict: shard the ``"second"`` dim, or ``"neither"``."""

    PREFIX: ClassVar[str] = "resolve:"
    group: int
    resolution: str

    @property
    def id(self) -> int:
        return self.group

    @property
    def value(self) -> str:
        return self.resolution


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)
class Recompute(Decision):
    """Rematerialise recompute unit ``unit`` (a layer stack) in the backward pass."""

    PREFIX: ClassVar[str] = "recompute:"
    ON: ClassVar[str] = "unit"
    ON_GROUP: ClassVar[bool] = False
    unit: int
    kind: str

    @property
    def id(self) -> int:
        return self.unit

    @property
    def value(self) -> str:
        return self.kind


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)
class Memory(Decision):
    """Keep state set ``state`` (an index into ``STATES``) in memory space ``space``
    between steps."""

    PREFIX: ClassVar[str] = "memory:"
    ON: ClassVar[str] = "state"
    ON_GROUP: ClassVar[bool] = False
    state: int
    space: str

    @property
    def id(self) -> int:
        return self.state

    @property
    def value(self) -> str:
        return self.space

    @property
    def role(self) -> str:
        """The state set's role (``STATES``)."""
        return STATES[self.state]


# The kinds a file's slot prefix names; a slot without a known prefix is a mesh axis.
_PREFIXED: dict[str, type[Decision]] = {cls.PREFIX: cls for cls in (Resolve, Recompute, Memory)}


def slot_kind(slot: str) -> type[Decision]:
    """The decision class a file's slot spells (``Shard`` for a plain mesh axis)."""
    head, sep, _ = slot.partition(":")
    return _PREFIXED.get(head + sep, Shard) if sep else Shard


def decision_of(id: int, slot: str) -> Decision:
    """The decision a file's pair ``[id, slot]`` spells."""
    cls = slot_kind(slot)
    return cls(int(id), slot[len(cls.PREFIX):])  # type: ignore[call-arg]


def decisions_of(pairs: Iterable[Sequence]) -> tuple[Decision, ...]:
    """Decisions from file pairs (``[[id, slot], ...]``)."""
    return tuple(decision_of(i, s) for i, s in pairs)


def shards(decisions: Iterable[Decision]) -> list[Shard]:
    return [d for d in decisions if isinstance(d, Shard)]


def recomputes(decisions: Iterable[Decision]) -> list[Recompute]:
    return [d for d in decisions if isinstance(d, Recompute)]


def resolutions(decisions: Iterable[Decision]) -> list[Resolve]:
    return [d for d in decisions if isinstance(d, Resolve)]


def memories(decisions: Iterable[Decision]) -> list[Memory]:
    return [d for d in decisions if isinstance(d, Memory)]
