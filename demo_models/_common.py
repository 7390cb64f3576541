"""Shared machinery for the demo models: errors, config parsing, parameter specs, Adam.

Every model describes its parameters and its batch as a pytree of `Leaf` specs (shape,
logical axis names, initializer).  From that one description we derive the real arrays
(tiny preset), the `jax.ShapeDtypeStruct`s (every other preset, nothing allocated) and the
logical axis names, so the three can never disagree.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np


class DemoModelError(ValueError):
    """Bad user input to the demo-model registry (one-line, human-readable message)."""


# --------------------------------------------------------------------------- registry types


@dataclass(frozen=True)
class Model:
    """A built demo model: `fn(*args)` is one training step."""

    fn: Callable
    args: tuple
    axis_names: Any
    name: str
    preset: str
    config: Any


@dataclass(frozen=True)
class ModelDef:
    """How to build one demo model.

    spec(config) -> (param_spec, batch_spec), pytrees of `Leaf`.
    loss(config, params, batch) -> scalar f32 loss.
    validate(config) raises DemoModelError for inconsistent configs.
    host_state(config) -> (parameters, optimizer state) kept in host memory between steps
    (MaxText's ``parameter_memory_host_offload``, ``optimizer_memory_host_offload``).
    """

    name: str
    description: str
    config_cls: type
    presets: Mapping[str, Any]
    spec: Callable[[Any], tuple[Any, Any]]
    loss: Callable[[Any, Any, Any], jax.Array]
    validate: Callable[[Any], None] | None = None
    host_state: Callable[[Any], tuple[bool, bool]] | None = None


# --------------------------------------------------------------------------- config parsing

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_overrides(items: list[str] | tuple[str, ...] | None) -> dict[str, str]:
    """["layers=12", "batch=1"] -> {"layers": "12", "batch": "1"} (later items win)."""
    out: dict[str, str] = {}
    for item in items or ():
        if not isinstance(item, str) or "=" not in item:
            raise DemoModelError(f"malformed override {item!r}; expected key=value, e.g. layers=2")
        key, value = item.split("=", 1)
        key, value = key.strip(), value.strip()
        if not key or not value:
            raise DemoModelError(f"malformed override {item!r}; expected key=value, e.g. layers=2")
        out[key] = value
    return out


def _parse_value(model: str, key: str, typ: type, raw: Any) -> Any:
    if not isinstance(raw, str):  # programmatic use: accept an already-typed value
        if typ is float and isinstance(raw, int) and not isinstance(raw, bool):
            return float(raw)
        if isinstance(raw, typ) and not (typ is int and isinstance(raw, bool)):
            return raw
        raw = str(raw)
    text = raw.strip()
    try:
        if typ is bool:
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise ValueError
        if typ is int:
            return int(text)
        if typ is float:
            value = float(text)
            if not math.isfinite(value):
                raise ValueError
            return value
        return text
    except ValueError:
        kind = "true/false" if typ is bool else typ.__name__
        raise DemoModelError(
            f"bad value {raw!r} for {model} config key {key!r} (expected {kind})"
        ) from None


def apply_overrides(model: str, config: Any, overrides: Mapping[str, Any] | None) -> Any:
    """Return `config` with `overrides` (str values parsed by each field's type) applied."""
    if not overrides:
        return config
    hints = typing.get_type_hints(type(config))
    valid = sorted(f.name for f in dataclasses.fields(config))
    changes = {}
    for key, raw in overrides.items():
        if key not in hints:
            raise DemoModelError(
                f"unknown config key {key!r} for {model}; valid keys: {', '.join(valid)}"
            )
        changes[key] = _parse_value(model, key, hints[key], raw)
    return dataclasses.replace(config, **changes)


def check_positive(model: str, config: Any) -> None:
    """Every int/float field of a demo config must be > 0."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if hints[f.name] in (int, float) and not value > 0:
            raise DemoModelError(f"{model} config key {f.name!r} must be > 0, got {value}")


def check_divides(model: str, what: str, divisor: int, dividend: int) -> None:
    if dividend % divisor:
        raise DemoModelError(f"{model}: {what} ({dividend} is not divisible by {divisor})")


# --------------------------------------------------------------------------- parameter specs


@dataclass(frozen=True)
class Leaf:
    """One array of a model: shape, logical axis names and how to initialise it.

    init: "normal" (std `scale`), "zeros", "ones" or "randint" (int32 in [0, maxval)).
    Deliberately not a pytree node, so jax treats it as a leaf.
    """

    shape: tuple[int, ...]
    names: tuple[str | None, ...]
    init: str = "normal"
    scale: float = 1.0
    maxval: int = 0

    def __post_init__(self):
        assert len(self.shape) == len(self.names), (self.shape, self.names)
        assert self.init in ("normal", "zeros", "ones", "randint"), self.init

    @property
    def dtype(self):
        return jnp.int32 if self.init == "randint" else jnp.float32


def weight(shape, names, fan_in: int | None = None) -> Leaf:
    """A weight with 1/sqrt(fan_in) init (fan_in defaults to shape[0])."""
    fan_in = shape[0] if fan_in is None else fan_in
    return Leaf(tuple(shape), tuple(names), "normal", 1.0 / math.sqrt(fan_in))


def zeros(shape, names) -> Leaf:
    return Leaf(tuple(shape), tuple(names), "zeros")


def ones(shape, names) -> Leaf:
    return Leaf(tuple(shape), tuple(names), "ones")


def normal(shape, names, scale: float = 1.0) -> Leaf:
    return Leaf(tuple(shape), tuple(names), "normal", scale)


def randint(shape, names, maxval: int) -> Leaf:
    return Leaf(tuple(shape), tuple(names), "randint", maxval=maxval)


def _is_leaf(x) -> bool:
    return isinstance(x, Leaf)


def stack_spec(spec: Any, n: int, name: str = "layers") -> Any:
    """Prefix every leaf of `spec` with a stacked axis of size n (for scan-over-layers)."""
    return jax.tree.map(
        lambda l: dataclasses.replace(l, shape=(n,) + l.shape, names=(name,) + l.names),
        spec,
        is_leaf=_is_leaf,
    )


def spec_names(spec: Any) -> Any:
    return jax.tree.map(lambda l: l.names, spec, is_leaf=_is_leaf)


def spec_abstract(spec: Any) -> Any:
    return jax.tree.map(lambda l: jax.ShapeDtypeStruct(l.shape, l.dtype), spec, is_leaf=_is_leaf)


def spec_materialize(spec: Any, key: jax.Array) -> Any:
    """Deterministic real arrays for `spec` from `key`.

    All normal leaves are slices of ONE `jax.random.normal` draw and all integer leaves of
    ONE `jax.random.uniform` draw (in flatten order): two compiled ops per build instead of
    one per leaf, which keeps building a tiny model fast.
    """
    leaves, treedef = jax.tree.flatten(spec, is_leaf=_is_leaf)
    sizes = [math.prod(l.shape) for l in leaves]
    n_normal = sum(s for l, s in zip(leaves, sizes) if l.init == "normal")
    n_int = sum(s for l, s in zip(leaves, sizes) if l.init == "randint")
    k_normal, k_int = jax.random.split(key)
    normals = np.asarray(jax.random.normal(k_normal, (n_normal,), jnp.float32))
    uniforms = np.asarray(jax.random.uniform(k_int, (n_int,), jnp.float32))
    out, i_n, i_u = [], 0, 0
    for leaf, size in zip(leaves, sizes):
        if leaf.init == "normal":
            arr = np.float32(leaf.scale) * normals[i_n:i_n + size].reshape(leaf.shape)
            i_n += size
        elif leaf.init == "randint":
            u = uniforms[i_u:i_u + size].reshape(leaf.shape)
            arr = np.minimum((u * leaf.maxval).astype(np.int32), leaf.maxval - 1)
            i_u += size
        else:
            arr = np.full(leaf.shape, 0.0 if leaf.init == "zeros" else 1.0, np.float32)
        out.append(jnp.asarray(arr, leaf.dtype))
    return jax.tree.unflatten(treedef, out)


def count_params(spec_or_tree: Any) -> int:
    leaves = jax.tree.leaves(spec_or_tree, is_leaf=_is_leaf)
    return sum(math.prod(l.shape) for l in leaves)


# --------------------------------------------------------------------------- numerics


def rmsnorm(x: jax.Array, scale: jax.Array, eps: float = 1e-6) -> jax.Array:
    var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(var + eps) * scale


def layernorm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float = 1e-5) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * scale + bias


def mse(pred: jax.Array, target: jax.Array) -> jax.Array:
    return jnp.mean(jnp.square(pred - target))


# --------------------------------------------------------------------------- Adam


def adam_init(params: Any) -> dict:
    """{"mu", "nu"} like params (zeros, or ShapeDtypeStructs for abstract params), count ()."""
    abstract = any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(params))
    if abstract:
        like = lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype)
        count = jax.ShapeDtypeStruct((), jnp.int32)
    else:
        like = jnp.zeros_like
        count = jnp.zeros((), jnp.int32)
    return {"mu": jax.tree.map(like, params), "nu": jax.tree.map(like, params), "count": count}


def adam_update(params, grads, state, lr: float, b1: float = 0.9, b2: float = 0.999,
                eps: float = 1e-8):
    count = state["count"] + 1
    mu = jax.tree.map(lambda m, g: b1 * m + (1.0 - b1) * g, state["mu"], grads)
    nu = jax.tree.map(lambda v, g: b2 * v + (1.0 - b2) * jnp.square(g), state["nu"], grads)
    t = count.astype(jnp.float32)
    step = lr * jnp.sqrt(1.0 - b2**t) / (1.0 - b1**t)
    new_params = jax.tree.map(lambda p, m, v: p - step * m / (jnp.sqrt(v) + eps), params, mu, nu)
    return new_params, {"mu": mu, "nu": nu, "count": count}


def make_train_step(loss_fn: Callable[[Any, Any], jax.Array], lr: float, name: str,
                    host_params: bool = False, host_opt: bool = False) -> Callable:
    """train_step(params, opt_state, batch) -> (new_params, new_opt_state, loss).
    ``host_params`` / ``host_opt``: the parameters / Adam's state come in host memory and go
    back there; the step copies them to the device where it reads them (as MaxText's
    parameter and optimizer memory host offload)."""

    def train_step(params, opt_state, batch):
        if host_params:
            params = jax.device_put(params, jax.memory.Space.Device)
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        if host_opt:
            opt_state = jax.device_put(opt_state, jax.memory.Space.Device)
        new_params, new_opt_state = adam_update(params, grads, opt_state, lr)
        if host_opt:
            new_opt_state = jax.device_put(new_opt_state, jax.memory.Space.Host)
        if host_params:
            new_params = jax.device_put(new_params, jax.memory.Space.Host)
        return new_params, new_opt_state, loss

    train_step.__name__ = train_step.__qualname__ = f"{name.replace('-', '_')}_train_step"
    return train_step


# --------------------------------------------------------------------------- build


def _in_host_memory(tree: Any) -> Any:
    """Arrays (or ShapeDtypeStructs) placed in pinned host memory; where, on the devices, is
    the plan's to say (the mesh here only carries the memory kind: its axis is Auto)."""
    devices = jax.devices()
    mesh = jax.sharding.Mesh(np.array(devices), ("host_offload",), axis_types=(jax.sharding.AxisType.Auto,))
    host = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(), memory_kind="pinned_host")
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=host)
                        if isinstance(x, jax.ShapeDtypeStruct) else jax.device_put(x, host), tree)


def build_model(mdef: ModelDef, preset: str, overrides: Mapping[str, Any] | None) -> Model:
    if preset not in mdef.presets:
        raise DemoModelError(
            f"unknown preset {preset!r} for {mdef.name}; valid presets: "
            f"{', '.join(mdef.presets)}"
        )
    config = apply_overrides(mdef.name, mdef.presets[preset], overrides)
    check_positive(mdef.name, config)
    if mdef.validate is not None:
        mdef.validate(config)
    param_spec, batch_spec = mdef.spec(config)
    if preset == "tiny":
        key = jax.random.key(0)
        params = spec_materialize(param_spec, jax.random.fold_in(key, 0))
        batch = spec_materialize(batch_spec, jax.random.fold_in(key, 1))
    else:
        params, batch = spec_abstract(param_spec), spec_abstract(batch_spec)
    opt_state = adam_init(params)
    host_params, host_opt = mdef.host_state(config) if mdef.host_state is not None else (False, False)
    if host_params:
        params = _in_host_memory(params)
    if host_opt:
        opt_state = _in_host_memory(opt_state)
    pnames = spec_names(param_spec)
    axis_names = (pnames, {"mu": pnames, "nu": pnames, "count": ()}, spec_names(batch_spec))
    loss_fn = lambda params, batch: mdef.loss(config, params, batch)
    fn = make_train_step(loss_fn, config.lr, mdef.name, host_params, host_opt)
    return Model(fn=fn, args=(params, opt_state, batch), axis_names=axis_names,
                 name=mdef.name, preset=preset, config=config)
