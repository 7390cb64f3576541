"""The named-dimension graph's clusters and node positions (computed off the page's event
loop in the load job for the first view; re-laid out on a click, at most ``MAX_VISIBLE``
nodes, in a few tens of ms).

**Clusters.** A model of up to ``MAX_NODES`` decision groups is drawn group by group. A larger
one (a U-Net's 52 groups, a tower of distinct layers' 222) is a tree: groups by *role* (batch,
experts, tensor-parallel pairs, vocabulary, outputs joined to skip connections: ``partex``'s
roles from the program's structure; then the other dims of parameters, and activations no
input holds), then by *layer*: the module path of the first parameter holding the group
(``up/1/block``), or for an activation, the function whose ops make it (``made in
group_norm``). A cluster with more than ``MAX_CHILDREN`` children splits its children into
ranges in model order (``0…9``). The first view opens the largest clusters while at most
``MAX_NODES`` nodes show; a click opens one more (others close to stay within
``MAX_VISIBLE``). Every group is a node or inside a cluster node that counts it: none is left
out. Nodes show group titles (``Analysis.titles``), shortened from their start (``short``).

**Positions.** Springs are short between nodes that share many bytes of tensors (Kamada-Kawai,
deterministic); then every node's box, its circle and its two text lines, is pushed apart from
the others in pixels of the drawing's smallest size (``PX_W`` x ``PX_H``), so that no two
labels overlap at any width the page gives the graph.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Iterable, Union

import networkx as nx
import numpy as np

from ._format import fmt_bytes

MAX_NODES = 14  # the first view (and a model drawn group by group) shows at most this many
MAX_VISIBLE = 22  # after clicks: more close to stay within this
MAX_CHILDREN = 10  # a cluster with more children splits them into ranges
MAX_EDGES_PER_NODE = 4
X_RANGE, Y_RANGE = (-1.7, 1.7), (-1.34, 1.16)  # the figure's data ranges
PX_W, PX_H = 540, 450  # the drawing's least size in pixels (its min_width; the card's height)
LABEL_CHARS = 20  # a label longer than this is shortened with "…" (``short``)
LABEL_PX, SUB_PX = 8.0, 6.4  # width per character of the 13 px bold label and the 11 px line under it
LABEL_H, SUB_H = 17, 15  # their heights, pixels
PAD = 6  # pixels between two nodes' boxes

Node = Union[int, str]  # a group id, or a cluster's key


def node_size(nbytes: float, most: float) -> float:
    """A node's diameter in pixels, by the bytes of its tensors."""
    return 20 + 30 * math.sqrt(nbytes / most) if most > 0 else 20


_TAIL = re.compile(r"(\[\d+\])?(#\d+)?$")  # a title's dim and repeat number: "[1]#2"


def short(label: str, n: int = LABEL_CHARS) -> str:
    """``label`` in at most ``n`` characters, keeping what tells groups apart: its dim and
    repeat number, and the end of a path (``…/down_proj[1]``), cutting from its start."""
    if len(label) <= n:
        return label
    m = _TAIL.search(label)  # always matches (both parts optional), at worst the empty end
    tail = m.group(0) if m else ""
    head = label[: len(label) - len(tail)]
    if len(tail) > n - 2:
        return label[: n - 1] + "…"
    room = n - len(tail) - 1
    parts = head.split("/")
    for k in range(1, len(parts)):  # drop leading path components while they do not fit
        rest = "/".join(parts[k:])
        if len(rest) + 1 <= room:
            return "…/" + rest + tail if len(rest) + 2 <= room else "…" + rest + tail
    return head[: room] + "…" + tail


# --------------------------------------------------------------------------- clusters

@dataclasses.dataclass(frozen=True)
class Cluster:
    key: str
    label: str
    role: str
    groups: tuple[int, ...]  # every decision group under it
    children: tuple[Node, ...]  # sub-clusters and groups, largest first
    bytes: int


# (role, its cluster's label, what its groups are called under a layer's cluster)
ROLES = (("batch", "batch", "batch"), ("experts", "experts", "expert"), ("pair", "tensor-parallel", "TP"),
         ("vocab", "vocabulary", "vocab"), ("joined", "skip-joined outputs", "skip"),
         ("param", "parameter dims", "param"), ("data", "data dims", "data"), ("act", "activations", "activation"))
TAGS = {r: t for r, _, t in ROLES}


@dataclasses.dataclass(frozen=True)
class GraphTree:
    """Decision groups under clusters (``clusters[""]`` is the root)."""

    clusters: dict[str, Cluster]
    parent: dict  # node -> its cluster's key
    group_bytes: dict[int, int]

    def path(self, node: Node) -> list[str]:
        """The clusters above a node, outermost first (the root left out)."""
        out = []
        while node in self.parent and self.parent[node] != "":
            node = self.parent[node]
            out.append(node)
        return out[::-1]

    def nbytes(self, node: Node) -> int:
        return self.clusters[node].bytes if isinstance(node, str) else self.group_bytes[node]

    def visible(self, opened: Iterable[str]) -> list[Node]:
        """The nodes drawn when the clusters in ``opened`` are open (a cluster opens only
        where its parent is open)."""
        opened = set(opened) | {""}
        out, todo = [], [""]
        while todo:
            c = self.clusters[todo.pop(0)]
            for ch in c.children:
                if isinstance(ch, str) and ch in opened:
                    todo.append(ch)
                else:
                    out.append(ch)
        return out

    def first_view(self, limit: int = MAX_NODES) -> frozenset[str]:
        """Open the largest clusters while at most ``limit`` nodes show."""
        opened: set[str] = set()
        while True:
            shown = self.visible(opened)
            fits = [n for n in shown if isinstance(n, str)
                    and len(shown) - 1 + len(self.clusters[n].children) <= limit]
            if not fits:
                return frozenset(opened)
            opened.add(max(fits, key=self.nbytes))

    def open(self, opened: Iterable[str], key: str, limit: int = MAX_VISIBLE) -> frozenset[str]:
        """``opened`` with ``key`` and the clusters above it open; other open clusters close,
        the smallest first, while more than ``limit`` nodes would show."""
        keep = set(self.path(key)) | {key}
        now = set(opened) | keep
        for c in sorted(set(now) - keep, key=self.nbytes):
            if len(self.visible(now)) <= limit:
                break
            now -= {c, *[k for k in now if c in self.path(k)]}
        return frozenset(now)

    def close(self, opened: Iterable[str], key: str) -> frozenset[str]:
        """``opened`` less ``key`` and every cluster inside it."""
        return frozenset(k for k in opened if k != key and key not in self.path(k))


def _layer_of(paths: list[str], root: int) -> tuple[str, ...]:
    """A parameter's layer: its path's components under the parameters' common root, less
    the leaf's own name."""
    return tuple(paths[root:-1])


def _split(path: str) -> list[str]:
    return [p for p in re.split(r"[/.\[\]]+", path) if p]


def _homes(an, infos) -> dict[int, tuple[str, tuple[str, ...]]]:
    """Each group's cluster role (one of ROLES) and layer: the path components of its first
    parameter's module below the components all parameters share (an activation's: the
    function whose ops make it)."""
    p = an.program
    roles = an.roles
    vid_of = dict(zip(p.input_paths, p.inputs))
    param_paths = [_split(path) for path, vid in zip(p.input_paths, p.inputs) if vid in roles.parameters]
    root = 0  # components every parameter's path starts with ("params")
    while param_paths and all(len(q) > root + 1 and q[root] == param_paths[0][root] for q in param_paths):
        root += 1
    by_role = {}
    # a vocabulary-like group a concatenate joins into a contracted dim (a U-Net's skip
    # connection) is no vocabulary: its own cluster says what it is
    for r, gs in (("batch", roles.batch_groups), ("experts", roles.expert_groups), ("pair", roles.pair_groups),
                  ("joined", roles.joined_groups), ("vocab", roles.vocab_groups)):
        for g in gs:
            by_role.setdefault(g, r)
    homes: dict[int, tuple[str, tuple[str, ...]]] = {}
    for g, info in infos.items():
        params = [path for path, _, _ in info.tensors if vid_of.get(path) in roles.parameters]
        layer = _layer_of(_split(params[0]), root) if params else ()
        if g in by_role:
            role = by_role[g]
        elif params:
            role = "param"
        elif info.tensors:
            role = "data"
        else:
            role = "act"
        if not params and info.sources:  # an activation: the function whose ops make it
            src = max(info.sources, key=lambda s: s[1])[0]
            fn = src.partition(" (")[2].rstrip(")")
            layer = (fn.split(".<locals>")[0] or "ops",) if fn else ()
        homes[g] = (role, layer)
    return homes


def graph_tree(an, infos) -> GraphTree:
    """Cluster the decision groups by role, then by layer."""
    p = an.program
    homes = _homes(an, infos)
    group_bytes = {g: info.bytes for g, info in infos.items()}
    # the model's own order: a group's first input leaf in argument order (its tensors are
    # listed that way), then the ones no input holds
    index = {path: k for k, path in enumerate(p.input_paths)}
    order = {g: (index[info.tensors[0][0]] if info.tensors else len(index), g) for g, info in infos.items()}
    clusters: dict[str, Cluster] = {}
    parent: dict = {}

    def ranged(key: str, role: str, children: list[Node], depth: int) -> list[Node]:
        """More than MAX_CHILDREN children in model order: about MAX_CHILDREN ranges of them
        (a range of more than twice that: ranges again)."""
        if len(children) <= MAX_CHILDREN:
            return children
        per = math.ceil(len(children) / MAX_CHILDREN)
        out = []
        for i in range(0, len(children), per):
            part = children[i:i + per]
            if len(part) == 1:
                out.append(part[0])
                continue
            first = _node_name(clusters, homes, part[0], depth)
            last = _node_name(clusters, homes, part[-1], depth, last=True)
            rk = f"{key}#{len(clusters)}"
            inner = ranged(rk, role, part, depth) if len(part) > 2 * MAX_CHILDREN else part
            clusters[rk] = Cluster(rk, f"{first}…{last} · {TAGS[role]}", role, _members(clusters, part),
                                   tuple(sorted(inner, key=lambda n: -_nbytes(clusters, group_bytes, n))),
                                   sum(_nbytes(clusters, group_bytes, n) for n in part))
            for n in inner:
                parent[n] = rk
            out.append(rk)
        return out

    def build(key: str, label: str, role: str, members: list[int], depth: int) -> Node:
        """A cluster of ``members`` split by the layer component at ``depth``; a single
        group is itself."""
        if len(members) == 1:
            return members[0]
        subs: dict[str, list[int]] = {}
        direct = []
        for g in members:
            layer = homes[g][1]
            if len(layer) > depth:
                subs.setdefault(layer[depth], []).append(g)
            else:
                direct.append(g)
        if len(subs) == 1 and not direct:  # one layer below: go down a level, same node
            (name, gs), = subs.items()
            return build(key, label, role, gs, depth + 1)
        children: list[Node] = list(direct)
        for name, gs in subs.items():
            where = "/".join(homes[gs[0]][1][: depth + 1])
            # an activation's layer is the function that makes it: say so (a tag would cut it)
            sub_label = f"made in {where}" if role == "act" else f"{where} · {TAGS[role]}"
            children.append(build(f"{key}/{name}", sub_label, role, gs, depth + 1))
        children.sort(key=lambda n: order[n] if isinstance(n, int) else order[clusters[n].groups[0]])
        children = ranged(key, role, children, depth)
        children.sort(key=lambda n: -_nbytes(clusters, group_bytes, n))
        clusters[key] = Cluster(key, label, role, tuple(sorted(members, key=order.__getitem__)), tuple(children),
                                sum(group_bytes[g] for g in members))
        for n in children:
            parent[n] = key
        return key

    top: list[Node] = []
    if len(infos) <= MAX_NODES:
        top = list(infos)
    else:
        for role, title, _ in ROLES:
            members = [g for g in infos if homes[g][0] == role]
            if members:
                top.append(build(role, title, role, members, 0))
    top.sort(key=lambda n: -_nbytes(clusters, group_bytes, n))
    clusters[""] = Cluster("", "model", "", tuple(infos), tuple(top), sum(group_bytes.values()))
    for n in top:
        parent[n] = ""
    return GraphTree(clusters, parent, group_bytes)


def _members(clusters, nodes) -> tuple[int, ...]:
    out = []
    for n in nodes:
        out.extend(clusters[n].groups if isinstance(n, str) else (n,))
    return tuple(out)


def _nbytes(clusters, group_bytes, n) -> int:
    return clusters[n].bytes if isinstance(n, str) else group_bytes[n]


def _node_name(clusters, homes, n, depth, last: bool = False) -> str:
    """How a range names its first (last) child: the layer component that tells them apart."""
    g = clusters[n].groups[-1 if last else 0] if isinstance(n, str) else n
    layer = homes[g][1]
    return layer[depth] if len(layer) > depth else str(g)


# --------------------------------------------------------------------------- positions

@dataclasses.dataclass(frozen=True)
class GraphLayout:
    tree: GraphTree
    opened: frozenset[str]  # clusters open
    nodes: tuple[Node, ...]  # drawn: groups and closed clusters, largest first
    pos: dict  # node -> (x, y) in data units
    edges: tuple[tuple[Node, Node, int], ...]  # (node, node, bytes of tensors holding both)
    labels: dict  # node -> (label, line under it)

    @property
    def groups_shown(self) -> int:
        """Decision groups drawn, as nodes or inside the clusters drawn: all of them."""
        return sum(len(self.tree.clusters[n].groups) if isinstance(n, str) else 1 for n in self.nodes)


def sub_line(tree: GraphTree, infos, node: Node, remat: str = "") -> str:
    """The line under a node's label: a group's size, layers and bytes (and the recompute
    its layers take), a cluster's group count."""
    if isinstance(node, str):
        c = tree.clusters[node]
        return f"{len(c.groups)} groups"  # its bytes: the node's size and its tooltip
    info = infos[node]
    layers = f" · ×{info.layers}" if info.layers > 1 else ""
    return f"{info.size}{layers} · {fmt_bytes(info.bytes)}" + (f" · ↻ {remat}" if remat else "")


def graph_layout(an, infos, tree: GraphTree | None = None, opened: Iterable[str] | None = None) -> GraphLayout:
    """Positions of the nodes drawn with ``opened`` clusters open (None: the first view)."""
    tree = tree or graph_tree(an, infos)
    in_units = set().union(*an.unit_groups.values()) if an.units else set()
    # a group of a layer stack may show the recompute its layers take: room for the longest
    sub = lambda n: sub_line(tree, infos, n, "regather" if n in in_units else "")  # noqa: E731
    opened = tree.first_view() if opened is None else frozenset(opened)
    nodes = sorted(tree.visible(opened), key=lambda n: -tree.nbytes(n))
    rep = {}
    for n in nodes:
        for g in (tree.clusters[n].groups if isinstance(n, str) else (n,)):
            rep[g] = n
    weight: dict[tuple, int] = {}
    for (a, b), nb in an.cooccur.items():
        ra, rb = rep.get(a), rep.get(b)
        if ra is None or rb is None or ra == rb or nb <= 0:
            continue
        k = (ra, rb) if nodes.index(ra) < nodes.index(rb) else (rb, ra)
        weight[k] = weight.get(k, 0) + nb
    keep = set()
    for n in nodes:
        mine = sorted((k for k in weight if n in k), key=lambda k: -weight[k])[:MAX_EDGES_PER_NODE]
        keep.update(mine)
    edges = [(a, b, weight[(a, b)]) for a, b in weight if (a, b) in keep]
    labels = {n: (short(tree.clusters[n].label) if isinstance(n, str) else short(infos[n].shown),
                  sub(n)) for n in nodes}
    pos = _positions(nodes, edges)
    most = max((tree.nbytes(n) for n in nodes), default=1)
    boxes = np.array([box(node_size(tree.nbytes(n), most), *labels[n]) for n in nodes], dtype=float)
    xy = separate(pos, boxes)
    return GraphLayout(tree, opened, tuple(nodes), {n: (float(x), float(y)) for n, (x, y) in zip(nodes, xy)},
                       tuple(edges), labels)


def _positions(nodes, edges) -> np.ndarray:
    G = nx.Graph()
    G.add_nodes_from(range(len(nodes)))
    idx = {n: i for i, n in enumerate(nodes)}
    if edges:
        lo = math.log(min(n for *_, n in edges))
        hi = math.log(max(n for *_, n in edges))
        for a, b, n in edges:
            w = (math.log(n) - lo) / (hi - lo) if hi > lo else 1.0
            G.add_edge(idx[a], idx[b], dist=1.3 - 0.4 * w)  # heavier co-occurrence, somewhat shorter spring
    if len(nodes) <= 1:
        return np.zeros((len(nodes), 2))
    if nx.is_connected(G):
        pos = nx.kamada_kawai_layout(G, weight="dist")
    else:
        pos = nx.spring_layout(G, seed=0, weight=None, k=1.2 / math.sqrt(len(nodes)))
    return _fit(np.array([pos[i] for i in range(len(nodes))], dtype=float))


def _fit(xy: np.ndarray) -> np.ndarray:
    """Centre and stretch the layout to fill the drawing, in pixels (origin at its centre)."""
    xy = xy - xy.mean(axis=0)
    if np.ptp(xy[:, 1]) > np.ptp(xy[:, 0]):  # lay the long side along x
        xy = xy[:, ::-1]
    span = np.abs(xy).max(axis=0)
    span[span == 0] = 1.0
    return xy / span * np.array([PX_W, PX_H]) * 0.4


def box(size: float, label: str, sub: str = "") -> tuple[float, float, float]:
    """A node's box in pixels around its centre: (half width, extent above, extent below):
    its circle (and conflict ring), its label and the line under it."""
    half = max(size + 12, len(label) * LABEL_PX, len(sub) * SUB_PX) / 2 + PAD / 2
    above = (size + 12) / 2 + PAD / 2
    below = (size + 12) / 2 + LABEL_H + (SUB_H if sub else 0) + PAD / 2
    return half, above, below


def label_dy(size: float) -> float:
    """The label's offset below the node's centre, pixels (below its conflict ring)."""
    return (size + 12) / 2 + 2


def overlaps(xy: np.ndarray, boxes: np.ndarray) -> list[tuple[int, int]]:
    """Pairs of nodes whose boxes overlap (pixel positions)."""
    out = []
    for i in range(len(xy)):
        for j in range(i + 1, len(xy)):
            if _overlap(xy, boxes, i, j) is not None:
                out.append((i, j))
    return out


def _overlap(xy, boxes, i, j):
    """How far boxes i and j overlap along x and along y (None: they do not)."""
    dx = abs(xy[i, 0] - xy[j, 0])
    ox = boxes[i, 0] + boxes[j, 0] - dx
    top, low = (i, j) if xy[i, 1] >= xy[j, 1] else (j, i)  # y grows upwards
    oy = boxes[top, 2] + boxes[low, 1] - (xy[top, 1] - xy[low, 1])
    return (ox, oy) if ox > 0 and oy > 0 else None


def separate(xy: np.ndarray, boxes: np.ndarray, rounds: int = 150) -> np.ndarray:
    """Push overlapping boxes apart along the axis where they overlap least, keeping every
    box inside the drawing; return data units."""
    xy = xy.copy()
    n = len(xy)
    lo = np.stack([-PX_W / 2 + boxes[:, 0], -PX_H / 2 + boxes[:, 2]], axis=1)
    hi = np.stack([PX_W / 2 - boxes[:, 0], PX_H / 2 - boxes[:, 1]], axis=1)
    hi = np.maximum(hi, lo)
    rng = np.random.default_rng(0)
    for _ in range(rounds):
        moved = False
        for i in range(n):
            for j in range(i + 1, n):
                o = _overlap(xy, boxes, i, j)
                if o is None:
                    continue
                moved = True
                ox, oy = o
                if ox / (boxes[i, 0] + boxes[j, 0]) < oy / (boxes[i, 1] + boxes[i, 2]):
                    s = np.sign(xy[i, 0] - xy[j, 0]) or rng.choice([-1.0, 1.0])
                    xy[i, 0] += s * (ox / 2 + 0.5)
                    xy[j, 0] -= s * (ox / 2 + 0.5)
                else:
                    s = np.sign(xy[i, 1] - xy[j, 1]) or rng.choice([-1.0, 1.0])
                    xy[i, 1] += s * (oy / 2 + 0.5)
                    xy[j, 1] -= s * (oy / 2 + 0.5)
        xy = np.clip(xy, lo, hi)
        if not moved:
            break
    if overlaps(xy, boxes):
        xy = _rows(xy, boxes)
    sx = (X_RANGE[1] - X_RANGE[0]) / PX_W
    sy = (Y_RANGE[1] - Y_RANGE[0]) / PX_H
    cx, cy = sum(X_RANGE) / 2, sum(Y_RANGE) / 2
    return np.stack([cx + xy[:, 0] * sx, cy + xy[:, 1] * sy], axis=1)


def _rows(xy: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Where pushing apart leaves overlaps (a crowded drawing): rows, top to bottom in the
    springs' order of height and each left to right in theirs, spaced evenly: the most rows
    of equal counts that fit the drawing, else as few rows as fit its width."""
    n = len(xy)
    by_y = [int(i) for i in np.argsort(-xy[:, 1], kind="stable")]

    def fits(rows):
        return (sum(max(boxes[r, 1]) + max(boxes[r, 2]) for r in rows) <= PX_H
                and all(2 * boxes[r, 0].sum() <= PX_W for r in rows))

    best = None
    for k in range(1, n + 1):
        rows = [by_y[round(i * n / k):round((i + 1) * n / k)] for i in range(k)]
        if fits(rows):
            best = rows
    if best is None:  # fill each row to the drawing's width
        best, row, width = [], [], 0.0
        for i in by_y:
            if row and width + 2 * boxes[i, 0] > PX_W:
                best.append(row)
                row, width = [], 0.0
            row.append(i)
            width += 2 * boxes[i, 0]
        best.append(row)
        if not fits(best):  # more than the drawing holds: keep the pushed positions
            return xy
    heights = [max(boxes[r, 1]) + max(boxes[r, 2]) for r in best]
    out = xy.copy()
    gap_y = (PX_H - sum(heights)) / len(best)
    top = PX_H / 2
    for r, h in zip(best, heights):
        r = sorted(r, key=lambda i: xy[i, 0])
        widths = 2 * boxes[r, 0]
        gap_x = (PX_W - widths.sum()) / len(r)
        x = -PX_W / 2 + gap_x / 2
        y = top - gap_y / 2 - max(boxes[r, 1])
        for i, w in zip(r, widths):
            out[i] = (x + w / 2, y)
            x += w + gap_x
        top -= h + gap_y
    return out


def to_pixels(pos: dict, nodes) -> np.ndarray:
    """Data units back to pixels of the least drawing (for checks)."""
    sx = (X_RANGE[1] - X_RANGE[0]) / PX_W
    sy = (Y_RANGE[1] - Y_RANGE[0]) / PX_H
    cx, cy = sum(X_RANGE) / 2, sum(Y_RANGE) / 2
    return np.array([((pos[n][0] - cx) / sx, (pos[n][1] - cy) / sy) for n in nodes], dtype=float)
