"""Analysis: the factor rule of each primitive (``_rules``), the named-dimension analysis in
frozen stages (``_analysis``: dimension graph, named dimensions, layer groups, conflicts),
its records (``_types``: ``Analysis`` and its parts, ``Roles``), what is read from the program's structure on top of it (``_roles``, ``_stacks``: layer
stacks; ``_constraints``: the step's own shardings; ``_recompute``: the layer stacks a
recompute decision covers), and the decision space (``_space``). Imports ``tracing`` and
partex's bottom modules (errors, mesh, decisions) only."""
