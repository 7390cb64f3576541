"""Pricing: the seconds of one kernel and of one collective on the hardware.

Without a profile a kernel costs its roofline: the larger of its FLOPs at the hardware's
peak and its bytes at the peak bandwidth, and a collective its ring (alpha-beta) time over
the slowest link of its axes. With a profile (``Hardware.profile``, ``partex calibrate``) a
matmul or conv costs what the profile measured for a kernel of its local shape and dtype,
a memory-bound kernel what the profile measured for its bytes, each kernel the profile's
floor besides; an op fused into another's kernel (no bytes of its own) costs only its
FLOPs; a collective costs the profile's time for its kind, devices and bytes where measured
and the mesh gives its axes no bandwidths of their own (then the links are the mesh's:
ring time).

Pricing side: imports ``_records``, ``_shardings``, ``_kinds`` and the hardware type.
"""

from __future__ import annotations

import math
from .._mesh import Hardware
from ._kinds import CollectiveKind
from ._records import Pattern, Tables
from ._shardings import prod


def kernel_seconds(hw: Hardware, pat: Pattern, fax, axis_size: dict[str, int], flops: float,
                   nbytes: float) -> float:
    """Seconds of one execution of a pattern's op per device: ``flops`` and ``nbytes`` its
    share (FLOPs; bytes read and written), ``fax`` the mesh axes of each of its factors."""
    prof = hw.profile
    if prof is None:
        return max(flops / hw.peak_flops, nbytes / hw.hbm_bandwidth)
    c = pat.contraction
    if c is not None and flops > 0:
        def local(factors) -> int:
            return math.prod(max(1, pat.factors[f][1] // prod(axis_size, fax[f])) for f in factors)

        return prof.gemm_time(c.dtype, local(c.batch), local(c.m), local(c.n), local(c.k), flops) + prof.kernel_floor
    if nbytes <= 0:  # computed inside another op's kernel
        return flops / hw.peak_flops
    return max(flops / hw.peak_flops, prof.memory_time(nbytes)) + prof.kernel_floor


def copy_seconds(hw: Hardware, nbytes: float) -> float:
    """Seconds of a kernel that copies ``nbytes`` (reads them and writes them again)."""
    if nbytes <= 0:
        return 0.0
    if hw.profile is None:
        return 2 * nbytes / hw.hbm_bandwidth
    return hw.profile.memory_time(2 * nbytes) + hw.profile.kernel_floor


def collective_seconds(t: Tables, kind: CollectiveKind, axes: tuple[str, ...], nbytes: float) -> float:
    """Seconds of one collective over ``axes`` moving ``nbytes`` per device (the larger of
    the buffer before and after); a host transfer's over the host link."""
    if kind is CollectiveKind.HOST_TRANSFER:  # a copy to or from host memory, over the host link
        return t.hw.host_seconds(nbytes) if nbytes else 0.0
    axis_size = t.axis_size
    n = prod(axis_size, axes)
    if n <= 1:
        return 0.0
    prof = t.hw.profile
    if prof is not None and t.mesh.bandwidth is None:
        measured = prof.collective_time(kind.value, n, nbytes)
        if measured is not None:
            return measured
    bw = min(t.axis_bw[a] for a in axes)
    lat = sum(t.axis_lat[a] * (axis_size[a] - 1) for a in axes)
    k = kind.ring_passes
    return k * (n - 1) / n * nbytes / bw + k * lat
