"""MaxText's Mixtral (a mixture-of-experts decoder) and MaxText's own pre-training step, for partex.

Built as ``maxtext_llama.py`` builds llama2 (MaxText's pyconfig, mesh, NNX model, AdamW,
``TrainStateNNX`` and ``train_step``; random init, nothing downloaded), from MaxText's
``models/mixtral-8x7b.yml`` (``decoder_block: mixtral``: every layer's MLP is a routed MoE), on
one of MaxText's MoE paths (``layers/moe.py`` ``RoutedMoE``), ``make(path=...)``:

- ``"dense"`` (the default): ``dense_matmul`` with ``capacity_factor`` 2: GShard's one-hot
  dispatch and combine einsums with a per-expert capacity, every op a plain jnp op that MaxText
  constrains with its logical names. The mesh is ``maxtext_llama.py``'s: MaxText's tensor axis
  named ``model`` (the experts' MLP and embedding dims of activations on it), the batch on
  ``data``.
- ``"sparse"``: ``sparse_matmul``, MaxText's production path: a ``jax.shard_map`` region over
  MaxText's mesh in which each device routes its own tokens (top-k, a sort by expert),
  multiplies them with ``jax.lax.ragged_dot`` (``megablox: false``: MaxText's megablox and
  tokamax Pallas kernels are TPU and GPU kernels) and combines them; its in/out specs come from
  the logical-axis rules, its ``psum`` s are written in its body. MaxText's MoE layer finds its
  tensor and expert axes by name (``"tensor"``, ``"expert"`` in ``RoutedMoE.__init__``): with
  the tensor axis renamed ``model`` the region computes its output whole and declares it
  sharded (a (8, 32, 128) output for emb 64). So here the plan's ``model`` axis is MaxText's
  FSDP axis (``fsdp`` renamed ``model`` in ``mesh_axes``, ``data_sharding`` and every rule;
  MaxText sizes an axis called ``model`` by ``ici_tensor_parallelism``, which therefore carries
  the size, and the tensor axis, of size 1, leaves the mesh and the rules): the tokens go on
  ``data`` and ``model``, and each device holds every expert's weights inside the region.
- ``"sparse_ep"``: the same with expert parallelism on MaxText's own ``expert`` axis (its own
  axis names): the region dispatches tokens to their experts' devices and back with
  ``jax.lax.ragged_all_to_all``, which XLA:CPU cannot compile ("UNIMPLEMENTED: HLO opcode
  `ragged-all-to-all` is not supported by XLA:CPU"): analyse and plan it here, run it on a GPU
  or TPU.

The sparse paths' regions run over MaxText's whole mesh (its axes of size 1 included): plan
them on that mesh (``mesh="step"``). The mesh is ``data=N/2`` by 2 (``model``, or ``expert``)
over the process's N devices unless ``MAXTEXT_MESH`` (``data=D,model=M``) says otherwise.

``size="tiny"``: emb 64, 4 heads of 16, 4 experts of MLP width 128, 2 per token, vocab 256,
seq 32, float32, real arrays, global batch 8. ``size="full"``: mixtral-8x7b (emb 4096, 32
heads, 8 experts of 14336, 2 per token, vocab 32000; seq 4096, bfloat16 activations) as
ShapeDtypeStructs.

    partex analyze scripts/libmodels/maxtext_moe.py:tiny
    partex bench   scripts/libmodels/maxtext_moe.py:tiny --mesh data=4,model=2 --memory 4MiB --budget 10
    partex bench   scripts/libmodels/maxtext_moe.py:tiny_sparse --mesh step --memory 8MiB --budget 10
    partex analyze scripts/libmodels/maxtext_moe.py:tiny_ep
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys

import jax


def _sibling(name: str):
    """scripts/libmodels/<name>.py, loaded once per process (its MaxText imports included)."""
    key = f"partex_libmodel_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, os.path.join(os.path.dirname(__file__), f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


_llama = _sibling("maxtext_llama")  # MaxText's imports, the batch, the names, the run settings

with contextlib.redirect_stdout(sys.stderr):
    from flax import nnx
    from flax.linen import partitioning as nn_partitioning
    from maxtext.common import train_state_nnx
    from maxtext.configs import pyconfig
    from maxtext.trainers.pre_train import train as mt_train
    from maxtext.utils import maxtext_utils, model_creation_utils, sharding, train_utils

GLOBAL_BATCH = _llama.GLOBAL_BATCH

# MaxText's MoE paths (layers/moe.py RoutedMoE.__call__), each as MaxText's settings
PATHS = {
    # GShard-style dense dispatch: one-hot dispatch/combine einsums with a per-expert capacity
    # (capacity_factor > 0: tokens over it are dropped); MaxText's tensor axis named ``model``
    "dense": dict(sparse_matmul=False, megablox=False, capacity_factor=2.0),
    # the shard_map with a per-device sort and jax.lax.ragged_dot (no Pallas kernel), dropless;
    # MaxText's fsdp axis named ``model`` (its MoE layer needs its tensor axis called "tensor")
    "sparse": dict(sparse_matmul=True, megablox=False, use_tokamax_gmm=False, capacity_factor=-1.0),
    # the same with expert parallelism: tokens dispatched by jax.lax.ragged_all_to_all over
    # MaxText's own ``expert`` axis (XLA:CPU cannot compile it)
    "sparse_ep": dict(sparse_matmul=True, megablox=False, use_tokamax_gmm=False, capacity_factor=-1.0),
}
TINY = dict(base_emb_dim=64, base_num_query_heads=4, base_num_kv_heads=4, head_dim=16, base_mlp_dim=128,
            base_moe_mlp_dim=128, num_experts=4, num_experts_per_tok=2, vocab_size=256, max_target_length=32,
            dtype="float32", learning_rate=1e-3, warmup_steps_fraction=0.0)
FULL = dict(max_target_length=4096)  # mixtral-8x7b.yml as it is; MaxText's dtypes (bf16 activations)


def _strip_tensor(axes):
    """A mesh-axes entry or rule without MaxText's tensor axis (size 1 here)."""
    if isinstance(axes, str):
        return axes
    return [_strip_tensor(a) for a in axes if a != "tensor"]


# MaxText's mesh axes as the plan names them, per path (see the module docstring)
_PLAN_AXES = {
    "dense": lambda axes: _llama._rename(axes, "tensor", "model"),
    "sparse": lambda axes: _llama._rename(_strip_tensor(axes), "fsdp", "model"),
}
# which ici_*_parallelism carries the second axis's size (MaxText sizes an axis called
# ``model`` by ici_tensor_parallelism)
_SECOND_ICI = {"dense": "ici_tensor_parallelism", "sparse": "ici_tensor_parallelism",
               "sparse_ep": "ici_expert_parallelism"}


def config(layers: int, size: str = "tiny", path: str = "dense", **overrides):
    """MaxText's HyperParameters for mixtral-8x7b (tiny: shrunk) on this process's devices,
    on one of MaxText's MoE ``PATHS``."""
    if size not in ("tiny", "full"):
        raise ValueError(f"size must be 'tiny' or 'full', got {size!r}")
    if path not in PATHS:
        raise ValueError(f"path must be one of {sorted(PATHS)}, got {path!r}")
    sizes = _llama.mesh_sizes()
    n = sizes["data"] * sizes["model"]
    kw = dict(_llama._RUN, model_name="mixtral-8x7b", override_model_config=True,
              per_device_batch_size=GLOBAL_BATCH / n, ici_data_parallelism=sizes["data"], ici_fsdp_parallelism=1,
              ici_tensor_parallelism=1, base_num_decoder_layers=layers, **PATHS[path])
    kw[_SECOND_ICI[path]] = sizes["model"]
    kw.update(TINY if size == "tiny" else FULL)
    kw.update(overrides)
    with contextlib.redirect_stdout(sys.stderr):
        cfg = pyconfig.initialize(None, **kw)
        if path not in _PLAN_AXES:
            return cfg
        plan_axes = _PLAN_AXES[path]
        rules = [[name, plan_axes(axes)] for name, axes in cfg.logical_axis_rules]
        return pyconfig.initialize(
            None, **kw, mesh_axes=plan_axes(list(cfg.mesh_axes)),
            data_sharding=[plan_axes(list(d)) for d in cfg.data_sharding],
            logical_axis_rules=rules, override_logical_axis_rules=True)


def build(layers: int, size: str = "tiny", path: str = "dense", **overrides):
    """(step, state, data, names, cfg, mesh): MaxText's pieces as its train loop sets them up
    (``train_utils.setup_train_loop`` less the data pipeline and checkpoint manager)."""
    cfg = config(layers, size, path, **overrides)
    with contextlib.redirect_stdout(sys.stderr):
        mesh = maxtext_utils.get_mesh_from_config(cfg)
        create_model, abstract_model = model_creation_utils.create_nnx_abstract_model(cfg, mesh)
        _, tx = train_utils.create_training_optimizer(cfg, abstract_model, mesh=mesh)

        def init_state():
            model = create_model()
            return train_state_nnx.TrainStateNNX(model, nnx.Optimizer(model, tx, wrt=nnx.Param))

        with nn_partitioning.axis_rules(cfg.logical_axis_rules):
            _, _, state_shardings = maxtext_utils.get_abstract_state_nnx(cfg, mesh, init_state, True)
            graphdef, state = nnx.split(nnx.eval_shape(init_state))
            if size == "full":
                state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
            else:  # random init as MaxText's setup_initial_state does it (a jit of the init), unsharded
                state = jax.jit(lambda: nnx.state(init_state()))()
        params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(cfg, state_shardings)
        functional_train, *_ = maxtext_utils.get_functional_train_with_signature(
            mt_train.train_step, None, state_shardings, graphdef, cfg, params_shardings)

    rules = cfg.logical_axis_rules

    def train_step(state, data):
        """MaxText's train_step as its jit sees it, under its logical-axis rules (the MoE's
        shard_map and the activation constraints carry MaxText's mesh themselves)."""
        with nn_partitioning.axis_rules(rules):
            return functional_train(state, data)

    if size == "full":
        data = maxtext_utils.get_shaped_batch(cfg)
        data = {k: jax.ShapeDtypeStruct((cfg.micro_batch_size_to_train_on,) + v.shape[1:], v.dtype)
                for k, v in data.items()}
    else:
        data = _llama.batch(cfg)
    names = (_llama._names(state), {k: tuple(cfg.input_data_sharding_logical_axes) for k in data})
    return train_step, state, data, names, cfg, mesh


_BUILT: dict = {}


def make(layers: int | None = None, size: str = "tiny", path: str = "dense"):
    """(train_step, (state, data), axis_names): see the module docstring. ``layers``: 2 for
    tiny, mixtral-8x7b's 32 for full unless given. Built once per setting and process; each
    call returns fresh copies of the arrays (a step that donates them leaves the next intact)."""
    if layers is None:
        layers = 32 if size == "full" else 2
    key = (layers, size, path, tuple(_llama.mesh_sizes().items()))
    if key not in _BUILT:
        _BUILT[key] = build(layers, size, path)
    step, state, data, names, _, _ = _BUILT[key]
    if size != "full":
        state, data = jax.tree.map(lambda x: x.copy(), (state, data))
    return step, (state, data), names


def tiny():
    return make(2, "tiny")


def tiny4():
    return make(4, "tiny")


def tiny_sparse():
    return make(2, "tiny", path="sparse")


def tiny_ep():
    return make(2, "tiny", path="sparse_ep")


def full():
    return make(size="full")

