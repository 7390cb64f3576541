"""Named-dimension analysis on the demo models and small programs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from partex import demo_models
from partex import analyze_model, trace
from partex.analysis._analysis import analyze
from partex.analysis._analysis import NO_DIM


def _input(program, path):
    for vid, p in zip(program.inputs, program.input_paths):
        if p == path:
            return vid
    raise KeyError(path)


@pytest.fixture(scope="module")
def tiny_transformer():
    # batch=3 so that the batch size is unique among the tiny dims
    return analyze_model("transformer", "tiny", ["batch=3"])


def test_ffn_weights_share_one_named_dim(tiny_transformer):
    p, an = tiny_transformer.program, tiny_transformer.analysis
    w1 = _input(p, "params/layers/0/w1")
    b1 = _input(p, "params/layers/0/b1")
    w2 = _input(p, "params/layers/0/w2")
    nd = an.nd_of(w1, 1)
    assert nd != NO_DIM
    assert an.nd_of(b1, 0) == nd
    assert an.nd_of(w2, 0) == nd
    # the other layer's ffn is another named dim of the same group
    w1_1 = _input(p, "params/layers/1/w1")
    assert an.nd_of(w1_1, 1) != nd
    assert an.group_of(w1_1, 1) == an.group_of(w1, 1)
    assert an.groups[an.group_of(w1, 1)].label == "ffn"
    # d_model (w1 dim 0) is not the ffn dim
    assert an.nd_of(w1, 0) != nd


def test_batch_dims_of_inputs_and_activations_are_one_named_dim(tiny_transformer):
    p, an = tiny_transformer.program, tiny_transformer.analysis
    tokens = _input(p, "batch/tokens")
    targets = _input(p, "batch/targets")
    batch = an.nd_of(tokens, 0)
    assert an.nd_of(targets, 0) == batch
    activations = [v for v in p.values if len(v.shape) >= 2 and v.shape[0] == 3 and v.producer >= 0]
    assert len(activations) > 50
    for v in activations:
        assert an.nd_of(v.id, 0) == batch, (v, p.ops[v.producer].primitive)
    assert an.named_dims[batch].label == "batch"


def test_attention_scores_carry_an_intra_conflict(tiny_transformer):
    p, an = tiny_transformer.program, tiny_transformer.analysis
    seq = an.nd_of(_input(p, "batch/tokens"), 1)
    conflicts = [c for c in an.conflicts if c.named_dim == seq]
    assert len(conflicts) == 1
    c = conflicts[0]
    cfg = tiny_transformer.model.config
    shapes = {p.values[vid].shape: (a, b) for vid, a, b in c.values}
    assert shapes[(3, cfg.heads, cfg.seq, cfg.seq)] == (2, 3)
    d = an.describe_conflict(c)
    assert d["named_dim"] == "seq"
    assert any("dot_general" in step for step in d["path"])
    assert len(d["options"]) >= 2


def test_x_times_x_transpose_is_a_conflict():
    an = analyze(trace(lambda x: x @ x.T, (jnp.ones((8, 4)),)))
    assert len(an.conflicts) == 1
    (vid, a, b), = an.conflicts[0].values
    assert an.program.values[vid].shape == (8, 8) and (a, b) == (0, 1)


def test_plain_mlp_has_no_conflict():
    res = analyze_model("mlp")
    assert res.analysis.conflicts == ()
    assert res.analysis.unknown_primitives == {}


@pytest.mark.parametrize("name", list(demo_models.MODELS))
def test_no_unknown_primitives_in_demo_models(name):
    res = analyze_model(name)
    assert res.analysis.unknown_primitives == {}
    assert res.analysis.summary()["groups"] > 0


@pytest.mark.parametrize("name", ["transformer", "transformer-scan"])
def test_decision_groups_do_not_grow_with_depth(name):
    counts = {
        layers: analyze_model(name, "tiny", [f"layers={layers}"]).analysis.decision_space(2)["groups"]
        for layers in (2, 32, 48)
    }
    assert len(set(counts.values())) == 1, counts


def test_unrolled_and_scanned_give_the_same_groups():
    a = analyze_model("transformer").analysis
    b = analyze_model("transformer-scan").analysis
    assert sorted(g.label for g in a.decision_groups) == sorted(g.label for g in b.decision_groups)


def test_scan_body_is_analysed_once_with_carry_tied():
    res = analyze_model("transformer-scan", "tiny", ["layers=6"])
    p, an = res.program, res.analysis
    assert sum(1 for op in p.ops if op.primitive == "scan_enter") == 2  # forward + backward
    # the stacked w1's hidden dim (dim 2) is the ffn group; its layer dim is a loop axis
    w1 = _input(p, "params/layers/w1")
    assert an.groups[an.group_of(w1, 2)].label == "ffn"
    assert an.named_dims[an.nd_of(w1, 0)].loop_axis
    body_ops = [op for op in p.ops if op.trip == 6]
    assert body_ops and all(p.regions[op.region].kind == "scan" for op in body_ops)


def test_full_t48_is_analysed_from_shape_structs():
    res = analyze_model("transformer", "t48")
    assert all(isinstance(a, jax.ShapeDtypeStruct) for a in jax.tree.leaves(res.model.args))
    s = res.analysis.summary()
    assert s["groups"] == analyze_model("transformer").analysis.summary()["groups"]
    assert s["unknown_primitives"] == {}


def test_source_lines_and_paths_are_kept(tiny_transformer):
    p = tiny_transformer.program
    assert "params/layers/1/wq" in p.input_paths
    assert "opt_state/mu/layers/0/w1" in p.input_paths
    assert any("_transformer.py" in op.source for op in p.ops)
    assert p.output_paths[-1].startswith("out/")


def test_nested_calls_are_inlined_and_loops_kept():
    @jax.custom_jvp
    def f(x):
        return jnp.sin(x)

    f.defjvp(lambda p, t: (f(p[0]), t[0] * jnp.cos(p[0])))

    def fn(x, w):
        y = jax.jit(lambda a: a + 1)(x)
        y = jax.checkpoint(lambda a: jnp.tanh(f(a)))(y)
        y = jax.lax.cond(y.sum() > 0, lambda a: a * 2, lambda a: a - 1, y)
        return (y @ w).sum()

    def step(x, w):
        g = jax.grad(fn)(x, w)
        return jax.lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] @ w), (0, g))[1]

    p = trace(step, (jnp.ones((4, 4)), jnp.ones((4, 4))))
    prims = {op.primitive for op in p.ops}
    assert not prims & {"jit", "custom_jvp_call", "remat2", "checkpoint"}
    assert {"cond_exit", "while_exit"} <= prims
    an = analyze(p)
    assert an.unknown_primitives == {}


def test_axis_names_match_the_args_structure_with_empty_containers():
    """optax.adamw's state holds EmptyState(), an empty NamedTuple: names mirroring it
    label the arrays around it (not dropped silently), and a leaf whose names do not fit is
    left out with a warning naming it."""
    from typing import NamedTuple

    import jax.numpy as jnp

    from partex import analyze

    class EmptyState(NamedTuple):
        pass

    def step(params, opt_state, x):
        h = x @ params["w"]
        return {"w": params["w"] - 0.1 * x.T @ h}, opt_state, jnp.sum(h)

    args = ({"w": jnp.ones((8, 32))}, (EmptyState(), {"mu": jnp.ones((8, 32))}), jnp.ones((16, 8)))
    names = ({"w": ("embed", "hidden")}, (EmptyState(), {"mu": ("embed", "hidden")}), ("batch", "embed"))
    labels = {g.label for g in analyze(step, *args, axis_names=names).analysis.groups}
    assert {"hidden", "batch"} <= labels, labels
    bad = ({"w": ("embed",)}, (EmptyState(), {"mu": ("embed", "hidden")}), ("batch", "embed"))
    with pytest.warns(UserWarning, match=r"params/w \(rank 2\)"):
        labels = {g.label for g in analyze(step, *args, axis_names=bad).analysis.groups}
    assert "batch" in labels


def test_axis_names_that_do_not_mirror_the_args_are_matched_by_path_with_a_warning():
    """Names missing a leaf, or with one the args lack, still label every leaf they reach by
    path (a prefix labels the leaves under it); the warning names the first leaf left
    unnamed and the first names that match nothing, instead of dropping them all."""
    import jax.numpy as jnp

    from partex import analyze

    def step(params, opt, x):
        h = x @ params["w1"]
        return jnp.sum(h @ params["w2"]) + jnp.sum(opt["mu"]["w1"])

    args = ({"w1": jnp.ones((8, 32)), "w2": jnp.ones((32, 4))}, {"mu": {"w1": jnp.ones((8, 32))}},
            jnp.ones((16, 8)))
    partial = ({"w1": ("embed", "hidden")}, None, ("batch", "embed"))
    with pytest.warns(UserWarning, match=r"no names for params/w2;"):
        labels = {g.label for g in analyze(step, *args, axis_names=partial).analysis.groups}
    assert {"hidden", "embed", "batch"} <= labels, labels
    extra = ({"w1": ("embed", "hidden"), "w2": ("hidden", "out"), "b": ("out",)},
             {"mu": ("embed", "hidden")}, ("batch", "embed"))  # "mu": a prefix of mu/w1
    with pytest.warns(UserWarning, match=r"names for params/b match no argument"):
        an = analyze(step, *args, axis_names=extra).analysis
    assert {"hidden", "out", "batch"} <= {g.label for g in an.groups}


def _keyed_layers(tree, spell):
    """Every list held under "layers" as a dict keyed by spell(i) (layer_3, h.3, blocks[3])."""
    if isinstance(tree, dict):
        return {k: ({spell(i): _keyed_layers(x, spell) for i, x in enumerate(v)} if k == "layers" and
                    isinstance(v, list) else _keyed_layers(v, spell)) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_keyed_layers(x, spell) for x in tree)
    return tree


def _listed_layers(tree):
    if isinstance(tree, dict):
        return {k: ([_listed_layers(x) for x in v.values()] if k == "layers" and isinstance(v, dict)
                    else _listed_layers(v)) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_listed_layers(x) for x in tree)
    return tree


@pytest.mark.parametrize("spell", [lambda i: f"layer_{i}", lambda i: f"layers_{i}",
                                   lambda i: f"transformer_layer_{i}", lambda i: f"h.{i}",
                                   lambda i: f"blocks[{i}]"],
                         ids=["layer_3", "layers_3", "transformer_layer_3", "h.3", "blocks[3]"])
def test_layer_stacks_group_however_their_index_is_spelled(spell):
    """Layers keyed layer_0, h.0, blocks[0], ... (gemma, keras-hub, haiku spellings) form
    one stack as a list does: the decision groups do not grow with depth."""
    from partex import analyze, demo_models

    groups = []
    for layers in (2, 4):
        m = demo_models.build("transformer", "tiny", {"layers": layers})
        fn = m.fn
        args = _keyed_layers(tuple(m.args), spell)
        assert any(spell(1) in k for k in args[0]["layers"])
        step = lambda *a, fn=fn: _keyed_layers(fn(*_listed_layers(a)), spell)  # noqa: E731
        groups.append(len(analyze(step, *args).analysis.decision_groups))
    listed = len(analyze_model("transformer").analysis.decision_groups)
    assert groups == [listed, listed] == [9, 9]


@pytest.mark.parametrize("name", ["transformer", "moe"])  # the demos with unrolled layers
def test_layer_stacks_are_found_in_the_op_graph_without_any_name(name):
    """Every leaf of every argument passed as one flat list (keras' trainable_variables, an
    optimizer's state by position): no path says where a layer starts, yet the layers are
    one stack -- the same decision groups as the named model, at every depth -- because the
    traced ops repeat, block after chained block (engine/analysis/_stacks.py)."""
    from partex import analyze
    from partex.analysis._stacks import layer_blocks

    counts = []
    for layers in (2, 4):
        m = demo_models.build(name, "tiny", {"layers": layers})
        leaves, tree = jax.tree_util.tree_flatten(tuple(m.args))

        def flat_step(leaves, fn=m.fn, tree=tree):
            return fn(*jax.tree_util.tree_unflatten(tree, leaves))

        an = analyze(flat_step, leaves).analysis
        assert all(p.split("/")[1].isdigit() for p in an.program.input_paths)
        blocks = layer_blocks(an.program)
        assert [b.count for b in blocks if b.count == layers], blocks  # forward and backward stacks
        named = analyze(m.fn, *m.args).analysis
        counts.append((len(an.decision_groups), len(named.decision_groups)))
    assert counts[0] == counts[1] and counts[0][0] == counts[0][1], counts


# --------------------------------------------------------------------------- titles

def test_titles_name_activations_by_the_function_that_makes_them_and_labels_stay():
    """A group no input holds is titled by the user's function whose ops make it (unet's
    GroupNorm and upsampling reshapes, the conv's reversed kernel), not by a primitive; its
    label, the name plan and session files give its decisions, stays the structural one."""
    an = analyze_model("unet").analysis
    titles = an.titles
    by_label = {g.label: titles[g.id] for g in an.decision_groups}
    assert by_label["reshape[4]"] == "group_norm[4]" and by_label["reshape[4]#4"] == "group_norm[4]#4"
    assert by_label["broadcast_in_dim[2]"] == "upsample[2]" and by_label["reshape[4]#5"] == "upsample[4]#2"
    assert by_label["rev[0]"] == "conv[0]"
    assert by_label["channels#7"] == "channels#7" and by_label["conv*/w[0]"] == "conv*/w[0]"
    assert len(set(titles.values())) == len(titles)  # one title per group
    infos = an.group_infos()
    assert all(info.title == titles[g] for g, info in infos.items())
    assert {g["label"]: g["title"] for g in an.to_json()["group_list"]}["reshape[4]#5"] == "upsample[4]#2"


def test_a_plan_naming_a_group_by_its_label_resolves_to_that_group_whatever_its_title(tmp_path):
    """Plan and session files name decisions by label (an activation's group has no input
    anchor): the label resolves to the same group whatever title the group is shown with."""
    import json

    from partex import Plan, Session, Shard
    from partex.plan._planned import resolve_decisions

    s = Session.from_spec("unet", preset="tiny", mesh="data=4,model=2")
    plan = s.plan([("reshape[4]#5", "model"), ("batch", "data")])
    d = plan.to_json()
    for x in d["decisions"]:
        x.pop("anchor", None)  # by label alone
    assert [x["group"] for x in d["decisions"]] == ["reshape[4]#5", "batch"]
    (tmp_path / "plan.json").write_text(json.dumps(d))
    an = s.analysis
    d0, _ = resolve_decisions(Plan.load(tmp_path / "plan.json"), an)
    assert isinstance(d0, Shard) and d0.axis == "model"
    g = d0.group
    assert an.titles[g] == "upsample[4]#2"
    assert s.group("reshape[4]#5").id == g  # a pin by label (the CLI's, a session file's)
    s.pin("reshape[4]#5", "model")
    assert s.to_json()["pins"] == [{"group": "reshape[4]#5", "axis": "model"}]


def test_the_demos_keep_their_familiar_titles():
    for name in ("transformer", "moe", "llama"):
        an = analyze_model(name).analysis
        titles = an.titles
        shown = {titles[g.id] for g in an.decision_groups}
        assert {"batch", "d_model", "ffn", "heads", "vocab"} <= shown, (name, shown)
        assert all(titles[g.id] == g.label for g in an.decision_groups if g.label.split("#")[0] in
                   ("batch", "seq", "d_model", "ffn", "heads", "vocab", "experts"))


def test_a_models_batch_without_axis_names_is_titled_by_its_role():
    """No logical names: the data's batch dim is labelled by its leaf (``x[0]``) and titled
    by its role; a weight's dims by their leaf and dim."""
    def step(params, x):
        def loss(p):
            return jnp.mean(jnp.tanh(x @ p["w1"]) @ p["w2"])
        grads = jax.grad(loss)(params)
        return jax.tree_util.tree_map(lambda p, g: p - g, params, grads), loss(params)

    params = {"w1": jnp.zeros((16, 64)), "w2": jnp.zeros((64, 8))}
    from partex import analyze as analyze_fn

    an = analyze_fn(step, params, jnp.zeros((32, 16))).analysis
    titles = {g.label: an.titles[g.id] for g in an.decision_groups}
    assert titles["x[0]"] == "batch", titles
    assert titles["params/w1[1]"] == "params/w1[1]", titles


# --------------------------------------------------------------------------- roles through a concatenate

def test_a_unet_block_output_joined_to_a_skip_connection_is_no_vocabulary():
    """A U-Net block's output channels are joined to an earlier block's by a concatenate
    whose dim the next block's convs contract. One matmul at a time they look like a
    vocabulary (produced, never contracted: column-parallel outputs, sharded alike by the
    hand strategies); the roles say they are joined groups, the LM's head and embedding
    are not."""
    an = analyze_model("unet").analysis
    roles = an.roles
    up0 = an.group_by_label("channels#7")  # up/0's conv2 and skip outputs, concatenated into up/1
    assert roles.joined_groups == (up0.id,)
    assert set(roles.joined_groups) <= set(roles.vocab_groups)
    tr = analyze_model("transformer").analysis
    assert [tr.groups[g].label for g in tr.roles.vocab_groups] == ["vocab", "vocab#2"]
    assert tr.roles.joined_groups == ()


def test_a_matmul_output_concatenated_into_a_contracted_dim_is_joined_not_vocabulary():
    def step(params, x):
        def loss(p):
            a = x @ p["w1"]  # [32, 8]: w1's dim 1, produced
            c = jnp.concatenate([a, x], axis=1)  # [32, 12]
            return jnp.mean((c @ p["w2"]) ** 2)  # w2's dim 0 contracts the joined dim
        grads = jax.grad(loss)(params)
        return jax.tree_util.tree_map(lambda p, g: p - g, params, grads), loss(params)

    from partex import analyze as analyze_fn

    params = {"w1": jnp.zeros((4, 8)), "w2": jnp.zeros((12, 6))}
    res = analyze_fn(step, params, jnp.zeros((32, 4)))
    an, p = res.analysis, res.program
    w1 = _input(p, "params/w1")
    w2 = _input(p, "params/w2")
    roles = an.roles
    assert an.group_of(w1, 1) in roles.joined_groups  # contracted by w2, after the concatenate
    assert an.group_of(w2, 1) in roles.vocab_groups  # produced, never contracted: the head's output
    assert an.group_of(w2, 1) not in roles.joined_groups


def test_a_metric_that_reads_only_the_batch_is_not_the_forward_pass():
    """MaxText reports a count of the batch's target tokens beside the loss: that 3-op metric
    reads no parameter, so the forward pass (and the Megatron pair found in it) is the loss's."""
    def step(params, batch):
        def loss(p):
            return jnp.mean((jax.nn.relu(batch["x"] @ p["w1"]) @ p["w2"]) ** 2)
        value, g = jax.value_and_grad(loss)(params)
        new = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, g)
        return new, {"loss": value, "total_weights": jnp.sum(batch["mask"] != 0)}

    params = {"w1": jnp.ones((16, 64)) / 16, "w2": jnp.ones((64, 16)) / 64}
    batch = {"x": jnp.ones((8, 16)), "mask": jnp.ones((8, 4), jnp.int32)}
    import partex

    roles = partex.analyze(step, params, batch).analysis.roles
    assert len(roles.param_matmuls) == 2 and len(roles.pair_groups) == 1
