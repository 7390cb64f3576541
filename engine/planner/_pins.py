"""What a user fixes about a search: decisions it keeps and decisions it never takes.

``Pins`` is a value: ``pin``, ``forbid`` and ``unpin`` return a new one and leave the old as
it was. ``Session`` owns the current one and hands it to every call of the search that
depends on it (a simulation starts from the pinned state; the best plan honours both)."""

from __future__ import annotations

import dataclasses
from typing import Callable

from .._decisions import Decision
from .._errors import PartexError

Label = Callable[[Decision], str]  # a decision's label for messages (``Analysis.decision_label``)


@dataclasses.dataclass(frozen=True)
class Pins:
    """``pinned``: decisions every plan keeps, first, in the order they were pinned.
    ``forbidden``: decisions no plan takes. A decision is never in both."""

    pinned: tuple[Decision, ...] = ()
    forbidden: frozenset[Decision] = frozenset()

    def pin(self, d: Decision, label: Label) -> Pins:
        if d in self.forbidden:
            raise PartexError(f"cannot pin {label(d)}: it is forbidden (unpin the forbid first)")
        return self if d in self.pinned else Pins(self.pinned + (d,), self.forbidden)

    def forbid(self, d: Decision, label: Label) -> Pins:
        if d in self.pinned:
            raise PartexError(f"cannot forbid {label(d)}: it is pinned (unpin it first)")
        return self if d in self.forbidden else Pins(self.pinned, self.forbidden | {d})

    def unpin(self, d: Decision, label: Label) -> Pins:
        """Without ``d`` as a pin or a forbid."""
        if d not in self.pinned and d not in self.forbidden:
            raise PartexError(f"{label(d)} is neither pinned nor forbidden")
        return Pins(tuple(p for p in self.pinned if p != d), self.forbidden - {d})
