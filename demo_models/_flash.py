"""Flash attention as production JAX runs it on TPU: JAX's Pallas flash-attention kernels
(``jax.experimental.pallas.ops.tpu.flash_attention``: a forward kernel that keeps each
block of scores on chip and saves only the softmax statistics, and two backward kernels),
made partitionable with ``custom_partitioning``, as JAX's cuDNN fused attention is: the
batch and head dims are sharded as the operands are (each device runs the kernel on its
own batch and heads), the sequence and head dims are kept whole (the causal kernel masks by
the positions of its blocks). Off TPU the kernels run in Pallas' TPU interpret mode.

    attention(q, k, v, causal=True, sm_scale=...)  # q, k, v: [batch, heads, seq, head_dim]

The kernels' own entry points (``_flash_attention`` with its residuals,
``_flash_attention_bwd``) are JAX's private functions behind its public ``flash_attention``,
whose custom VJP cannot be wrapped in ``custom_partitioning`` from outside.
"""

from __future__ import annotations

import contextlib
import functools

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

_FWD_RULE = "b h q d, b h k d, b h k d -> b h q d, b h q, b h q"
_BWD_RULE = ("b h q d, b h k d, b h k d, b h q d, b h q, b h q, b h q d -> "
             "b h q d, b h k d, b h k d")
_WHOLE = ("q", "d", "k")  # the causal kernel's positions come from its blocks (in the rule's order: Shardy wants them sorted)


def _kernels():
    from jax.experimental.pallas.ops.tpu import flash_attention as fa
    return fa


@contextlib.contextmanager
def _interpret():
    """Off TPU, Pallas' HLO interpreter: the kernel's grid as XLA loops over its blocks (TPU
    interpret mode would simulate the chip with host callbacks, which a partitioned
    ``custom_partitioning`` body may not hold)."""
    if jax.default_backend() == "tpu":
        yield
        return
    from jax._src import config
    flag = config.pallas_tpu_interpret_mode_context_manager
    prev = flag.swap_local(True)
    try:
        yield
    finally:
        flag.set_local(prev)


def _blocks(q_len: int, k_len: int):
    fa = _kernels()
    bq, bk = min(512, q_len), min(512, k_len)
    return fa.BlockSizes(block_q=bq, block_k_major=bk, block_k=bk, block_b=1,
                         block_q_major_dkv=bq, block_k_major_dkv=bk, block_k_dkv=bk, block_q_dkv=bq,
                         block_k_major_dq=bk, block_k_dq=bk, block_q_dq=bq)


def _fwd_kernel(q, k, v, *, causal: bool, sm_scale: float):
    fa = _kernels()
    with _interpret():
        return fa._flash_attention(q, k, v, None, None, True, causal, sm_scale,
                                   _blocks(q.shape[2], k.shape[2]), False)


def _bwd_kernel(q, k, v, o, l, m, do, *, causal: bool, sm_scale: float):
    fa = _kernels()
    with _interpret():
        dq, dk, dv, _, _ = fa._flash_attention_bwd(False, causal, sm_scale, _blocks(q.shape[2], k.shape[2]), False,
                                                   (q, k, v, None, None, o, l, m), do)
    return dq, dk, dv


def _batch_heads(mesh, sharding) -> NamedSharding:
    """The operand's sharding with only its batch and head dims kept."""
    spec = tuple(getattr(sharding, "spec", ())) + (None, None)
    return NamedSharding(mesh, PartitionSpec(spec[0], spec[1], None, None))


def _partitioned(kernel, rule: str, n_out: int, causal: bool, sm_scale: float):
    def fn(*args):
        return kernel(*args, causal=causal, sm_scale=sm_scale)

    fn.__name__ = fn.__qualname__ = "flash_attention" + kernel.__name__.removesuffix("_kernel")

    op = custom_partitioning(fn)

    def partition(mesh, arg_shapes, result_shape):
        s = _batch_heads(mesh, arg_shapes[0].sharding)
        return mesh, fn, (s,) * n_out, (s,) * len(arg_shapes)

    op.def_partition(partition, sharding_rule=rule, need_replication_factors=_WHOLE)
    return op


@functools.cache
def _attention(causal: bool, sm_scale: float):
    fwd_op = _partitioned(_fwd_kernel, _FWD_RULE, 3, causal, sm_scale)
    bwd_op = _partitioned(_bwd_kernel, _BWD_RULE, 3, causal, sm_scale)

    @jax.custom_vjp
    def attention(q, k, v):
        return fwd_op(q, k, v)[0]

    def fwd(q, k, v):
        o, l, m = fwd_op(q, k, v)
        return o, (q, k, v, o, l, m)

    def bwd(res, do):
        return tuple(bwd_op(*res, do))

    attention.defvjp(fwd, bwd)
    return attention


def attention(q, k, v, *, causal: bool = True, sm_scale: float = 1.0):
    """Flash attention of q, k, v [batch, heads, seq, head_dim] (as many k/v heads as q's)."""
    return _attention(bool(causal), float(sm_scale))(q, k, v)
