"""MaxText's llama2 decoder and MaxText's own pre-training step, for partex.

Everything is MaxText's (PyPI ``maxtext`` 0.2.5, installed with ``--no-deps``; see
``maxtext.nodeps.txt`` / ``maxtext.requirements.txt``): the config comes from its pyconfig
(``base.yml`` + ``models/llama2-7b.yml`` + overrides, no file downloaded), the mesh from
``maxtext_utils.get_mesh_from_config`` (the ``ici_*_parallelism`` settings), the NNX model and
the AdamW optimizer from ``model_creation_utils`` / ``train_utils.create_training_optimizer``
wrapped in MaxText's ``TrainStateNNX``, and the step is ``maxtext.trainers.pre_train.train.
train_step`` bound the way MaxText binds it (``maxtext_utils.get_functional_train_with_signature``):
``fn(state, data)`` with ``state`` the ``nnx.State`` of the train state (params, AdamW moments,
step counters, RNG streams) and ``data`` MaxText's batch dict (``get_shaped_batch``: inputs,
positions, segmentations, targets).

MaxText annotates activations with logical axis names and constrains them on its mesh
(``sharding.maybe_shard_with_logical`` -> ``with_sharding_constraint``): the traced step keeps
those constraints (44 ``sharding_constraint`` eqns at 2 layers: batch dims on ``data``, the
embed / heads / mlp dims of activations on MaxText's tensor axis). So that they name the plan's
mesh, the factory builds MaxText's mesh with the plan's axes: ``ici_data_parallelism=data``,
``ici_tensor_parallelism=model`` and MaxText's ``tensor`` mesh axis renamed ``model`` in
``mesh_axes``, ``data_sharding`` and every logical-axis rule (MaxText maps a ``model`` mesh axis
to ``ici_tensor_parallelism`` itself). ``make(..., stock_axes=True)`` keeps MaxText's own axis
names (the constraints then shard over ``tensor``, an axis a ``data,model`` plan lacks).

The mesh is ``data=N/2,model=2`` over the process's N devices unless ``MAXTEXT_MESH`` (e.g.
``data=8,model=4``) says otherwise; its sizes must match the plan's mesh. The global batch is 8
(``per_device_batch_size = 8 / N``; below 1 MaxText loads one row per device and trains on the
first 8, which are the rows given here). ``axis_names`` are MaxText's logical names of each
parameter and AdamW moment (its ``out_sharding`` metadata, with ``layers`` for the scanned axis)
and of the batch (``input_data_sharding_logical_axes``).

Two things MaxText does that a tool reading its step meets: importing its train utilities
replaces ``jax.lax.with_sharding_constraint`` process-wide with a shim
(``maxtext/integration/tunix/tunix_adapter.py``, ``_compat_wsc``: on any error it retries with
``jax.sharding.reshard``), so every constraint's source line is that shim's; and the NNX train
state holds its RNG streams as typed PRNG key arrays (``key<fry>`` leaves).

    partex analyze scripts/libmodels/maxtext_llama.py:tiny
    partex bench   scripts/libmodels/maxtext_llama.py:tiny --mesh data=4,model=2 --memory 2MiB --budget 10
    MAXTEXT_MESH=data=8,model=4 JAX_NUM_CPU_DEVICES=32 \\
      partex bench scripts/libmodels/maxtext_llama.py:full --mesh data=8,model=4 --hardware tpu-v4 \\
      --memory 32GiB --budget 60 --verify --json

``size="tiny"``: llama2 with emb 64, 4 heads of 16, mlp 128, vocab 256, seq 32, float32, real
arrays. ``size="full"``: llama2-7b as MaxText configures it (emb 4096, 32 heads, mlp 11008, vocab
32000, seq 2048, bfloat16 activations over float32 weights), args as ShapeDtypeStructs.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

# MaxText's switch for running without Google Cloud: its GCS / goodput / Vertex / diagnostics
# clients are stubbed (they are not installed).
os.environ.setdefault("DECOUPLE_GCLOUD", "TRUE")

import jax
import jax.numpy as jnp

# MaxText prints "[DECOUPLED NO-OP] ...: using stub." on stdout while it imports; keep stdout
# clean for `partex ... --json`.
with contextlib.redirect_stdout(sys.stderr):
    from flax import nnx
    from flax.linen import partitioning as nn_partitioning
    from maxtext.common import train_state_nnx
    from maxtext.configs import pyconfig
    from maxtext.trainers.pre_train import train as mt_train
    from maxtext.utils import maxtext_utils, model_creation_utils, sharding, train_utils

GLOBAL_BATCH = 8

TINY = dict(base_emb_dim=64, base_num_query_heads=4, base_num_kv_heads=4, head_dim=16, base_mlp_dim=128,
            vocab_size=256, max_target_length=32, dtype="float32", learning_rate=1e-3, warmup_steps_fraction=0.0)
FULL = dict(max_target_length=2048)  # llama2-7b.yml as it is; MaxText's dtypes (bf16 activations)

# Settings for a run on this machine, not the model: no checkpointing, no JAX cache dir of
# MaxText's own (it would replace the caller's), no distributed init, CPU dot-product attention.
_RUN = dict(enable_checkpointing=False, jax_cache_dir="", skip_jax_distributed_system=True, hardware="cpu",
            attention="dot_product", log_config=False, enable_goodput_recording=False, monitor_goodput=False,
            run_name="partex", base_output_directory=os.path.join(tempfile.gettempdir(), "partex_maxtext"))


def mesh_sizes(n_devices: int | None = None) -> dict[str, int]:
    """The mesh MaxText builds: MAXTEXT_MESH (``data=8,model=4``) or data=N/2,model=2."""
    n = jax.device_count() if n_devices is None else n_devices
    text = os.environ.get("MAXTEXT_MESH", "")
    if text:
        sizes = {k.strip(): int(v) for k, v in (p.split("=") for p in text.split(",") if p.strip())}
        bad = set(sizes) - {"data", "model"}
        if bad:
            raise ValueError(f"MAXTEXT_MESH names {sorted(bad)}: use data=D,model=M")
        sizes = {"data": sizes.get("data", 1), "model": sizes.get("model", 1)}
    else:
        model = 2 if n % 2 == 0 else 1
        sizes = {"data": n // model, "model": model}
    if sizes["data"] * sizes["model"] != n:
        raise ValueError(f"MaxText mesh data={sizes['data']},model={sizes['model']} needs "
                         f"{sizes['data'] * sizes['model']} devices but JAX has {n}")
    return sizes


def _rename(axes, old: str, new: str):
    if isinstance(axes, str):
        return new if axes == old else axes
    return [_rename(a, old, new) for a in axes]


def config(layers: int, size: str = "tiny", stock_axes: bool = False, **overrides):
    """MaxText's HyperParameters for llama2-7b (tiny: shrunk) on this process's devices."""
    if size not in ("tiny", "full"):
        raise ValueError(f"size must be 'tiny' or 'full', got {size!r}")
    sizes = mesh_sizes()
    n = sizes["data"] * sizes["model"]
    # override_model_config: our keys win over models/llama2-7b.yml's (its layer count, and
    # below its logical-axis rule, renamed)
    kw = dict(_RUN, model_name="llama2-7b", override_model_config=True, per_device_batch_size=GLOBAL_BATCH / n,
              ici_data_parallelism=sizes["data"], ici_tensor_parallelism=sizes["model"], ici_fsdp_parallelism=1,
              base_num_decoder_layers=layers)
    kw.update(TINY if size == "tiny" else FULL)
    kw.update(overrides)
    with contextlib.redirect_stdout(sys.stderr):
        cfg = pyconfig.initialize(None, **kw)
        if stock_axes:
            return cfg
        # MaxText's tensor axis under the plan's name: the mesh axis, the data sharding and
        # every logical-axis rule that names it.
        rules = [[name, _rename(axes, "tensor", "model")] for name, axes in cfg.logical_axis_rules]
        return pyconfig.initialize(
            None, **kw, mesh_axes=_rename(list(cfg.mesh_axes), "tensor", "model"),
            data_sharding=_rename([list(d) for d in cfg.data_sharding], "tensor", "model"),
            logical_axis_rules=rules, override_logical_axis_rules=True)


def _names(state):
    """MaxText's logical axis names of each state leaf (its Variables' ``out_sharding``)."""
    def one(v):
        names = v.get_metadata().get("out_sharding") if isinstance(v, nnx.Variable) else None
        rank = len(jnp.shape(v.get_value() if isinstance(v, nnx.Variable) else v))
        if not names or len(names) != rank:
            names = (None,) * rank
        return v.replace(value=tuple(names)) if isinstance(v, nnx.Variable) else tuple(names)
    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch(cfg, seed: int = 0):
    """A batch of MaxText's keys (``get_shaped_batch``'s), unpacked: next-token targets, one
    segment per row, the rows the step trains on (``micro_batch_size_to_train_on``)."""
    b, s = cfg.micro_batch_size_to_train_on, cfg.max_target_length
    inputs = jax.random.randint(jax.random.key(seed), (b, s), 1, cfg.vocab_size, jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    seg = jnp.ones((b, s), jnp.int32)
    return {"inputs": inputs, "inputs_position": pos, "inputs_segmentation": seg,
            "targets": jnp.roll(inputs, -1, axis=1), "targets_position": pos, "targets_segmentation": seg}


def build(layers: int, size: str = "tiny", stock_axes: bool = False, **overrides):
    """(step, state, data, names, cfg, mesh): MaxText's pieces as its train loop sets them up
    (``train_utils.setup_train_loop`` less the data pipeline and checkpoint manager)."""
    cfg = config(layers, size, stock_axes, **overrides)
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
        """MaxText's train_step(model, config, state_mesh_shardings, params_shardings, state, data)
        as its jit sees it, under its logical-axis rules (MaxText also enters jax.set_mesh(mesh),
        which JAX refuses inside a trace; the constraints carry their mesh themselves)."""
        with nn_partitioning.axis_rules(rules):
            return functional_train(state, data)

    if size == "full":
        # MaxText's batch keys and dtypes (get_shaped_batch), with the rows the step trains on:
        # below one sequence per device MaxText loads one per device and trains on the first 8
        data = maxtext_utils.get_shaped_batch(cfg)
        data = {k: jax.ShapeDtypeStruct((cfg.micro_batch_size_to_train_on,) + v.shape[1:], v.dtype)
                for k, v in data.items()}
    else:
        data = batch(cfg)
    names = (_names(state), {k: tuple(cfg.input_data_sharding_logical_axes) for k in data})
    return train_step, state, data, names, cfg, mesh


_BUILT: dict = {}


def make(layers: int | None = None, size: str = "tiny", stock_axes: bool = False):
    """(train_step, (state, data), axis_names): see the module docstring. ``layers``: 2 for
    tiny, llama2-7b's 32 for full unless given. Built once per
    setting and process (MaxText's config and init take seconds); each call returns fresh
    copies of the arrays, so a step that donates them leaves the next call's intact."""
    if layers is None:
        layers = 32 if size == "full" else 2
    key = (layers, size, stock_axes, tuple(mesh_sizes().items()))
    if key not in _BUILT:
        _BUILT[key] = build(layers, size, stock_axes)
    step, state, data, names, _, _ = _BUILT[key]
    if size != "full":
        state, data = jax.tree.map(lambda x: x.copy(), (state, data))
    return step, (state, data), names


def tiny():
    return make(2, "tiny")


def tiny4():
    return make(4, "tiny")


def full():
    return make(size="full")
