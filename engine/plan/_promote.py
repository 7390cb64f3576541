"""Promotion: a step that computes in bfloat16 or float16, computed in float32 instead.

Verify compares a plan's numerics with the unsharded step's; in 16-bit floats the rounding
would hide a misplaced shard in noise. With ``constrained_function(..., promote=True)`` apply
widens inputs and constants to float32 (``widen``), rewrites every eqn's params that name a
16-bit float (``promoted``: casts, matmul accumulators, a reduction's computation) and asks
matmuls and convolutions for full float32 precision (GPUs take TF32 by default); the ops
are the same, in the same shardings. ``reduce_precision`` is skipped; a bitcast of a 16-bit
float cannot be promoted and is an error.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .._errors import PartexError
from ..tracing._jax import ClosedJaxpr, jcore
from ..tracing._program import Program

__all__ = ["abstract", "is_low", "promoted", "widen"]

_LOW = frozenset({np.dtype(jnp.bfloat16), np.dtype(np.float16)})
# the params by which an eqn names the dtype it computes in or casts to
_DTYPE_PARAMS = ("new_dtype", "dtype", "preferred_element_type")

# evaluate(jaxpr, consts, args): a jaxpr's outputs on ``args``, evaluated as apply does
Evaluate = Callable[[Any, Sequence[Any], list], list]


def is_low(dtype) -> bool:
    """A 16-bit float dtype (bfloat16, float16): what ``promote`` computes in float32."""
    try:
        return np.dtype(dtype) in _LOW
    except TypeError:  # not a numpy dtype (a PRNG key type)
        return False


def widen(x):
    """x in float32 if it is a 16-bit float, else as it is."""
    dtype = getattr(x, "dtype", None)
    return x.astype(np.float32) if dtype is not None and is_low(dtype) else x


def abstract(aval, promote: bool = False, shape=None) -> jax.ShapeDtypeStruct:
    """``aval`` as a ShapeDtypeStruct to trace a body at: in float32 where ``promote`` widens
    it, at ``shape`` where given (a pipelined body's microbatch)."""
    dtype = np.float32 if promote and is_low(aval.dtype) else aval.dtype
    return jax.ShapeDtypeStruct(aval.shape if shape is None else tuple(shape), dtype,
                                weak_type=getattr(aval, "weak_type", False))


def promoted(eqn, params: dict, program: Program, evaluate: Evaluate) -> dict | None:
    """The eqn's params computing in float32 where they name a 16-bit float; None for an
    eqn that rounds to 16 bits (``reduce_precision``), which promotion skips. A jaxpr param
    (a reduction's computation: scatter-add's) is traced again through ``evaluate``, widened.

    Raises ``PartexError`` for a bitcast of a 16-bit float, whose bits float32 cannot keep."""
    name = eqn.primitive.name
    if name == "reduce_precision":
        return None
    if name == "bitcast_convert_type" and any(is_low(v.aval.dtype) for v in (*eqn.invars, *eqn.outvars)):
        raise PartexError(f"{program.ops[program.eqn_ops[id(eqn)]].source if id(eqn) in program.eqn_ops else name}: "
                          "the step bitcasts a 16-bit float, which cannot be computed in float32")
    out = {}
    for k, v in params.items():
        if k in _DTYPE_PARAMS and v is not None and is_low(v):
            v = np.dtype(np.float32)
        elif k == "precision" and name in ("dot_general", "conv_general_dilated"):
            # float32 in float32: not TF32 / bf16 passes, which GPUs and TPUs take by default
            v = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
        elif isinstance(v, (ClosedJaxpr, jcore.Jaxpr)):  # a reduction's computation (scatter-add)
            v = _promoted_jaxpr(v, evaluate)
        out[k] = v
    return out


def _promoted_jaxpr(j, evaluate: Evaluate):
    inner = j.jaxpr if isinstance(j, ClosedJaxpr) else j
    consts = getattr(j, "consts", ())
    if not any(is_low(v.aval.dtype) for v in (*inner.invars, *inner.outvars)):
        return j
    closed = jax.make_jaxpr(lambda *xs: evaluate(inner, consts, list(xs)))(
        *[abstract(v.aval, promote=True) for v in inner.invars])
    return closed if isinstance(j, ClosedJaxpr) else closed.jaxpr
