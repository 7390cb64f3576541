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
    roles = an.roles
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


def test_search_finds_a_group_by_title_label_or_path(model):
    name, an, infos = model
    found = search_options(infos)
    for g, info in infos.items():
        assert found[info.title] == g
        assert found[info.label] == g  # the name plan files give it finds it too
        for path, _, dim in info.tensors[:3]:
            assert found[f"{path} dim {dim} · {info.title}"] == g


# primitives whose names labelled the groups no input holds ("reshape[4]#5")
PRIMITIVES = ("reshape", "broadcast_in_dim", "rev", "iota", "concatenate", "transpose", "dot_general",
              "conv_general_dilated", "squeeze", "expand_dims", "slice", "pad", "gather", "select_n", "const")


def test_nodes_show_titles_from_the_program_not_primitive_names(model):
    """Every node and cluster drawn, at the first view and opened to any group, reads as the
    model's own names: logical names, input leaves and dims, roles, the functions that make
    activations (unet: group_norm[4], upsample[2]), each in full or cut at its start."""
    name, an, infos = model
    tree = L.graph_tree(an, infos)
    views = [tree.first_view()] + [tree.open(tree.first_view(), tree.parent[g]) for g in infos if tree.parent[g]]
    for opened in views[:: max(1, len(views) // 8)]:
        lay = L.graph_layout(an, infos, tree, opened)
        for n in lay.nodes:
            label = lay.labels[n][0]
            assert label.split("[")[0].split("/")[-1] not in PRIMITIVES, (n, label)
            if isinstance(n, int):
                assert label == L.short(infos[n].title)
                # a cut keeps the dim and the end of the path
                assert label == infos[n].title or label.startswith("…") or "…" in label, label
    for info in infos.values():
        assert info.title.split("[")[0] not in PRIMITIVES, info
    if name == "unet":
        titles = {info.label: info.title for info in infos.values()}
        assert titles["reshape[4]"] == "group_norm[4]" and titles["reshape[4]#5"] == "upsample[4]#2"
        assert titles["rev[0]"] == "conv[0]" and titles["channels"] == "channels"
        # a U-Net has no vocabulary: its block output joined to a skip connection is drawn as
        # what it is (tests/test_analysis.py), never under a "vocabulary" cluster
        assert not any(c.role == "vocab" for c in tree.clusters.values())
        joined = an.group_by_label("channels#7").id
        assert all(tree.clusters[k].role == "joined" for k in tree.path(joined))
    if name == "transformer":  # the demos' familiar names stay as they were
        assert {"batch", "seq", "d_model", "ffn", "heads", "vocab"} <= {i.title for i in infos.values()}
        assert all(i.title == i.label for i in infos.values())


@pytest.mark.parametrize("label, want", [
    ("broadcast_in_dim_long[2]", "broadcast_in_dim…[2]"),
    ("group_norm[4]#2", "group_norm[4]#2"),
    ("params/layers/*/attention/wq[1]", "…/*/attention/wq[1]"),
    ("transformer_layer_*/mlp_gate_proj[1]", "…/mlp_gate_proj[1]"),
    ("down/1/block/conv1 · param", "…/conv1 · param"),
])
def test_short_keeps_a_labels_dim_and_its_paths_end(label, want):
    assert L.short(label) == want
    assert len(L.short(label)) <= L.LABEL_CHARS


def test_a_full_size_unet_clusters_its_skip_joined_outputs_not_as_vocabulary():
    an = partex.Session.from_spec("unet", preset="full", mesh="data=4,model=2").model.analysis
    infos = an.group_infos()
    tree = L.graph_tree(an, infos)
    roles = {c.role: c.label for c in tree.clusters.values()}
    assert "vocab" not in roles and roles["joined"] == "skip-joined outputs", roles
