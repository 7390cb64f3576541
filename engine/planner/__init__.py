"""The search's parts, split as mctx splits a search from what it searches: the evaluation
cache every strategy shares (``Evaluator``: a plan's score, the best plan that fits, what XLA
rejected), the tree search over an injected score (``TreeSearch``) and the local search from
the best plan (``LocalSearch``); ``Search`` (``_search``) composes them with the driver
(step, run) and persistence, under the pins its caller owns and passes in (``Pins``,
``_pins``). Beside them: the Alpa-style ILP (``_ilp``), the exhaustive optimum
(``_exhaustive``) and the hand strategies (``_strategies``). Imports ``plan`` (the inputs a
step donates), ``cost``, ``analysis``, ``tracing`` and partex's bottom modules; nothing of
the session."""

from ._evaluator import Best, Evaluation, Evaluator
from ._local import LocalSearch
from ._tree import STOP, Node, TreeSearch

__all__ = ["Best", "Evaluation", "Evaluator", "LocalSearch", "Node", "STOP", "TreeSearch"]
