"""keras-hub (0.32.0) Llama and GPT-2 on Keras 3 (3.15.1) with the JAX backend, trained in a
pure-JAX step as the Keras guide "Writing a training loop from scratch in JAX" writes it.

The model is keras-hub's own ``LlamaCausalLM`` / ``GPT2CausalLM`` over a ``LlamaBackbone`` /
``GPT2Backbone`` built from its config kwargs (``arch="llama"``, the default, or
``arch="gpt2"``), random init, no preprocessor (no tokenizer, nothing downloaded). The step::

    (loss, non_trainable), grads = jax.value_and_grad(compute_loss, has_aux=True)(
        trainable, non_trainable, x, y)       # model.stateless_call(..., training=True)
    trainable, optimizer_variables = optimizer.stateless_apply(optimizer_variables, grads, trainable)

with ``keras.losses.SparseCategoricalCrossentropy(from_logits=True)`` and Keras's own
``keras.optimizers.AdamW`` through ``stateless_apply`` (what that guide and keras-hub users do;
not optax). The arguments are what such users hold: ``trainable_variables``,
``non_trainable_variables`` and ``optimizer_variables`` as *lists* of arrays
(``[v.value for v in model.trainable_variables]``, in Keras's variable order), and the batch
``x = {"token_ids", "padding_mask"}``, ``y``. It returns ``(trainable, non_trainable,
optimizer_variables, loss)``. Keras has no logical axis names; none are passed, and a list
position names nothing, so partex labels a list-held variable by the Keras layer scope its
first reader was traced in (``self_attention/query[1]``: the query kernel's heads) and finds
the layer stack from the repeated ops; the Keras path of each position is
``variable_paths(arch)``. ``make(variables="paths")`` holds the three
states as dicts keyed by Keras variable path instead (``transformer_layer_0/self_attention/
query/kernel``; AdamW's ``adam_w/transformer_layer_0_self_attention_query_kernel_momentum``),
converted to Keras's lists inside the step.

Sizes: ``size="tiny"``: hidden 64, 4 heads (Llama: 2 kv heads), FFN 128, vocab 256, batch 8,
seq 32; GPT-2 keeps keras-hub's default dropout 0.1, active under ``training=True`` (its seed
generators' states are the ``non_trainable_variables``; Llama has none). ``size="full"``: Llama-7B shape (hidden 4096, 32 layers, 32 heads, intermediate 11008,
vocab 32000, float32) or GPT-2 base (hidden 768, 12 layers, 12 heads, 3072, vocab 50257,
positions 1024) at batch 8, seq 2048 (GPT-2: 1024), as ``jax.ShapeDtypeStruct``: the model is
built inside a ``keras.StatelessScope``, where Keras defers variable initialisation, so no
weight is allocated.

Commands::

    partex analyze scripts/libmodels/keras_hub.py:tiny
    partex bench scripts/libmodels/keras_hub.py:tiny --mesh data=4,model=2 --memory 1MiB --budget 10
    JAX_NUM_CPU_DEVICES=32 partex bench scripts/libmodels/keras_hub.py:full \\
        --mesh data=8,model=4 --hardware tpu-v4 --memory 32GiB --budget 60 --verify --json
"""

from __future__ import annotations

import contextlib
import os

os.environ["KERAS_BACKEND"] = "jax"  # before keras is imported (Keras reads it once)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import keras_hub  # noqa: E402

if keras.backend.backend() != "jax":
    raise ImportError(f"keras was imported with the {keras.backend.backend()!r} backend before this module; "
                      "set KERAS_BACKEND=jax")

BATCH, SEQ = 8, 32
CONFIGS = {
    ("llama", "tiny"): dict(vocabulary_size=256, num_query_heads=4, num_key_value_heads=2, hidden_dim=64,
                            intermediate_dim=128),
    ("llama", "full"): dict(vocabulary_size=32000, num_query_heads=32, num_key_value_heads=32, hidden_dim=4096,
                            intermediate_dim=11008),
    ("gpt2", "tiny"): dict(vocabulary_size=256, num_heads=4, hidden_dim=64, intermediate_dim=128,
                           max_sequence_length=SEQ),
    ("gpt2", "full"): dict(vocabulary_size=50257, num_heads=12, hidden_dim=768, intermediate_dim=3072,
                           max_sequence_length=1024),
}
FULL_LAYERS = {"llama": 32, "gpt2": 12}
FULL_BATCH = 8
FULL_SEQ = {"llama": 2048, "gpt2": 1024}


def _build(arch: str, layers: int, size: str, abstract: bool = False):
    """The causal LM and its AdamW, built (variables created) but not called. ``abstract``:
    no weight is allocated -- inside a ``keras.StatelessScope`` Keras creates variables with a
    callable initializer uninitialised (shape, dtype and path only) and lists them for a
    deferred initialisation, which the next outermost StatelessScope to close (the one in
    ``stateless_call``) would run; they are taken off that list, so they never allocate. The
    scalars Keras creates with a value (the optimizers' ``iterations`` and learning rate,
    including the default Adam that keras-hub's ``Task`` compiles with) are made outside."""
    if (arch, size) not in CONFIGS:
        raise ValueError(f"arch must be 'llama' or 'gpt2' and size 'tiny' or 'full', not {arch!r}, {size!r}")
    from keras.src.backend.common import global_state

    pending = list(global_state.get_global_attribute("uninitialized_variables", []) or [])

    def weights():
        return keras.StatelessScope(initialize_variables=False) if abstract else contextlib.nullcontext()

    keras.utils.set_random_seed(0)
    config = dict(CONFIGS[arch, size], num_layers=FULL_LAYERS[arch] if size == "full" else layers)
    with weights():
        if arch == "llama":
            backbone = keras_hub.models.LlamaBackbone(**config)
        else:
            backbone = keras_hub.models.GPT2Backbone(**config)
    task = keras_hub.models.LlamaCausalLM if arch == "llama" else keras_hub.models.GPT2CausalLM
    model = task(backbone=backbone, preprocessor=None)
    optimizer = keras.optimizers.AdamW(learning_rate=1e-4, weight_decay=0.01)
    with weights():
        optimizer.build(model.trainable_variables)
    if abstract:
        global_state.set_global_attribute("uninitialized_variables", pending)
    return model, optimizer


def _train_step(model, optimizer, variables: str = "list"):
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def compute_loss_and_updates(trainable_variables, non_trainable_variables, x, y):
        y_pred, non_trainable_variables = model.stateless_call(trainable_variables, non_trainable_variables, x,
                                                               training=True)
        loss = loss_fn(y, y_pred, sample_weight=x["padding_mask"])
        return loss, non_trainable_variables

    grad_fn = jax.value_and_grad(compute_loss_and_updates, has_aux=True)

    def train_step(trainable_variables, non_trainable_variables, optimizer_variables, x, y):
        (loss, non_trainable_variables), grads = grad_fn(trainable_variables, non_trainable_variables, x, y)
        trainable_variables, optimizer_variables = optimizer.stateless_apply(optimizer_variables, grads,
                                                                             trainable_variables)
        return trainable_variables, non_trainable_variables, optimizer_variables, loss

    if variables == "list":
        return train_step
    # the state as dicts keyed by Keras variable path, in and out; Keras's calls take lists
    held = (model.trainable_variables, model.non_trainable_variables, optimizer.variables)

    def train_step_by_path(trainable_variables, non_trainable_variables, optimizer_variables, x, y):
        lists = [[d[v.path] for v in vs] for d, vs in zip((trainable_variables, non_trainable_variables,
                                                            optimizer_variables), held)]
        *new, loss = train_step(*lists, x, y)
        return (*({v.path: a for v, a in zip(vs, values)} for vs, values in zip(held, new)), loss)

    return train_step_by_path


def make(layers: int = 2, size: str = "tiny", arch: str = "llama", variables: str = "list"):
    """``(train_step, (trainable_variables, non_trainable_variables, optimizer_variables, x, y))``.

    ``variables="list"`` (the default): the three states are lists of arrays in Keras's
    variable order, as Keras's JAX training-loop guide holds them; ``"paths"``: dicts keyed
    by each variable's Keras path (``llama_backbone/transformer_layer_0/...``)."""
    if variables not in ("list", "paths"):
        raise ValueError(f"variables must be 'list' or 'paths', not {variables!r}")
    if size == "full":
        batch, seq = FULL_BATCH, FULL_SEQ[arch]
        model, optimizer = _build(arch, layers, size, abstract=True)

        def value(v):
            return jax.ShapeDtypeStruct(tuple(v.shape), jnp.dtype(v.dtype))

        x = {"token_ids": jax.ShapeDtypeStruct((batch, seq), jnp.int32),
             "padding_mask": jax.ShapeDtypeStruct((batch, seq), jnp.int32)}
        y = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    else:
        batch, seq = BATCH, SEQ
        model, optimizer = _build(arch, layers, size)

        def value(v):
            return v.value

        tokens = jax.random.randint(jax.random.key(0), (batch, seq + 1), 0, CONFIGS[arch, size]["vocabulary_size"],
                                    dtype=jnp.int32)
        x = {"token_ids": tokens[:, :-1], "padding_mask": jnp.ones((batch, seq), jnp.int32)}
        y = tokens[:, 1:]

    def state(vs):
        return [value(v) for v in vs] if variables == "list" else {v.path: value(v) for v in vs}

    args = (state(model.trainable_variables), state(model.non_trainable_variables), state(optimizer.variables), x, y)
    return _train_step(model, optimizer, variables), args


def variable_paths(arch: str = "llama", layers: int = 2) -> list[str]:
    """Keras's path of each position of the trainable list (``llama_backbone/...``)."""
    model, _ = _build(arch, layers, "tiny", abstract=True)
    return [v.path for v in model.trainable_variables]


def tiny():
    return make(2, "tiny")


def tiny4():
    return make(4, "tiny")


def full():
    return make(size="full")


def tiny_gpt2():
    return make(2, "tiny", arch="gpt2")


def full_gpt2():
    return make(size="full", arch="gpt2")
