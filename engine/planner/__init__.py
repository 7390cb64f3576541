"""The search's parts, split as mctx splits a search from what it searches: the evaluation
cache every strategy shares (``Evaluator``: a plan's score, the best plan that fits, what XLA
rejected), the tree search over an injected score (``TreeSearch``) and the local search from
the best plan (``LocalSearch``); ``Search`` (``_search``) composes them with the pins, the
driver (step, run) and persistence. Beside them: the Alpa-style ILP (``_ilp``), the exhaustive
optimum (``_exhaustive``) and the hand strategies (``_strategies``). Imports ``plan`` (a search
makes plans), ``cost``, ``analysis``, ``tracing`` and partex's bottom modules; nothing of the
session."""

from ._evaluator import Best, Evaluator
from ._local import LocalSearch
from ._tree import STOP, Node, TreeSearch

__all__ = ["Best", "Evaluator", "LocalSearch", "Node", "STOP", "TreeSearch"]
