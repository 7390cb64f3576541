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

MAX_NODES = 16
MAX_EDGES_PER_NODE = 4
WIDTH, HEIGHT = 1.3, 1.0  # the drawing's half extents (the figure is about 1.4x wider than high)
MIN_GAP = 0.62  # least distance between two node centres: room for the node and its label


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
            G.add_edge(a, b, dist=1.3 - 0.4 * w)  # heavier co-occurrence, somewhat shorter spring
    if len(nodes) <= 1:
        pos = {g: np.zeros(2) for g in nodes}
    elif nx.is_connected(G):
        pos = nx.kamada_kawai_layout(G, weight="dist")
    else:
        pos = nx.spring_layout(G, seed=0, weight=None, k=1.2 / math.sqrt(len(nodes)))
    xy = np.array([pos[g] for g in nodes], dtype=float).reshape(-1, 2)
    if len(nodes) > 1:
        xy = _fit(xy)
        xy = _spread(xy, MIN_GAP * min(1.0, math.sqrt(12 / len(nodes))))
    return GraphLayout(tuple(nodes), {g: (float(x), float(y)) for g, (x, y) in zip(nodes, xy)},
                       tuple(edges), len(groups) - len(nodes))


def _fit(xy: np.ndarray) -> np.ndarray:
    """Centre and stretch the layout to fill the drawing's box."""
    xy = xy - xy.mean(axis=0)
    if np.ptp(xy[:, 1]) > np.ptp(xy[:, 0]):  # lay the long side along x
        xy = xy[:, ::-1]
    span = np.abs(xy).max(axis=0)
    span[span == 0] = 1.0
    return xy / span * np.array([WIDTH, HEIGHT])


def _spread(xy: np.ndarray, gap: float, rounds: int = 200) -> np.ndarray:
    """Push apart nodes closer than ``gap`` (overlapping circles and labels), keeping them
    in the box."""
    xy = xy.copy()
    n = len(xy)
    box = np.array([WIDTH, HEIGHT])
    for _ in range(rounds):
        d = xy[:, None, :] - xy[None, :, :]
        dist = np.sqrt((d ** 2).sum(-1)) + np.eye(n) * 1e9
        close = dist < gap
        if not close.any():
            break
        push = np.where(close, (gap - dist) / 2 / np.maximum(dist, 1e-6), 0.0)
        xy += (d * push[:, :, None]).sum(axis=1) * 0.6
        xy = np.clip(xy, -box, box)
    return xy
