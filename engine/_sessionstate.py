"""What one configuration of a ``Session`` holds (``SessionState``): the cost model and
decision space of its model on a mesh and hardware, the search over them, the pins it
honours, and the hand plans scored there (``Candidate``s).

A new mesh, hardware or pipeline makes a new state (``SessionState.new``); a resumed file
restores one (``_sessionfile``); ``Session.adopt`` takes another session's.
"""

from __future__ import annotations

import dataclasses

from ._decisions import Decision
from ._loader import ModelAnalysis
from ._mesh import Hardware, MeshSpec
from .analysis._space import DecisionSpace
from .cost import CostModel, CostReport
from .planner._pins import Pins
from .planner._search import Search, check_mesh_axes, search_inputs


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A plan candidate scored by the cost model: a baseline, the search's best, an upload."""

    name: str
    decisions: tuple[Decision, ...]
    report: CostReport  # detailed (collectives listed)


@dataclasses.dataclass
class SessionState:
    """One configuration's search: the cost model and decision space of the model on a mesh
    and hardware, the search over them, the pins it honours, and the hand plans scored on
    that cost model (None until asked for)."""

    cost_model: CostModel
    space: DecisionSpace  # the decisions of this model on this mesh, and what names them
    search: Search
    pins: Pins
    baselines: dict[str, Candidate] | None = None

    @classmethod
    def new(cls, model: ModelAnalysis, mesh: MeshSpec, hw: Hardware, seed: int, warm_start: bool,
            user_shardings: str) -> "SessionState":
        """A fresh search (no pins); a mesh or budget it refuses raises ``PartexError``."""
        cm, space = search_inputs(model, mesh, hw, user_shardings=user_shardings)
        check_mesh_axes(space)
        return cls(cm, space, Search(cm, space, seed=int(seed), warm_start=bool(warm_start)), Pins())

    @classmethod
    def resumed(cls, model: ModelAnalysis, mesh: MeshSpec, hw: Hardware, state: dict,
                user_shardings: str) -> "SessionState":
        """A search resumed from its ``state()`` (a session file's), with its cost model and pins."""
        r = Search.from_state(model, mesh, hw, state, user_shardings=user_shardings)
        check_mesh_axes(r.space)
        return cls(r.cost_model, r.space, r.search, r.pins)
