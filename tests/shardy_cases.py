"""The ops partex's factor rules are compared on with Shardy's (tests/test_shardy_rules.py,
scripts/shardy_table.py): one tiny example per primitive and per distinct case of its rule,
each naming the StableHLO op it lowers to."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from _shardy import Case

F32, I32, BOOL = jnp.float32, jnp.int32, jnp.bool_


def _conv(stride=(1, 1), groups=1, padding="SAME"):
    return lambda x, w: lax.conv_general_dilated(x, w, stride, padding, dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                                 feature_group_count=groups)


def _conv_wgrad(x, g):
    """The weight gradient of a depthwise conv: a conv with batch_group_count = channels."""
    def f(w):
        return _conv(groups=8)(x, w)
    return jax.vjp(f, jnp.zeros((3, 3, 1, 8), x.dtype))[1](g)[0]


def _maxpool(x):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


CASES: dict[str, Case] = {
    # elementwise
    "add": Case(lambda a, b: a + b, [(4, 6), (4, 6)], "stablehlo.add"),
    "mul": Case(lambda a, b: a * b, [(4, 6), (4, 6)], "stablehlo.multiply"),
    "max": Case(lambda a, b: jnp.maximum(a, b), [(4, 6), (4, 6)], "stablehlo.maximum"),
    "pow": Case(lambda a, b: a ** b, [(4, 6), (4, 6)], "stablehlo.power"),
    "atan2": Case(lambda a, b: jnp.arctan2(a, b), [(4, 6), (4, 6)], "stablehlo.atan2"),
    "rem": Case(lambda a, b: lax.rem(a, b), [(4, 6), (4, 6)], "stablehlo.remainder"),
    "select_n": Case(lambda a, b: jnp.where(a > 0, a, b), [(4, 6), (4, 6)], "stablehlo.select", "select_n",
                     [0, 1, 2]),
    "clamp": Case(lambda a: lax.clamp(0.0, a, 1.0), [(4, 6)], "stablehlo.clamp", "clamp", [None, 1, None]),
    "exp": Case(jnp.exp, [(4, 6)], "stablehlo.exponential"),
    "tanh": Case(jnp.tanh, [(4, 6)], "stablehlo.tanh"),
    "rsqrt": Case(lax.rsqrt, [(4, 6)], "stablehlo.rsqrt"),
    "neg": Case(lambda a: -a, [(4, 6)], "stablehlo.negate"),
    "sign": Case(jnp.sign, [(4, 6)], "stablehlo.sign"),
    "convert_element_type": Case(lambda a: a.astype(jnp.bfloat16), [(4, 6)], "stablehlo.convert"),
    "reduce_precision": Case(lambda a: lax.reduce_precision(a, 5, 10), [(4, 6)], "stablehlo.reduce_precision"),
    "bitcast_convert_type": Case(lambda a: lax.bitcast_convert_type(a, jnp.int32), [(4, 6)],
                                 "stablehlo.bitcast_convert"),
    "population_count": Case(lax.population_count, [(4, 6)], "stablehlo.popcnt", dtypes=[I32]),
    "shift_left": Case(lax.shift_left, [(4, 6), (4, 6)], "stablehlo.shift_left", dtypes=[I32, I32]),
    "clamp_arrays": Case(lax.clamp, [(4, 6), (4, 6), (4, 6)], "stablehlo.clamp", "clamp"),
    "eq": Case(lambda a, b: a == b, [(4, 6), (4, 6)], "stablehlo.compare"),
    "not": Case(lambda a: ~a, [(4, 6)], "stablehlo.not", dtypes=[BOOL]),
    # contractions
    "dot_general": Case(lambda a, b: a @ b, [(4, 6), (6, 8)], "stablehlo.dot_general"),
    "dot_general_batched": Case(lambda a, b: jnp.einsum("bij,bjk->bik", a, b), [(2, 4, 6), (2, 6, 8)],
                                "stablehlo.dot_general"),
    "dot_general_two_contractions": Case(lambda a, b: jnp.einsum("ijk,jkl->il", a, b), [(4, 6, 2), (6, 2, 8)],
                                         "stablehlo.dot_general"),
    "dot_general_vector": Case(lambda a, b: a @ b, [(4, 6), (6,)], "stablehlo.dot_general"),
    "dot_general_transposed": Case(lambda a, b: jnp.einsum("ij,kj->ki", a, b), [(4, 6), (8, 6)],
                                   "stablehlo.dot_general", "dot_general"),
    # layout
    "broadcast_in_dim": Case(lambda a: lax.broadcast_in_dim(a, (4, 2, 6), (0, 2)), [(4, 6)],
                             "stablehlo.broadcast_in_dim"),
    "broadcast_in_dim_size1": Case(lambda a: lax.broadcast_in_dim(a, (4, 6), (0, 1)), [(4, 1)],
                                   "stablehlo.broadcast_in_dim"),
    "reshape_merge": Case(lambda a: a.reshape(2048), [(2, 1024)], "stablehlo.reshape"),
    "reshape_split": Case(lambda a: a.reshape(16, 4, 64), [(16, 256)], "stablehlo.reshape"),
    "reshape_gcd": Case(lambda a: a.reshape(4, 12), [(8, 6)], "stablehlo.reshape"),
    "reshape_gcd_three_dims": Case(lambda a: a.reshape(8, 15), [(4, 6, 5)], "stablehlo.reshape"),
    "reshape_gcd_minor_first": Case(lambda a: a.reshape(6, 4), [(2, 12)], "stablehlo.reshape"),
    "reshape_gcd_uneven": Case(lambda a: a.reshape(4, 6), [(6, 4)], "stablehlo.reshape"),
    "reshape_flatten_batch_seq": Case(lambda a: a.reshape(8 * 16, 32), [(8, 16, 32)], "stablehlo.reshape"),
    "reshape_flatten": Case(lambda a: a.reshape(24), [(4, 6)], "stablehlo.reshape"),
    "reshape_unit_dim": Case(lambda a: a.reshape(4, 1, 6), [(4, 6)], "stablehlo.reshape"),
    "squeeze": Case(lambda a: a.squeeze(1), [(4, 1, 6)], "stablehlo.reshape", "squeeze"),
    "expand_dims": Case(lambda a: lax.expand_dims(a, (1,)), [(4, 6)], "stablehlo.broadcast_in_dim",
                        "broadcast_in_dim"),
    "transpose": Case(lambda a: a.transpose(2, 0, 1), [(4, 6, 8)], "stablehlo.transpose"),
    "rev": Case(lambda a: jnp.flip(a, 1), [(4, 6)], "stablehlo.reverse"),
    # reductions
    "reduce_sum": Case(lambda a: a.sum(1), [(4, 6)], "stablehlo.reduce", "reduce_sum", [0, None]),
    "reduce_max": Case(lambda a: a.max(0), [(4, 6)], "stablehlo.reduce", "reduce_max", [0, None]),
    "reduce_sum_all": Case(lambda a: a.sum(), [(4, 6)], "stablehlo.reduce", "reduce_sum", [0, None]),
    "argmax": Case(lambda a: jnp.argmax(a, 1), [(16, 64)], "stablehlo.reduce", "argmax",
                   [0, None, None, None], [None, 0]),
    "argmin": Case(lambda a: jnp.argmin(a, 0), [(16, 64)], "stablehlo.reduce", "argmin",
                   [0, None, None, None], [None, 0]),
    "cumsum": Case(lambda a: jnp.cumsum(a, 1), [(4, 6)], "stablehlo.reduce_window", "cumsum", [0, None]),
    "cummax": Case(lambda a: lax.cummax(a, axis=1), [(4, 6)], "stablehlo.reduce_window", "cummax", [0, None]),
    "reduce_window_sum": Case(lambda x: lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"),
                              [(2, 8, 8, 4)], "stablehlo.reduce_window", "reduce_window_sum", [0, None]),
    "reduce_window_max": Case(_maxpool, [(2, 8, 8, 4)], "stablehlo.reduce_window", "reduce_window_max",
                              [0, None]),
    "select_and_scatter_add": Case(lambda x, g: jax.vjp(_maxpool, x)[1](g)[0], [(2, 8, 8, 4), (2, 4, 4, 4)],
                                   "stablehlo.select_and_scatter", "select_and_scatter_add", [1, 0, None]),
    # sort / top-k
    "sort": Case(lambda a: jnp.sort(a, 1), [(4, 6)], "stablehlo.sort"),
    "sort_two_operands": Case(lambda k, v: lax.sort((k, v), dimension=0, num_keys=1), [(4, 6), (4, 6)],
                              "stablehlo.sort"),
    # slicing / concatenation
    "concatenate": Case(lambda a, b: jnp.concatenate([a, b], 1), [(4, 6), (4, 2)], "stablehlo.concatenate"),
    "pad": Case(lambda a: jnp.pad(a, ((0, 0), (1, 1))), [(4, 6)], "stablehlo.pad", "pad"),
    "pad_interior": Case(lambda a: lax.pad(a, 0.0, ((0, 0, 0), (0, 0, 1))), [(4, 6)], "stablehlo.pad", "pad"),
    "slice": Case(lambda a: a[:, 1:5], [(4, 6)], "stablehlo.slice", "slice"),
    "slice_strided": Case(lambda a: a[:, ::2], [(4, 6)], "stablehlo.slice", "slice"),
    "dynamic_slice": Case(lambda a, i: lax.dynamic_slice(a, (0, i), (4, 3)), [(4, 6), ()],
                          "stablehlo.dynamic_slice", "dynamic_slice", dtypes=[F32, I32]),
    "dynamic_update_slice": Case(lambda a, u, i: lax.dynamic_update_slice(a, u, (0, i)), [(4, 6), (4, 3), ()],
                                 "stablehlo.dynamic_update_slice", "dynamic_update_slice", dtypes=[F32, F32, I32]),
    "dynamic_update_slice_whole_row": Case(lambda a, u, i: lax.dynamic_update_slice(a, u, (i, 0)),
                                           [(4, 6), (1, 6), ()], "stablehlo.dynamic_update_slice",
                                           "dynamic_update_slice", dtypes=[F32, F32, I32]),
    # gather / scatter
    "scatter_row_constant_index": Case(lambda a, u: a.at[2].set(u), [(4, 6), (6,)], "stablehlo.scatter", "scatter"),
    "gather_embedding": Case(lambda t, ids: t[ids], [(32, 8), (4, 6)], "stablehlo.gather", "gather",
                             dtypes=[F32, I32]),
    "gather_take_along": Case(lambda a, i: jnp.take_along_axis(a, i, axis=1), [(4, 6), (4, 3)],
                              "stablehlo.gather", "gather", dtypes=[F32, I32]),
    "scatter_add_embedding_grad": Case(lambda t, ids, u: t.at[ids].add(u), [(32, 8), (4, 6), (4, 6, 8)],
                                       "stablehlo.scatter", "scatter-add", dtypes=[F32, I32, F32]),
    "scatter_add_window": Case(lambda x, i, u: x.at[i, 0:16].add(u), [(8, 32), (), (16,)],
                               "stablehlo.scatter", "scatter-add", dtypes=[F32, I32, F32]),
    # convolutions
    "conv": Case(_conv(), [(2, 8, 8, 6), (3, 3, 6, 4)], "stablehlo.convolution"),
    "conv_strided": Case(_conv((2, 2)), [(2, 8, 8, 6), (3, 3, 6, 4)], "stablehlo.convolution"),
    "conv_depthwise": Case(_conv(groups=6), [(2, 8, 8, 6), (3, 3, 1, 6)], "stablehlo.convolution"),
    "conv_grouped": Case(_conv(groups=2), [(2, 8, 8, 6), (3, 3, 3, 4)], "stablehlo.convolution"),
    "conv_depthwise_weight_grad": Case(_conv_wgrad, [(2, 8, 8, 8), (2, 8, 8, 8)], "stablehlo.convolution",
                                       "conv_general_dilated"),
    # fft (the linear algebra lowers to LAPACK custom calls on CPU, which have no Shardy rule)
    "fft": Case(lambda a: jnp.fft.fft(a, axis=-1), [(4, 8)], "stablehlo.fft", "fft"),
    # random
    "rng_bit_generator": Case(lambda k: lax.rng_bit_generator(k, (4, 6))[1], [(4,)], "stablehlo.rng_bit_generator",
                              "rng_bit_generator", [0], [0, 1], dtypes=[jnp.uint32]),
}
