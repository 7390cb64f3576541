"""Tracing: a JAX step to one flat ``Program`` of ops over values (``_program``: nested jaxprs
inlined, loops keeping their body, inputs their pytree paths and ops their source lines), and
the rewrites made while tracing (``_rotate``: a static ``jnp.roll`` as one op), and the one
module that reaches JAX's internals (``_jax``: every ``jax._src`` import partex makes, the
call and remat primitives' parameters, ``called_jaxpr``). Imports JAX and partex's bottom
modules (errors, mesh) only."""
