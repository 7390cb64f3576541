"""Named-dimension analysis (TOAST): dimension graph -> named dimensions -> conflicts ->
layer groups -> decision space.

Nodes of the dimension graph are (value, dim) pairs. Each tying factor (PASS or REDUCTION)
of each op joins the dims it spans; union-find gives the connected components, the *named
dimensions*: all tensor dims that must be sharded identically. A value with two dims in one
named dimension is an *intra conflict* (attention scores' two sequence dims); named
dimensions that meet in one tensor *co-occur*, which is where axis conflicts arise once two
of them are given the same mesh axis. Repeated structure (an unrolled layer stack) makes
many named dimensions with the same role: they are collected into *layer groups*, the unit
of decision, so the decision space does not grow with depth.

This module holds the stages: ``analyze`` and the four it runs (``dim_graph``,
``dim_components``, ``layer_groups``, ``conflicts_of``), each returning a frozen result
(``DimGraph``, ``DimComponents``, ``LayerGroups``, the conflicts), and the labels and titles
of the groups. The records they make (``Analysis`` and its parts) are in ``_types``; the
roles built on them in ``_roles``.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import time
from typing import Any, Mapping, Sequence

import numpy as np

from .._decisions import NO_DIM, GroupId, Resolve
from ..tracing._program import NO_PRODUCER, Program
from ._constraints import user_shardings
from ._recompute import units as recompute_units
from ._roles import infer_roles
from ._rules import PSEUDO_OPS, Factor, rule_for
from ._stacks import layer_blocks, scope_name, stack_roles
from ._types import Analysis, Conflict, DimAnalysis, Group, NamedDim, Roles

_DIGITS = re.compile(r"\d+")


def layer_paths(paths: Sequence[str], shapes: Sequence[tuple], dtypes: Sequence[str]) -> dict[str, str]:
    """Input paths with their layer indices replaced by ``*``, found by structure: siblings
    in the input pytree whose names differ only in a number (``3``, ``layer_3``,
    ``layers_3``, ``transformer_layer_3``, ``h.3``, ``blocks[3]``) and whose subtrees are
    identical (the same relative paths, shapes and dtypes) are one layer stack. A leaf is
    never an index (``w1`` and ``w2`` are two weights, not two layers), nor are siblings
    that differ in anything but the number."""
    split = [p.split("/") for p in paths]
    # subtree signature of every internal node: (relative path, shape, dtype) of its leaves
    subtree: dict[tuple[str, ...], list] = collections.defaultdict(list)
    for parts, shape, dtype in zip(split, shapes, dtypes):
        for k in range(1, len(parts)):
            subtree[tuple(parts[:k])].append(("/".join(parts[k:]), tuple(shape), dtype))
    siblings: dict[tuple, list[tuple[str, ...]]] = collections.defaultdict(list)
    for node in subtree:
        if _DIGITS.search(node[-1]):
            siblings[(node[:-1], _DIGITS.sub("#", node[-1]))].append(node)
    index: dict[tuple[str, ...], str] = {}
    for (_, template), nodes in siblings.items():
        if len(nodes) < 2:
            continue
        by_sig: dict[tuple, list] = collections.defaultdict(list)
        for n in nodes:
            by_sig[tuple(sorted(subtree[n]))].append(n)
        for same in by_sig.values():
            if len(same) >= 2:
                for n in same:
                    index[n] = template.replace("#", "*")
    return {path: "/".join(index.get(tuple(parts[:k + 1]), seg) for k, seg in enumerate(parts))
            for path, parts in zip(paths, split)}


# Where a group's title comes from (``_TitleBase.kind``): a logical axis name the model gives
# its inputs; an input leaf's path and dim; the function whose op makes an activation.
NAMED, INPUT, MADE = "named", "input", "made"


@dataclasses.dataclass(frozen=True, slots=True)
class _TitleBase:
    kind: str  # NAMED, INPUT or MADE
    text: str  # "ffn", "w1[1]", "group_norm[4]"


# --------------------------------------------------------------------------- union-find

class _UnionFind:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        parent = self.parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, a: int, b: int) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return False
        if ra < rb:
            ra, rb = rb, ra
        self.parent[ra] = rb
        return True

# --------------------------------------------------------------------------- the analysis, in stages

@dataclasses.dataclass(frozen=True)
class DimGraph:
    """Stage 1, the dimension graph: a node per (value, dim) (``node_base[v] + d``), joined by
    each op's tying factors. ``roots``: each node's component; ``edges``: the ties that joined
    two components (node, node, op); ``loop_nodes``: the dims a scan boundary carries."""

    factors: tuple[tuple[Factor, ...], ...]  # per op
    node_base: np.ndarray  # [num_values + 1]
    roots: np.ndarray  # [num_nodes]
    edges: tuple[np.ndarray, np.ndarray, np.ndarray]
    loop_nodes: tuple[int, ...]
    unknown: Mapping[str, int]  # primitive -> ops with no factor rule


@dataclasses.dataclass(frozen=True)
class DimComponents:
    """Stage 2, the named dimensions: the graph's components over dims of size > 1
    (``node_nd[node]``, NO_DIM for a size-1 dim) and, per named dim, its distinct sizes, member
    count, bytes, input members (path, dim, bytes) and the logical names its inputs give it."""

    node_nd: np.ndarray  # [num_nodes]
    live: np.ndarray  # [num_nodes] the dim's size is > 1
    value_of_node: np.ndarray  # [num_nodes]
    dim_of_node: np.ndarray  # [num_nodes]
    sizes: tuple[frozenset[int], ...]
    members: np.ndarray
    nbytes: np.ndarray
    inputs: tuple[tuple[tuple[str, int, int], ...], ...]
    votes: tuple[collections.Counter, ...]  # logical name -> input bytes carrying it
    loop: frozenset[int]  # named dims a scan boundary carries


@dataclasses.dataclass(frozen=True)
class LayerGroups:
    """Stage 3: named dimensions with the same role (one per layer) as one group each, with
    their labels, the named dims that now know their group, and where each title comes from."""

    groups: tuple[Group, ...]
    named_dims: tuple[NamedDim, ...]
    group_of_nd: np.ndarray
    title_bases: tuple[_TitleBase, ...]  # per group


def analyze(program: Program, axis_names: dict[int, tuple] | None = None,
            min_group_fraction: float = 1e-4) -> Analysis:
    """Run the named-dimension analysis: dimension graph -> named dimensions -> layer groups
    -> conflicts (each stage a frozen result), then the roles, user shardings, recompute units'
    local groups and titles built on it.

    axis_names: optional logical axis names of input values (value id -> one name per dim),
      like flax's logical partitioning; used only for readable labels.
    min_group_fraction: a group touching less than this fraction of the largest group's
      bytes is not worth a decision (its tensors are tiny).
    """
    t0 = time.perf_counter()
    graph = dim_graph(program)
    dims = dim_components(program, graph, axis_names or {})
    blocks = layer_blocks(program)
    grouped = layer_groups(program, dims, blocks, min_group_fraction)
    conflicts, cooccur = conflicts_of(program, graph, dims, grouped)
    node_base = graph.node_base[:-1]
    for arr in (node_base, dims.node_nd):
        arr.setflags(write=False)
    core = DimAnalysis(program, graph.factors, node_base, dims.node_nd, grouped.named_dims, grouped.groups,
                       conflicts, cooccur, graph.unknown, graph.edges, tuple(recompute_units(program, blocks)))
    roles = infer_roles(core)
    return Analysis(**{f.name: getattr(core, f.name) for f in dataclasses.fields(core)},
                    roles=roles, user_shardings=tuple(user_shardings(program)), unit_groups=_unit_groups(core),
                    titles=_titles(core, roles, grouped.title_bases), seconds=time.perf_counter() - t0)


def dim_graph(program: Program) -> DimGraph:
    """Stage 1: each op's factor rule (``_rules.rule_for``) ties the (value, dim) nodes it spans."""
    values = program.values
    ranks = np.fromiter((len(v.shape) for v in values), dtype=np.int64, count=len(values))
    node_base = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(ranks, out=node_base[1:])
    num_nodes = int(node_base[-1])
    uf = _UnionFind(num_nodes)
    ea, eb, eo = [], [], []
    factors: list[tuple[Factor, ...]] = []
    unknown: collections.Counter[str] = collections.Counter()
    loop_nodes: list[int] = []
    base = node_base.tolist()

    for op in program.ops:
        ins = [values[i].shape for i in op.inputs]
        outs = [values[o].shape for o in op.outputs]
        rule, known = rule_for(op.primitive)
        if not known:
            unknown[op.primitive] += 1
        fs = rule(op.params, ins, outs)
        factors.append(tuple(fs))
        for f in fs:
            nodes = [base[op.inputs[i]] + d for i, d in f.operands]
            nodes += [base[op.outputs[j]] + d for j, d in f.results]
            if f.ties:
                first = nodes[0]
                for n in nodes[1:]:
                    if uf.union(first, n):
                        ea.append(first)
                        eb.append(n)
                        eo.append(op.id)
            elif op.primitive in ("scan_enter", "scan_exit"):
                loop_nodes.extend(nodes)
    roots = np.fromiter((uf.find(n) for n in range(num_nodes)), dtype=np.int64, count=num_nodes)
    edges = (np.asarray(ea, dtype=np.int64), np.asarray(eb, dtype=np.int64), np.asarray(eo, dtype=np.int64))
    return DimGraph(tuple(factors), node_base, roots, edges, tuple(loop_nodes), dict(unknown))


def dim_components(program: Program, graph: DimGraph, axis_names: dict[int, tuple]) -> DimComponents:
    """Stage 2: the graph's components (over dims of size > 1) as named dims, numbered in the
    order of their roots, with what stage 3 groups them by."""
    values = program.values
    node_base, num_nodes = graph.node_base, len(graph.roots)
    ranks = np.diff(node_base)
    sizes = np.fromiter((s for v in values for s in v.shape), dtype=np.int64, count=num_nodes)
    live = sizes > 1
    uniq, nd_of_node = np.unique(np.where(live, graph.roots, -1), return_inverse=True)
    has_neg = len(uniq) and uniq[0] == -1
    node_nd = nd_of_node.astype(np.int64) - (1 if has_neg else 0)
    node_nd[~live] = NO_DIM
    num_nd = len(uniq) - (1 if has_neg else 0)

    value_of_node = np.repeat(np.arange(len(values)), ranks)
    dim_of_node = np.arange(num_nodes) - node_base[:-1][value_of_node]
    nbytes = np.fromiter((v.nbytes for v in values), dtype=np.float64, count=len(values))

    members = np.bincount(node_nd[live], minlength=num_nd)
    # bytes per nd: each value counted once per nd it touches
    pairs = np.unique(np.stack([node_nd[live], value_of_node[live]]), axis=1)
    nd_bytes = np.bincount(pairs[0], weights=nbytes[pairs[1]], minlength=num_nd)
    nd_sizes: list[set[int]] = [set() for _ in range(num_nd)]
    for nd, s in zip(node_nd[live].tolist(), sizes[live].tolist()):
        nd_sizes[nd].add(s)
    loop_nd = frozenset(int(node_nd[n]) for n in graph.loop_nodes if node_nd[n] != NO_DIM)

    # Input members of each nd (path, dim) and their logical names.
    input_members: list[list[tuple[str, int, int]]] = [[] for _ in range(num_nd)]
    label_votes: list[collections.Counter] = [collections.Counter() for _ in range(num_nd)]
    base = node_base.tolist()
    for vid in program.inputs:
        v = values[vid]
        for d in range(len(v.shape)):
            nd = int(node_nd[base[vid] + d])
            if nd == NO_DIM:
                continue
            input_members[nd].append((v.path, d, v.nbytes))
            logical = axis_names.get(vid)
            if logical is not None and d < len(logical) and logical[d]:
                label_votes[nd][logical[d]] += v.nbytes
    return DimComponents(node_nd, live, value_of_node, dim_of_node, tuple(frozenset(s) for s in nd_sizes),
                         members, nd_bytes, tuple(tuple(m) for m in input_members), tuple(label_votes), loop_nd)


def layer_groups(program: Program, dims: DimComponents, blocks, min_group_fraction: float) -> LayerGroups:
    """Stage 3: named dims with one signature are one group. An input's named dim is keyed by
    its sizes and its leaves' places in a layer stack (the path with the layer index starred,
    or the role in a stack found in the op graph, ``_stacks``); an intermediate-only one by its
    sizes, member count and producing primitives."""
    values = program.values
    node_nd, live, nd_bytes, nd_sizes = dims.node_nd, dims.live, dims.nbytes, dims.sizes
    value_of_node, dim_of_node = dims.value_of_node, dims.dim_of_node
    num_nd = len(nd_sizes)
    # Producer primitives of each nd's members (signature of intermediate-only nds).
    prod = np.fromiter((v.producer for v in values), dtype=np.int64, count=len(values))
    # ---- layer groups: same role = same sizes, same input paths modulo layer index
    layered = layer_paths([values[v].path for v in program.inputs], [values[v].shape for v in program.inputs],
                          [str(values[v].dtype) for v in program.inputs])
    sigs, made_by = _signatures(program, dims, blocks, layered, prod)

    group_of_nd = np.zeros(num_nd, dtype=np.int64)
    raw_groups = sorted(sigs.values(), key=lambda nds: (-sum(nd_bytes[n] for n in nds), nds[0]))
    first_node = np.full(num_nd, -1, dtype=np.int64)
    live_idx = np.flatnonzero(live)
    first_node[node_nd[live_idx][::-1]] = live_idx[::-1]
    named = _scoped(program, _unwrapped(layered))
    labels = [_label(dims.votes[nd], dims.inputs[nd], int(first_node[nd]), values, prod,
                     program, value_of_node, dim_of_node, named) for nd in range(num_nd)]
    title_bases = tuple(_title_base(dims.votes[nds[0]], dims.inputs[nds[0]], made_by.get(nds[0], {}),
                                    labels[nds[0]]) for nds in raw_groups)
    max_bytes = max((sum(nd_bytes[n] for n in nds) for nds in raw_groups), default=1.0)
    # named dims of fully manual shard_map bodies' values: per-device code, not the plan's to shard
    manual_nd = set()
    fully = [v for v in program.manual_values if v not in program.manual_axes]
    if fully:
        in_body = np.isin(value_of_node, np.array(fully, dtype=np.int64)) & live
        manual_nd = set(node_nd[in_body].tolist())
    nd_manual = _manual_axes(program, node_nd, value_of_node, live)
    groups: list[Group] = []
    seen_labels: collections.Counter[str] = collections.Counter()
    for gid, nds in enumerate(raw_groups):
        for n in nds:
            group_of_nd[n] = gid
        lab = labels[nds[0]]
        seen_labels[lab] += 1
        if seen_labels[lab] > 1:
            lab = f"{lab}#{seen_labels[lab]}"
        gbytes = int(sum(nd_bytes[n] for n in nds))
        is_loop = any(n in dims.loop for n in nds)
        decidable = bool((not is_loop) and gbytes >= min_group_fraction * max_bytes
                         and not any(n in manual_nd for n in nds))
        manual = frozenset.intersection(*(nd_manual.get(n, frozenset()) for n in nds))
        groups.append(Group(gid, lab, tuple(nds), max(max(nd_sizes[n]) for n in nds), gbytes, decidable, manual))

    named_dims = tuple(
        NamedDim(nd, groups[group_of_nd[nd]].label, tuple(sorted(nd_sizes[nd])), int(dims.members[nd]),
                 int(nd_bytes[nd]), int(group_of_nd[nd]), nd in dims.loop,
                 tuple((p, d) for p, d, _ in sorted(dims.inputs[nd], key=lambda t: -t[2])))
        for nd in range(num_nd)
    )
    return LayerGroups(tuple(groups), named_dims, group_of_nd, title_bases)


def _manual_axes(program: Program, node_nd: np.ndarray, value_of_node: np.ndarray, live: np.ndarray
                 ) -> dict[int, frozenset[str]]:
    """Named dim -> the mesh axes every value holding it is manual over (the named dims all
    of whose values lie in partially manual regions; the others have none)."""
    if not program.manual_axes:
        return {}
    in_part = np.isin(value_of_node, np.fromiter(program.manual_axes, dtype=np.int64)) & live
    out: dict[int, frozenset[str]] = {}
    for nd, v in zip(node_nd[in_part].tolist(), value_of_node[in_part].tolist()):
        axes = program.manual_axes[v]
        out[nd] = out[nd] & axes if nd in out else axes
    for nd in set(node_nd[live & ~in_part].tolist()):
        out.pop(nd, None)
    return out


def _signatures(program: Program, dims: DimComponents, blocks, layered: dict[str, str], prod: np.ndarray
                ) -> tuple[dict[Any, list[int]], dict[int, dict[str, list[int]]]]:
    """The named dims of each group signature (``layer_groups``), in order of first
    appearance; and per intermediate-only named dim, {function: [tensor dims it makes, the
    dim of its first]} in program order (the group's title)."""
    values = program.values
    # A leaf's place in a layer stack: its path with the index starred where the names show
    # the stack; else its role in a stack found in the op graph (a list, a leaf-name index).
    roles = stack_roles(program, blocks)
    stacked = {values[v].path: (layered[values[v].path] if "*" in layered[values[v].path] else roles.get(v))
               for v in program.inputs}
    sigs: dict[Any, list[int]] = collections.defaultdict(list)
    nd_prims: dict[int, collections.Counter] = {}
    made_by: dict[int, dict[str, list[int]]] = {}
    fn_of: dict[int, str] = {}  # op id -> the function it was traced in
    for nd in range(len(dims.sizes)):
        if dims.inputs[nd]:
            # A named dim holding any layer's leaf is that layer's: its other members (the
            # optimizer's moments of those leaves) are the same in every layer.
            where = {(stacked[p], d) for p, d, _ in dims.inputs[nd] if stacked[p]}
            where = where or {(layered[p], d) for p, d, _ in dims.inputs[nd]}
            key = ("in", tuple(sorted(dims.sizes[nd])), tuple(sorted(where)))
            sigs[key].append(nd)
        else:
            nd_prims[nd] = collections.Counter()
    if nd_prims:
        # Intermediate-only nds: signature by sizes, member count and producing primitives.
        sel = np.isin(dims.node_nd, np.fromiter(nd_prims, dtype=np.int64))
        for nd, vid, d in zip(dims.node_nd[sel].tolist(), dims.value_of_node[sel].tolist(),
                              dims.dim_of_node[sel].tolist()):
            p = int(prod[vid])
            nd_prims[nd][(program.ops[p].primitive if p != NO_PRODUCER else "input", d)] += 1
            if p != NO_PRODUCER:
                fn = fn_of.get(p)
                if fn is None:
                    fn = fn_of[p] = _function_of(program.ops[p])
                if fn:
                    made_by.setdefault(nd, {}).setdefault(fn, [0, d])[0] += 1
        for nd, cnt in nd_prims.items():
            key = ("mid", tuple(sorted(dims.sizes[nd])), int(dims.members[nd]), tuple(sorted(cnt.items())))
            sigs[key].append(nd)
    return sigs, made_by


def conflicts_of(program: Program, graph: DimGraph, dims: DimComponents,
                 grouped: LayerGroups) -> tuple[tuple[Conflict, ...], dict[tuple[GroupId, GroupId], int]]:
    """Stage 4, per value: its intra conflicts (two dims in one named dim), with the tie path
    that joins them and the candidate resolutions; and the bytes each pair of groups co-occurs in."""
    values, node_nd, gnd = program.values, dims.node_nd, grouped.group_of_nd
    base = graph.node_base.tolist()
    intra: dict[int, list[tuple[int, int, int]]] = collections.defaultdict(list)
    cooccur: collections.Counter[tuple[int, int]] = collections.Counter()
    for vid, v in enumerate(values):
        r = len(v.shape)
        if r < 2:
            continue
        b = base[vid]
        nds = node_nd[b:b + r].tolist()
        seen: dict[int, int] = {}
        for d, nd in enumerate(nds):
            if nd == NO_DIM:
                continue
            if nd in seen:
                intra[nd].append((vid, seen[nd], d))
            else:
                seen[nd] = d
        gs = sorted({int(gnd[n]) for n in seen})
        for i in range(len(gs)):
            for j in range(i + 1, len(gs)):
                cooccur[(gs[i], gs[j])] += v.nbytes

    conflicts = []
    for cid, (nd, vals) in enumerate(sorted(intra.items(), key=lambda kv: -dims.nbytes[kv[0]])):
        # representative: the largest tensor made by a real op (not a loop boundary)
        vals = sorted(vals, key=lambda t: (_real_producer(program, values[t[0]]),
                                           values[t[0]].nbytes, -t[0]), reverse=True)
        vid, a, b = vals[0]
        path = _path(graph.edges, node_nd, nd, base[vid] + a, base[vid] + b)
        lab = grouped.named_dims[nd].label
        options = (f"keep {lab} sharded on dim {a}: gather dim {b}'s operand (e.g. all-gather K/V); the default",
                   f"keep {lab} sharded on dim {b}: gather dim {a}'s operand, reduce-scatter the result "
                   f"({lab}->{Resolve.PREFIX}second)",
                   f"leave {lab} unsharded in these tensors: gather both operands ({lab}->{Resolve.PREFIX}neither)")
        conflicts.append(Conflict(cid, "intra", nd, int(gnd[nd]), tuple(vals), path, options))
    return tuple(conflicts), dict(cooccur)


def _unit_groups(an: DimAnalysis) -> dict[int, frozenset[GroupId]]:
    """Per recompute unit, the groups local to its layers: those whose tensors the forward
    pass makes only in the unit's ops (a layer's ffn, heads), not the ones that run
    through the whole step (batch, d_model). A view shows the unit's decision on them."""
    p, base, nd = an.program, an.node_base, an.node_nd
    out = {}
    for u in an.units:
        inside, outside = set(), set()
        spans = [range(lo, hi) for lo, hi in u.copies]
        for op in p.ops[:u.boundary]:
            if op.primitive.endswith(("_enter", "_exit")):
                continue
            side = inside if any(op.id in r for r in spans) else outside
            for v in op.outputs:
                b = base[v]
                side.update(an.named_dims[n].group for n in nd[b:b + len(p.values[v].shape)].tolist()
                            if n != NO_DIM)
        out[u.id] = frozenset(inside - outside)
    return out


def _titles(an: DimAnalysis, roles: Roles, bases: tuple[_TitleBase, ...]) -> dict[GroupId, str]:
    """Every group's readable title, from the program's structure: the logical axis name
    the model gives it (``ffn``); else its role where that names it better than a leaf
    (the data's ``batch``, an MoE's ``experts``); else its largest input leaf and dim
    (``w1[1]``); else, for a group no input holds, the function whose op first makes it
    and the dim there (``group_norm[4]``), never a primitive's name. Repeats are
    numbered (``#2``), largest group first.

    A title is for reading only. The label stays each decision's name in plan and
    session files (``group_by_label``): files written with today's labels keep naming
    the same groups, and no decision depends on how a title is spelled."""
    by_role = {}
    by_role.update((g, "batch") for g in roles.batch_groups)
    by_role.update((g, "experts") for g in roles.expert_groups)
    out: dict[GroupId, str] = {}
    seen: collections.Counter[str] = collections.Counter()
    for g in an.groups:
        base = bases[g.id]
        text = base.text if base.kind == NAMED or g.id not in by_role else by_role[g.id]
        seen[text] += 1
        out[g.id] = text if seen[text] == 1 else f"{text}#{seen[text]}"
    return out


def _real_producer(program: Program, v) -> bool:
    return v.producer != NO_PRODUCER and program.ops[v.producer].primitive not in PSEUDO_OPS


def _path(edges, node_nd, nd: int, src: int, dst: int) -> tuple[int, ...]:
    """The op ids along a shortest path of tie edges from node src to node dst."""
    ea, eb, eo = edges
    sel = node_nd[ea] == nd
    adj: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)
    for a, b, o in zip(ea[sel].tolist(), eb[sel].tolist(), eo[sel].tolist()):
        adj[a].append((b, o))
        adj[b].append((a, o))
    prev: dict[int, tuple[int, int]] = {src: (-1, -1)}
    frontier = collections.deque([src])
    while frontier:
        x = frontier.popleft()
        if x == dst:
            break
        for y, o in adj[x]:
            if y not in prev:
                prev[y] = (x, o)
                frontier.append(y)
    if dst not in prev:
        return ()
    ops = []
    x = dst
    while prev[x][0] != -1:
        x, o = prev[x]
        ops.append(o)
    # keep each op once, in program order
    return tuple(sorted(set(ops)))


def _unwrapped(layered: dict[str, str]) -> dict[str, str]:
    """Input paths without a wrapper's leaf segment: a leaf name that is the only child of
    containers of several names and never has a sibling (an nnx Variable's ``value``, an
    einsum module's ``w``) names nothing; its container does."""
    children: dict[str, set[str]] = collections.defaultdict(set)
    for path in layered.values():
        parts = path.split("/")
        for k in range(1, len(parts)):
            children["/".join(parts[:k])].add(parts[k])
    only: dict[str, set[str]] = collections.defaultdict(set)  # leaf name -> its parents' names
    with_siblings: set[str] = set()
    for path in layered.values():
        parts = path.split("/")
        if len(parts) > 2:
            if len(children["/".join(parts[:-1])]) == 1:
                only[parts[-1]].add(parts[-2])
            else:
                with_siblings.add(parts[-1])
    wrapper = {name for name, parents in only.items() if len(parents) >= 2 and name not in with_siblings}
    out = {}
    for orig, path in layered.items():
        parts = path.split("/")
        if len(parts) > 2 and parts[-1] in wrapper:
            parts = parts[:-1]
        out[orig] = "/".join(parts)
    return out


def _scoped(program: Program, named: dict[str, str]) -> dict[str, str]:
    """Names for leaves whose path has none (a list position, ``trainable_variables/2``): the
    scope JAX traced the first op that reads it in (keras' layer names), layer index starred."""
    unnamed: dict[int, str] = {}
    for vid in program.inputs:
        path = program.values[vid].path
        parts = named[path].split("/")
        if len(parts) > 1 and all(_DIGITS.fullmatch(q) for q in parts[1:]):
            unnamed[vid] = path
    if not unnamed:
        return named
    out = dict(named)
    for op in program.ops:
        for vid in op.inputs:
            path = unnamed.pop(vid, None)
            scope = scope_name(op.scope) if path is not None else ""
            if path is not None and scope:
                parts = [_DIGITS.sub("*", q) if _DIGITS.search(q) and not q.isdigit() else q
                         for q in scope.split("/")]
                out[path] = "/".join([named[path].split("/")[0]] + parts)
        if not unnamed:
            break
    return out


def _title_base(votes, inputs, made_by: dict[str, list[int]], label: str) -> _TitleBase:
    """Where a group's title comes from (``Analysis.titles``): its logical name, its input
    leaf (the label's own ``w1[1]``), or the function that makes most of its tensor dims
    (the first in program order on a tie; a library's helper that makes the first one,
    ``one_hot``'s, is outvoted by the user's function around it), with the dim of the
    first tensor it makes."""
    if votes:
        return _TitleBase(NAMED, label)
    if inputs:
        return _TitleBase(INPUT, label)
    if not made_by:
        return _TitleBase(MADE, "activation")
    fn, (_, dim) = max(made_by.items(), key=lambda kv: kv[1][0])  # max keeps the first on a tie
    return _TitleBase(MADE, f"{fn}[{dim}]")


def _function_of(op) -> str:
    """The user's function an op was traced in, from its source line ``file:line:col (fn)``
    (``outer.<locals>.inner`` -> ``outer``); else the innermost scope of its name stack."""
    src = op.source.split(" <- ")[0]
    fn = src.rpartition(" (")[2].rstrip(")") if src.endswith(")") else ""
    fn = fn.split(".<locals>")[0].strip("<>")
    if fn and fn not in ("lambda", "module", "listcomp", "genexpr", "dictcomp"):
        return fn
    scope = scope_name(op.scope)
    return scope.rsplit("/", 1)[-1] if scope else ""


def _label(votes, inputs, first_node, values, prod, program, value_of_node, dim_of_node, layered) -> str:
    """A readable label: the logical axis name most of its input bytes carry; else the
    largest input leaf and dim (``w1[1]``); else the primitive that first makes it."""
    if votes:
        return votes.most_common(1)[0][0]
    if inputs:
        path, d, _ = max(inputs, key=lambda t: t[2])
        leaf = layered[path].split("/")
        return f"{'/'.join(leaf[-2:])}[{d}]"
    vid = int(value_of_node[first_node])
    p = int(prod[vid])
    prim = program.ops[p].primitive if p != NO_PRODUCER else "const"
    if prim == "shard_map_exit":  # a region's result: named by the region's function
        prim = f"{program.ops[p].params.get('name') or 'shard_map'}.out"
    return f"{prim}[{int(dim_of_node[first_node])}]"
