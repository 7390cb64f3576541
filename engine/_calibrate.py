"""``partex calibrate``: micro-benchmarks on the local devices, as measurement rows.

Each kernel is timed inside one compiled step, as a step runs it: a jitted chain of R of
them (each waiting for the last, optimisation barriers keeping XLA from fusing or merging
them) against a chain of one, the difference over R - 1 (rows marked ``"in_step": true``),
so neither the call's own overhead from Python nor its variance is in the figure; and on
every local device at once (``shard_map``), as a mesh's devices run a step: simulated CPU
devices share the host's cores. Rows:

- ``device``: the device kind, platform, JAX version, local device count, and the memory a
  program may take (``memory_stats()["bytes_limit"]``, the allocator's limit) and in all;
- ``gemm``: matmuls over a grid of shapes (model-like and square) and dtypes, batched too;
- ``elementwise``: a multiply-add over sizes (bytes read + written);
- ``kernel``: one tiny kernel's seconds (the floor every kernel of a step pays);
- ``launch``: one tiny jitted call from Python (for reference; not a kernel's cost);
- ``host``: copies to and from host memory (pinned where the backend has it) by size;
- ``collective``: all-gather, reduce-scatter, all-reduce, all-to-all and a permute over
  groups of 2, 4, ... of the local devices, by bytes per device, where there are 2 or more.

``_profile.from_measurements`` turns the rows into a ``Profile``. This module imports JAX.
"""

from __future__ import annotations

import datetime
import math
import statistics
import time
from typing import Any, Callable

from ._errors import PartexError

Progress = Callable[[str, float], None]  # (what is being measured, fraction done)

# (m, n, k) per platform: the shapes a transformer's layers and attention run, and squares
_GEMMS = {
    "gpu": [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
            (16384, 2048, 2048), (16384, 5632, 2048), (16384, 2048, 5632), (16384, 4096, 4096),
            (16384, 14336, 4096), (16384, 4096, 14336), (16384, 32000, 2048), (4096, 4096, 16384),
            (8192, 1024, 8192), (4096, 256, 4096), (65536, 4096, 4096), (2048, 8192, 32768)],
    "cpu": [(64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 512, 512), (1024, 256, 256),
            (256, 1024, 256), (2048, 128, 512)],
}
# (batch, m, n, k): attention's scores (s x s over head_dim) and its weighted sum (s x head_dim over s)
_BATCHED = {
    "gpu": [(128, 1024, 1024, 128), (128, 2048, 2048, 128), (64, 4096, 4096, 128), (128, 2048, 128, 2048),
            (64, 4096, 128, 4096)],
    "cpu": [(16, 128, 128, 32), (16, 256, 32, 256)],
}
_DTYPES = {"gpu": ("bfloat16", "float32"), "cpu": ("float32", "bfloat16")}
_ELEMENTWISE = {"gpu": [2**k for k in range(20, 34, 2)], "cpu": [2**k for k in range(14, 25, 2)]}
_HOST = {"gpu": [2**24, 2**26, 2**28], "cpu": []}
_COLLECTIVE = {"gpu": [2**k for k in range(16, 29, 3)], "cpu": [2**k for k in range(10, 19, 4)]}
_COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


def _median_seconds(f, *args, reps: int) -> float:
    import jax

    jax.block_until_ready(f(*args))
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def _per_kernel(chain: Callable[[int], Callable], args, reps: int, length: int = 5) -> float:
    """Seconds of one kernel inside a step: (t(chain of ``length``) - t(chain of 1)) / (length - 1),
    never below a microsecond's hundredth (noise can make the difference negative)."""
    one = _median_seconds(chain(1), *args, reps=reps)
    many = _median_seconds(chain(length), *args, reps=reps)
    return max((many - one) / (length - 1), 1e-8)


def _gemm_body(r: int):
    from jax import lax

    def f(x, w1, w2):
        for _ in range(r):  # x (m, k) -> (m, n) -> (m, k): each matmul waits for the last
            x = lax.optimization_barrier(x @ w1) @ w2
            x = lax.optimization_barrier(x)
        return x

    return f


def _batched_body(r: int):
    import jax.numpy as jnp
    from jax import lax

    def f(x, w1, w2):
        for _ in range(r):
            y = lax.optimization_barrier(jnp.einsum("bmk,bkn->bmn", x, w1))
            x = lax.optimization_barrier(jnp.einsum("bmn,bnk->bmk", y, w2))
        return x

    return f


def _elementwise_body(r: int):
    from jax import lax

    def f(x):
        for _ in range(r):
            x = lax.optimization_barrier(x * 1.0001 + 1e-4)
        return x

    return f


class _Everywhere:
    """Kernels run on every local device at once, each on its own copy (a mesh's devices
    run their shares of a step together: simulated CPU devices share the host's cores, and
    a device measured alone would look as fast as the host). With one device, on it."""

    def __init__(self, devs):
        import numpy as np
        from jax.sharding import Mesh

        self.devs = devs
        self.mesh = Mesh(np.array(devs), ("d",)) if len(devs) > 1 else None

    def chain(self, body: Callable[[int], Callable]) -> Callable[[int], Callable]:
        import jax
        from jax.sharding import PartitionSpec as P

        if self.mesh is None:
            return lambda r: jax.jit(body(r))

        def make(r: int):
            f = body(r)
            return jax.jit(jax.shard_map(lambda *a: f(*(x[0] for x in a))[None], mesh=self.mesh, in_specs=P("d"),
                                         out_specs=P("d")))

        return make

    def array(self, make: Callable[[], Any]):
        """An array made by ``make`` on each device (stacked over them where there are several)."""
        import jax
        from jax.sharding import NamedSharding, PartitionSpec as P

        if self.mesh is None:
            return make()
        return jax.jit(lambda: jax.numpy.stack([make()] * len(self.devs)),
                       out_shardings=NamedSharding(self.mesh, P("d")))()


def calibrate(*, quick: bool = False, progress: Progress | None = None, collectives: bool = True,
              devices=None) -> list[dict]:
    """Measure the local devices (module docstring) and return the rows. ``quick``: fewer
    shapes and repetitions (a check that everything runs, not a profile to trust)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    devs = list(devices if devices is not None else jax.devices())
    if not devs:
        raise PartexError("JAX sees no devices to calibrate")
    dev = devs[0]
    plat = "gpu" if dev.platform in ("gpu", "cuda", "rocm") else dev.platform
    grid = "cpu" if plat == "cpu" else "gpu"
    reps = 3 if quick else 7
    report = progress or (lambda what, frac: None)
    stats = {}
    try:
        stats = dev.memory_stats() or {}
    except Exception:  # a backend without memory statistics
        stats = {}
    if plat == "cpu" and not stats.get("bytes_limit"):  # the simulated devices share the host's memory
        stats = {"bytes_limit": _host_memory() // len(devs)}
    rows: list[dict] = [{
        "kind": "device", "name": dev.device_kind, "platform": plat if plat in ("gpu", "tpu") else "cpu",
        "jax": jax.__version__, "devices": len(devs), "date": datetime.date.today().isoformat(),
        **({"bytes_limit": int(stats["bytes_limit"])} if stats.get("bytes_limit") else {}),
        **({"bytes_total": int(stats["bytes_reservable_limit"])} if stats.get("bytes_reservable_limit") else {}),
    }]
    gemms = _GEMMS[grid][::3] if quick else _GEMMS[grid]
    batched = _BATCHED[grid][:1] if quick else _BATCHED[grid]
    dtypes = _DTYPES[grid]
    sizes = _ELEMENTWISE[grid][::2] if quick else _ELEMENTWISE[grid]
    # (what, dtype, shape or bytes): the first dtype over every shape, the others over a third
    plan: list[tuple[str, str, Any]] = []
    for dt in dtypes:
        plan += [("gemm", dt, s) for s in (gemms if dt == dtypes[0] else gemms[: max(2, len(gemms) // 3)])]
    plan += [("bgemm", dtypes[0], s) for s in batched]
    plan += [("elementwise", "float32", n) for n in sizes]
    plan += [("kernel", "float32", 1024), ("launch", "float32", 128)]
    plan += [("host", "float32", n) for n in _HOST[grid]]
    steps = len(plan) + (1 if collectives and len(devs) > 1 else 0)
    key = jax.random.key(0)
    every = _Everywhere(devs)
    with jax.default_device(dev):
        for i, (kind, dt, shape) in enumerate(plan):
            report(f"{kind} {dt} {shape}", i / steps)
            dtype = jnp.dtype(dt)
            if kind == "gemm":
                m, n, k = shape
                x = every.array(lambda m=m, k=k, dtype=dtype: jax.random.normal(key, (m, k), dtype))
                w1 = every.array(lambda k=k, n=n, dtype=dtype: jax.random.normal(key, (k, n), dtype) / math.sqrt(k))
                w2 = every.array(lambda k=k, n=n, dtype=dtype: jax.random.normal(key, (n, k), dtype) / math.sqrt(n))
                pair = _per_kernel(every.chain(_gemm_body), (x, w1, w2), reps)
                # a pair is (m, n, k) then (m, k, n): the same FLOPs; each row half of it
                rows.append({"kind": "gemm", "dtype": dt, "m": m, "n": n, "k": k, "s": pair / 2, "in_step": True})
                if n != k:
                    rows.append({"kind": "gemm", "dtype": dt, "m": m, "n": k, "k": n, "s": pair / 2, "in_step": True})
                del x, w1, w2
            elif kind == "bgemm":
                b, m, n, k = shape
                x = every.array(lambda b=b, m=m, k=k, dtype=dtype: jax.random.normal(key, (b, m, k), dtype))
                w1 = every.array(lambda b=b, k=k, n=n, dtype=dtype:
                                 jax.random.normal(key, (b, k, n), dtype) / math.sqrt(k))
                w2 = every.array(lambda b=b, k=k, n=n, dtype=dtype:
                                 jax.random.normal(key, (b, n, k), dtype) / math.sqrt(n))
                pair = _per_kernel(every.chain(_batched_body), (x, w1, w2), reps)
                rows.append({"kind": "gemm", "dtype": dt, "batch": b, "m": m, "n": n, "k": k, "s": pair / 2,
                             "in_step": True})
                del x, w1, w2
            elif kind == "elementwise":
                x = every.array(lambda n=shape // 8, dtype=dtype: jnp.ones((n,), dtype))  # float32: 4 bytes each way
                rows.append({"kind": "elementwise", "dtype": dt, "bytes": shape,
                             "s": _per_kernel(every.chain(_elementwise_body), (x,), reps), "in_step": True})
                del x
            elif kind == "kernel":
                x = every.array(lambda n=shape, dtype=dtype: jnp.ones((n,), dtype))
                rows.append({"kind": "kernel", "s": _per_kernel(every.chain(_elementwise_body), (x,), reps, length=33)})
            elif kind == "launch":
                x = jnp.ones((shape,), dtype)
                rows.append({"kind": "launch", "what": "one tiny jitted call",
                             "s": _median_seconds(jax.jit(lambda x: x + 1), x, reps=max(reps, 20))})
            elif kind == "host":
                row = _host_row(dev, shape, reps)
                if row is not None:
                    rows.append(row)
        if collectives and len(devs) > 1:
            report("collectives", len(plan) / steps)
            rows += _collective_rows(devs, _COLLECTIVE[grid][::2] if quick else _COLLECTIVE[grid], reps,
                                     lambda what, frac: report(what, (len(plan) + frac) / steps))
    report("done", 1.0)
    del np
    return rows


def _host_memory() -> int:
    """The host's physical memory in bytes (16 GiB where the system does not say)."""
    import os

    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 * 1024**3


def _host_row(dev, nbytes: int, reps: int) -> dict | None:
    """A copy of ``nbytes`` to pinned host memory and back, where the backend has it."""
    import jax
    import jax.numpy as jnp

    try:
        s_dev = jax.sharding.SingleDeviceSharding(dev)
        s_host = jax.sharding.SingleDeviceSharding(dev, memory_kind="pinned_host")
        x = jnp.ones((nbytes // 4,), jnp.float32)
        to_host = jax.jit(lambda x: x, out_shardings=s_host)
        h = to_host(x)
        to_dev = jax.jit(lambda x: x, out_shardings=s_dev)
        d2h = _median_seconds(to_host, x, reps=reps)
        h2d = _median_seconds(to_dev, h, reps=reps)
        return {"kind": "host", "bytes": nbytes, "d2h_s": d2h, "h2d_s": h2d}
    except Exception:  # no pinned host memory on this backend: nothing measured
        return None


def _collective_rows(devs, sizes: list[int], reps: int, report: Progress) -> list[dict]:
    """Each collective over groups of 2, 4, ... devices (a 1-D mesh of the first n), by
    bytes per device, timed as a chain of them inside one step."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    groups = [n for n in (2, 4, 8, 16, 32, 64) if n <= len(devs)]
    rows: list[dict] = []
    total = len(groups) * len(sizes) * len(_COLLECTIVES)
    done = 0
    for n in groups:
        mesh = Mesh(np.array(devs[:n]), ("x",))

        def chain(kind: str, r: int, mesh=mesh, n=n):
            def body(x):
                for _ in range(r):
                    if kind == "all-gather":  # then this device's block again (a slice XLA keeps)
                        y = lax.dynamic_slice_in_dim(lax.all_gather(x, "x", tiled=True),
                                                     lax.axis_index("x") * x.shape[0], x.shape[0])
                    elif kind == "reduce-scatter":
                        y = jnp.tile(lax.psum_scatter(x, "x", tiled=True), n)
                    elif kind == "all-reduce":
                        y = lax.psum(x, "x")
                    elif kind == "all-to-all":
                        y = lax.all_to_all(x, "x", 0, 0, tiled=True)
                    else:
                        y = lax.ppermute(x, "x", [(i, (i + 1) % n) for i in range(n)])
                    x = lax.optimization_barrier(y)
                return x

            return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))

        for nbytes in sizes:
            per = max(n, nbytes // 4 // n * n)  # elements per device, a multiple of n
            x = jax.device_put(jnp.ones((per * n,), jnp.float32), NamedSharding(mesh, P("x")))
            for kind in _COLLECTIVES:
                report(f"{kind} over {n} devices, {per * 4} bytes each", done / total)
                t = _per_kernel(lambda r, kind=kind: chain(kind, r), (x,), reps, length=4)
                # the bytes CostModel counts: the larger of a device's buffer before and after
                big = per * 4 * (n if kind == "all-gather" else 1)
                rows.append({"kind": "collective", "op": kind, "devices": n, "bytes": big, "s": t, "in_step": True})
                done += 1
    return rows
