"""A decoder-only (Llama-style) transformer LM written with flax.linen, trained as linen
users train: ``flax.training.train_state.TrainState`` with ``optax.adamw``.

The model is linen's own modules (``nn.Embed``, ``nn.Dense``, ``nn.LayerNorm``), with
hand-written causal attention between multi-axis projections (``Projection``: a kernel
and a ``dot_general``, as ``nn.DenseGeneral`` computes them), and the layers as a Python list of submodules built in ``setup`` (linen
names them ``layers_0``, ``layers_1``, ...). Every parameter carries logical axis names
through ``nn.with_logical_partitioning``, and the activations through
``nn.with_logical_constraint`` (a no-op until a script runs the step under
``nn.logical_axis_rules``, e.g. the rules ``partex export --format flax-rules`` writes); the axis names handed to partex are what linen
users get from them, ``nn.get_partition_spec`` of the abstract train state (as MaxText
does: the boxed state gives the logical specs, the step runs on the unboxed state).

``TrainState.create`` leaves ``step`` a Python ``0``: it stays one here, as users have it.

    partex analyze scripts/libmodels/flax_linen.py:tiny
    partex bench   scripts/libmodels/flax_linen.py:tiny --mesh data=4,model=2 --budget 20 --verify
    JAX_NUM_CPU_DEVICES=32 partex bench scripts/libmodels/flax_linen.py:full \\
        --mesh data=8,model=4 --hardware tpu-v4 --memory 32GiB --budget 60 --verify --json

``full()`` is Llama-2-7B's shape (d_model 4096, 32 layers, 32 heads, MLP 11008, vocab
32000, seq 2048, batch 8), f32 parameters and bf16 compute, as ShapeDtypeStructs.
"""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 256
    d_model: int = 64
    heads: int = 4
    head_dim: int = 16
    mlp: int = 128
    layers: int = 2
    seq: int = 16
    batch: int = 8
    dtype: jnp.dtype = jnp.float32  # activations; parameters stay f32


TINY = Config()
FULL = Config(vocab=32000, d_model=4096, heads=32, head_dim=128, mlp=11008, layers=32, seq=2048,
              batch=8, dtype=jnp.bfloat16)

# Logical axis names of the batch (linen users write these by hand, beside the params' names).
BATCH_NAMES = {"inputs": ("batch", "length"), "targets": ("batch", "length")}


def _init(names, init=nn.initializers.lecun_normal()):
    return nn.with_logical_partitioning(init, names)


class Projection(nn.Module):
    """``nn.DenseGeneral``'s projection with its kernel created at its own shape: linen's
    DenseGeneral initialises a multi-axis kernel flat and reshapes it, and under
    ``nn.logical_axis_rules`` on a mesh its box then constrains the flat (rank-2) kernel with
    three logical names, which JAX rejects; MaxText writes its own DenseGeneral likewise."""
    features: tuple[int, ...]
    names: tuple[str, ...]
    contract: int  # how many trailing dims of the input it contracts
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x):
        ins = x.shape[x.ndim - self.contract:]
        init = nn.initializers.lecun_normal(in_axis=tuple(range(self.contract)),
                                            out_axis=tuple(range(self.contract, self.contract + len(self.features))))
        kernel = self.param("kernel", _init(self.names, init), (*ins, *self.features))
        axes = tuple(range(x.ndim - self.contract, x.ndim)), tuple(range(self.contract))
        return jax.lax.dot_general(x.astype(self.dtype), kernel.astype(self.dtype), (axes, ((), ())))


class Attention(nn.Module):
    cfg: Config

    @nn.compact
    def __call__(self, x):
        cfg = self.cfg
        proj = functools.partial(Projection, (cfg.heads, cfg.head_dim), ("embed", "heads", "kv"), 1, cfg.dtype)
        heads = ("batch", "length", "heads", "kv")
        q = nn.with_logical_constraint(proj(name="query")(x), heads)
        k = nn.with_logical_constraint(proj(name="key")(x), heads)
        v = nn.with_logical_constraint(proj(name="value")(x), heads)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(cfg.head_dim).astype(cfg.dtype)
        causal = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), dtype=bool))
        scores = jnp.where(causal, scores, jnp.finfo(cfg.dtype).min)
        probs = nn.softmax(scores.astype(jnp.float32), axis=-1).astype(cfg.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
        return Projection((cfg.d_model,), ("heads", "kv", "embed"), 2, cfg.dtype, name="out")(out)


class Mlp(nn.Module):
    cfg: Config

    @nn.compact
    def __call__(self, x):
        cfg = self.cfg
        dense = functools.partial(nn.Dense, use_bias=False, dtype=cfg.dtype)
        gate = dense(cfg.mlp, kernel_init=_init(("embed", "mlp")), name="wi_0")(x)
        up = dense(cfg.mlp, kernel_init=_init(("embed", "mlp")), name="wi_1")(x)
        hidden = nn.with_logical_constraint(nn.silu(gate) * up, ("batch", "length", "mlp"))
        return dense(cfg.d_model, kernel_init=_init(("mlp", "embed")), name="wo")(hidden)


def _norm(cfg: Config, name: str) -> nn.LayerNorm:
    return nn.LayerNorm(dtype=cfg.dtype, name=name,
                        scale_init=_init(("embed",), nn.initializers.ones),
                        bias_init=_init(("embed",), nn.initializers.zeros))


class DecoderLayer(nn.Module):
    cfg: Config

    @nn.compact
    def __call__(self, x):
        x = x + Attention(self.cfg, name="attention")(_norm(self.cfg, "pre_attention_norm")(x))
        x = x + Mlp(self.cfg, name="mlp")(_norm(self.cfg, "pre_mlp_norm")(x))
        return nn.with_logical_constraint(x, ("batch", "length", "embed"))


class Transformer(nn.Module):
    cfg: Config

    def setup(self):
        cfg = self.cfg
        self.embed = nn.Embed(cfg.vocab, cfg.d_model, dtype=cfg.dtype,
                              embedding_init=_init(("vocab", "embed"), nn.initializers.normal(1.0)))
        self.layers = [DecoderLayer(cfg) for _ in range(cfg.layers)]  # layers_0, layers_1, ...
        self.final_norm = _norm(cfg, "final_norm")
        self.lm_head = nn.Dense(cfg.vocab, use_bias=False, dtype=cfg.dtype,
                                kernel_init=_init(("embed", "vocab")))

    def __call__(self, tokens):
        x = nn.with_logical_constraint(self.embed(tokens), ("batch", "length", "embed"))
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.final_norm(x)).astype(jnp.float32)


def train_step(state: train_state.TrainState, batch):
    def loss_fn(params):
        logits = state.apply_fn({"params": params}, batch["inputs"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def _create_state(model: Transformer, tx, key, tokens) -> train_state.TrainState:
    variables = jax.jit(model.init)(key, tokens)
    return train_state.TrainState.create(apply_fn=model.apply, params=variables["params"], tx=tx)


def make(layers: int = 2, size: str = "tiny"):
    """(train_step, (state, batch), axis_names): real arrays for ``size="tiny"``,
    ShapeDtypeStructs for ``size="full"`` (the 7B; nothing allocated)."""
    cfg = dataclasses.replace({"tiny": TINY, "full": FULL}[size], layers=layers)
    model = Transformer(cfg)
    tx = optax.adamw(3e-4, weight_decay=0.1)
    tokens = jax.ShapeDtypeStruct((cfg.batch, cfg.seq), jnp.int32)
    create = functools.partial(_create_state, model, tx)
    abstract = jax.eval_shape(create, jax.random.key(0), tokens)  # boxed: LogicallyPartitioned
    axis_names = (nn.get_partition_spec(abstract), BATCH_NAMES)
    if size == "full":
        state = nn.meta.unbox(abstract)
        batch = {"inputs": tokens, "targets": tokens}
    else:
        k_init, k_in, k_tg = jax.random.split(jax.random.key(0), 3)
        state = nn.meta.unbox(create(k_init, jnp.zeros(tokens.shape, tokens.dtype)))
        batch = {"inputs": jax.random.randint(k_in, tokens.shape, 0, cfg.vocab),
                 "targets": jax.random.randint(k_tg, tokens.shape, 0, cfg.vocab)}
    return train_step, (state, batch), axis_names


def tiny():
    return make(2, "tiny")


def tiny4():
    return make(4, "tiny")


def full():
    return make(32, "full")
