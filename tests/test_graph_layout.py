"""The named-dimension graph at any size (explorer/_layout.py): clusters by role and layer
hold every decision group, the first view and a view opened to any group stay within their
node limits, no two nodes' boxes (circle, label, the line under it) overlap, and the search
box finds a group by its label or a pytree path."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

import partex
from partex.explorer import _layout as L
from partex.explorer._graph import search_options

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _tower():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import tower
    finally:
        sys.path.pop(0)
    fn, args = tower.make()
    return partex.analyze(fn, *args).analysis


@pytest.fixture(scope="module", params=["transformer", "unet", "tower"])
def model(request):
    if request.param == "tower":
        an = _tower()
    else:
        an = partex.Session.from_spec(request.param, preset="tiny", mesh="data=4,model=2").model.analysis
    return request.param, an, an.group_infos()


def _members(tree, n):
    return tree.clusters[n].groups if isinstance(n, str) else (n,)


def _check(lay, infos):
    tree = lay.tree
    drawn = [g for n in lay.nodes for g in _members(tree, n)]
    assert sorted(drawn) == sorted(infos), "every group drawn once: as a node or inside one cluster node"
    assert lay.groups_shown == len(infos)
    most = max(tree.nbytes(n) for n in lay.nodes)
    boxes = np.array([L.box(L.node_size(tree.nbytes(n), most), *lay.labels[n]) for n in lay.nodes])
    px = L.to_pixels(lay.pos, lay.nodes)
    clash = [(lay.labels[lay.nodes[i]][0], lay.labels[lay.nodes[j]][0]) for i, j in L.overlaps(px, boxes)]
    assert not clash, clash
    assert (np.abs(px[:, 0]) + boxes[:, 0] <= L.PX_W / 2 + 1e-6).all()  # inside the drawing
    assert (px[:, 1] + boxes[:, 1] <= L.PX_H / 2 + 1e-6).all() and (px[:, 1] - boxes[:, 2] >= -L.PX_H / 2 - 1e-6).all()
    for n in lay.nodes:
        assert len(lay.labels[n][0]) <= L.LABEL_CHARS


def test_first_view_holds_every_group_without_overlaps(model):
    name, an, infos = model
    lay = L.graph_layout(an, infos)
    _check(lay, infos)
    assert len(lay.nodes) <= L.MAX_NODES
    if len(infos) <= L.MAX_NODES:
        assert set(lay.nodes) == set(infos)  # a small model: group by group
    else:
        assert any(isinstance(n, str) for n in lay.nodes)
    # clusters split by role first: a cluster's groups all play its role
    roles = an.roles()
    for c in lay.tree.clusters.values():
        if c.role == "pair":
            assert set(c.groups) <= set(roles.pair_groups)
        if c.role == "batch":
            assert set(c.groups) <= set(roles.batch_groups)


def test_any_group_can_be_opened_to(model):
    name, an, infos = model
    tree = L.graph_tree(an, infos)
    first = tree.first_view()
    groups = sorted(infos, key=lambda g: infos[g].bytes)
    for g in groups[:: max(1, len(groups) // 12)] + groups[-1:]:  # a dozen of them, smallest to largest
        opened = tree.open(first, tree.parent[g]) if tree.parent[g] else first
        lay = L.graph_layout(an, infos, tree, opened)
        assert g in lay.nodes
        _check(lay, infos)
        closed = tree.close(opened, tree.path(g)[0]) if tree.path(g) else opened
        assert g not in tree.visible(closed) or not tree.path(g)


def test_ranges_and_layers_follow_the_model(model):
    name, an, infos = model
    tree = L.graph_tree(an, infos)
    for c in tree.clusters.values():
        assert len(c.children) <= max(2 * L.MAX_CHILDREN, len(tree.clusters[""].children))
        assert sorted(g for ch in c.children for g in _members(tree, ch)) == sorted(c.groups)
    if name == "tower":
        # 110 blocks of distinct widths: 222 groups, ranges of blocks in order, one layer per block
        assert len(infos) > 200
        labels = {c.label for c in tree.clusters.values()}
        assert "57 · TP" in labels
        g57 = next(g for g, i in infos.items() if i.label == "57/down[0]")
        assert tree.clusters[tree.parent[g57]].label == "57 · TP"
        assert tree.clusters[tree.path(g57)[-2]].label.endswith("· TP") and "…" in tree.clusters[tree.path(g57)[-2]].label


def test_search_finds_a_group_by_label_or_path(model):
    name, an, infos = model
    found = search_options(infos)
    for g, info in infos.items():
        assert found[info.label] == g
        for path, _, dim in info.tensors[:3]:
            assert found[f"{path} dim {dim} · {info.label}"] == g
