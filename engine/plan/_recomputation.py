"""Recomputation and offloading, as apply binds them (``constrained_function``'s ``recompute``
and ``host_state``).

A ``CopyPlan`` recomputes forward values before the backward op ``at`` that needs them: the
saved values it reads (and the weights, and the backward values it waits for) pass through
one ``jax.lax.optimization_barrier``, its forward ops are bound again on the barrier's
results, and every later read of a recomputed value or a weight takes the new one. The
barrier keeps XLA from CSE-ing the recomputation (or the weight's reshard) with the
forward's, and from starting it before the backward pass reaches it. A ``LoopPlan`` does
the same for layers under ``scan`` (``LoopUnit``). An offloaded residual is copied to host
memory where it is made and back at ``at``; an argument in host memory is copied to the
device where the step first reads it.

``Recomputation`` holds the plan's tables, built once; ``SavedValues`` what one trace of the
step has saved and recomputed so far, a fresh one per trace.

XLA:CPU expands optimisation barriers early and runs CSE after, so on CPU the barrier alone
does not keep a recomputation apart from the forward's: there the values it reads are made
distinct (``_distinct_leaves``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Collection, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from ..analysis._recompute import LoopPlan, shard_map_spans
from ..tracing._jax import jcore
from ..tracing._program import Program
from ._plan_constraints import Constraints
from ._promote import widen

__all__ = ["LoopUnit", "Recomputation", "SavedValues", "to_device", "to_host"]

# bind(eqn, op_id, invals): an eqn's outputs, bound again as apply binds an op, in the eqn's context
Bind = Callable[[Any, int, list], list]


def to_host(x):
    """A copy of ``x`` in host memory (an offloaded residual)."""
    return jax.device_put(x, jax.memory.Space.Host)


def to_device(x):
    """``x`` back in device memory."""
    return jax.device_put(x, jax.memory.Space.Device)


@dataclasses.dataclass(slots=True)
class SavedValues:
    """One trace's recomputation state: what it has saved, recomputed and copied so far."""

    pending: dict[int, list]  # the recomputations ahead, by the op they run before
    eqns: dict[int, Any] = dataclasses.field(default_factory=dict)  # forward ops a recomputation binds again
    made: dict[int, Any] = dataclasses.field(default_factory=dict)  # the values a recomputation reads, as made
    recomputed: dict[int, Any] = dataclasses.field(default_factory=dict)  # recomputed (and offloaded) values, back
    # weight -> (its value re-taken for the backward pass, the last op reading that one)
    retaken: dict[int, tuple[Any, int]] = dataclasses.field(default_factory=dict)
    # forward loop's enter op -> (its new stacked outputs, its xs operands' leaves: (value, operand))
    loop_saved: dict[int, tuple] = dataclasses.field(default_factory=dict)
    on_host: dict[int, Any] = dataclasses.field(default_factory=dict)  # offloaded values' host copies
    on_device: dict[int, Any] = dataclasses.field(default_factory=dict)  # host arguments' device copies


class Recomputation:
    """The plan's recomputations (``plans``: ``CopyPlan``s and ``LoopPlan``s) and the state
    it keeps in host memory (``host_state``: argument and result value ids), applied as the
    interpreter evaluates the step. ``bind`` binds a forward op again (the interpreter's);
    ``input_specs`` are the specs of the inputs a recomputation re-takes."""

    def __init__(self, program: Program, plans: Sequence[Any], host_state: Collection[int], constraints: Constraints,
                 input_specs: Mapping[int, PartitionSpec] | None, promote: bool, bind: Bind):
        self.program = program
        self.constraints = constraints
        self.bind = bind
        self.promote = promote
        # XLA:CPU expands optimisation barriers early and runs CSE after: there the saved
        # values a recomputation reads are made distinct from the forward's (_distinct)
        mesh = constraints.mesh
        self.cpu = isinstance(mesh, jax.sharding.Mesh) and mesh.devices.flat[0].platform == "cpu"
        host_state = set(host_state)
        self.host_args = host_state & set(program.inputs)  # copied to the device at their first read
        self.host_outs = [k for k, v in enumerate(program.outputs) if v in host_state]
        loops = [lp for lp in plans if isinstance(lp, LoopPlan)]
        copies = [cp for cp in plans if not isinstance(cp, LoopPlan)]
        self.copies = tuple(cp for cp in copies if cp.at >= 0)
        self.loops_f = {lp.forward: lp for lp in loops}  # scan units, by their forward loop's enter op
        self.loops_b = {lp.backward: lp for lp in loops}  # ... and by their backward loop's
        self.input_specs = dict(input_specs or {})
        self.ops = {o for cp in (*copies, *loops) for o in cp.ops}  # the forward ops bound again
        self.keep = {v for cp in copies for v in (*cp.leaves, *cp.weights, *cp.anchors)} \
            | {v for lp in loops for v in lp.leaves}  # the values a recomputation reads
        # ``offload``: residuals copied to host memory where they are made, back at ``at``
        self.to_host = {v for cp in self.copies for v in cp.offloaded}
        self.keep |= self.to_host
        self.trace = self.start()

    def start(self) -> SavedValues:
        """A fresh trace: the recompute points ahead, nothing saved or recomputed yet."""
        pending: dict[int, list] = {}
        for cp in self.copies:
            pending.setdefault(cp.at, []).append(cp)
        self.trace = SavedValues(pending)
        return self.trace

    def made(self, vid: int, x) -> None:
        """Value ``vid`` (one the recomputation reads) is made as ``x``: kept, and copied to
        host memory if it is offloaded."""
        self.trace.made[vid] = x
        if vid in self.to_host:
            self.trace.on_host[vid] = to_host(x)

    def on_device(self, vid: int, x):
        """The device copy of argument ``vid``, in host memory as ``x``: made once, where
        the step first reads it, with the argument's value spec."""
        on_device = self.trace.on_device
        y = on_device.get(vid)
        if y is None:
            y = to_device(x)
            spec = self.constraints.value_specs.get(vid)
            if spec is not None:
                y = self.constraints.place(y, spec, f"argument {vid} copied from host memory")
            y = on_device[vid] = y
        return y

    def kept(self, vid: int):
        """A value a recomputation or loop reads as it was made (an argument in host memory:
        its device copy)."""
        return self.trace.on_device.get(vid, self.trace.made[vid])

    def recompute(self, plans) -> None:
        """Bind the forward ops of ``plans`` again, on their saved values passed through one
        optimisation barrier; later reads take the recomputed values and the re-taken weights."""
        specs, place, trace = self.constraints.value_specs, self.constraints.place, self.trace
        for cp in plans:
            for v in cp.offloaded:  # back from host memory for the backward pass (and the recomputation)
                spec = specs.get(v)
                back = to_device(trace.on_host[v])
                trace.recomputed[v] = place(back, spec, f"offloaded value {v}") if spec is not None else back
            names = list(dict.fromkeys((*cp.leaves, *cp.weights, *cp.anchors)))
            xs = [trace.recomputed[v] if v in trace.recomputed else
                  trace.retaken[v][0] if v in trace.retaken else self.kept(v) for v in names]
            ys = jax.lax.optimization_barrier(tuple(xs))
            if self.cpu:
                ys = _distinct_leaves(cp, names, ys)
            local = {}
            for v, y in zip(names, ys):
                spec = specs.get(v) or self.input_specs.get(v)
                local[v] = place(y, spec, f"saved value {v}") if spec is not None else y
            for w in cp.weights:
                trace.retaken[w] = (local[w], cp.until)
            self.rebind(cp.ops, local)
            for v in cp.recomputed:
                trace.recomputed[v] = local[v]

    def rebind(self, ops, local: dict) -> None:
        """Bind the forward ops ``ops`` again, in order, on the values in ``local`` (by value
        id; the step's constants otherwise); their results, constrained, go to ``local``."""
        program, specs, place = self.program, self.constraints.value_specs, self.constraints.place
        # a shard_map region is bound whole with its enter op: its results are the exit's
        regions = (shard_map_spans(program, ops[0], ops[-1] + 1) or {}) if ops else {}
        skip = -1
        for o in ops:
            if o <= skip:
                continue
            results = program.ops[o].outputs
            if o in regions:
                skip = regions[o]
                results = program.ops[skip].outputs
            eqn = self.trace.eqns[o]
            invals = []
            for a in eqn.invars:
                if isinstance(a, jcore.Literal):
                    invals.append(widen(a.val) if self.promote else a.val)
                    continue
                vid = program.var_ids[id(a)]
                x = local.get(vid)
                if x is None:  # a constant of the step
                    x = program.constants[vid]
                    x = widen(x) if self.promote else x
                invals.append(x)
            outs = self.bind(eqn, o, invals)
            for vid, x in zip(results, outs):
                spec = specs.get(vid)
                local[vid] = place(x, spec, f"recomputed value {vid}") if spec is not None else x

    def loop_leaves(self, lp: LoopPlan, carry, xs, extra) -> dict:
        """In the backward loop's body: the values the recomputation reads (``xs``: the
        loop's own slices; ``extra``: those of the values the forward loop stacked for it and
        of its xs operands), through one optimisation barrier with the loop's carry (the
        cotangent it waits for)."""
        names = [*lp.stacked, *(v for v, _ in self.trace.loop_saved[lp.forward][1])]
        vals = [to_device(x) if k in lp.host_stacked else x for k, x in enumerate(extra)]
        ncarry = self.program.ops[lp.backward].params["num_carry"]
        for v, i in lp.reuse:
            names.append(v)
            vals.append(xs[i - ncarry])
        consts = [v for v in lp.leaves if v not in names]
        names += consts
        vals += [self.kept(v) for v in consts]  # the forward loop's consts, as it read them
        ys = jax.lax.optimization_barrier((tuple(vals), tuple(carry)))[0]
        specs, place = self.constraints.value_specs, self.constraints.place
        return {v: place(y, specs[v], f"saved value {v}") if specs.get(v) is not None else y
                for v, y in zip(names, ys)}


class LoopUnit:
    """A ``scan`` loop's part in a ``LoopPlan`` (none: every step an identity). The forward
    loop (``fwd``) stops stacking the residuals recomputed and stacks the values the
    recomputation reads instead (its xs operands' among them); every iteration of the
    backward loop (``bwd``) binds the forward body's ops again on their slices, through a
    barrier with its carry, before its own body. Stacks kept in host memory are copied there
    as they are stacked and back as they are sliced."""

    def __init__(self, rc: Recomputation, enter_id: int, ncarry: int, xs: list):
        self.rc = rc
        self.enter_id = enter_id
        self.ncarry = ncarry
        self.n_xs = len(xs)
        self.fwd, self.bwd = rc.loops_f.get(enter_id), rc.loops_b.get(enter_id)
        self.xs_leaves: list = []  # set when fwd is not None, read only then
        self.fed: dict[int, int] = {}  # set when bwd is not None, read only then
        fwd, bwd = self.fwd, self.bwd
        if fwd is not None:  # leaves the backward loop slices again: of the forward loop's xs operands
            self.xs_leaves = [(v, xs[k - ncarry]) for k, v in enumerate(rc.program.ops[enter_id].outputs)
                              if k >= ncarry and v in fwd.leaves and v not in dict(fwd.reuse)]
        if bwd is not None:  # the residuals it recomputes are not stacked: their slices are made anew
            self.fed = {i - ncarry: v for i, v in bwd.feeds}

    def operands(self, xs: list) -> list:
        """The loop's xs operands: a backward loop's with the forward loop's new stacks."""
        if self.bwd is None:
            return xs
        stacked, xs_leaves = self.rc.trace.loop_saved[self.bwd.forward]
        return [x for x in xs if x is not None] + list(stacked) + [x for _, x in xs_leaves]

    def slices(self, carry, x):
        """An iteration's slices as its body reads them: a backward loop's, with the values
        it recomputes (from the slices of the forward loop's new stacks)."""
        bwd, fed, n_xs, ncarry = self.bwd, self.fed, self.n_xs, self.ncarry
        if bwd is None:
            return x
        if not bwd.ops:  # slices of stacks kept in host memory (nothing recomputed)
            return [to_device(y) if k + ncarry in bwd.host_in else y for k, y in enumerate(x)]
        it = iter(x[:n_xs - len(fed)])
        full = [None if k in fed else next(it) for k in range(n_xs)]
        full = [to_device(y) if k + ncarry in bwd.host_in else y for k, y in enumerate(full)]
        local = self.rc.loop_leaves(bwd, carry, full, x[n_xs - len(fed):])
        self.rc.rebind(bwd.ops, local)
        return [local[fed[k]] if k in fed else full[k] for k in range(n_xs)]

    def stacked(self, ys: list) -> list:
        """An iteration's outputs as the loop stacks them: a forward loop's without the
        residuals recomputed, with the values the recomputation reads."""
        fwd, rc = self.fwd, self.rc
        if fwd is None:
            return ys
        ys = [to_host(y) if j in fwd.host_ys else y for j, y in enumerate(ys)]
        return [y for j, y in enumerate(ys) if j not in fwd.dropped] + [
            to_host(rc.kept(v)) if k in fwd.host_stacked else rc.kept(v) for k, v in enumerate(fwd.stacked)]

    def outputs(self, ys: list, n_ys: int) -> list:
        """The loop's ``n_ys`` stacked outputs: a forward loop's dropped ones None (the
        backward loop makes them anew), its new stacks kept for the backward loop."""
        fwd = self.fwd
        if fwd is None:
            return ys
        made = iter(ys[:len(ys) - len(fwd.stacked)])
        self.rc.trace.loop_saved[self.enter_id] = (ys[len(ys) - len(fwd.stacked):], self.xs_leaves)
        return [None if j in fwd.dropped else next(made) for j in range(n_ys)]


# --------------------------------------------------------------------------- XLA:CPU

def _kind(x) -> str:
    """The numpy kind of ``x``'s dtype ("f", "i", "u", ...); "" for JAX's extended dtypes (a
    typed PRNG key's ``key<fry>``), which numpy cannot represent and arithmetic cannot touch."""
    if jnp.issubdtype(x.dtype, jax.dtypes.extended):
        return ""
    return np.dtype(x.dtype).kind


def _zero_of(x):
    """An integer zero computed from all of ``x`` that XLA cannot fold (``clamp(0, bits,
    0)``, reduced): NaN-safe, and nothing that reads it can run before ``x`` is made."""
    dtype = np.dtype(x.dtype)
    bits = jax.lax.bitcast_convert_type(x, np.dtype(f"int{8 * dtype.itemsize}")) if dtype.kind == "f" else x
    z = jax.lax.clamp(np.zeros((), bits.dtype), bits, np.zeros((), bits.dtype))
    return jax.numpy.max(z) if z.ndim else z


def _distinct(x, zero=None):
    """``x`` exactly, as a value XLA cannot prove equal to ``x``: plus an integer zero it
    cannot fold (``zero``, else ``clamp(0, bits, 0)`` of its own bits), so that CSE keeps a
    recomputation that reads it apart from the forward's (XLA:CPU runs CSE after expanding
    optimisation barriers) and, with ``zero`` from a backward value, the scheduler cannot
    start it before that value is made."""
    if _kind(x) not in ("f", "i", "u"):
        return x
    dtype = np.dtype(x.dtype)
    if dtype.kind == "f" and dtype.itemsize not in (2, 4, 8):
        return x
    if zero is None:
        bits = jax.lax.bitcast_convert_type(x, np.dtype(f"int{8 * dtype.itemsize}")) if dtype.kind == "f" else x
        zero = jax.lax.clamp(np.zeros((), bits.dtype), bits, np.zeros((), bits.dtype))
    return x + jax.lax.convert_element_type(zero, dtype)


def _distinct_leaves(cp, names, ys) -> list:
    """XLA:CPU: the values a recomputation (or a re-gather) reads, made distinct from the
    forward's and dependent on a backward value it waits for (``_distinct``), so that
    neither CSE nor the scheduler moves it back into the forward pass. The dependency is
    a scalar zero reduced from that value (a 4-byte all-reduce where it is sharded)."""
    got = dict(zip(names, ys))
    anchor = next((got[a] for a in cp.anchors if _kind(got[a]) in ("f", "i", "u")), None)
    zero = None if anchor is None else _zero_of(anchor)
    anchors = set(cp.anchors)
    return [y if v in anchors else _distinct(y, zero) for v, y in zip(names, ys)]
