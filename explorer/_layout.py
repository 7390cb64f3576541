"""Where the named-dimension graph puts its nodes (computed in the load job, off the page's
event loop: Kamada-Kawai needs scipy's optimiser).

Legibility: the graph shows decision groups, not named dimensions, so an unrolled stack of
layers is one node per role ("ffn ×2"), and at most ``MAX_NODES`` of them (the heaviest);
each node keeps its ``MAX_EDGES_PER_NODE`` heaviest edges. Springs are short between groups
that share many bytes of tensors; the layout is deterministic.
"""

from __future__ import annotations

import dataclasses
import math

import networkx as nx
import numpy as np

MAX_NODES = 24
MAX_EDGES_PER_NODE = 4


@dataclasses.dataclass(frozen=True)
class GraphLayout:
    nodes: tuple[int, ...]  # group ids drawn, heaviest first
    pos: dict[int, tuple[float, float]]  # in [-1, 1]^2
    edges: tuple[tuple[int, int, int], ...]  # (group, group, bytes of tensors holding both)
    hidden: int  # decision groups not drawn


def graph_layout(an) -> GraphLayout:
    groups = sorted(an.decision_groups, key=lambda g: -g.bytes)
    nodes = [g.id for g in groups[:MAX_NODES]]
    shown = set(nodes)
    pairs = [(a, b, n) for (a, b), n in an.cooccur.items() if a in shown and b in shown and n > 0]
    keep = set()
    for g in nodes:
        mine = sorted((p for p in pairs if g in p[:2]), key=lambda p: -p[2])[:MAX_EDGES_PER_NODE]
        keep.update((a, b) for a, b, _ in mine)
    edges = [(a, b, n) for a, b, n in pairs if (a, b) in keep]
    G = nx.Graph()
    G.add_nodes_from(nodes)
    if edges:
        lo = math.log(min(n for *_, n in edges))
        hi = math.log(max(n for *_, n in edges))
        for a, b, n in edges:
            w = (math.log(n) - lo) / (hi - lo) if hi > lo else 1.0
            G.add_edge(a, b, dist=1.6 - 0.8 * w)  # heavier co-occurrence, shorter spring
    if len(nodes) <= 1:
        pos = {g: np.zeros(2) for g in nodes}
    elif nx.is_connected(G):
        pos = nx.kamada_kawai_layout(G, weight="dist")
    else:
        pos = nx.spring_layout(G, seed=0, weight=None, k=1.2 / math.sqrt(len(nodes)))
    xy = np.array([pos[g] for g in nodes], dtype=float).reshape(-1, 2)
    if len(nodes):
        xy -= xy.mean(axis=0)
        xy /= np.abs(xy).max() or 1.0
    return GraphLayout(tuple(nodes), {g: (float(x), float(y)) for g, (x, y) in zip(nodes, xy)},
                       tuple(edges), len(groups) - len(nodes))
