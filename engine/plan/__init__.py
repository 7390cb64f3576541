"""Plans: the plan file (``_plan``, ``_specs``: pure data, no JAX), a plan bound to a traced
step and applied as ``jax.jit`` shardings (``_planned``, ``_apply``: the interpreter that
inserts the constraints and recomputation), decisions to a plan (``_planning``), and XLA's
check of it (``_verify``, ``_hlo``: the compiled module read; ``_explain``: XLA's collectives
by source line; ``_export``: the plan as files a job uses without partex). Imports ``cost``,
``analysis``, ``tracing``, the model loader and partex's bottom modules; nothing of the
search or the session."""
