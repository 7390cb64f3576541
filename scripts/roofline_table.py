"""partex's per-device FLOPs, bytes accessed and collective (ICI) bytes beside
``jax.experimental.roofline``'s, on the demo models' layers under the hand plans.

    JAX_NUM_CPU_DEVICES=8 python scripts/roofline_table.py [--mesh data=4,model=2] [--json out.json]
                                                            [--layers a,b] [--plans dp,zero3] [--no-check]

What is compared. Each layer (the transformer demo's decoder layer and its MLP block, the
Llama demo's attention and SwiGLU blocks, the MLP demo's whole loss) becomes one training
step, ``step(params, x) -> (params - lr * grad, loss)`` with ``loss = mean(layer(params,
x)**2)`` (the MLP demo: its own loss), at a size where the matmuls dominate (d_model 1024,
sequence 512, batch 16; traced only, nothing allocated or compiled at that size). Both sides
count that one step, forward, backward and update, per device:

- partex: ``Session(step, args, mesh=...)``; ``session.strategy(plan)`` gives the hand
  plan's decisions, ``cost_model.work(decisions)`` its (FLOPs, bytes accessed) and
  ``evaluate(decisions).collectives`` its collectives, turned into the bytes one device
  sends on a ring: an all-reduce 2(n-1)/n of its buffer, an all-gather, reduce-scatter or
  all-to-all (n-1)/n (what the cost model's collective time charges).
- roofline: ``roofline(local_step, mesh, in_specs, out_specs)`` with the plan's own input
  PartitionSpecs (``session.plan(decisions).inputs``). roofline wraps the function in
  ``shard_map``, so ``local_step`` is the per-device program with its collectives written
  out: parameter dims on the batch's mesh axis (ZeRO-3) are ``all_gather``-ed before use
  (their gradient's transpose is a ``psum_scatter``), a contraction over a
  tensor-parallel-sharded weight dim (Megatron's row-parallel matmul) is ``psum``-ed (the
  demo layer's own code runs unchanged; its ``jnp.einsum`` / ``jnp.dot`` are wrapped while it
  is traced), the loss is ``pmean``-ed over the batch axes, and the gradients of
  parameters replicated over an axis are summed by shard_map's own transposes (a ``pvary``
  transposes to a ``psum``). Before the table, every ``local_step`` is checked against the
  global step at the demo's tiny size on the simulated devices (``--no-check`` skips it):
  the same loss, parameters and update, so both sides count the same computation.

roofline's counting (``jax/experimental/roofline/rooflines.py``, JAX 0.12): ``flops`` and
``hbm_bytes`` are dot_general's alone (2 x the multiply-adds; its operands and result);
every other op goes to ``unfused_flops`` / ``unfused_hbm_bytes`` (an elementwise op one flop
per element whatever it is, tanh none, a reduce_sum n-1 per output, data movement none).
Its ICI bytes per collective and axis: all_gather (n-1) x the local input, reduce_scatter
(n-1)/n x the input, psum 2(n-1)/n x the input, pmin/pmax a scalar's; a collective over two
axes puts the same total under each (the table's ICI bytes are the sum over the mesh axes, on
both sides; the hand plans' collectives are each over one axis). Its ``vjp=True`` mode is not used: it counts the
backward shard_map alone and feeds bfloat16 cotangents, which an f32 function refuses.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import json
import math
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import roofline as rl
from jax.sharding import NamedSharding, PartitionSpec as P

from partex import Session, demo_models

LR = 1e-3
PLANS = ("dp", "megatron", "zero3")
MESH = "data=4,model=2"

# The comparison size (ShapeDtypeStructs); the check runs the demos' tiny presets (real
# arrays), which every mesh of 8 devices divides.
TRANSFORMER = {"layers": 1, "d_model": 1024, "heads": 16, "d_ff": 4096, "seq": 512, "batch": 16, "vocab": 256}
LLAMA = {"layers": 1, "d_model": 1024, "heads": 16, "kv_heads": 8, "d_ff": 2816, "seq": 512, "batch": 16,
         "vocab": 256}
MLP = {"d_in": 1024, "hidden": 4096, "d_out": 1024, "batch": 8192}
TINY_LLAMA = {"layers": 1, "heads": 8, "kv_heads": 4}  # a model axis of 4 shards the key/value heads too


# --------------------------------------------------------------------------- the layers


@dataclasses.dataclass(frozen=True)
class Layer:
    """One layer as a loss: ``loss(params, data) -> scalar`` (a mean over the batch), with
    the demo module whose ``jnp`` calls it makes (wrapped to add the row-parallel psums)."""

    name: str
    model: str
    module: Any
    loss: Callable
    params: Any
    data: Any


def _module(model: str):
    """The demo model's own module (where its loss and layer functions are defined)."""
    return inspect.getmodule(demo_models.MODELS[model].loss)


def _layer_params(model):
    """The first layer's parameters of a built transformer / Llama demo (a stacked layer
    loses its leading dim)."""
    layers = model.args[0]["layers"]
    if isinstance(layers, list):
        return layers[0]

    def first(a):
        if isinstance(a, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(a.shape[1:], a.dtype)
        return a[0]

    return jax.tree.map(first, layers)


def _activation(c, real: bool):
    shape = (c.batch, c.seq, c.d_model)
    if real:
        return jax.random.normal(jax.random.key(1), shape, jnp.float32)
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def _mean_square(fn):
    return lambda p, x: jnp.mean(jnp.square(fn(p, x)))


def make_layers(names=None, tiny: bool = False) -> list[Layer]:
    """The layers compared, at the comparison size or (``tiny``) the demo's tiny preset with
    real arrays."""
    preset = "tiny" if tiny else "full"
    out = []
    tf = _module("transformer")
    m = demo_models.build("transformer", preset, {"layers": 1} if tiny else TRANSFORMER)
    p, x = _layer_params(m), _activation(m.config, tiny)
    mlp_keys = ("ln2", "w1", "b1", "w2", "b2")
    out += [Layer("transformer decoder layer", "transformer", tf, _mean_square(tf.decoder_layer), p, x),
            Layer("transformer MLP block", "transformer", tf, _mean_square(tf.mlp_block),
                  {k: p[k] for k in mlp_keys}, x)]
    ll = _module("llama")
    m = demo_models.build("llama", preset, TINY_LLAMA if tiny else LLAMA)
    p, x, c = _layer_params(m), _activation(m.config, tiny), m.config
    attn_keys = ("attn_norm", "wq", "wk", "wv", "wo")

    def llama_attention(p, x):
        # the config's head counts, as this device sees them (heads sharded on an axis)
        # (head_dim is d_model // heads: d_model shrinks with them)
        h, kv = p["wq"].shape[1], p["wk"].shape[1]
        if h * c.kv_heads != kv * c.heads:
            raise ValueError(f"llama attention: {h} of {c.heads} query heads but {kv} of {c.kv_heads} key/value "
                             "heads on a device: the grouped heads are not sharded alike (not written out)")
        local = dataclasses.replace(c, heads=h, kv_heads=kv, d_model=h * c.head_dim)
        return ll.attention(local, p, x)

    out += [Layer("llama attention", "llama", ll, _mean_square(llama_attention), {k: p[k] for k in attn_keys}, x),
            Layer("llama SwiGLU", "llama", ll, _mean_square(ll.swiglu),
                  {k: p[k] for k in ("ffn_norm", "w_gate", "w_up", "w_down")}, x)]
    mm = _module("mlp")
    m = demo_models.build("mlp", preset, None if tiny else MLP)
    cfg = m.config
    out.append(Layer("mlp (whole model)", "mlp", mm, lambda p, b: mm.loss(cfg, p, b), m.args[0], m.args[2]))
    if names:
        keep = [n.strip() for n in names.split(",")]
        out = [layer for layer in out if any(k in layer.name for k in keep)]
    return out


def global_step(layer: Layer) -> Callable:
    """The training step partex traces: loss, grads, plain SGD."""
    loss_fn = layer.loss

    def step(params, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        return jax.tree.map(lambda a, g: a - LR * g, params, grads), loss

    return step


# --------------------------------------------------------------------------- per-device program


def _axes(entry) -> tuple[str, ...]:
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def _spec(json_spec) -> P:
    return P(*[None if e is None else e if isinstance(e, str) else tuple(e) for e in json_spec])


class _RowParallel:
    """``jax.numpy`` for a demo module's code traced per device: ``einsum`` and ``dot`` psum
    their result over the mesh axes of any weight dim they contract that is sharded
    (Megatron's row-parallel matmul); everything else is jax.numpy's."""

    def __init__(self, sharded: dict[int, tuple[Any, tuple[tuple[str, ...], ...]]]):
        self._sharded = sharded  # id(weight tracer) -> (the tracer, mesh axes per dim)

    def __getattr__(self, name):
        return getattr(jnp, name)

    def _psum(self, out, axes):
        return jax.lax.psum(out, tuple(dict.fromkeys(axes))) if axes else out

    def einsum(self, subscripts, *operands, **kw):
        out = jnp.einsum(subscripts, *operands, **kw)
        if not any(id(op) in self._sharded for op in operands):
            return out
        if "->" not in subscripts or "." in subscripts:
            raise ValueError(f"einsum {subscripts!r} of a sharded weight: give explicit output letters, no '...'")
        ins, res = subscripts.replace(" ", "").split("->")
        axes = []
        for letters, op in zip(ins.split(","), operands):
            _, dims = self._sharded.get(id(op), (None, ()))
            axes += [a for letter, d in zip(letters, dims) if letter not in res for a in d]
        return self._psum(out, axes)

    def dot(self, a, b, **kw):
        out = jnp.dot(a, b, **kw)  # contracts a's last dim with b's first (b 2-D) or second-to-last
        _, da = self._sharded.get(id(a), (None, ()))
        _, db = self._sharded.get(id(b), (None, ()))
        axes = list(da[-1]) if da else []
        if db:
            axes += db[0] if len(db) <= 2 else db[-2]
        return self._psum(out, axes)


@contextlib.contextmanager
def _wrapped_jnp(module, sharded):
    saved = module.jnp
    module.jnp = _RowParallel(sharded)
    try:
        yield
    finally:
        module.jnp = saved


def local_step(layer: Layer, param_specs, data_specs) -> Callable:
    """The per-device training step under these PartitionSpecs (pytrees like params and
    data), with its collectives written out (module docstring)."""
    batch_axes = tuple(dict.fromkeys(a for s in jax.tree.leaves(data_specs, is_leaf=lambda s: isinstance(s, P))
                                     for e in s for a in _axes(e)))
    is_spec = lambda s: isinstance(s, P)

    def gather(p, spec):
        """ZeRO-3: a parameter dim on a batch axis is gathered before use; (gathered, the mesh
        axes left per dim)."""
        left = []
        for d, entry in enumerate(tuple(spec) + (None,) * (p.ndim - len(spec))):
            axes = _axes(entry)
            on_batch = [a for a in axes if a in batch_axes]
            if on_batch and len(on_batch) != len(axes):
                raise ValueError(f"a parameter dim on {axes}: mixed batch and tensor axes are not written out")
            if on_batch:
                p = jax.lax.all_gather(p, on_batch[0] if len(axes) == 1 else tuple(axes), axis=d, tiled=True)
                axes = ()
            left.append(axes)
        return p, tuple(left)

    def loss_fn(params, data):
        gathered = jax.tree.map(gather, params, param_specs, is_leaf=is_spec)
        full = jax.tree.map(lambda g: g[0], gathered, is_leaf=lambda g: isinstance(g, tuple))
        dims = jax.tree.map(lambda g: g[1], gathered, is_leaf=lambda g: isinstance(g, tuple))
        sharded = {id(t): (t, d) for t, d in zip(jax.tree.leaves(full),
                                                  jax.tree.leaves(dims, is_leaf=lambda d: isinstance(d, tuple)))
                   if any(d)}
        with _wrapped_jnp(layer.module, sharded):
            loss = layer.loss(full, data)
        return jax.lax.pmean(loss, batch_axes) if batch_axes else loss

    def step(params, data):
        loss, grads = jax.value_and_grad(loss_fn)(params, data)
        return jax.tree.map(lambda a, g: a - LR * g, params, grads), loss

    return step


def plan_specs(session: Session, decisions, args) -> tuple[Any, Any]:
    """The plan's input PartitionSpecs as pytrees like (params, data)."""
    plan = session.plan(decisions)
    leaves, treedef = jax.tree.flatten(args)
    sig = plan.signature["inputs"]
    assert len(sig) == len(leaves), (len(sig), len(leaves))
    specs = []
    for x, (path, shape, _) in zip(leaves, sig):
        assert tuple(np.shape(x)) == tuple(shape), (path, np.shape(x), shape)
        specs.append(_spec(plan.inputs.get(path, [])))
    return tuple(jax.tree.unflatten(treedef, specs))


def shard_step(layer: Layer, specs, mesh) -> Callable:
    param_specs, data_specs = specs
    return jax.shard_map(local_step(layer, param_specs, data_specs), mesh=mesh, in_specs=specs,
                         out_specs=(param_specs, P()))


def _jax_mesh(session: Session):
    m = session.mesh
    return jax.make_mesh(tuple(m.axis_size(a) for a in m.axes), tuple(m.axes))


# --------------------------------------------------------------------------- the two sides


RING = {"all-reduce": lambda n: 2 * (n - 1) / n}  # the bytes one device sends per buffer byte; others (n-1)/n
# The hardware changes no count here, but "cpu" would: XLA:CPU has no reduce-scatter, and the
# cost model then charges ZeRO-3's gradient reduce-scatters as all-reduces.
HARDWARE = "tpu-v4"


def partex_side(session: Session, decisions) -> dict:
    flops, nbytes = session.cost_model.work(decisions)
    ici: dict[str, float] = {}
    for c in session.evaluate(decisions).collectives:
        n = math.prod(session.mesh.axis_size(a) for a in c.axes)
        sent = RING.get(c.kind, lambda n: (n - 1) / n)(n) * c.bytes * c.count
        for a in c.axes:  # a collective over two axes under each, as roofline files it
            ici[a] = ici.get(a, 0.0) + sent
    return {"flops": flops, "bytes": nbytes, "ici": sum(ici.values()), "ici_by_axis": ici}


def roofline_side(layer: Layer, specs, mesh) -> dict:
    param_specs, data_specs = specs
    args = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, s)),
                        (layer.params, layer.data), specs)
    _, r = rl.roofline(local_step(layer, param_specs, data_specs), mesh, in_specs=specs,
                       out_specs=(param_specs, P()))(*args)
    return {"flops": r.flops, "unfused_flops": r.unfused_flops, "hbm_bytes": r.hbm_bytes,
            "unfused_hbm_bytes": r.unfused_hbm_bytes, "ici": sum(r.ici_bytes.values()),
            "ici_by_axis": dict(r.ici_bytes)}


def check(layer: Layer, plan: str, mesh_text: str) -> float:
    """The per-device step against the global step at the tiny size: max relative error."""
    s = Session(global_step(layer), (layer.params, layer.data), mesh=mesh_text, hardware=HARDWARE)
    mesh = _jax_mesh(s)
    specs = plan_specs(s, s.strategy(plan), (layer.params, layer.data))
    args = jax.tree.map(lambda x, sp: jax.device_put(x, NamedSharding(mesh, sp)), (layer.params, layer.data), specs)
    got = jax.jit(shard_step(layer, specs, mesh))(*args)
    want = jax.jit(global_step(layer))(layer.params, layer.data)
    err = 0.0
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        g, w = np.asarray(g), np.asarray(w)
        err = max(err, float(np.max(np.abs(g - w)) / (np.max(np.abs(w)) + 1e-30)))
    return err


def compare(layer: Layer, plan: str, mesh_text: str = MESH) -> dict:
    """One row: partex's and roofline's per-device figures for this layer and hand plan."""
    args = (layer.params, layer.data)
    s = Session(global_step(layer), args, mesh=mesh_text, hardware=HARDWARE)
    dec = s.strategy(plan)
    specs = plan_specs(s, dec, args)
    return {"layer": layer.name, "plan": plan, "mesh": mesh_text, "decisions": [s.label(d) for d in dec],
            "partex": partex_side(s, dec), "roofline": roofline_side(layer, specs, _jax_mesh(s))}


# --------------------------------------------------------------------------- the table


# Why a ratio leaves 0.9-1.1, by column (from roofline's rules, JAX 0.12; checked op by op on
# the unsharded steps: the primitives named account for the whole gap).
REASONS = {
    "flops": "roofline's flops are dot_general's alone; partex adds every elementwise op and reduction "
             "(XLA's HloCostAnalysis counting)",
    "unfused_flops": "roofline gives tanh, reduce_max and the backward's cotangent sums (add_any) no FLOPs and a "
                     "logistic one per element; partex counts them (a logistic four)",
    "hbm_bytes": "roofline's hbm_bytes are dot_general's operands and result alone (everything else taken as "
                 "fused into the matmuls); partex leaves out only what XLA fuses away (a value an elementwise op "
                 "makes and one elementwise op or reduction reads) and counts the rest",
    "unfused_hbm_bytes": "roofline's unfused_hbm_bytes count every op's operands and results, fused or not (and "
                         "give none to the backward's cotangent sums, transposes, RoPE's slice/pad/concatenate/"
                         "split, reduce_max and tanh); partex leaves out the intermediates XLA fuses away: partex "
                         "sits between roofline's two bounds",
    "ici": "roofline's ring bytes equal partex's for a collective over one axis (all_gather (n-1) x its input, "
           "psum_scatter (n-1)/n, psum 2(n-1)/n); over two axes it phases the ring and puts the total under each",
}
COLUMNS = (("flops", "flops", "flops"), ("unfused_flops", "flops", "unfused_flops"), ("hbm_bytes", "bytes", "hbm_bytes"),
           ("unfused_hbm_bytes", "bytes", "unfused_hbm_bytes"), ("ici", "ici", "ici"))


def ratios(row: dict) -> dict[str, float | None]:
    """partex / roofline per column (None where roofline counts nothing)."""
    return {name: _ratio(row["partex"][a], row["roofline"][b]) for name, a, b in COLUMNS}


def reasons(rows: list[dict], lo: float = 0.9, hi: float = 1.1) -> list[str]:
    """One line per column with a ratio outside [lo, hi]: its range and why."""
    out = []
    for name, _, _ in COLUMNS:
        rs = [r for r in (ratios(row)[name] for row in rows) if r is not None]
        if any(not lo <= r <= hi for r in rs):
            out.append(f"- {name} {min(rs):.2f}-{max(rs):.2f}: {REASONS[name]}")
    return out


def _fmt(x: float) -> str:
    for unit, k in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= k:
            return f"{x / k:.3g}{unit}"
    return f"{x:.3g}"


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _cell(a: float, b: float) -> str:
    r = _ratio(a, b)
    return f"{_fmt(a)} / {_fmt(b)} ({'-' if r is None else f'{r:.2f}'})"


def table(rows: list[dict]) -> str:
    lines = ["| layer | plan | mesh | FLOPs partex / roofline (ratio) | vs unfused | "
             "HBM bytes partex / roofline (ratio) | vs unfused | ICI bytes partex / roofline (ratio) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p, q, k = r["partex"], r["roofline"], ratios(r)
        uf, ub = (f"{x:.2f}" if x is not None else "-" for x in (k["unfused_flops"], k["unfused_hbm_bytes"]))
        lines.append(f"| {r['layer']} | {r['plan']} | {r['mesh']} | {_cell(p['flops'], q['flops'])} | {uf} | "
                     f"{_cell(p['bytes'], q['hbm_bytes'])} | {ub} | {_cell(p['ici'], q['ici'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mesh", default=MESH)
    ap.add_argument("--layers", default=None, help="substrings of the layer names to keep, comma separated")
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--no-check", action="store_true", help="skip the tiny-size check of each per-device step")
    ap.add_argument("--json", metavar="PATH", nargs="?", const="-",
                    help="the rows as JSON on stdout instead of the table; with PATH, written there beside the table")
    a = ap.parse_args(argv)
    plans = [p.strip() for p in a.plans.split(",") if p.strip()]
    t0 = time.time()
    checks = {}
    if not a.no_check:
        for layer in make_layers(a.layers, tiny=True):
            for plan in plans:
                checks[(layer.name, plan)] = check(layer, plan, a.mesh)
        bad = {k: v for k, v in checks.items() if not v < 1e-4}
        if bad:
            print(f"the per-device step differs from the global step: {bad}", file=sys.stderr)
            return 1
    rows = []
    for layer in make_layers(a.layers):
        for plan in plans:
            row = compare(layer, plan, a.mesh)
            if checks:
                row["check_max_rel_err"] = checks[(layer.name, plan)]
            row["ratios"] = ratios(row)
            rows.append(row)
    if a.json == "-":
        json.dump(rows, sys.stdout, indent=1)
        print()
        return 0
    print(table(rows))
    why = reasons(rows)
    if why:
        print("\nratios outside 0.9-1.1:\n" + "\n".join(why))
    if checks:
        print(f"\nper-device steps checked against the global step (tiny size): max relative error "
              f"{max(checks.values()):.1e}")
    print(f"{len(rows)} rows in {time.time() - t0:.1f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
