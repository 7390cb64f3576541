"""The analytic cost model: step time, collectives and per-device peak memory of a plan.

A plan is an ordered list of decisions (group, mesh axis). From it follow
- each value's sharding: walking the decisions in order, a decision shards the first dim of
  the value in that group (an intra conflict: the other dim stays unsharded), unless the
  value already uses that mesh axis on another dim (an axis conflict: the earlier decision
  keeps it) or the dim does not divide;
- each op's sharding, the same way over its factors (need-replication factors never shard);
- communication where a value's sharding and its consumer's view differ: an axis dropped is
  an all-gather, an axis moved to another dim an all-to-all, an axis added a free local
  slice; a sharded reduction factor leaves partial sums: an all-reduce, or a reduce-scatter
  when the result value is sharded on that axis. Ring (alpha-beta) costs per mesh axis.
- peak memory per device by liveness over program order, every buffer at its sharded size;
  arguments and outputs counted whole (as XLA reports them), donated outputs aliased;
- the step compiled as the hardware's platform compiles it (``CostModel``'s lowering: TPU,
  GPU or XLA:CPU), a recompute decision priced as XLA fuses the program it makes.

Evaluation is memoised per value signature and per op pattern (ops with the same shapes,
factors and groups), which do not grow with depth; the overlap schedule runs unrolled layers
until they repeat and counts the rest, and CSE is worked out once per class of values read
alike, so scoring a plan costs about the same for 8 or 126 layers.

The modules, each pure over the immutable tables of one (analysis, mesh, hardware). Building
the tables is apart from pricing with them: no building module imports a pricing one, and
the records both sides share sit below both.

Shared by both sides:

- ``_kinds``: ``CollectiveKind``, the one list of collective kinds (HLO parser and
  verifier import it too);
- ``_facts``: per-primitive cost facts, a registry beside ``_rules.factor_rules`` (FLOPs,
  free ops, views, fusible ops, the partitioner's quirks); ``_kernels``: what a Pallas or
  ``custom_partitioning`` kernel costs;
- ``_shardings``: axes from ordered decisions (``assign``), an op's view of a tensor;
- ``_records``: the plain records the package shares (``Tables``, ``Liveness``,
  ``Pattern``, ``PatternCost``, ``Need``/``Coll``, ``Aggregate``, ``Edit``, ``Moved``).

Building, once per (analysis, mesh, hardware):

- ``_fusion``: what XLA fuses away, what its kernels read, which values share a buffer;
- ``_liveness``: the live ranges (``build_liveness``);
- ``_compile``: the ops as patterns, ops that cost alike (``compile_patterns``);
- ``_tables``: the tables (value signatures, patterns, live ranges, bitmasks);
- ``_variants``: a recompute decision's tables, as XLA fuses the program under it.

Pricing, per plan (each piece memoised by the façade):

- ``_report``: the public results (``CostReport``, ``MemoryReport``, ``CollectiveCost``);
- ``_pricing``: the seconds of one kernel or collective, from the hardware's figures or its
  measured profile (``Hardware.profile``);
- ``_reshard``: the collectives' time, reshards, halos, concatenate/split;
- ``_patterns``: the cost of one pattern under decisions;
- ``_aggregate``: the summed costs of the patterns of one group mask;
- ``_cse``: one reshard of a value per computation;
- ``_recompute``: what recompute decisions change (``Edit``), and its price;
- ``_memory``: the per-device peak, and state kept in host memory;
- ``_periodic``: the periodic stretches of a region's ops (unrolled layers);
- ``_overlap``: the schedule of collectives under compute;
- ``_rows``: the report's collective rows, and the host link's seconds;
- ``_model``: ``CostModel``, the memoising façade, and the only reader of a decision's form.

Imports ``analysis``, ``tracing`` and partex's bottom modules (mesh, decisions) only.
"""

from ._facts import CostFacts, cost_facts, facts_of
from ._kinds import KINDS, CollectiveKind
from ._model import CostModel
from ._report import CollectiveCost, CostReport, HeldBuffer, MemoryReport
from ._shardings import Spec

__all__ = [
    "KINDS", "CollectiveCost", "CollectiveKind", "CostFacts", "CostModel", "CostReport", "HeldBuffer", "MemoryReport", "Spec",
    "cost_facts", "facts_of",
]
