"""The same decoder-only (Llama-style) transformer LM as ``flax_linen.py``, written with
flax.nnx modules (``nnx.Embed``, ``nnx.Linear``, ``nnx.LayerNorm``), the layers in an
``nnx.List``, and the training step in the functional style NNX users write for
``jax.jit``: ``nnx.split`` the model into a graphdef and a state, and a pure
``train_step(state, opt_state, batch)`` that ``nnx.merge``s them, takes the loss and
gradients and applies ``optax.adamw``. No logical axis names: partex finds the roles
from the program's structure.

    partex analyze scripts/libmodels/flax_nnx.py:tiny
    partex bench   scripts/libmodels/flax_nnx.py:tiny --mesh data=4,model=2 --budget 20 --verify
    JAX_NUM_CPU_DEVICES=32 partex bench scripts/libmodels/flax_nnx.py:full \\
        --mesh data=8,model=4 --hardware tpu-v4 --memory 32GiB --budget 60 --verify --json

``full()`` is Llama-2-7B's shape (d_model 4096, 32 layers, 32 heads, MLP 11008, vocab
32000, seq 2048, batch 8), f32 parameters and bf16 compute, built with ``nnx.eval_shape``
(nothing allocated).
"""

import dataclasses

import jax
import jax.numpy as jnp
import optax
from flax import nnx


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


class Attention(nnx.Module):
    def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
        self.cfg = cfg
        inner = cfg.heads * cfg.head_dim
        self.query = nnx.Linear(cfg.d_model, inner, use_bias=False, dtype=cfg.dtype, rngs=rngs)
        self.key = nnx.Linear(cfg.d_model, inner, use_bias=False, dtype=cfg.dtype, rngs=rngs)
        self.value = nnx.Linear(cfg.d_model, inner, use_bias=False, dtype=cfg.dtype, rngs=rngs)
        self.out = nnx.Linear(inner, cfg.d_model, use_bias=False, dtype=cfg.dtype, rngs=rngs)

    def __call__(self, x):
        cfg = self.cfg
        b, t, _ = x.shape
        heads = lambda y: y.reshape(b, t, cfg.heads, cfg.head_dim)
        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(cfg.head_dim).astype(cfg.dtype)
        causal = jnp.tril(jnp.ones((t, t), dtype=bool))
        scores = jnp.where(causal, scores, jnp.finfo(cfg.dtype).min)
        probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(cfg.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
        return self.out(out.reshape(b, t, cfg.heads * cfg.head_dim))


class Mlp(nnx.Module):
    def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
        self.gate = nnx.Linear(cfg.d_model, cfg.mlp, use_bias=False, dtype=cfg.dtype, rngs=rngs)
        self.up = nnx.Linear(cfg.d_model, cfg.mlp, use_bias=False, dtype=cfg.dtype, rngs=rngs)
        self.down = nnx.Linear(cfg.mlp, cfg.d_model, use_bias=False, dtype=cfg.dtype, rngs=rngs)

    def __call__(self, x):
        return self.down(nnx.silu(self.gate(x)) * self.up(x))


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
        self.attention_norm = nnx.LayerNorm(cfg.d_model, dtype=cfg.dtype, rngs=rngs)
        self.attention = Attention(cfg, rngs=rngs)
        self.mlp_norm = nnx.LayerNorm(cfg.d_model, dtype=cfg.dtype, rngs=rngs)
        self.mlp = Mlp(cfg, rngs=rngs)

    def __call__(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nnx.Module):
    def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(cfg.vocab, cfg.d_model, dtype=cfg.dtype, rngs=rngs)
        self.layers = nnx.List([DecoderLayer(cfg, rngs=rngs) for _ in range(cfg.layers)])
        self.final_norm = nnx.LayerNorm(cfg.d_model, dtype=cfg.dtype, rngs=rngs)
        self.lm_head = nnx.Linear(cfg.d_model, cfg.vocab, use_bias=False, dtype=cfg.dtype, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.final_norm(x)).astype(jnp.float32)


def make_train_step(graphdef, tx):
    """The pure step users jit: (state, opt_state, batch) -> (state, opt_state, loss)."""

    def train_step(state, opt_state, batch):
        def loss_fn(state):
            model = nnx.merge(graphdef, state)
            logits = model(batch["inputs"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(state)
        updates, opt_state = tx.update(grads, opt_state, state)
        return optax.apply_updates(state, updates), opt_state, loss

    return train_step


def make(layers: int = 2, size: str = "tiny"):
    """(train_step, (state, opt_state, batch)): real arrays for ``size="tiny"``,
    ShapeDtypeStructs for ``size="full"`` (the 7B; nothing allocated)."""
    cfg = dataclasses.replace({"tiny": TINY, "full": FULL}[size], layers=layers)
    tx = optax.adamw(3e-4, weight_decay=0.1)
    if size == "full":
        model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
        graphdef, state = nnx.split(model)
        opt_state = jax.eval_shape(tx.init, state)
        tokens = jax.ShapeDtypeStruct((cfg.batch, cfg.seq), jnp.int32)
        batch = {"inputs": tokens, "targets": tokens}
    else:
        graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
        opt_state = tx.init(state)
        k_in, k_tg = jax.random.split(jax.random.key(1))
        batch = {"inputs": jax.random.randint(k_in, (cfg.batch, cfg.seq), 0, cfg.vocab),
                 "targets": jax.random.randint(k_tg, (cfg.batch, cfg.seq), 0, cfg.vocab)}
    return make_train_step(graphdef, tx), (state, opt_state, batch)


def tiny():
    return make(2, "tiny")


def tiny4():
    return make(4, "tiny")


def full():
    return make(32, "full")
