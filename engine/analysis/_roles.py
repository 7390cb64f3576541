"""Roles from structure: which inputs are parameters, optimizer state and data, and which
named-dimension groups play the batch, tensor-parallel, vocabulary and expert roles.
``infer_roles`` reads a ``DimAnalysis`` and makes a ``Roles`` (both records in ``_types``).

Nothing here reads a label, a logical axis name or a pytree path: a user's Llama keyed
``wq``/``w_gate`` with no axis names gets the same roles as a demo model keyed ``heads``/
``ffn``. The rules, in the order they are computed:

- **Dependencies**: for every value, the set of input leaves it depends on (a forward pass
  over the program's ops, as bitsets over the input leaves). Loop bodies are flattened into
  the program between ``<loop>_enter``/``<loop>_exit`` pseudo-ops; their dataflow is mapped
  operand by operand (carry j feeds carry j), with the loop's back edge (body carry out j
  feeds body carry in j) iterated to a fixed point.
- **Mirror**: an output *mirrors* an input when it has the input's shape and dtype and
  depends on it: the updated parameters and optimizer state a training step returns.
  Outputs are matched in order, each to the first unmatched candidate input.
- **State inputs**: the mirrored inputs. **Parameters**: the state inputs on which the
  step's *non-state* outputs (the loss, metrics: outputs that mirror nothing) depend;
  **optimizer state**: the other state inputs. When there is no non-state output, or it
  depends on no state input, every state input is a parameter. **Data**: the inputs that
  are not state.
- **Forward ops**: the ancestors of the non-state outputs (all ops when there are none).
- **Weight**: a value that depends on some parameter and on no data input. A **param
  matmul** is a forward ``dot_general`` or ``conv_general_dilated`` with one weight operand
  and one operand that depends on data. Its *produced* groups are the weight's
  non-contracting dims that reach the result and are not carried by the activation; its
  *contracted* groups are the weight's contracting dims; its *batch* groups are the weight's
  dims shared with the activation and the result (the MoE expert matmul).
- **Batch groups**: for each data leaf, largest first, the group of its first dim that is
  decidable, carried by no state input and free of intra conflicts (fallback: the first
  decidable dim not carried by a state input); deduplicated, then sorted by group bytes,
  largest first, so that the bigger tensors keep the axis (a graph's edges before its
  nodes).
- **Expert groups**: groups carried by a parameter that are a batch group of a param
  matmul.
- **Pair groups** (Megatron's tensor-parallel pairs: attention heads, the FFN hidden dim, a
  plain MLP's hidden layer, a convnet's channels): groups some param matmul produces and some
  param matmul contracts, over which no other forward op sums (layer norms reduce over
  d_model, ``q·k`` contracts the head dim: both are excluded; a max over it, as an int8
  quantiser's scale takes, is an all-reduce of one number per row and does not count), and
  which are not experts.
- **Vocabulary-like groups**: groups a param matmul produces that no param matmul contracts,
  where that matmul contracts no pair group (a column-parallel matmul fed by a replicated
  activation: the LM head's vocabulary; the last matmul of an MLP contracts its pair group
  and its output is all-reduced instead), plus the indexed dims of an embedding table (a
  weight gathered with data-dependent indices: Megatron's vocab-parallel embedding); not
  experts. The rule sees one matmul at a time: a concatenate's dim is another named
  dimension (its factor needs replication and ties nothing), so the output channels of a
  U-Net block, joined to a skip connection's and contracted only after the join, match it
  too. They are column-parallel outputs as a vocabulary is, and the hand strategies shard
  them alike; but they are no vocabulary:
- **Joined groups**: the vocabulary-like groups that forward concatenates (through any
  chain of them) join into a dim some param matmul contracts (a U-Net's skip
  connections). A view names them for what they are.
- A pair or vocabulary group every tensor of which also holds a bigger group of those kinds
  is dropped: it could never take the model axis (the head dim of ``v`` and ``wo`` beside
  the heads).
- **Parameter bytes per group**: the bytes of the parameter leaves with a dim in each group.
"""

from __future__ import annotations

import collections
import dataclasses

from .._decisions import NO_DIM, GroupId
from ..tracing._program import OpId, Program, ValueId
from ._rules import FactorKind
from ._types import DimAnalysis, Roles

# Contractions whose weight operand makes a tensor-parallel matmul.
MATMUL_PRIMITIVES = frozenset({"dot_general", "conv_general_dilated"})
# Lookups whose indexed weight dims are an embedding's vocabulary.
GATHER_PRIMITIVES = frozenset({"gather"})
# Joins along a dim: the operands' dims there feed the result's (another named dimension).
CONCAT_PRIMITIVES = frozenset({"concatenate"})


# --------------------------------------------------------------------------- dataflow

def _flows(op) -> list[tuple[int, tuple[int, ...]]] | None:
    """For pseudo-ops: [(result index, operand indices it reads)]; None for "every result
    reads every operand" (ordinary ops)."""
    prim = op.primitive
    n_out = len(op.outputs)
    if prim in ("scan_enter", "while_enter", "shard_map_enter", "shard_map_exit"):
        return [(j, (j,)) for j in range(n_out)]
    if prim == "scan_exit":
        nc = op.params["num_carry"]
        ny = n_out - nc
        return [(j, (j, nc + ny + j) if j < nc else (j,)) for j in range(n_out)]
    if prim == "while_exit":
        return [(j, (j, n_out + j)) for j in range(n_out)]
    if prim == "cond_exit":
        b = op.params["branches"]
        return [(j, tuple(k * n_out + j for k in range(b))) for j in range(n_out)]
    if prim == "cond_enter":
        return []
    return None


def _loops(program: Program):
    """(enter op, exit op, number of carried values) of every scan / while region, and for
    every cond exit the predicate value its results depend on."""
    loops, cond_pred = [], {}
    for r in program.regions:
        if r.enter < 0 or r.exit < 0:
            continue
        enter, exit_ = program.ops[r.enter], program.ops[r.exit]
        if r.kind == "scan":
            loops.append((enter, exit_, enter.params["num_carry"]))
        elif r.kind == "while":
            loops.append((enter, exit_, len(enter.outputs)))
        elif r.kind == "cond" and enter.inputs:
            cond_pred[exit_.id] = enter.inputs[0]
    return loops, cond_pred


def dependencies(program: Program) -> list[int]:
    """Per value, a bitset (Python int) of the input leaves it depends on: bit k for
    ``program.inputs[k]``."""
    deps = [0] * len(program.values)
    for k, vid in enumerate(program.inputs):
        deps[vid] |= 1 << k
    loops, cond_pred = _loops(program)
    flows = [_flows(op) for op in program.ops]
    changed = True
    while changed:
        for op, fl in zip(program.ops, flows):
            if fl is None:
                m = 0
                for i in op.inputs:
                    m |= deps[i]
                for o in op.outputs:
                    deps[o] |= m
            else:
                extra = deps[cond_pred[op.id]] if op.id in cond_pred else 0
                for j, srcs in fl:
                    m = extra
                    for i in srcs:
                        m |= deps[op.inputs[i]]
                    deps[op.outputs[j]] |= m
        # the back edge: what a body carry becomes feeds the next iteration's carry
        changed = False
        for enter, exit_, nc in loops:
            for j in range(nc):
                new = deps[enter.outputs[j]] | deps[exit_.inputs[j]]
                if new != deps[enter.outputs[j]]:
                    deps[enter.outputs[j]] = new
                    changed = True
    return deps


def mirror_map(program: Program, deps: list[int] | None = None) -> dict[ValueId, ValueId]:
    """Output leaf -> the input leaf it mirrors: same shape and dtype, and the output depends
    on it. Outputs in order, each to the first unmatched candidate. Dtypes compare by name:
    numpy's ``dtype.str`` is ``<V1`` for int4 and every float8 alike."""
    deps = dependencies(program) if deps is None else deps
    candidates: dict[tuple, list[tuple[int, ValueId]]] = collections.defaultdict(list)
    for k, vid in enumerate(program.inputs):
        v = program.values[vid]
        candidates[(v.shape, str(v.dtype))].append((k, vid))
    used: set[ValueId] = set()
    mirror: dict[ValueId, ValueId] = {}
    for ovid in program.outputs:
        if ovid in mirror:
            continue  # one value returned twice mirrors once
        v = program.values[ovid]
        for k, ivid in candidates.get((v.shape, str(v.dtype)), ()):
            if ivid not in used and (deps[ovid] >> k) & 1:
                mirror[ovid] = ivid
                used.add(ivid)
                break
    return mirror


def state_inputs(program: Program) -> frozenset[ValueId]:
    """The input leaves some output mirrors (parameters and optimizer state)."""
    return frozenset(mirror_map(program).values())


def _forward_ops(program: Program, free_outputs: list[ValueId], deps, data_mask: int) -> frozenset[OpId]:
    """The forward pass: the ops the step's free outputs (loss, metrics) depend on. A metric
    of the gradients (a global norm, optax's clipping) depends on the whole backward pass
    too, so only the outputs made by the fewest ops count (the loss, and metrics of the
    forward pass: within 1.5x of the smallest); outputs that do not read the data (a norm of
    the params) never make a forward pass, nor do those that read no parameter or state (a
    count of the batch's target tokens, as MaxText reports it)."""
    if not free_outputs:
        return frozenset(op.id for op in program.ops)
    state_mask = ((1 << len(program.inputs)) - 1) & ~data_mask
    roots = ([o for o in free_outputs if deps[o] & data_mask and deps[o] & state_mask]
             or [o for o in free_outputs if deps[o] & data_mask] or free_outputs)
    sets = [_ancestor_ops(program, {o}) for o in roots]
    smallest = min(len(s) for s in sets)
    return frozenset().union(*(s for s in sets if len(s) <= 1.5 * smallest))


def _ancestor_ops(program: Program, roots: set[ValueId]) -> frozenset[OpId]:
    needed = [False] * len(program.values)
    for v in roots:
        needed[v] = True
    loops, cond_pred = _loops(program)
    flows = [_flows(op) for op in program.ops]
    ops: set[OpId] = set()
    changed = True
    while changed:
        for op, fl in zip(reversed(program.ops), reversed(flows)):
            if fl is None:
                if any(needed[o] for o in op.outputs):
                    ops.add(op.id)
                    for i in op.inputs:
                        needed[i] = True
                continue
            for j, srcs in fl:
                if needed[op.outputs[j]]:
                    ops.add(op.id)
                    for i in srcs:
                        needed[op.inputs[i]] = True
                    if op.id in cond_pred:
                        needed[cond_pred[op.id]] = True
        changed = False
        for enter, exit_, nc in loops:
            for j in range(nc):
                if needed[enter.outputs[j]] and not needed[exit_.inputs[j]]:
                    needed[exit_.inputs[j]] = True
                    changed = True
    return frozenset(ops)


# --------------------------------------------------------------------------- roles

@dataclasses.dataclass
class _Contractions:
    """What the forward param matmuls (and embedding lookups) do with their weights' groups."""

    matmuls: list[OpId] = dataclasses.field(default_factory=list)
    produced: dict[GroupId, list[OpId]] = dataclasses.field(default_factory=dict)  # by which matmuls
    contracted: set[GroupId] = dataclasses.field(default_factory=set)
    contracts: dict[OpId, set[GroupId]] = dataclasses.field(default_factory=dict)  # per matmul
    weight_batch: set[GroupId] = dataclasses.field(default_factory=set)
    embedding: set[GroupId] = dataclasses.field(default_factory=set)
    other_reduced: set[GroupId] = dataclasses.field(default_factory=set)  # by any other forward op
    # group -> the groups a forward concatenate along its dim joins it into
    concatenated: dict[GroupId, set[GroupId]] = dataclasses.field(default_factory=dict)

    def contracted_downstream(self) -> set[GroupId]:
        """The contracted groups and those concatenated (through any chain of concatenates)
        into a contracted one."""
        out = set(self.contracted)
        changed = True
        while changed:
            changed = False
            for g, into in self.concatenated.items():
                if g not in out and into & out:
                    out.add(g)
                    changed = True
        return out


def infer_roles(an: DimAnalysis) -> Roles:
    """The roles of ``an``'s inputs and groups; ``analyze`` builds them once (``Analysis.roles``)."""
    p = an.program
    deps = dependencies(p)
    mirror = mirror_map(p, deps)
    bit = {vid: 1 << k for k, vid in enumerate(p.inputs)}
    state = set(mirror.values())
    free_outputs = [o for o in p.outputs if o not in mirror]
    free_deps = 0
    for o in free_outputs:
        free_deps |= deps[o]
    parameters = {v for v in state if free_deps & bit[v]} or set(state)
    optimizer = state - parameters
    data = [v for v in p.inputs if v not in state]
    forward = _forward_ops(p, free_outputs, deps, sum(bit[v] for v in set(data)))
    param_mask = sum(bit[v] for v in parameters)
    data_mask = sum(bit[v] for v in set(data))
    con = _contractions(an, forward,
                        is_weight=lambda v: bool(deps[v] & param_mask) and not deps[v] & data_mask,
                        on_data=lambda v: bool(deps[v] & data_mask))

    decidable = {g.id for g in an.decision_groups}
    carried_by_state = {g for v in state for g in _groups_of(an, v)}
    carried_by_param = {g for v in parameters for g in _groups_of(an, v)}
    param_bytes: collections.Counter[GroupId] = collections.Counter()
    for vid in parameters:
        for g in _groups_of(an, vid):
            param_bytes[g] += p.values[vid].nbytes

    experts = {g for g in con.weight_batch if g in carried_by_param and g in decidable}
    pairs = {g for g in con.produced if g in con.contracted and g not in con.other_reduced
             and g not in experts and g in decidable}
    # produced, never contracted, by a matmul that is not the second of a pair
    vocab = {g for g, ops in con.produced.items()
             if g not in con.contracted and g not in experts and g in decidable
             and any(not (con.contracts[o] & pairs) for o in ops)}
    vocab |= {g for g in con.embedding if g in decidable and g not in experts and g not in pairs}
    joined = con.contracted_downstream()  # contracted after a concatenate (or before one)
    pair_list, vocab_list = _drop_dominated(an, _by_bytes(an, pairs), _by_bytes(an, vocab),
                                            varying=lambda v: deps[v] != 0)

    return Roles(
        mirror=mirror,
        parameters=frozenset(parameters),
        optimizer=frozenset(optimizer),
        data=frozenset(data),
        forward_ops=forward,
        param_matmuls=tuple(con.matmuls),
        batch_groups=_batch_groups(an, data, carried_by_state, decidable),
        pair_groups=pair_list,
        vocab_groups=vocab_list,
        expert_groups=_by_bytes(an, experts),
        joined_groups=tuple(g for g in vocab_list if g in joined),
        param_group_bytes=dict(param_bytes),
    )


def _groups_of(an: DimAnalysis, vid: ValueId) -> list[GroupId]:
    """The groups of a value's dims (size-1 dims have none)."""
    gs = (an.group_of(vid, d) for d in range(len(an.program.values[vid].shape)))
    return [g for g in gs if g != NO_DIM]


def _by_bytes(an: DimAnalysis, groups) -> tuple[GroupId, ...]:
    return tuple(sorted(groups, key=lambda g: (-an.groups[g].bytes, g)))


def _contractions(an: DimAnalysis, forward: frozenset[OpId], is_weight, on_data) -> _Contractions:
    p = an.program
    con = _Contractions()
    for op in p.ops:
        if op.id not in forward:
            continue
        factors = an.factors[op.id]
        w = _weight_operand(op, is_weight, on_data)
        # a matmul that contracts nothing (``einsum("...k,k->...k")``: a scale) is elementwise
        if (op.primitive in MATMUL_PRIMITIVES and w is not None
                and any(f.kind == FactorKind.REDUCTION for f in factors)):
            con.matmuls.append(op.id)
            mine = con.contracts[op.id] = set()
            for f in factors:
                with_act = any(i != w for i, _ in f.operands)
                for i, d in f.operands:
                    g = an.group_of(op.inputs[i], d) if i == w else NO_DIM
                    if g == NO_DIM:
                        continue
                    if f.kind == FactorKind.REDUCTION:  # a contracting dim
                        con.contracted.add(g)
                        mine.add(g)
                    elif f.kind == FactorKind.PASS and f.results and with_act:  # a batch dim
                        con.weight_batch.add(g)
                    elif f.kind == FactorKind.PASS and f.results:  # the weight's own output dim
                        con.produced.setdefault(g, []).append(op.id)
        elif op.primitive in GATHER_PRIMITIVES and w == 0:
            # an embedding lookup: the table's indexed dims are reduction factors (each
            # device gathers the rows it holds, the partial results are summed)
            con.embedding |= {an.group_of(op.inputs[0], d) for f in factors
                              if f.kind == FactorKind.REDUCTION for i, d in f.operands if i == 0}
            con.embedding.discard(NO_DIM)
        else:  # a max or min over it (a quantiser's scale, softmax's max) is a row's all-reduce
            con.other_reduced |= {an.group_of(op.inputs[i], d) for f in factors
                                  if f.kind == FactorKind.REDUCTION and f.reduce not in ("max", "min")
                                  for i, d in f.operands}
        if op.primitive in CONCAT_PRIMITIVES:
            axis = op.params["dimension"]
            into = an.group_of(op.outputs[0], axis)
            for v in op.inputs:
                g = an.group_of(v, axis)
                if g != NO_DIM and into != NO_DIM and g != into:
                    con.concatenated.setdefault(g, set()).add(into)
    con.other_reduced.discard(NO_DIM)
    return con


def _batch_groups(an: DimAnalysis, data: list[ValueId], carried_by_state: set[GroupId],
                  decidable: set[GroupId]) -> tuple[GroupId, ...]:
    p = an.program
    conflicted = {c.group for c in an.conflicts}
    batch: list[GroupId] = []
    for vid in sorted(data, key=lambda v: -p.values[v].nbytes):  # stable: input order on ties
        ok = [g for g in (an.group_of(vid, d) for d in range(len(p.values[vid].shape)))
              if g in decidable and g not in carried_by_state]
        pick = [g for g in ok if g not in conflicted][:1] or ok[:1]
        if pick and pick[0] not in batch:
            batch.append(pick[0])
    return _by_bytes(an, batch)


def _weight_operand(op, is_weight, on_data) -> int | None:
    """The index of the op's one weight operand when its other operand depends on data."""
    if len(op.inputs) < 2:
        return None
    a, b = op.inputs[0], op.inputs[1]
    if is_weight(a) and on_data(b):
        return 0
    if is_weight(b) and on_data(a):
        return 1
    return None


def _drop_dominated(an: DimAnalysis, pairs: tuple[GroupId, ...], vocab: tuple[GroupId, ...],
                    varying) -> tuple[tuple[GroupId, ...], tuple[GroupId, ...]]:
    """Drop the groups every tensor of which also holds a bigger kept group: on the one
    model axis the bigger group keeps the axis there, so the smaller one never shards.
    Tensors that depend on no input (tables built from iotas, a rotary embedding's cos and
    sin) are left out: any device makes them at any sharding."""
    cands = sorted(pairs + vocab, key=lambda g: (-an.groups[g].bytes, g))
    rank = {g: r for r, g in enumerate(cands)}
    held_sets: set[tuple[GroupId, ...]] = set()
    for vid, v in enumerate(an.program.values):
        if not varying(vid):
            continue
        held = {an.group_of(vid, d) for d in range(len(v.shape))} & rank.keys()
        if held:
            held_sets.add(tuple(sorted(held, key=rank.__getitem__)))
    keep: set[GroupId] = set()
    for g in cands:  # largest first: a group is kept if some tensor holds no bigger kept one
        if any(g in hs and not any(h in keep for h in hs[:hs.index(g)]) for hs in held_sets):
            keep.add(g)
    return tuple(g for g in pairs if g in keep), tuple(g for g in vocab if g in keep)
