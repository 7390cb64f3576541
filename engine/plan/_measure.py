"""measure: run a plan on the local devices for a few steps; its step time and peak memory.

The plan's step is compiled as ``apply`` makes it and run ``warmup`` + ``steps`` times, each
step on the state the step before returned (the updated parameters and optimizer state take
the donated inputs' place, as a training loop feeds them), timed from the call to the last
output ready; the step time is the median of the timed steps. Example arguments given as
``jax.ShapeDtypeStruct`` are made on the devices at the plan's shardings (floats small and
random, integers zero: token ids in range), so a full-size model is measured without a
host copy of it. The peak is the allocator's ``peak_bytes_in_use``, the most of any of the
plan's devices; it is the process's high-water mark, so a MODEL spec is measured in a fresh
process per plan (``measure``), a function in this one (``measure_loaded``).

XLA:CPU runs the simulated devices of a mesh on the host's cores: its step times are real
but say nothing of an accelerator's, and it reports no peak (None). ``Measured``
(``partex._results``) holds the figures beside the prediction.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Sequence

from .._errors import PartexError
from .._results import Measured
from ._plan import Plan
from ._planned import apply_plan
from ._worker import run_worker, worker_main

# Set by a process that keeps itself on the CPU (the explorer's server): the JAX_PLATFORMS the
# machine's devices are measured on ("" for JAX's choice)
DEVICE_PLATFORMS = "PARTEX_DEVICE_PLATFORMS"
# XLA's words for a step that does not fit the device: the plan's limit, not partex's bug
_OOM = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "Failed to allocate")


def _made(x, sharding, key):
    """An example leaf as an array at ``sharding``: a ShapeDtypeStruct made on the devices."""
    import jax
    import jax.numpy as jnp

    if not isinstance(x, jax.ShapeDtypeStruct):
        return jax.device_put(x, sharding)
    dtype = x.dtype
    if jnp.issubdtype(dtype, jax.dtypes.prng_key):
        return jax.jit(lambda: jax.random.split(jax.random.key(0), max(1, int(jnp.prod(jnp.array(x.shape)))))
                       .reshape(x.shape), out_shardings=sharding)()
    if jnp.issubdtype(dtype, jnp.floating):
        return jax.jit(lambda: (0.02 * jax.random.normal(key, x.shape, jnp.float32)).astype(dtype),
                       out_shardings=sharding)()
    return jax.jit(lambda: jnp.zeros(x.shape, dtype), out_shardings=sharding)()


def _peak(devices) -> float | None:
    peaks = []
    for d in devices:
        try:
            stats = d.memory_stats()
        except Exception:  # a backend without memory statistics
            stats = None
        if stats and "peak_bytes_in_use" in stats:
            peaks.append(float(stats["peak_bytes_in_use"]))
    return max(peaks) if peaks else None


def measure_loaded(model, plan: Plan, *, steps: int = 5, warmup: int = 2, label: str | None = None,
                   mesh=None) -> Measured:
    """Run ``plan`` on ``model`` (a ``LoadedModel``) in this process, on the first
    ``plan.mesh.size`` of JAX's devices (module docstring)."""
    import jax

    from ..tracing._program import dynamic_args

    if steps < 1 or warmup < 0:
        raise PartexError(f"measure needs steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    n = plan.mesh.size
    devs = jax.devices()
    if len(devs) < n:
        raise PartexError(f"measuring plan {label or plan.strategy or ''} needs {n} devices for mesh "
                          f"{plan.mesh.text()} and JAX has {len(devs)} here ({devs[0].platform}); measure it on "
                          f"a machine with {n} devices (on the CPU: JAX_NUM_CPU_DEVICES={n})")
    dev = devs[0]
    pred = plan.predicted or {}

    def result(step_time=None, times=(), peak=None, xla=None, compile_s=None, error=None) -> Measured:
        return Measured(label or plan.strategy or "plan", plan.mesh.text(), dev.device_kind, dev.platform, n, steps,
                        step_time, tuple(times), peak, xla, compile_s, pred.get("step_time_s"),
                        (pred.get("memory") or {}).get("peak"), plan.hardware.priced_by(), error)

    planned = apply_plan(plan, model.fn, mesh=mesh if mesh is not None else plan.mesh.jax_mesh(devs[:n]),
                         axis_names=model.axis_names)
    try:
        t0 = time.perf_counter()
        lowered = planned.lower(*model.args)
        compiled = lowered.compile()
        compile_s = time.perf_counter() - t0
    except Exception as e:  # XLA refusing a step too large for the device
        if any(w in str(e) for w in _OOM):
            return result(error=f"XLA could not compile it on {dev.device_kind}: {_first_line(e)}")
        raise
    ma = compiled.memory_analysis()
    xla = None
    if ma is not None:
        xla = float(ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes
                    - ma.alias_size_in_bytes)
    program, bound = planned.program, planned.bound
    assert program is not None and bound is not None  # lower() bound the plan
    analysis = bound.analysis
    shardings = jax.tree_util.tree_leaves(compiled.input_shardings[0])
    dyn = dynamic_args(model.args)
    leaves, tree = jax.tree_util.tree_flatten(dyn)
    key = jax.random.key(1)
    leaves = [_made(x, s, jax.random.fold_in(key, k)) for k, (x, s) in enumerate(zip(leaves, shardings))]
    # the updated state takes its input's place (the donated buffers are gone after a step)
    at = {v: k for k, v in enumerate(program.inputs)}
    feed = {j: at[analysis.roles.mirror[v]] for j, v in enumerate(program.outputs)
            if v in analysis.roles.mirror and analysis.roles.mirror[v] in at}
    donated = {k for k, info in enumerate(jax.tree_util.tree_leaves(compiled.args_info)) if info.donated}
    times: list[float] = []
    try:
        for i in range(warmup + steps):
            args = jax.tree_util.tree_unflatten(tree, leaves)
            t = time.perf_counter()
            out = compiled(*args)
            jax.block_until_ready(out)
            dt = time.perf_counter() - t
            if i >= warmup:
                times.append(dt)
            outs = jax.tree_util.tree_leaves(out)
            fresh = list(leaves)
            for j, k in feed.items():
                fresh[k] = outs[j]
            for k in donated - set(feed.values()):  # a donated input nothing gives back: a copy of it
                fresh[k] = leaves[k].copy() if i + 1 < warmup + steps else leaves[k]
            leaves = fresh
    except Exception as e:  # the step ran out of device memory
        if any(w in str(e) for w in _OOM):
            return result(times=times, peak=_peak(devs[:n]), xla=xla, compile_s=compile_s,
                          error=f"out of memory running it on {dev.device_kind}: {_first_line(e)}")
        raise
    return result(statistics.median(times), times, _peak(devs[:n]), xla, compile_s)


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__


def measure(model: str, plans: Sequence[Plan], *, preset: str = "tiny", overrides: Sequence[str] | None = None,
            steps: int = 5, warmup: int = 2, labels: Sequence[str] | None = None, timeout: float = 1800
            ) -> list[Measured]:
    """Measure plans of a MODEL spec, each in a fresh process on the local devices (its peak
    its own): the accelerators JAX finds, or, where JAX finds only the CPU, as many simulated
    CPU devices as the plan's mesh has."""
    out = []
    for k, plan in enumerate(plans):
        env = dict(os.environ)
        # the machine's devices: the accelerators JAX finds (a server that keeps its own
        # process on the CPU says which platforms the devices are on), else as many
        # simulated CPU devices as the mesh has
        if DEVICE_PLATFORMS in env:
            platforms = env.pop(DEVICE_PLATFORMS)
            if platforms:
                env["JAX_PLATFORMS"] = platforms
            else:
                env.pop("JAX_PLATFORMS", None)
        env["JAX_NUM_CPU_DEVICES"] = str(plan.mesh.size)
        # the step's temporaries allocated as it needs them, not 75% of a GPU up front
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        env.setdefault("PARTEX_JAX_CACHE", os.path.join(os.getcwd(), ".jax_cache"))
        spec = {"model": model, "preset": preset, "overrides": list(overrides or []), "plan": plan.to_json(),
                "steps": steps, "warmup": warmup, "label": (labels[k] if labels else None)}
        what = f"measuring {spec['label'] or plan.strategy or 'a plan'}"
        out.append(Measured.from_json(run_worker("partex.plan._measure", "measure", spec, env, timeout, what)))
    return out


def _worker(spec: dict) -> Measured:
    import jax

    from .._loader import load_model

    n = os.environ.get("JAX_NUM_CPU_DEVICES")
    if n:
        jax.config.update("jax_num_cpu_devices", int(n))
    cache = os.environ.get("PARTEX_JAX_CACHE")
    if cache:
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    model = load_model(spec["model"], spec["preset"], spec["overrides"])
    plan = Plan.from_json(spec["plan"])
    return measure_loaded(model, plan, steps=int(spec["steps"]), warmup=int(spec["warmup"]), label=spec["label"])


def main() -> None:
    worker_main("measure", lambda spec: _worker(spec).to_json())


if __name__ == "__main__":
    main()
