"""Kernels: what a ``pallas_call`` and a ``custom_partitioning`` op cost.

XLA sees a Pallas kernel as one custom call: the FLOPs and bytes it is told are the kernel's
``cost_estimate`` (``pl.CostEstimate``), and nothing of what the kernel keeps in its own
scratch memory reaches HBM (a flash-attention kernel never writes its [seq, seq] scores).
partex prices it the same way: FLOPs and HBM bytes from the ``cost_estimate`` where the kernel
has one, otherwise the FLOPs of its body counted once per grid step (a ``pl.when`` branch
counted whole: an upper bound for a causal kernel that skips blocks). Its memory is its
operands and results alone. A ``custom_partitioning`` op costs what the function it wraps
costs (its ``call`` jaxpr, the kernels inside it included).

Shared by both sides (through ``_facts``): imports nothing of partex; ``_facts`` registers
these with its own ``facts_of`` passed in (each eqn of a body counted as a traced op of that
primitive is).
"""

from __future__ import annotations

import math
from typing import Any

# Primitives of a kernel body that move data between a kernel's refs and its registers, or
# read the grid: no FLOPs (XLA's count of a kernel is its cost estimate's, and partex's
# body count is the arithmetic on the loaded blocks).
_KERNEL_MEMORY = frozenset({
    "get", "swap", "addupdate", "load", "masked_load", "store", "masked_swap", "program_id",
    "num_programs", "multiple_of", "dma_start", "dma_wait", "semaphore_signal", "semaphore_wait",
    "semaphore_read", "barrier", "delay", "run_state", "get_barrier_semaphore", "device_id",
})


def _shape(var) -> tuple[int, ...]:
    shape = getattr(var.aval, "shape", ())
    try:
        return tuple(int(s) for s in shape)
    except TypeError:  # a dynamic dim: counted as 1
        return tuple(int(s) if isinstance(s, int) else 1 for s in shape)


def _sub_jaxprs(params) -> list:
    out = []
    for v in params.values():
        if hasattr(v, "eqns"):  # a Jaxpr
            out.append(v)
        elif hasattr(v, "jaxpr") and hasattr(v.jaxpr, "eqns"):  # a ClosedJaxpr
            out.append(v.jaxpr)
        elif isinstance(v, (tuple, list)):
            out += [b.jaxpr if hasattr(b, "jaxpr") else b for b in v if hasattr(b, "eqns") or hasattr(b, "jaxpr")]
    return out


def jaxpr_flops(jaxpr, facts_of) -> float:
    """FLOPs of one run of ``jaxpr`` as partex counts a traced op's (``facts_of``: a
    primitive's cost facts): loops by their trip counts (a ``while``'s body once), a branch
    by its costliest arm, calls inlined."""
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in _KERNEL_MEMORY:
            continue
        facts = facts_of(name)
        subs = _sub_jaxprs(eqn.params) if name not in ("pallas_call", "custom_partitioning") else []
        if name == "cond":
            total += max((jaxpr_flops(b, facts_of) for b in subs), default=0.0)
        elif subs:
            trips = int(eqn.params.get("length", 1)) if name == "scan" else 1
            total += trips * sum(jaxpr_flops(b, facts_of) for b in subs)
        else:
            total += facts.flops(eqn.params, [_shape(v) for v in eqn.invars], [_shape(v) for v in eqn.outvars])
    return total


def _estimate(params) -> Any:
    return params.get("cost_estimate")


def _grid_steps(params) -> int:
    grid = getattr(params.get("grid_mapping"), "grid", ()) or ()
    return int(math.prod(int(g) if isinstance(g, int) else 1 for g in grid))


def pallas_flops(params, ins, outs, facts_of) -> float:
    """The kernel's cost estimate (FLOPs plus transcendentals, as XLA counts them), else
    its body's FLOPs once per grid step."""
    est = _estimate(params)
    if est is not None:
        return float(est.flops) + float(est.transcendentals)
    body = params.get("jaxpr")
    return _grid_steps(params) * jaxpr_flops(body, facts_of) if body is not None else 0.0


def pallas_hbm_bytes(params) -> float:
    """The bytes the kernel's cost estimate says it reads and writes (0: none given; the
    operands' and results' own bytes are counted anyway)."""
    est = _estimate(params)
    return float(est.bytes_accessed) if est is not None else 0.0


def call_flops(params, ins, outs, facts_of) -> float:
    """A ``custom_partitioning`` op: the FLOPs of the function it wraps."""
    call = params.get("call")
    return jaxpr_flops(call, facts_of) if call is not None else 0.0


def call_hbm_bytes(params) -> float:
    """A ``custom_partitioning`` op: its kernels' estimated bytes (0 where none says)."""
    call = params.get("call")
    if call is None:
        return 0.0
    total = 0.0
    stack = [call]
    while stack:
        j = stack.pop()
        for eqn in j.eqns:
            if eqn.primitive.name == "pallas_call":
                total += pallas_hbm_bytes(eqn.params)
            else:
                stack += _sub_jaxprs(eqn.params)
    return total


def ragged_dot_flops(params, ins, outs) -> float:
    """``ragged_dot_general`` as a grouped kernel runs it (TPU megablox, GPU): each row of its
    ragged dim multiplies with its own group's weight, 2 m k n whichever of the three forms
    (forward, and the two gradients): sqrt(|lhs| |rhs| |out| / groups) is m k n for each."""
    groups = ins[2][0] if len(ins) > 2 and ins[2] else 1
    size = math.prod(ins[0]) * math.prod(ins[1]) * math.prod(outs[0]) / max(groups, 1)
    return 2.0 * math.sqrt(size)


def ragged_dot_cpu_flops(params, ins, outs) -> float:
    """XLA:CPU lowers ``ragged_dot_general`` densely: every row against every group's weight,
    masked (groups times the grouped kernel's FLOPs)."""
    groups = ins[2][0] if len(ins) > 2 and ins[2] else 1
    return groups * ragged_dot_flops(params, ins, outs)
