"""Hardware profiles: what the local devices measure, as the tables the cost model prices from.

A datasheet prices every matmul at the chip's peak and every byte at its peak bandwidth; real
kernels reach a fraction of both that depends on their shape and size (an H200's bf16 GEMMs
run at 2% to 87% of the 989 TFLOP/s peak, its memory-bound kernels at 0.95 to 3.7 of its
4.8 TB/s). A ``Profile`` holds what one device kind measures, through JAX:

- ``gemm``: matmul kernels by dtype and shape (batch, m, n, k), seconds per kernel;
- ``memory``: memory-bound kernels (elementwise, reductions) by the bytes they move;
- ``kernel_floor``: the seconds a kernel costs inside one compiled step however small;
- ``host``: copies between device and host memory by size, each way;
- ``collectives``: per collective kind and number of devices, seconds by bytes per device;
- the device memory a program may take (the allocator's limit), the JAX version and the date.

Measurements arrive as rows (``from_measurements``): one JSON object each, with a ``kind``
(the format of ``partex calibrate``'s output, documented in docs/hardware.md). Every timed row is
one jitted call from Python, so it holds the call's own overhead (~80 us on a GPU); the
tables hold kernel time: a call's overhead, estimated per kind from its smallest rows, is
taken off (``_kernel_times``). The cost model looks tables up by interpolation
(``gemm_time``, ``memory_time``, ``host_time``, ``collective_time``).

This module is pure Python and NumPy (no JAX): a profile made on one machine prices plans
on another. ``Hardware.load`` reads a profile file into a ``Hardware``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from typing import Any, Mapping, Sequence

import numpy as np

from ._errors import PartexError

FORMAT = "partex-hardware-profile"
VERSION = 1
PLATFORMS = ("gpu", "tpu", "cpu")
COLLECTIVE_KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")

# Spec sheets of device kinds JAX reports (``device.device_kind``): dense bf16 FLOP/s, memory,
# memory bandwidth and the per-device bandwidth of one direction of its links. They fill what
# measurements leave out (a file of kernel timings names the device, not its memory) and give
# the peak a plan's MFU is counted against.
DATASHEETS: dict[str, dict[str, float]] = {
    "NVIDIA H200": {"peak_flops": 989e12, "hbm_bytes": 141e9, "hbm_bandwidth": 4.8e12, "link_bandwidth": 450e9},
    "NVIDIA H100 80GB HBM3": {"peak_flops": 989e12, "hbm_bytes": 80 * 1024**3, "hbm_bandwidth": 3.35e12,
                              "link_bandwidth": 450e9},
    "NVIDIA H100": {"peak_flops": 989e12, "hbm_bytes": 80 * 1024**3, "hbm_bandwidth": 3.35e12, "link_bandwidth": 450e9},
    "NVIDIA A100-SXM4-80GB": {"peak_flops": 312e12, "hbm_bytes": 80 * 1024**3, "hbm_bandwidth": 2.039e12,
                              "link_bandwidth": 300e9},
    "NVIDIA A100-SXM4-40GB": {"peak_flops": 312e12, "hbm_bytes": 40 * 1024**3, "hbm_bandwidth": 1.555e12,
                              "link_bandwidth": 300e9},
    "TPU v4": {"peak_flops": 275e12, "hbm_bytes": 32 * 1024**3, "hbm_bandwidth": 1.2e12, "link_bandwidth": 100e9},
    "TPU v5 lite": {"peak_flops": 197e12, "hbm_bytes": 16 * 1024**3, "hbm_bandwidth": 0.82e12, "link_bandwidth": 100e9},
    "TPU v5p": {"peak_flops": 459e12, "hbm_bytes": 95 * 1024**3, "hbm_bandwidth": 2.765e12, "link_bandwidth": 200e9},
    "TPU v6 lite": {"peak_flops": 918e12, "hbm_bytes": 32e9, "hbm_bandwidth": 1.638e12, "link_bandwidth": 200e9},
}
# The share of a GPU's memory JAX's allocator lets a process take by default
# (XLA_PYTHON_CLIENT_MEM_FRACTION, preallocated or not): where measurements do not give the
# allocator's own limit (``memory_stats()["bytes_limit"]``), a GPU profile assumes it.
JAX_GPU_MEMORY_FRACTION = 0.75
# Seconds per kernel inside one compiled step where none was measured: a GPU launches the
# kernels of a step back to back (about 2-4 us apart); a TPU runs one program.
DEFAULT_KERNEL_FLOOR = {"gpu": 3e-6, "tpu": 1e-6, "cpu": 2e-6}
# Where the table has no row of a matmul's dtype: its rate relative to bfloat16's (GPU
# tensor cores: float32 runs as TF32 at half the bf16 rate, 8-bit types at twice it).
_DTYPE_RATE = {"bfloat16": 1.0, "float16": 1.0, "float32": 0.5, "float64": 1 / 16, "int8": 2.0,
               "float8_e4m3fn": 2.0, "float8_e5m2": 2.0}


def _dtype_name(d: Any) -> str:
    name = str(d)
    return {"bf16": "bfloat16", "f32": "float32", "f16": "float16", "f64": "float64", "s8": "int8"}.get(name, name)


@dataclasses.dataclass(frozen=True)
class Profile:
    """Measured tables of one device kind (module docstring). Times are kernel seconds."""

    device: str  # device kind as JAX reports it ("NVIDIA H200")
    platform: str  # "gpu" | "tpu" | "cpu": how XLA lowers a step there (``CostModel``'s lowering)
    jax: str  # the JAX version it was measured with
    date: str  # when (ISO date)
    source: str  # "partex calibrate" or the measurements file it was built from
    devices: int = 1  # devices the collectives were measured over
    # device memory a program may take: the allocator's limit where measured, else the
    # datasheet's (a GPU's times JAX_GPU_MEMORY_FRACTION); None: unknown
    memory_bytes: float | None = None
    hbm_bytes: float | None = None  # the device's memory by its datasheet or its runtime
    peak_flops: float | None = None  # the datasheet's dense peak (MFU is counted against it)
    dispatch: float = 0.0  # seconds of one jitted call's own overhead, seen from Python
    kernel_floor: float = 3e-6  # seconds per kernel inside one step
    gemm: tuple[tuple[str, int, int, int, int, float], ...] = ()  # (dtype, batch, m, n, k, seconds)
    memory: tuple[tuple[float, float], ...] = ()  # (bytes moved, seconds), memory-bound kernels
    host: tuple[tuple[float, float, float], ...] = ()  # (bytes, device->host s, host->device s)
    collectives: tuple[tuple[str, int, float, float], ...] = ()  # (kind, devices, bytes per device, s)
    notes: tuple[str, ...] = ()  # what was estimated rather than measured

    def __post_init__(self) -> None:
        if self.platform not in PLATFORMS:
            raise PartexError(f"profile platform must be one of {', '.join(PLATFORMS)}, got {self.platform!r}")
        if not self.gemm or not self.memory:
            raise PartexError(f"profile of {self.device}: needs matmul and memory-bound kernel timings "
                              "(rows of kind 'gemm' and 'elementwise'); run `partex calibrate` on the device")

    # ------------------------------------------------------------------ look-ups
    @functools.cached_property
    def _tables(self) -> dict:
        """The tables as arrays for interpolation (built on first use)."""
        gemm: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for dt in sorted({r[0] for r in self.gemm}):
            rows = [r for r in self.gemm if r[0] == dt]
            pts, eff = [], []
            for _, b, m, n, k, s in rows:
                rate = 2.0 * b * m * n * k / s
                # a matmul's cost is the same with its operands swapped: both orientations
                for mm, nn in ((m, n), (n, m)):
                    pts.append((math.log2(b * mm), math.log2(nn), math.log2(k)))
                    eff.append(math.log(rate))
            gemm[dt] = (np.array(pts), np.array(eff))
        mb = np.array(sorted(self.memory))
        memory = (np.log(mb[:, 0]), np.log(mb[:, 0] / mb[:, 1]))
        host = None
        if self.host:
            hb = np.array(sorted(self.host))
            host = (np.log(hb[:, 0]), np.log(hb[:, 0] / hb[:, 1]), np.log(hb[:, 0] / hb[:, 2]))
        colls: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
        for kind, n in sorted({(r[0], r[1]) for r in self.collectives}):
            rows = sorted((b, s) for k, d, b, s in self.collectives if (k, d) == (kind, n))
            colls[(kind, n)] = (np.array([b for b, _ in rows]), np.array([s for _, s in rows]))
        return {"gemm": gemm, "memory": memory, "host": host, "collectives": colls, "memo": {}}

    def gemm_rate(self, dtype: str, batch: int, m: int, n: int, k: int) -> float:
        """FLOP/s of one ``dtype`` matmul kernel of ``batch`` products of (``m`` x ``k``) by
        (``k`` x ``n``): the measured rates of the three nearest
        shapes (log-space distance over batch x m, n and k), weighted by inverse squared
        distance, in log space, the better of the product and its transpose; a dtype with no
        rows takes bfloat16's at its relative rate."""
        dtype = _dtype_name(dtype)
        key = (dtype, batch, m, n, k)
        memo = self._tables["memo"]
        r = memo.get(key)
        if r is not None:
            return r
        tabs = self._tables["gemm"]
        scale = 1.0
        if dtype not in tabs:
            base = "bfloat16" if "bfloat16" in tabs else next(iter(tabs))
            scale = _DTYPE_RATE.get(dtype, 1.0) / _DTYPE_RATE.get(base, 1.0)
            dtype = base
        pts, eff = tabs[dtype]
        rates = []
        for mm, nn in ((m, n), (n, m)):  # the kernel may compute the product transposed
            q = np.array([math.log2(max(1, batch * mm)), math.log2(max(1, nn)), math.log2(max(1, k))])
            d = np.sqrt(((pts - q) ** 2).sum(axis=1))
            near = np.argsort(d)[:3]
            if d[near[0]] < 1e-9:
                rates.append(float(np.exp(eff[near[0]])))
            else:
                w = 1.0 / d[near] ** 2
                rates.append(float(np.exp((w * eff[near]).sum() / w.sum())))
        r = max(rates) * scale
        memo[key] = r
        return r

    def gemm_time(self, dtype: str, batch: int, m: int, n: int, k: int, flops: float | None = None) -> float:
        """Seconds of one ``dtype`` matmul kernel of ``batch`` products of (``m`` x ``k``) by
        (``k`` x ``n``), at the rate the tables give for that shape (``gemm_rate``); ``flops``:
        its own count, where it is not 2bmnk."""
        work = 2.0 * batch * m * n * k if flops is None else flops
        return work / self.gemm_rate(dtype, batch, m, n, k) if work > 0 else 0.0

    def memory_time(self, nbytes: float) -> float:
        """Seconds of one memory-bound kernel moving ``nbytes`` (read + written): at the
        bandwidth measured for that size, interpolated in log space (flat beyond the table)."""
        if nbytes <= 0:
            return 0.0
        xs, bw = self._tables["memory"]
        return nbytes / math.exp(float(np.interp(math.log(nbytes), xs, bw)))

    @property
    def peak_bandwidth(self) -> float:
        """The highest memory bandwidth measured (bytes/s)."""
        return float(math.exp(self._tables["memory"][1].max()))

    @property
    def peak_gemm_rate(self) -> float:
        """The highest matmul rate measured (FLOP/s), any dtype."""
        return float(max(math.exp(e.max()) for _, e in self._tables["gemm"].values()))

    def host_time(self, nbytes: float, to_host: bool = True) -> float | None:
        """Seconds to copy ``nbytes`` to host memory (``to_host``) or back; None: not measured."""
        h = self._tables["host"]
        if h is None or nbytes <= 0:
            return None if h is None else 0.0
        xs, d2h, h2d = h
        bw = math.exp(float(np.interp(math.log(nbytes), xs, d2h if to_host else h2d)))
        return nbytes / bw

    @property
    def host_bandwidth(self) -> float | None:
        """The highest host-copy bandwidth measured, either way (bytes/s); None: not measured."""
        h = self._tables["host"]
        return None if h is None else float(math.exp(max(h[1].max(), h[2].max())))

    def collective_time(self, kind: str, devices: int, nbytes: float) -> float | None:
        """Seconds of one collective of ``kind`` over ``devices`` moving ``nbytes`` per device
        (the buffer CostModel counts: the larger of before and after): interpolated in the
        table of that kind and group size, linear beyond it (at the largest rows' bus
        bandwidth); a group size not measured takes the nearest measured one's bus bandwidth
        through the ring formula. None: that kind was not measured."""
        tabs = self._tables["collectives"]
        sizes = [n for (k, n) in tabs if k == kind]
        if not sizes or devices <= 1:
            return None if not sizes else 0.0
        near = min(sizes, key=lambda n: (abs(math.log(n / devices)), -n))
        xs, ts = tabs[(kind, near)]
        if nbytes <= xs[0]:
            t = float(ts[0])
        elif nbytes >= xs[-1]:
            t = float(ts[-1] * nbytes / xs[-1])
        else:
            t = float(np.interp(nbytes, xs, ts))
        if near != devices:  # the ring's (n-1)/n share, at the measured group's bandwidth
            t *= ((devices - 1) / devices) / ((near - 1) / near)
        return t

    def collective_bandwidth(self) -> float | None:
        """The bus bandwidth of the largest all-gather measured (bytes/s of one device's
        links, the ring's (n-1)/n share): what a mesh axis's links are taken to carry."""
        rows = [r for r in self.collectives if r[0] == "all-gather" and r[1] > 1]
        if not rows:
            return None
        kind, n, b, s = max(rows, key=lambda r: (r[2], r[1]))
        return (n - 1) / n * b / s

    # ------------------------------------------------------------------ files
    def to_json(self) -> dict:
        """The profile file's JSON data: ``"format"``, ``"version"`` and every field, the
        tables as lists of rows."""
        d = dataclasses.asdict(self)
        return {"format": FORMAT, "version": VERSION, **{k: (list(map(list, v)) if k in _TABLES else
                                                             (list(v) if isinstance(v, tuple) else v))
                                                         for k, v in d.items()}}

    @classmethod
    def from_json(cls, d: Any, where: str = "profile") -> "Profile":
        """The profile in the JSON data ``d`` (``to_json``), checked; ``where`` names it in the
        PartexError for another format or version, an unknown field or a malformed table."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise PartexError(f"{where} is not a partex hardware profile (no \"format\": \"{FORMAT}\"); "
                              "make one with `partex calibrate --out FILE`")
        if d.get("version") != VERSION:
            raise PartexError(f"{where} is profile version {d.get('version')!r}; this partex reads version {VERSION}")
        fields = {f.name for f in dataclasses.fields(cls)}
        body = {k: v for k, v in d.items() if k not in ("format", "version")}
        unknown = set(body) - fields
        if unknown:
            raise PartexError(f"{where} has unknown field(s) {sorted(unknown)}")
        try:
            for k in _TABLES:
                if k in body:
                    body[k] = tuple(tuple(r) for r in body[k])
            if "notes" in body:
                body["notes"] = tuple(body["notes"])
            return cls(**body)
        except TypeError as e:
            raise PartexError(f"{where} is incomplete or malformed: {e}") from None

    def save(self, path: str | os.PathLike) -> None:
        """Write the profile file (``to_json``) to ``path``. Returns None."""
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Profile":
        """The profile in the file at ``path`` (``from_json``); PartexError for a file that is
        missing, unreadable or not a profile."""
        try:
            with open(path) as f:
                d = json.load(f)
        except FileNotFoundError:
            raise PartexError(f"no hardware profile at {path}; make one with `partex calibrate --out {path}`") from None
        except (OSError, json.JSONDecodeError) as e:
            raise PartexError(f"cannot read hardware profile {path}: {e}") from None
        return cls.from_json(d, where=str(path))

    @classmethod
    def from_measurements(cls, measurements: Any, *, source: str, where: str = "measurements",
                          hbm_bytes: float | None = None, memory_bytes: float | None = None,
                          platform: str | None = None) -> "Profile":
        """A profile from the rows ``measurements`` (``from_measurements``, the module's
        function, says which kinds it reads): ``source`` records where they came from,
        ``where`` names them in errors; ``hbm_bytes`` / ``memory_bytes``: the device's memory
        and what a program may take, where the rows do not say; ``platform`` ("gpu", "tpu",
        "cpu"), where given, over the device row's. PartexError for rows it cannot read."""
        return from_measurements(measurements, source=source, where=where, hbm_bytes=hbm_bytes,
                                 memory_bytes=memory_bytes, platform=platform)

    @staticmethod
    def read_measurements(path: str | os.PathLike) -> list[dict]:
        """The measurement rows of the file at ``path`` (``load_measurements``): a JSON list,
        or one JSON object per line; PartexError for a file it cannot read."""
        return load_measurements(path)

    def describe(self) -> str:
        """One line: what measured this profile and where its figures came from."""
        return (f"{self.device} profile ({self.source}, JAX {self.jax}, {self.date}): "
                f"{len(self.gemm)} matmuls, {len(self.memory)} memory-bound kernels"
                + (f", {len(self.collectives)} collectives over {self.devices} devices" if self.collectives else "")
                + (f", host copies up to {max(r[0] for r in self.host) / 1e9:.2f} GB" if self.host else ""))


_TABLES = ("gemm", "memory", "host", "collectives")
_UNMEASURED = 1e-8  # ``partex calibrate``'s floor for a difference of timings lost in noise
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8, "int8": 1, "int32": 4}


# ----------------------------------------------------------------------------- measurements

def _rows(measurements: Any, where: str) -> list[dict]:
    if isinstance(measurements, dict) and "rows" in measurements:
        measurements = measurements["rows"]
    if not isinstance(measurements, list) or not all(isinstance(r, dict) for r in measurements):
        raise PartexError(f"{where}: measurements must be a JSON list of objects, each with a \"kind\" "
                          "(the format `partex calibrate --save-measurements` writes)")
    return measurements


def _number(row: Mapping, key: str, where: str) -> float:
    try:
        x = float(row[key])
    except (KeyError, TypeError, ValueError):
        raise PartexError(f"{where}: a {row.get('kind')!r} row needs a number {key!r}, got {row.get(key)!r}") from None
    if not math.isfinite(x) or x < 0:
        raise PartexError(f"{where}: a {row.get('kind')!r} row has {key}={row.get(key)!r}; expected a finite "
                          "number >= 0")
    return x


def _kernel_times(times: Sequence[float], work: Sequence[float], in_step: Sequence[bool] | None = None
                  ) -> tuple[list[float], float]:
    """Kernel seconds of timed calls, and the call overhead taken off. A row timed inside one
    step (``in_step``: ``partex calibrate`` times a chain of kernels in one jitted call
    against one) is a kernel time already. A single jitted call is its overhead plus its
    kernel: the best rate is estimated from the largest such rows (where the overhead is
    the least share of the time); the overhead is the median, over the small rows (whose
    kernel at that rate would take under a tenth of their time), of each one's time less
    that kernel, or, without small rows, the least such difference; each row's kernel time
    is what is left of its time, no faster than the best rate."""
    in_step = list(in_step) if in_step is not None else [False] * len(times)
    calls = [i for i, s in enumerate(in_step) if not s]
    over = 0.0
    out = list(times)
    if calls:
        t = [times[i] for i in calls]
        w = [work[i] for i in calls]
        order = np.argsort(w)[::-1]
        rate = max(w[i] / t[i] for i in order[: max(1, len(order) // 4)])
        small = [ti - wi / rate for ti, wi in zip(t, w) if wi / rate < 0.1 * ti]
        over = max(0.0, float(np.median(small)) if small else min(ti - wi / rate for ti, wi in zip(t, w)))
        for i, ti, wi in zip(calls, t, w):
            out[i] = max(ti - over, wi / rate)
    return out, over


def _memory_curve(rows: Sequence[tuple[str, float, float, bool]]) -> tuple[tuple[tuple[float, float], ...], float]:
    """The memory-bound table ((bytes, kernel seconds), by size) from (dtype, bytes, seconds,
    in_step) rows, and the call overhead taken off single calls (``_kernel_times``). Only
    rows whose kernel takes at least the overhead say much of their bandwidth (below that,
    the call's noise is the kernel's size); of those, the dtype that reaches the most
    bandwidth sets the curve (a fused kernel of a step moves its bytes as fast as the best
    elementwise kernel does; bfloat16's elementwise micro-benchmark runs slower per byte on
    some GPUs), and its bandwidth is made non-decreasing with size (pooled where a larger
    kernel measured slower: a larger kernel amortises its launch at least as well)."""
    kernel, over = _kernel_times([r[2] for r in rows], [r[1] for r in rows], [r[3] for r in rows])
    if all(r[3] for r in rows):  # timed inside a step: as measured (a CPU's bandwidth falls past its caches)
        timed = sorted((r[1], k) for r, k in zip(rows, kernel) if k > _UNMEASURED)
        if not timed:
            raise PartexError("every memory-bound timing was below what a clock resolves; measure larger sizes")
        return tuple((float(b), float(k)) for b, k in timed), 0.0
    trusted = [(dt, b, k) for (dt, b, _, step), k in zip(rows, kernel) if step or k >= over]
    if len({b for _, b, _ in trusted}) < 2:  # too few: the largest rows, whatever their share
        trusted = sorted(((dt, b, k) for (dt, b, _, _), k in zip(rows, kernel)), key=lambda r: -r[1])[:3]
    by_dtype: dict[str, list[tuple[float, float]]] = {}
    for dt, b, k in trusted:
        by_dtype.setdefault(dt, []).append((b, k))
    best = max(by_dtype.values(), key=lambda rs: float(np.median([b / k for b, k in rs])))
    best = sorted(best)
    # pool adjacent violators: bandwidth non-decreasing in size, each row weighted by its time
    blocks: list[list[float]] = []  # [bandwidth, weight, rows]
    for b, k in best:
        blocks.append([b / k, k, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            bw2, w2, n2 = blocks.pop()
            bw1, w1, n1 = blocks.pop()
            blocks.append([(bw1 * w1 + bw2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    bws = [bw for bw, _, n in blocks for _ in range(int(n))]
    return tuple((float(b), float(b / bw)) for (b, _), bw in zip(best, bws)), over


def from_measurements(measurements: Any, *, source: str, where: str = "measurements",
                      hbm_bytes: float | None = None, memory_bytes: float | None = None,
                      platform: str | None = None) -> Profile:
    """A ``Profile`` from measurement rows (``partex calibrate``'s format; the rows of
    ``shared/reference/h200/micro.json`` are of it). Kinds read: ``device`` (``name``,
    ``jax``, optional ``platform``, ``devices``, ``bytes_limit``, ``bytes_total``), ``gemm``
    (``dtype``, ``m``, ``n``, ``k``, optional ``batch``, ``s``), ``bgemm`` (``shape``
    [b, h, s, d]: the attention scores' matmul, ``s``), ``elementwise`` (``bytes`` read and
    written, ``s``), ``reduce`` and ``softmax`` (``shape``, ``dtype``: the bytes they read
    and write), ``launch`` (``s``: one tiny jitted call), ``kernel`` (``s``: one kernel
    inside a step), ``host`` (``bytes``, ``d2h_s``, ``h2d_s``), ``collective`` (``op``, ``devices``,
    ``bytes`` per device, ``s``). Other kinds (``attention_fwd_bwd``) are kept out of the
    tables. ``hbm_bytes`` / ``memory_bytes``: the device's memory and what a program may
    take, where the rows do not say."""
    rows = _rows(measurements, where)
    dev = next((r for r in rows if r.get("kind") == "device"), None)
    if dev is None or not dev.get("name"):
        raise PartexError(f"{where}: no \"device\" row naming the device kind (e.g. {{\"kind\": \"device\", "
                          "\"name\": \"NVIDIA H200\", \"jax\": \"0.11.2\"}})")
    name = str(dev["name"])
    sheet = DATASHEETS.get(name, {})
    plat = platform or dev.get("platform") or ("gpu" if name.startswith("NVIDIA") or "GPU" in name else
                                               "tpu" if name.startswith("TPU") else "cpu")
    notes: list[str] = []
    timed = [r for r in rows if r.get("kind") in ("gemm", "bgemm", "elementwise", "reduce", "softmax", "launch",
                                                  "kernel", "host", "collective") and "error" not in r]
    for r in timed:
        for key in ("s", "d2h_s", "h2d_s"):
            if key in r:
                _number(r, key, where)
    # matmuls: (dtype, batch, m, n, k) and the call's time
    mm: list[tuple[str, int, int, int, int]] = []
    mt: list[float] = []
    mi: list[bool] = []  # timed inside one step (``partex calibrate``): no call overhead to take off
    for r in timed:
        if r["kind"] == "gemm":
            mm.append((_dtype_name(r.get("dtype", "bfloat16")), int(r.get("batch", 1)), int(_number(r, "m", where)),
                       int(_number(r, "n", where)), int(_number(r, "k", where))))
            mt.append(_number(r, "s", where))
            mi.append(bool(r.get("in_step")))
        elif r["kind"] == "bgemm":
            shape = r.get("shape")
            if not (isinstance(shape, list) and len(shape) == 4):
                raise PartexError(f"{where}: a 'bgemm' row needs \"shape\": [batch, heads, seq, head_dim]")
            b, h, s, d = (int(x) for x in shape)
            mm.append((_dtype_name(r.get("dtype", "bfloat16")), b * h, s, s, d))
            mt.append(_number(r, "s", where))
            mi.append(bool(r.get("in_step")))
    if not mm:
        raise PartexError(f"{where}: no matmul timings (rows of kind 'gemm'); a profile prices matmuls from them")
    gemm_k, gemm_over = _kernel_times(mt, [2.0 * b * m * n * k for _, b, m, n, k in mm], mi)
    # memory-bound kernels: elementwise (bytes read + written), reductions (read) and
    # softmaxes (read + written) over score-shaped arrays
    mem: list[tuple[str, float, float, bool]] = []  # (dtype, bytes, call s, timed inside a step)
    for r in timed:
        if r["kind"] == "elementwise":
            mem.append((_dtype_name(r.get("dtype", "float32")), _number(r, "bytes", where), _number(r, "s", where),
                        bool(r.get("in_step"))))
        elif r["kind"] in ("reduce", "softmax"):
            dt = _dtype_name(r.get("dtype", "float32"))
            n = math.prod(int(x) for x in r.get("shape", ()))
            mem.append((dt, float(n * _ITEMSIZE.get(dt, 4) * (2 if r["kind"] == "softmax" else 1)),
                        _number(r, "s", where), bool(r.get("in_step"))))
    if not mem:
        raise PartexError(f"{where}: no memory-bound timings (rows of kind 'elementwise'); a profile prices "
                          "elementwise kernels and reductions from them")
    memory, mem_over = _memory_curve(mem)
    launch = [_number(r, "s", where) for r in timed if r["kind"] == "launch"]
    dispatch = min(launch) if launch else mem_over
    floors = [_number(r, "s", where) for r in timed if r["kind"] == "kernel"]
    if floors:
        floor = min(floors)
    else:
        floor = DEFAULT_KERNEL_FLOOR[plat]
        notes.append(f"kernel floor not measured: {floor * 1e6:g} us assumed (a {plat}'s kernels back to back)")
    host = []
    for r in timed:
        if r["kind"] == "host":
            b = _number(r, "bytes", where)
            host.append((b, max(_number(r, "d2h_s", where) - mem_over, 1e-9), max(_number(r, "h2d_s", where) - mem_over,
                                                                                1e-9)))
    colls = []
    for r in timed:
        if r["kind"] == "collective":
            op = str(r.get("op", ""))
            if op not in COLLECTIVE_KINDS:
                raise PartexError(f"{where}: a 'collective' row's \"op\" must be one of {', '.join(COLLECTIVE_KINDS)}, "
                                  f"got {op!r}")
            colls.append((op, int(_number(r, "devices", where)), _number(r, "bytes", where),
                          max(_number(r, "s", where) - mem_over, 1e-9)))
    total = dev.get("bytes_total") or hbm_bytes or sheet.get("hbm_bytes")
    limit = dev.get("bytes_limit") or memory_bytes
    if limit is None and total is not None:
        if plat == "gpu":
            limit = total * JAX_GPU_MEMORY_FRACTION
            notes.append(f"memory a program may take not measured: {JAX_GPU_MEMORY_FRACTION:.0%} of the "
                         f"{total / 1e9:.0f} GB (JAX's default XLA_PYTHON_CLIENT_MEM_FRACTION)")
        else:
            limit = total
    if total is None and not dev.get("bytes_total"):
        notes.append("device memory not known: give it with --hbm")
    if gemm_over or mem_over:
        notes.append(f"each timed call's own overhead taken off its time: {gemm_over * 1e6:.0f} us (matmuls), "
                     f"{mem_over * 1e6:.0f} us (memory-bound kernels, host copies, collectives)")
    return Profile(
        device=name, platform=plat, jax=str(dev.get("jax", "?")), date=str(dev.get("date", "")) or _today(),
        source=source, devices=int(dev.get("devices", 1) or 1),
        memory_bytes=float(limit) if limit else None, hbm_bytes=float(total) if total else None,
        peak_flops=float(sheet["peak_flops"]) if "peak_flops" in sheet else None, dispatch=float(dispatch),
        kernel_floor=float(floor),
        gemm=tuple((dt, b, m, n, k, float(t)) for (dt, b, m, n, k), t in zip(mm, gemm_k)),
        memory=memory, host=tuple(sorted(host)), collectives=tuple(sorted(colls)), notes=tuple(notes))


def _today() -> str:
    import datetime

    return datetime.date.today().isoformat()


def load_measurements(path: str | os.PathLike) -> list[dict]:
    """The rows of a measurements file: a JSON list, or one JSON object per line."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise PartexError(f"cannot read measurements {path}: {e.strerror or e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        try:
            data = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise PartexError(f"cannot read measurements {path}: not JSON ({e})") from None
    return _rows(data, str(path))
