"""MaxText's llama2 decoder in explicit sharding mode (``shard_mode: explicit``) and MaxText's
own pre-training step, for partex.

The model, optimizer, train state and step are ``maxtext_llama.py``'s (MaxText's pyconfig with
``models/llama2-7b.yml`` shrunk, its NNX model, AdamW, ``TrainStateNNX`` and ``train_step``;
random init, nothing downloaded; MaxText's tensor axis named ``model``), with MaxText's
``shard_mode: explicit``: ``maxtext_utils.get_mesh_from_config`` gives the mesh
``AxisType.Explicit`` axes, and MaxText shards with the explicit APIs (``sharding.
maybe_shard_with_name`` / ``maybe_shard_with_logical`` call ``jax.sharding.reshard`` instead of
``with_sharding_constraint``; its dense layers pass ``out_sharding=``).

In explicit mode an array's sharding is part of its type, so the arguments are what MaxText's
train loop holds: the train state made by a jit of the init with MaxText's state shardings as
``out_shardings`` (``maxtext_utils.setup_initial_state``), the batch placed with MaxText's input
data sharding (``sharding.get_input_data_sharding``), both on the explicit mesh; ``size="full"``
gives ShapeDtypeStructs carrying those shardings. MaxText runs the step under
``jax.set_mesh(mesh)``; partex traces it under the arguments' mesh, as a user runs it, and reads
the typed shardings (the inputs', each ``reshard`` and ``out_sharding=``) as the step's own.
The mesh is ``data=N/2,model=2`` over the process's N devices unless ``MAXTEXT_MESH`` says
otherwise; the sizes are ``maxtext_llama.py``'s (tiny: emb 64, 4 heads of 16, mlp 128, vocab
256, seq 32, float32; full: llama2-7b, seq 2048).

    partex analyze scripts/libmodels/maxtext_explicit.py:tiny
    partex bench   scripts/libmodels/maxtext_explicit.py:tiny --mesh data=4,model=2 --memory 2MiB --budget 10
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


_llama = _sibling("maxtext_llama")  # the config, batch, names and MaxText's imports

with contextlib.redirect_stdout(sys.stderr):
    from flax import nnx
    from flax.linen import partitioning as nn_partitioning
    from maxtext.common import train_state_nnx
    from maxtext.trainers.pre_train import train as mt_train
    from maxtext.utils import maxtext_utils, model_creation_utils, sharding, train_utils


def config(layers: int, size: str = "tiny", **overrides):
    """maxtext_llama's HyperParameters with ``shard_mode: explicit``."""
    return _llama.config(layers, size, shard_mode="explicit", **overrides)


def build(layers: int, size: str = "tiny", **overrides):
    """(step, state, data, names, cfg, mesh): MaxText's pieces as its train loop sets them up in
    explicit mode, the state and batch placed on the explicit mesh."""
    cfg = config(layers, size, **overrides)
    with contextlib.redirect_stdout(sys.stderr):
        mesh = maxtext_utils.get_mesh_from_config(cfg)
        create_model, abstract_model = model_creation_utils.create_nnx_abstract_model(cfg, mesh)
        _, tx = train_utils.create_training_optimizer(cfg, abstract_model, mesh=mesh)

        def init_state():
            model = create_model()
            return train_state_nnx.TrainStateNNX(model, nnx.Optimizer(model, tx, wrt=nnx.Param))

        with nn_partitioning.axis_rules(cfg.logical_axis_rules):
            _, _, state_shardings = maxtext_utils.get_abstract_state_nnx(cfg, mesh, init_state, True)
            graphdef, abstract = nnx.split(nnx.eval_shape(init_state))
            if size == "full":
                state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                     abstract, state_shardings)
            else:  # MaxText's setup_initial_state: a jit of the init onto the state shardings
                with jax.set_mesh(mesh):
                    state = jax.jit(lambda: nnx.state(init_state()), out_shardings=state_shardings)()
        params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(cfg, state_shardings)
        functional_train, *_ = maxtext_utils.get_functional_train_with_signature(
            mt_train.train_step, None, state_shardings, graphdef, cfg, params_shardings)
        data_sharding = sharding.get_input_data_sharding(cfg, mesh)

    rules = cfg.logical_axis_rules

    def train_step(state, data):
        """MaxText's train_step as its jit sees it, under its logical-axis rules (MaxText also
        enters jax.set_mesh(mesh) around the call; a caller does, as partex does)."""
        with nn_partitioning.axis_rules(rules):
            return functional_train(state, data)

    if size == "full":
        data = maxtext_utils.get_shaped_batch(cfg)
        data = {k: jax.ShapeDtypeStruct((cfg.micro_batch_size_to_train_on,) + v.shape[1:], v.dtype,
                                        sharding=data_sharding) for k, v in data.items()}
    else:
        data = jax.device_put(_llama.batch(cfg), data_sharding)
    names = (_llama._names(state), {k: tuple(cfg.input_data_sharding_logical_axes) for k in data})
    return train_step, state, data, names, cfg, mesh


_BUILT: dict = {}


def make(layers: int | None = None, size: str = "tiny"):
    """(train_step, (state, data), axis_names): see the module docstring. ``layers``: 2 for
    tiny, llama2-7b's 32 for full unless given. Built once per setting and process; each call
    returns fresh copies of the arrays, sharded as MaxText places them."""
    if layers is None:
        layers = 32 if size == "full" else 2
    key = (layers, size, tuple(_llama.mesh_sizes().items()))
    if key not in _BUILT:
        _BUILT[key] = build(layers, size)
    step, state, data, names, _, _ = _BUILT[key]
    if size != "full":
        state, data = jax.tree.map(lambda x: x.copy(), (state, data))
    return step, (state, data), names


def mesh(layers: int = 2, size: str = "tiny"):
    """MaxText's explicit mesh of ``make(layers, size)`` (built with it)."""
    make(layers, size)
    return _BUILT[(layers, size, tuple(_llama.mesh_sizes().items()))][5]


def tiny():
    return make(2, "tiny")


def tiny4():
    return make(4, "tiny")


def full():
    return make(size="full")
