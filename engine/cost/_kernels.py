"""Kernels: what a ``pallas_call`` and a ``custom_partitioning`` op cost.

XLA sees a Pallas kernel as one custom call: the FLOPs and bytes it is told are the kernel's
``cost_estimate`` (``pl.CostEstimate``), and nothing of what the kernel keeps in its own
scratch memory reaches HBM (a flash-attention kernel never writes its [seq, seq] scores).
partex prices it the same way: FLOPs and HBM bytes from the ``cost_estimate`` where the kernel
has one, otherwise the FLOPs of its body counted once per grid step (a ``pl.when`` branch
counted whole: an upper bound for a causal kernel that skips blocks). Its memory is its
operands and results alone. A ``custom_partitioning`` op costs what the function it wraps
costs (its ``call`` jaxpr, the kernels inside it included).

A kernel's memory beyond its operands and results is its workspace (``Workspace``): what
the op holds in device memory for itself. A ``custom_partitioning`` op's body writes
buffers of its own to memory (the Pallas flash-attention kernels' softmax statistics,
written and read lane-broadcast as [batch, heads, seq, 128]). XLA:CPU runs a Pallas kernel
in Pallas' HLO interpreter: a loop over the grid whose state holds a copy of each operand
(made as soon as the operand is ready: XLA:CPU's default scheduler starts an op then), its
results (copies of a constant, made at the step's start) and the kernel's scratch, and
slices one block of each per step. XLA:CPU's ``ragged_dot_general`` is JAX's dense rollout:
the ragged operands broadcast over the groups and masked.

Shared by both sides (through ``_facts``): imports nothing of partex; ``_facts`` registers
these with its own ``facts_of`` passed in (each eqn of a body counted as a traced op of that
primitive is).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

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


class Workspace(NamedTuple):
    """An op's workspace. ``scaled``: held while the op runs, per part (operand index, or
    -1 - j for result j; bytes per byte of it as the op holds it per device: the workspace
    shards as the op's operands do), and ``fixed`` bytes (per device whatever the plan).
    ``early``, scaled alike: parts made before the op runs, because XLA:CPU's default
    scheduler starts an op as soon as its operands are ready: a part sized by operand i is
    made when that operand is and held through the op (an interpreted kernel's copy of it);
    one sized by result j is made at the step's start (the copy of a constant an
    interpreted kernel's loop starts from) and becomes the result when the op runs."""

    scaled: tuple[tuple[int, float], ...] = ()
    fixed: float = 0.0
    early: tuple[tuple[int, float], ...] = ()
    # operands an XLA:CPU loop copies into its state (``early``, one byte per byte), unless it
    # can take the operand's own buffer: one the op reads resharded (a copy already), or an
    # intermediate that nothing reads after the op
    copies: tuple[int, ...] = ()
    # parts XLA computes once for every op that computes them alike (its CSE): (operand
    # index, a token naming how the part is made, the operand indices it is made from); one
    # buffer, from the first such op through the last
    common: tuple[tuple[int, Any, tuple[int, ...]], ...] = ()


NO_WORKSPACE = Workspace()

# Call primitives whose body runs inline in the caller's: their values are the caller's.
_INLINED = frozenset({"custom_vjp_call", "custom_vjp_call_jaxpr", "custom_jvp_call", "jit", "pjit", "closed_call",
                      "core_call", "remat", "checkpoint"})


def _aval_bytes(aval) -> float:
    aval = getattr(aval, "inner_aval", aval)  # a kernel's Ref: its array
    dtype = getattr(aval, "dtype", None)
    size = getattr(dtype, "itemsize", 4) if dtype is not None else 0
    return float(math.prod(_shape_of(aval)) * size)


def _shape_of(aval) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in getattr(aval, "shape", ()))
    except TypeError:
        return tuple(int(s) if isinstance(s, int) else 1 for s in getattr(aval, "shape", ()))


def _inner(eqn):
    """The jaxpr an inlined call runs (``_INLINED``), or None."""
    if eqn.primitive.name not in _INLINED:
        return None
    for k in ("call_jaxpr", "jaxpr", "fun_jaxpr"):
        j = eqn.params.get(k)
        if j is not None and (hasattr(j, "eqns") or hasattr(getattr(j, "jaxpr", None), "eqns")):
            return j
    return None


def _flat_eqns(jaxpr, env: dict, out: list) -> None:
    """The body's eqns with nested calls inlined, as (primitive, params, operands, results);
    a value named by its variable in the body that makes it (``env``: an inlined body's
    variable -> the caller's)."""
    closed = jaxpr if hasattr(jaxpr, "consts") and hasattr(jaxpr, "jaxpr") else None
    j = closed.jaxpr if closed is not None else jaxpr
    for eqn in j.eqns:
        ins = [env.get(v, v) if not _is_literal(v) else None for v in eqn.invars]
        sub = _inner(eqn)
        if sub is None:
            out.append((eqn.primitive.name, eqn.params, ins, list(eqn.outvars)))
            continue
        sj = sub.jaxpr if hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns") else sub
        n = len(sj.invars)
        inner = dict(zip(sj.invars, ins[len(ins) - n:]))  # (leading consts of a custom_vjp_call: its own)
        _flat_eqns(sj, inner, out)
        for o, io in zip(eqn.outvars, sj.outvars):
            env[o] = None if _is_literal(io) else inner.get(io, io)


def _is_literal(v) -> bool:
    return not hasattr(v, "count") and hasattr(v, "val")


class CallBuffers(NamedTuple):
    """What a call body holds beyond its operands and results (``call_workspace``), in its
    traced (unsharded) bytes."""

    peak: float  # the most at once while the call runs
    ready: dict[int, float]  # operand index -> bytes made as soon as that operand is ready
    inits: float  # bytes made at the step's start (XLA:CPU's kernels' results)


def _origins(eqns, invars, facts_of) -> dict:
    """Per body value computed by fusible ops from the call's operands alone: the operand
    indices it comes from (a broadcast of one operand: that one)."""
    origin: dict = {v: frozenset((k,)) for k, v in enumerate(invars)}
    for name, _, ins, outs in eqns:
        if not facts_of(name).fusible:
            continue
        operands = [v for v in ins if v is not None]
        if operands and all(v in origin for v in operands):
            for o in outs:
                origin[o] = frozenset().union(*(origin[v] for v in operands))
    return origin


def call_workspace(call, facts_of, cpu: bool) -> CallBuffers:
    """A call body's own buffers (a ``custom_partitioning`` op's, as traced: unsharded):
    each value made inside it that XLA writes to memory (made by an op no fusion computes,
    or read by one that is no fusion: a kernel's operands and results), from its eqn to its
    last read. On XLA:CPU (``cpu``) each Pallas kernel runs interpreted
    (``pallas_workspace``): its copy of an operand computed from one of the call's operands
    alone (fused into the copy) is made as soon as that operand is ready, the others' while
    it runs, and its results' buffers at the step's start."""
    eqns: list = []
    _flat_eqns(call, {}, eqns)
    j = call.jaxpr if hasattr(call, "jaxpr") and hasattr(call.jaxpr, "eqns") else call
    outer = {v for v in (*j.invars, *j.outvars) if not _is_literal(v)}
    origin = _origins(eqns, j.invars, facts_of) if cpu else {}
    last: dict = {}
    unfused: set = set()
    kernel_only: dict = {}  # value -> read by kernels alone
    for k, (name, _, ins, _) in enumerate(eqns):
        reader = facts_of(name).fusion_reader
        for v in ins:
            if v is not None:
                last[v] = k
                kernel_only[v] = kernel_only.get(v, True) and name == "pallas_call"
                if not reader:
                    unfused.add(v)
    live = peak = inits = 0.0
    ready: dict[int, float] = {}
    dying: dict[int, float] = {}
    for k, (name, params, ins, outs) in enumerate(eqns):
        for o in outs:
            if o in outer or o not in last:
                continue
            if cpu and o in origin and kernel_only.get(o):  # the interpreted kernels' copies are it
                continue
            if not facts_of(name).fusible or o in unfused:
                size = _aval_bytes(o.aval)
                live += size
                dying[last[o]] = dying.get(last[o], 0.0) + size
        extra = 0.0
        if cpu and name == "pallas_call":
            w = pallas_workspace(params, len(ins), len(outs))
            extra = w.fixed
            for i, _ in w.early:
                size = _slot_bytes(i, ins, outs)
                src = origin.get(ins[i]) if i >= 0 else None
                if i < 0:
                    inits += size
                elif src is not None and len(src) == 1:
                    (at,) = src
                    ready[at] = ready.get(at, 0.0) + size
                else:
                    extra += size
        peak = max(peak, live + extra)
        live -= dying.pop(k, 0.0)
    return CallBuffers(peak, ready, inits)


def _slot_bytes(slot: int, ins, outs) -> float:
    v = ins[slot] if slot >= 0 else outs[-1 - slot]
    return _aval_bytes(v.aval) if v is not None else 0.0


def pallas_workspace(params, n_in: int, n_out: int) -> Workspace:
    """XLA:CPU's interpreted Pallas kernel (``pallas_call_hlo_interpret``) of ``n_in``
    operands and ``n_out`` results: a loop whose state holds a copy of each operand (made as
    soon as the operand is ready) and the kernel's scratch, with one block of each operand
    and result sliced per grid step; its results' buffers are the loop's state, copies of
    their initial value (a constant) made at the step's start."""
    gm = params.get("grid_mapping")
    fixed = sum(_aval_bytes(a) for a in getattr(gm, "scratch_avals", ()) or ())
    fixed += sum(_aval_bytes(getattr(bm, "block_aval", None)) for bm in getattr(gm, "block_mappings", ()) or ())
    return Workspace((), fixed, tuple((i, 1.0) for i in range(n_in)) + tuple((-1 - j, 1.0) for j in range(n_out)),
                     tuple(range(n_in)))


def _largest(in_bytes) -> int:
    return max(range(len(in_bytes)), key=lambda i: in_bytes[i]) if in_bytes else -1


def pallas_op_workspace(params, ins, in_bytes, out_bytes, cpu: bool) -> Workspace:
    """A ``pallas_call`` op: none where it runs as a kernel (its scratch is on chip); on
    XLA:CPU the interpreter's loop state (``pallas_workspace``)."""
    return pallas_workspace(params, len(in_bytes), len(out_bytes)) if cpu else NO_WORKSPACE


def call_op_workspace(params, ins, in_bytes, out_bytes, cpu: bool, facts_of) -> Workspace:
    """A ``custom_partitioning`` op: its body's own buffers (``call_workspace``; on XLA:CPU
    its kernels interpreted), in bytes per byte of its largest operand (each device runs the
    body on its shards; a part made when an operand is ready: per byte of that operand; the
    kernels' results made at the step's start: per byte of the op's first result)."""
    call = params.get("call")
    k = _largest(in_bytes)
    if call is None or k < 0 or not in_bytes[k]:
        return NO_WORKSPACE
    b = call_workspace(call, facts_of, cpu)
    early = tuple((i, size / in_bytes[i]) for i, size in sorted(b.ready.items()) if in_bytes[i])
    if b.inits and out_bytes and out_bytes[0]:
        early += ((-1, b.inits / out_bytes[0]),)
    return Workspace(((k, b.peak / in_bytes[k]),) if b.peak > 0 else (), 0.0, early)


def ragged_dot_workspace(params, ins, in_bytes, out_bytes, cpu: bool) -> Workspace:
    """``ragged_dot_general`` on XLA:CPU (JAX's dense rollout, ``_ragged_dot_general_impl``):
    the lhs broadcast over the groups and masked, and for a ragged contracting dim (a
    weight's gradient) the rhs too; none on TPU and GPU (a grouped kernel)."""
    if not cpu:
        return NO_WORKSPACE
    dn = params.get("ragged_dot_dimension_numbers")
    ragged = tuple(getattr(dn, "lhs_ragged_dimensions", ()) or ())
    (l_contract, r_contract), (l_batch, _) = getattr(dn, "dot_dimension_numbers", (((), ()), ((), ())))
    if not ragged or ragged[0] in tuple(l_batch):
        return NO_WORKSPACE
    groups = ins[2][-1] if len(ins) > 2 and ins[2] else 1
    # each expanded operand: along its ragged dim, by the group sizes (a weight's gradient
    # expands the forward's lhs again, as the forward did: one buffer)
    dims = {0: ragged[0]}
    if ragged[0] in tuple(l_contract):
        dims[1] = tuple(r_contract)[tuple(l_contract).index(ragged[0])]
    return Workspace(tuple((i, float(groups)) for i in dims),
                     common=tuple((i, ("ragged", d), (i, 2)) for i, d in dims.items()))
