"""JAX's internals that partex uses: the one module of partex that imports ``jax._src``.

partex reads a step's jaxpr eqn by eqn, rebuilds jaxprs, evaluates them again with sharding
constraints, and defines a primitive of its own; JAX's public API covers none of that, so
these names come from JAX's implementation, which may change in any release. Every such
import is here, under the name the rest of partex uses, so that a JAX release that moves one
breaks one line, in one file:

- ``jcore`` (``jax._src.core``): the jaxpr IR -- ``Jaxpr``, ``Var``, ``Literal``, ``DropVar``,
  ``jaxprs_in_params`` -- that the tracer walks and apply evaluates again, and
  ``standard_vma_rule`` for the ``roll`` primitive. ``ClosedJaxpr`` and ``ShapedArray`` are
  its names for a jaxpr with its consts and for an array's abstract value.
- ``pe`` (``jax._src.interpreters.partial_eval``): ``dce_jaxpr`` (the tracer drops the eqns
  nothing reads) and ``convert_constvars_jaxpr`` (apply binds a re-traced ``checkpoint`` body
  with its consts as operands).
- ``source_info_util``: an eqn's traceback and name stack, for an op's source line and scope
  and for the HLO metadata of the ops apply binds.
- ``jdtypes`` (``jax._src.dtypes``): the bits per element of sub-byte types and typed PRNG
  keys, which numpy's dtypes cannot say.
- ``ad``, ``batching``, ``mlir``, ``standard_primitive``, ``input_dtype``: what ``roll``
  (``_rotate``) is defined with, as lax's own primitives are: its transpose, batching rule,
  lowering, and shape / dtype / sharding rules.
- ``with_sharding_constraint``: JAX's own. A library may put something else at
  ``jax.lax.with_sharding_constraint`` (MaxText's tunix adapter swaps in a shim that swallows
  errors and retries with reshard); apply's constraints must be JAX's, and fail as JAX's do.
- ``custom_partitioning_p``: a ``custom_partitioning`` op, bound again at a pipeline stage's
  microbatch (``plan._micro``).
- ``SDY_BATCHING``: the prefix by which a ``custom_partitioning`` sharding rule names its
  leading ``...`` dims.
- ``distributed``: JAX's coordination client, through which the processes of a
  multi-process job agree on the plan they apply.
- ``cache_key_with_metadata``: the compilation cache keyed by HLO metadata too (a context,
  looked up when asked for: only ``explain`` needs it).

``import jax`` already loads every module imported here, so importing them costs nothing.
"""

from __future__ import annotations

import dataclasses

from jax._src import config as _config
from jax._src import core as jcore
from jax._src import distributed
from jax._src import dtypes as jdtypes
from jax._src import source_info_util
from jax._src.custom_partitioning import custom_partitioning_p
from jax._src.custom_partitioning_sharding_rule import BATCHING as SDY_BATCHING
from jax._src.interpreters import ad, batching, mlir
from jax._src.interpreters import partial_eval as pe
from jax._src.lax import lax as _lax
from jax._src.pjit import with_sharding_constraint

__all__ = [
    "CALLS", "Call", "ClosedJaxpr", "SDY_BATCHING", "ShapedArray", "ad", "batching", "cache_key_with_metadata",
    "called_jaxpr", "custom_partitioning_p", "distributed", "input_dtype", "is_remat", "jcore", "jdtypes", "mlir",
    "pe", "source_info_util", "standard_primitive", "with_sharding_constraint",
]

# JAX 0.11 merged ``ClosedJaxpr`` into ``Jaxpr`` (a Jaxpr carries its consts, ``.jaxpr`` is
# itself, and ``Jaxpr(jaxpr, consts)`` still builds one): one name for both releases.
ClosedJaxpr = getattr(jcore, "ClosedJaxpr", jcore.Jaxpr)
ShapedArray = jcore.ShapedArray

# lax's module imports these helpers from its utils module without re-exporting them; ``roll``
# is built with them as lax's own primitives are (the ignores: that re-export rule only).
standard_primitive = _lax.standard_primitive  # pyright: ignore[reportPrivateImportUsage]
input_dtype = _lax.input_dtype  # pyright: ignore[reportPrivateImportUsage]


def cache_key_with_metadata():
    """A context in which JAX's persistent compilation cache keys an executable by its HLO's
    metadata too (source lines), which it otherwise leaves out of the key."""
    return _config.compilation_cache_include_metadata_in_key(True)


# --------------------------------------------------------------------------- call primitives

# The params that may hold a called jaxpr, in the order they are looked for where the
# primitive's own is not known.
_CALLED_JAXPR_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """How partex treats a call primitive's eqn. The tracer inlines every one (the called
    jaxpr's variables are the outer values); apply evaluates the called jaxpr in place too,
    except a remat's (``remat``: True), which it binds again as itself around a body traced
    again with its constraints: inlining it would drop the optimisation barrier that stops
    XLA from CSE-ing the recomputation away, and with it the memory the remat saves."""

    param: str | None  # the param holding the called jaxpr (None: the first of _CALLED_JAXPR_PARAMS)
    remat: bool = False


CALLS: dict[str, Call] = {
    "jit": Call("jaxpr"),
    "pjit": Call("jaxpr"),
    "closed_call": Call("call_jaxpr"),
    "core_call": Call("call_jaxpr"),
    "remat2": Call("jaxpr", remat=True),
    "checkpoint": Call("jaxpr", remat=True),
    "custom_jvp_call": Call("call_jaxpr"),
    "custom_vjp_call": Call("call_jaxpr"),
    "custom_vjp_call_jaxpr": Call("fun_jaxpr"),
    "custom_lin": Call(None),
}


def is_remat(name: str) -> bool:
    """Whether primitive ``name`` is a remat (``checkpoint``): see ``Call``."""
    call = CALLS.get(name)
    return call is not None and call.remat


def called_jaxpr(eqn):
    """The jaxpr ``eqn`` calls (a ``Jaxpr`` or ``ClosedJaxpr``), or None: the param ``CALLS``
    names for its primitive; for a primitive ``CALLS`` gives no param for, the first of
    ``jaxpr`` / ``call_jaxpr`` / ``fun_jaxpr`` that holds a jaxpr."""
    call = CALLS.get(eqn.primitive.name)
    if call is not None and call.param is not None:
        return eqn.params.get(call.param)
    for k in _CALLED_JAXPR_PARAMS:
        j = eqn.params.get(k)
        if isinstance(j, (ClosedJaxpr, jcore.Jaxpr)):
            return j
    return None
