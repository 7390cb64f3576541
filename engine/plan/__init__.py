"""Plans: the plan file (``_plan``, ``_specs``: pure data, no JAX), a plan bound to a traced
step and applied as ``jax.jit`` shardings (``_planned``: ``apply_plan``, ``plan_shardings``,
``shard_inputs``; ``_apply``: the interpreter that re-evaluates the step, with the constraints
it places (``_plan_constraints``), float16 promotion (``_promote``), shard_map and
explicit-mode regions (``_regions``) and the recompute and offload bookkeeping
(``_recomputation``); ``_micro``: microbatched rows), the pipeline (``_pipeline_decision``:
the ``Pipeline`` decision and the step it makes; ``_pipelined_scan``: a scan rewritten as a
pipeline over a ``Schedule``), decisions to a plan (``_planning``), and XLA's check of it
(``_verify``, ``_hlo``: the compiled module read; ``_explain``: XLA's collectives by source
line; ``_measure``, ``_worker``: plans run in a fresh process; ``_export``: the plan as files
a job uses without partex). Imports ``cost``,
``analysis``, ``tracing``, the model loader and partex's bottom modules; nothing of the
search or the session."""
