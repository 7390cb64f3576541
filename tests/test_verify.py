"""The cost model against XLA: every demo model x hand strategy on two 8-device meshes.

Each (model, mesh) compiles its four plans in one fresh process with 8 simulated CPU
devices (``verify_many``), runs them and compares with the unsharded function. Bounds:
argument bytes within 1%, peak memory within 35%, collective bytes per kind within 25%,
per-device FLOPs within 10% of XLA's cost analysis (the U-Net's 16%: see _check), loss and
outputs within 1e-4 relative.
"""

from __future__ import annotations

import pytest

from partex import demo_models
from partex import analyze_model
from partex.cost import CostModel
from partex import MeshSpec, get_hardware
from partex.plan._planned import default_donate
from partex.plan._planning import make_plan
from partex.planner._strategies import strategy_decisions
from partex.plan._verify import verify_many

from _accuracy import check_report as _check

STRATEGIES = ("replicated", "dp", "megatron", "zero3")


# every demo model on both meshes, but the U-Net only where it is sharded two ways (its
# data=8 case compiles for 35 s and checks nothing the other meshes do not)
CASES = [(m, mesh) for m in demo_models.MODELS for mesh in ("data=4,model=2", "data=8")
         if (m, mesh) != ("unet", "data=8")]


@pytest.mark.parametrize("model,mesh_text", CASES)
def test_predictions_match_xla(tmp_path, model, mesh_text):
    res = analyze_model(model)
    mesh = MeshSpec.parse(mesh_text)
    hw = get_hardware("tpu-v4")
    donate = default_donate(res.program)
    cm = CostModel(res.analysis, mesh, hw, donate=donate)
    paths = []
    for s in STRATEGIES:
        plan = make_plan(res, mesh, hw, strategy_decisions(s, res.analysis, mesh), strategy=s,
                         donate=donate, cost_model=cm)
        paths.append(str(tmp_path / f"{s}.json"))
        plan.save(paths[-1])
    rows = verify_many(model, paths, run=True, timeout=900)
    assert [r.strategy for r in rows] == list(STRATEGIES)
    problems = [p for r in rows for p in _check(r)]
    assert problems == []


def _key_bias_attention():
    """Attention with a key bias, trained with Adam: the bias's gradient is exactly zero
    (softmax ignores a shift), so its Adam moments hold rounding noise (~1e-13, ~1e-26)."""
    import jax
    import jax.numpy as jnp

    from partex.demo_models._common import adam_init, adam_update

    def loss_fn(p, batch):
        x = batch["x"]
        q, k, v = x @ p["wq"], x @ p["wk"] + p["bk"], x @ p["wv"]
        h = jax.nn.softmax(jnp.einsum("btd,bsd->bts", q, k) / 4.0, axis=-1) @ v
        return jnp.mean((jnp.tanh(h @ p["wo"]) - batch["y"]) ** 2)

    def step(params, opt, batch):
        loss, g = jax.value_and_grad(loss_fn)(params, batch)
        params, opt = adam_update(params, g, opt, 1e-3)
        return params, opt, loss

    ks = jax.random.split(jax.random.key(0), 7)
    params = {n: jax.random.normal(ks[i], (64, 64)) / 8 for i, n in enumerate(["wq", "wk", "wv", "wo"])}
    params["bk"] = jax.random.normal(ks[4], (64,)) / 8
    batch = {"x": jax.random.normal(ks[5], (16, 32, 64)), "y": jax.random.normal(ks[6], (16, 32, 64))}
    return step, (params, adam_init(params), batch)


def test_numerics_do_not_cry_wolf_on_noise_and_still_catch_a_misplaced_shard():
    import jax
    import numpy as np

    import partex
    from partex.plan._verify import compare_outputs

    step, args = _key_bias_attention()
    plan = partex.Session(step, args, mesh="data=4,model=2").plan(strategy="megatron")
    out = partex.verify(plan, step, args, run=True)
    assert out.numerics.ok, out.numerics  # a correct plan passes ...
    expected = jax.jit(step)(*args)
    got = partex.apply_plan(plan, step)(*jax.tree.map(np.array, args))
    paths = [f"out/{i}/{'/'.join(str(getattr(k, 'key', getattr(k, 'idx', k))) for k in path)}"
             for i, tree in enumerate(expected) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    ref_l, got_l = jax.tree.leaves(expected), [np.asarray(x) for x in jax.tree.leaves(got)]
    # ... though relative to themselves its bias's Adam moments differ wholesale (the false alarm)
    assert not compare_outputs(paths, ref_l, got_l, floor=0.0)["ok"]
    # a shard in the wrong place: the two halves of the new wq's columns swapped
    wrong = list(got_l)
    i = paths.index("out/0/wq")
    wrong[i] = np.concatenate([got_l[i][:, 32:], got_l[i][:, :32]], axis=1)
    caught = compare_outputs(paths, ref_l, wrong)
    assert not caught["ok"] and caught["worst_output"] == "out/0/wq", caught


def test_run_numerics_with_prng_key_arguments():
    """Typed PRNG keys (an RNG in the train state) run and compare by their key data."""
    import jax
    import jax.numpy as jnp

    import partex

    def step(w, x, key):
        k1, k2 = jax.random.split(key)
        mask = jax.random.bernoulli(k1, 0.9, (x.shape[0], w.shape[1]))
        g = jax.grad(lambda w: jnp.mean((x @ w) * mask))(w)
        return w - 0.1 * g, k2

    s = partex.Session(step, (jnp.ones((16, 32)), jnp.ones((8, 16)), jax.random.key(1)), mesh="data=4,model=2")
    out = s.verify(s.plan(strategy="dp"), run=True)
    assert out.numerics.ok, out.numerics
