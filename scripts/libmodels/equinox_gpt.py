"""A GPT (GPT-2-style decoder: learned positions, pre-LayerNorm blocks, GELU MLP) written
with equinox's own modules (``eqx.nn.Embedding``, ``eqx.nn.MultiheadAttention``,
``eqx.nn.LayerNorm``, ``eqx.nn.Linear``), trained as equinox users train:
``eqx.partition(model, eqx.is_array)`` splits the parameters from the static rest, the step
``eqx.combine``s them, takes ``eqx.filter_value_and_grad`` of the loss and applies
``optax.adamw`` with ``eqx.apply_updates``. The model works on one sequence and is
``jax.vmap``ped over the batch, as equinox models are. No axis names (equinox has none).

The blocks are a Python list; ``make(..., scan=True)`` instead stacks them (built with
``eqx.filter_vmap`` over the init keys) and runs them under ``jax.lax.scan``, as equinox
users do for deep models.

    partex analyze scripts/libmodels/equinox_gpt.py:tiny
    partex analyze scripts/libmodels/equinox_gpt.py:tiny_scan
    partex bench   scripts/libmodels/equinox_gpt.py:tiny --mesh data=4,model=2 --budget 20 --verify
    JAX_NUM_CPU_DEVICES=32 partex bench scripts/libmodels/equinox_gpt.py:full \\
        --mesh data=8,model=4 --hardware tpu-v4 --memory 32GiB --budget 60 --verify --json

``full()`` / ``full_scan()`` are a 7B GPT (d_model 4096, 32 layers, 32 heads, MLP 16384,
vocab 50304, seq 2048, batch 8; 6.9B parameters, f32), built with ``eqx.filter_eval_shape``
(nothing allocated).
"""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 256
    d_model: int = 64
    heads: int = 4
    mlp: int = 256
    layers: int = 2
    seq: int = 16
    batch: int = 8


TINY = Config()
FULL = Config(vocab=50304, d_model=4096, heads=32, mlp=16384, layers=32, seq=2048, batch=8)


class Block(eqx.Module):
    attention_norm: eqx.nn.LayerNorm
    attention: eqx.nn.MultiheadAttention
    mlp_norm: eqx.nn.LayerNorm
    fc: eqx.nn.Linear
    proj: eqx.nn.Linear

    def __init__(self, cfg: Config, *, key):
        k_attn, k_fc, k_proj = jax.random.split(key, 3)
        self.attention_norm = eqx.nn.LayerNorm(cfg.d_model)
        self.attention = eqx.nn.MultiheadAttention(cfg.heads, cfg.d_model, use_query_bias=True,
                                                   use_key_bias=True, use_value_bias=True,
                                                   use_output_bias=True, key=k_attn)
        self.mlp_norm = eqx.nn.LayerNorm(cfg.d_model)
        self.fc = eqx.nn.Linear(cfg.d_model, cfg.mlp, key=k_fc)
        self.proj = eqx.nn.Linear(cfg.mlp, cfg.d_model, key=k_proj)

    def __call__(self, x):  # x: (seq, d_model), one sequence
        seq = x.shape[0]
        causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
        h = jax.vmap(self.attention_norm)(x)
        x = x + self.attention(h, h, h, mask=causal)
        h = jax.vmap(self.mlp_norm)(x)
        return x + jax.vmap(self.proj)(jax.nn.gelu(jax.vmap(self.fc)(h)))


class GPT(eqx.Module):
    token_embedding: eqx.nn.Embedding
    position_embedding: eqx.nn.Embedding
    blocks: list[Block] | Block  # a list, or one Block whose arrays are stacked (scan=True)
    final_norm: eqx.nn.LayerNorm
    lm_head: eqx.nn.Linear
    scan: bool = eqx.field(static=True)

    def __init__(self, cfg: Config, *, scan: bool = False, key):
        k_tok, k_pos, k_blocks, k_head = jax.random.split(key, 4)
        self.token_embedding = eqx.nn.Embedding(cfg.vocab, cfg.d_model, key=k_tok)
        self.position_embedding = eqx.nn.Embedding(cfg.seq, cfg.d_model, key=k_pos)
        block_keys = jax.random.split(k_blocks, cfg.layers)
        if scan:
            self.blocks = eqx.filter_vmap(lambda k: Block(cfg, key=k))(block_keys)
        else:
            self.blocks = [Block(cfg, key=k) for k in block_keys]
        self.final_norm = eqx.nn.LayerNorm(cfg.d_model)
        self.lm_head = eqx.nn.Linear(cfg.d_model, cfg.vocab, use_bias=False, key=k_head)
        self.scan = scan

    def __call__(self, tokens):  # tokens: (seq,) int32 -> logits (seq, vocab)
        positions = jnp.arange(tokens.shape[0])
        x = jax.vmap(self.token_embedding)(tokens) + jax.vmap(self.position_embedding)(positions)
        if self.scan:
            stacked, static = eqx.partition(self.blocks, eqx.is_array)

            def layer(x, block_arrays):
                return eqx.combine(block_arrays, static)(x), None

            x, _ = jax.lax.scan(layer, x, stacked)
        else:
            for block in self.blocks:
                x = block(x)
        return jax.vmap(self.lm_head)(jax.vmap(self.final_norm)(x))


def make_train_step(static, tx):
    """The step users ``eqx.filter_jit``, with the model's arrays as its argument:
    (params, opt_state, batch) -> (params, opt_state, loss)."""

    @eqx.filter_value_and_grad
    def loss_fn(model, batch):
        logits = jax.vmap(model)(batch["inputs"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()

    def train_step(params, opt_state, batch):
        model = eqx.combine(params, static)
        loss, grads = loss_fn(model, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, loss

    return train_step


def _is_param(x) -> bool:
    return eqx.is_array(x) or isinstance(x, jax.ShapeDtypeStruct)


def make(layers: int = 2, size: str = "tiny", scan: bool = False):
    """(train_step, (params, opt_state, batch)): real arrays for ``size="tiny"``,
    ShapeDtypeStructs for ``size="full"`` (the 7B; nothing allocated)."""
    cfg = dataclasses.replace({"tiny": TINY, "full": FULL}[size], layers=layers)
    tx = optax.adamw(3e-4, weight_decay=0.1)
    key = jax.random.key(0)
    if size == "full":
        model = eqx.filter_eval_shape(GPT, cfg, scan=scan, key=key)
        params, static = eqx.partition(model, _is_param)
        opt_state = jax.eval_shape(tx.init, params)
        tokens = jax.ShapeDtypeStruct((cfg.batch, cfg.seq), jnp.int32)
        batch = {"inputs": tokens, "targets": tokens}
    else:
        params, static = eqx.partition(GPT(cfg, scan=scan, key=key), eqx.is_array)
        opt_state = tx.init(params)
        k_in, k_tg = jax.random.split(jax.random.key(1))
        batch = {"inputs": jax.random.randint(k_in, (cfg.batch, cfg.seq), 0, cfg.vocab),
                 "targets": jax.random.randint(k_tg, (cfg.batch, cfg.seq), 0, cfg.vocab)}
    return make_train_step(static, tx), (params, opt_state, batch)


def tiny():
    return make(2, "tiny")


def tiny4():
    return make(4, "tiny")


def tiny_scan():
    return make(2, "tiny", scan=True)


def full():
    return make(32, "full")


def full_scan():
    return make(32, "full", scan=True)
