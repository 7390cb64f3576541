"""Meshes and hardware: named mesh axes with sizes and per-axis links; hardware presets
from public spec sheets. Every figure can be overridden; every figure is validated."""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import re
from typing import Any

from ._errors import PartexError
from ._profile import Profile

GiB = 1024**3
DEFAULT_MARGIN = 0.1  # the share of a budget kept free (Hardware.memory_margin; docs/concepts.md, "The memory promise")


@dataclasses.dataclass(frozen=True, slots=True)
class Hardware:
    """One device's figures the cost model prices a plan with (compute, memory, bandwidths,
    links, host memory): a preset (``HARDWARE``), a profile (``load``) or given; frozen, and
    checked by ``validate``. Each field's meaning is in its comment below."""

    name: str
    peak_flops: float  # FLOP/s per device (dense bf16 where the chip has it)
    hbm_bytes: float  # memory per device
    hbm_bandwidth: float  # bytes/s
    link_bandwidth: float  # bytes/s per mesh axis (intra-node / ICI), one direction
    link_latency: float  # seconds per collective step
    memory_budget: float | None = None  # per-device budget; defaults to hbm_bytes
    # the share of the budget a plan keeps free by the cost model's count: the memory model
    # is an estimate (within ~15% of XLA's on the library models), the budget is a promise.
    # Every preset, the CLI, the explorer and the API default to the same share
    memory_margin: float = DEFAULT_MARGIN
    # XLA runs collectives asynchronously on this hardware (TPU, GPU: its latency-hiding
    # scheduler overlaps them with independent compute); XLA:CPU runs them in line
    overlap: bool = True
    # bytes/s between a device and its host's memory, one direction, per device (its share of
    # the host's PCIe / DMA links): what moving a value offloaded to the host takes
    host_bandwidth: float = 16e9
    # bytes of host memory per device (its share of its host's RAM): what the values a plan
    # keeps in host memory may take, less the same margin
    host_memory_bytes: float = 100e9
    # measured tables (``partex calibrate``): where given, the cost model prices matmuls,
    # memory-bound kernels, host copies and collectives from them rather than from the
    # figures above, and lowers the step as the profile's platform does (``lowering``)
    profile: Profile | None = None

    @classmethod
    def load(cls, path: str | os.PathLike, **overrides) -> "Hardware":
        """The hardware the profile file at ``path`` describes (``partex calibrate --out
        PATH``; ``from_profile``), the figures in ``overrides`` replaced."""
        return cls.from_profile(Profile.load(path), **overrides)

    @classmethod
    def from_profile(cls, profile: Profile, **overrides) -> "Hardware":
        """Hardware priced by ``profile``: its device memory is what the profile says a
        program may take; its peak (MFU's denominator) the datasheet's where the profile
        knows it, else the best matmul rate measured; bandwidths the best measured; links
        the collectives measured, or the datasheet's, or 450 GB/s for a GPU."""
        from ._profile import DATASHEETS

        sheet = DATASHEETS.get(profile.device, {})
        link = profile.collective_bandwidth() or sheet.get("link_bandwidth") or (
            450e9 if profile.platform == "gpu" else 100e9 if profile.platform == "tpu" else 10e9)
        host = profile.host_bandwidth or (50e9 if profile.platform == "cpu" else 16e9)
        hw = cls(
            name=f"{profile.device} (profile)",
            peak_flops=profile.peak_flops or sheet.get("peak_flops") or profile.peak_gemm_rate,
            hbm_bytes=profile.memory_bytes or profile.hbm_bytes or sheet.get("hbm_bytes") or 16 * GiB,
            hbm_bandwidth=profile.peak_bandwidth, link_bandwidth=float(link),
            link_latency=10e-6 if profile.platform == "gpu" else 5e-6 if profile.platform == "tpu" else 20e-6,
            overlap=profile.platform != "cpu", host_bandwidth=float(host), profile=profile)
        hw.validate()
        return hw.replace(**overrides) if overrides else hw

    @property
    def lowering(self) -> str:
        """How XLA compiles a step here, as the cost model follows it (``CostModel``): the
        profile's platform; "tpu" for the presets (their figures, not their compiler)."""
        return self.profile.platform if self.profile is not None else "tpu"

    def priced_by(self) -> str:
        """What prices a plan on this hardware, in words (every report says it)."""
        if self.profile is not None:
            return self.profile.describe()
        return (f"{self.name} datasheet: {self.peak_flops / 1e12:g} TFLOP/s, {self.hbm_bandwidth / 1e12:g} TB/s, "
                f"links {self.link_bandwidth / 1e9:g} GB/s")

    def host_seconds(self, nbytes: float, to_host: bool = True) -> float:
        """Seconds to copy ``nbytes`` between this device and its host's memory, ``to_host``
        (True) or back: the profile's measured time where it has one, else by ``host_bandwidth``."""
        if self.profile is not None:
            t = self.profile.host_time(nbytes, to_host)
            if t is not None:
                return t
        return nbytes / self.host_bandwidth if nbytes else 0.0

    def to_json(self) -> dict:
        """Every figure as JSON data, the profile as ``Profile.to_json`` gives it."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "profile"}
        if self.profile is not None:
            d["profile"] = self.profile.to_json()
        return d

    @classmethod
    def from_json(cls, d: Any, where: str = "plan hardware") -> "Hardware":
        """The hardware in the JSON data ``d`` (``to_json``), validated; ``where`` names it in
        the PartexError for an unknown or missing field or a bad figure."""
        if not isinstance(d, dict):
            raise PartexError(f"{where} must be an object of figures")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - fields
        if unknown:
            raise PartexError(f"{where} has unknown field(s) {sorted(unknown)}")
        d = dict(d)
        if d.get("profile") is not None:
            d["profile"] = Profile.from_json(d["profile"], where=f"{where} profile")
        try:
            hw = cls(**d)
        except TypeError as e:
            raise PartexError(f"{where} is incomplete: {e}") from None
        hw.validate()
        return hw

    @property
    def budget(self) -> float:
        """The per-device memory budget in bytes: ``memory_budget``, else ``hbm_bytes``."""
        return self.memory_budget if self.memory_budget is not None else self.hbm_bytes

    @property
    def host_limit(self) -> float:
        """What a plan may keep in host memory per device by the cost model's count."""
        return self.host_memory_bytes * (1.0 - self.memory_margin)

    def fits(self, peak: float, host: float = 0.0) -> bool:
        """Whether a plan of device ``peak`` and ``host`` memory (bytes per device) fits:
        ``peak`` within ``limit`` and ``host`` within ``host_limit`` (both less the margin)."""
        return peak <= self.limit and host <= self.host_limit

    @property
    def limit(self) -> float:
        """What a plan may use by the cost model's count: the budget less the margin."""
        return self.budget * (1.0 - self.memory_margin)

    def replace(self, **kw) -> "Hardware":
        """A copy with the figures given by keyword replaced, validated; PartexError for an
        unknown field."""
        unknown = set(kw) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise PartexError(f"unknown hardware field(s) {sorted(unknown)}; valid: "
                              f"{', '.join(f.name for f in dataclasses.fields(self))}")
        hw = dataclasses.replace(self, **kw)
        hw.validate()
        return hw

    def validate(self) -> None:
        """Check every figure (positive and finite; a latency and the host's memory >= 0; a
    margin in [0, 1)).
        Returns None; PartexError naming the first figure that is wrong."""
        for f in ("peak_flops", "hbm_bytes", "hbm_bandwidth", "link_bandwidth", "host_bandwidth"):
            _positive(f"hardware {self.name}: {f}", getattr(self, f))
        if not (isinstance(self.host_memory_bytes, (int, float)) and math.isfinite(self.host_memory_bytes)
                and self.host_memory_bytes >= 0):
            raise PartexError(f"hardware {self.name}: host_memory_bytes must be a finite number >= 0 (0: keep "
                              f"nothing in host memory), got {self.host_memory_bytes!r}")
        if not (math.isfinite(self.link_latency) and self.link_latency >= 0):
            raise PartexError(f"hardware {self.name}: link_latency must be a finite number >= 0, "
                              f"got {self.link_latency}")
        if self.memory_budget is not None:
            _positive("memory budget", self.memory_budget)
        if not (isinstance(self.memory_margin, (int, float)) and 0 <= self.memory_margin < 1):
            raise PartexError(f"memory margin must be a fraction in [0, 1), e.g. 0.1, got {self.memory_margin!r}")
        if not isinstance(self.overlap, bool):
            raise PartexError(f"hardware {self.name}: overlap must be true or false, got {self.overlap!r}")
        if self.profile is not None and not isinstance(self.profile, Profile):
            raise PartexError(f"hardware {self.name}: profile must be a partex Profile (Hardware.load(path) reads one)")
        if self.profile is not None and not isinstance(self.profile, Profile):
            raise PartexError(f"hardware {self.name}: profile must be a partex Profile (Hardware.load(path) reads one)")


def _positive(what: str, x) -> None:
    try:
        ok = math.isfinite(float(x)) and float(x) > 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise PartexError(f"{what} must be a positive finite number, got {x!r}")


# Public spec sheets. Link bandwidth: one direction of the links a ring on one mesh axis uses.
# Host bandwidth: a device's share of its host's PCIe links, one direction (TPU hosts serve 4
# chips, v6e hosts 8, over PCIe 4.0 x16 each way per chip group; A100 PCIe 4.0 x16, H100 5.0
# x16 per GPU, as achieved by DMA): an estimate, set it (``host_bandwidth``) where measured.
# Host memory: a device's share of its host's RAM, from the cloud machine types that hold
# the chips (TPU v4 ct4p 407 GB / 4 chips, v5e ct5lp 192 GB / 4, v5p ct5p 448 GB / 4, v6e
# ct6e 720 GB / 4; A100 a2-highgpu-8g 680 GB / 8, H100 a3-highgpu-8g 1872 GB / 8), less
# nothing for the host's own use: set it (``host_memory_bytes``) for your machines.
HARDWARE: dict[str, Hardware] = {
    "tpu-v4": Hardware("tpu-v4", 275e12, 32 * GiB, 1.2e12, 100e9, 5e-6, host_bandwidth=16e9,
                       host_memory_bytes=407e9 / 4),
    "tpu-v5e": Hardware("tpu-v5e", 197e12, 16 * GiB, 0.82e12, 100e9, 5e-6, host_bandwidth=16e9,
                        host_memory_bytes=192e9 / 4),
    "tpu-v5p": Hardware("tpu-v5p", 459e12, 95 * GiB, 2.765e12, 200e9, 5e-6, host_bandwidth=32e9,
                        host_memory_bytes=448e9 / 4),
    # Trillium: 918 TFLOP/s bf16, 32 GB at 1638 GB/s; ICI 800 GB/s per chip both ways over
    # 4 ports (2D torus): a ring on one axis uses its two ports, 100 GB/s each way
    "tpu-v6e": Hardware("tpu-v6e", 918e12, 32e9, 1.638e12, 200e9, 5e-6, host_bandwidth=32e9,
                        host_memory_bytes=720e9 / 4),
    "a100-40gb": Hardware("a100-40gb", 312e12, 40 * GiB, 1.555e12, 300e9, 10e-6, host_bandwidth=25e9,
                          host_memory_bytes=680e9 / 8),
    "h100-80gb": Hardware("h100-80gb", 989e12, 80 * GiB, 3.35e12, 450e9, 10e-6, host_bandwidth=50e9,
                          host_memory_bytes=1872e9 / 8),
    "cpu": Hardware("cpu", 1e11, 16 * GiB, 50e9, 10e9, 20e-6, overlap=False, host_bandwidth=50e9,
                    host_memory_bytes=64 * GiB),
}


def is_profile_path(name: str) -> bool:
    """Whether a --hardware value names a profile file rather than a preset."""
    return name not in HARDWARE and (name.endswith(".json") or os.sep in name or os.path.isfile(name))


def get_hardware(name: str, **overrides) -> Hardware:
    """The hardware ``name`` names: a preset (``HARDWARE``), or the profile file at a path
    (``*.json``), with the figures in ``overrides`` (None values ignored) replaced.
    PartexError for an unknown preset."""
    if is_profile_path(name):
        return Hardware.load(name, **{k: v for k, v in overrides.items() if v is not None})
    if name not in HARDWARE:
        raise PartexError(f"unknown hardware preset {name!r}; valid presets: {', '.join(HARDWARE)}, "
                          "or a profile file from `partex calibrate --out FILE.json`")
    hw = HARDWARE[name]
    overrides = {k: v for k, v in overrides.items() if v is not None}
    return hw.replace(**overrides) if overrides else hw


_SIZE = re.compile(r"^\s*([0-9.eE+-]+)\s*([KMGT]i?B|B)?\s*$")
_UNITS = {None: 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
          "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}


def parse_bytes(text: str | float | int) -> float:
    """The bytes ``text`` spells: '16GiB', '1.5e9', '512 MiB' (a number passes as it is).
    PartexError for text it cannot read or a size that is not positive."""
    if isinstance(text, (int, float)):
        _positive("memory size", text)
        return float(text)
    m = _SIZE.match(str(text))
    try:
        value = float(m.group(1)) * _UNITS[m.group(2)] if m else math.nan
    except ValueError:
        value = math.nan
    if math.isnan(value):
        raise PartexError(f"cannot read memory size {text!r}: write e.g. 16GiB, 512MiB or 1.5e9")
    if not (math.isfinite(value) and value > 0):  # said as written: '-1GiB', not its bytes
        raise PartexError(f"memory size {text.strip()!r} is not a positive size: write e.g. 16GiB, 512MiB or 1.5e9")
    return value


def format_bytes(n: float | None) -> str:
    """``n`` bytes for people: 3145728 -> '3.0 MiB' (binary units, as budgets are written);
    '-' for None or a non-finite number."""
    if n is None or not math.isfinite(n):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@dataclasses.dataclass(frozen=True, slots=True)
class MeshSpec:
    """Named mesh axes with sizes, and the link bandwidth/latency of each axis."""

    axes: tuple[str, ...]
    sizes: tuple[int, ...]
    bandwidth: tuple[float, ...] | None = None  # bytes/s per axis; None: the hardware's
    latency: tuple[float, ...] | None = None

    @property
    def size(self) -> int:
        """The number of devices: the product of the axes' sizes."""
        return math.prod(self.sizes)

    @property
    def shape(self) -> dict[str, int]:
        """{axis: size}, in the mesh's order."""
        return dict(zip(self.axes, self.sizes))

    def axis_size(self, axis: str) -> int:
        """The size of the mesh axis ``axis``; PartexError for an axis the mesh lacks."""
        return self.sizes[self.index(axis)]

    def index(self, axis: str) -> int:
        """The position of ``axis`` in ``axes``; PartexError naming the mesh's axes for one it lacks."""
        try:
            return self.axes.index(axis)
        except ValueError:
            raise PartexError(f"unknown mesh axis {axis!r}; this mesh has {self.text()}") from None

    def axis_bandwidth(self, axis: str, hw: Hardware) -> float:
        """Bytes/s of ``axis``'s links: the mesh's own where it gives them, else ``hw``'s."""
        return self.bandwidth[self.index(axis)] if self.bandwidth else hw.link_bandwidth

    def axis_latency(self, axis: str, hw: Hardware) -> float:
        """Seconds per collective step on ``axis``: the mesh's own where it gives them, else ``hw``'s."""
        return self.latency[self.index(axis)] if self.latency else hw.link_latency

    def text(self, links: bool = False) -> str:
        """'data=4,model=2'; ``links``: each axis's bandwidth as ``parse`` reads it
        ('data=4@6.25,model=2@90') where the mesh gives them."""
        bw = [f"@{b / 1e9:g}" for b in self.bandwidth] if links and self.bandwidth else [""] * len(self.axes)
        return ",".join(f"{a}={s}{w}" for a, s, w in zip(self.axes, self.sizes, bw))

    def to_json(self) -> dict:
        """``{"axes", "sizes"}`` as JSON data, with ``bandwidth``, ``latency`` and (for
        reading) ``slow_axes`` where the mesh gives bandwidths."""
        d = {"axes": list(self.axes), "sizes": list(self.sizes)}
        if self.bandwidth:
            d["bandwidth"] = list(self.bandwidth)
        if self.latency:
            d["latency"] = list(self.latency)
        slow = self.slow_axes()
        if slow:  # for reading: what crosses hosts (derived from the bandwidths)
            d["slow_axes"] = list(slow)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "MeshSpec":
        """The mesh in the JSON data ``d`` (``to_json``), checked as ``create`` checks it."""
        try:
            axes, sizes = d["axes"], d["sizes"]
        except (KeyError, TypeError):
            raise PartexError("plan mesh must be {\"axes\": [...], \"sizes\": [...]}") from None
        return cls.create(axes, sizes, d.get("bandwidth"), d.get("latency"))

    @classmethod
    def create(cls, axes, sizes, bandwidth=None, latency=None) -> "MeshSpec":
        """A checked mesh: ``axes`` unique names, ``sizes`` one positive integer per axis,
        and optionally ``bandwidth`` (bytes/s, positive) and ``latency`` (seconds, >= 0), one
        per axis. PartexError for anything else."""
        axes = tuple(str(a) for a in axes)
        if not axes:
            raise PartexError("a mesh needs at least one axis, e.g. data=8")
        if len(set(axes)) != len(axes):
            raise PartexError(f"mesh axis names must be unique, got {', '.join(axes)}")
        if len(sizes) != len(axes):
            raise PartexError(f"mesh has {len(axes)} axes but {len(sizes)} sizes")
        out = []
        for a, s in zip(axes, sizes):
            if isinstance(s, bool) or not isinstance(s, (int, float)) or int(s) != s or int(s) < 1:
                raise PartexError(f"mesh axis {a!r} has size {s!r}: sizes must be positive integers")
            out.append(int(s))
        for name, vals in (("bandwidth", bandwidth), ("latency", latency)):
            if vals is not None:
                if len(vals) != len(axes):
                    raise PartexError(f"mesh {name} needs one value per axis ({len(axes)})")
                for a, v in zip(axes, vals):
                    if name == "bandwidth":
                        _positive(f"bandwidth of mesh axis {a!r}", v)
                    elif not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                        raise PartexError(f"latency of mesh axis {a!r} must be finite and >= 0, got {v!r}")
        return cls(axes, tuple(out), tuple(map(float, bandwidth)) if bandwidth else None,
                   tuple(map(float, latency)) if latency else None)

    @classmethod
    def parse(cls, text: str) -> "MeshSpec":
        """The mesh ``text`` spells: 'data=4,model=2', each axis optionally with
        '@<bandwidth GB/s>' (all or none). PartexError for text it cannot read."""
        if not isinstance(text, str) or not text.strip():
            raise PartexError("empty mesh: write axes as name=size pairs, e.g. data=4,model=2")
        axes, sizes, bws = [], [], []
        for part in text.split(","):
            m = re.fullmatch(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(-?\d+)\s*(?:@\s*([0-9.eE+]+))?\s*", part)
            if not m:
                raise PartexError(f"cannot parse mesh {text!r} at {part.strip()!r}: write axes as "
                                  "name=size pairs, e.g. data=4,model=2 (optionally name=size@GB/s)")
            axes.append(m.group(1))
            sizes.append(int(m.group(2)))
            bws.append(float(m.group(3)) * 1e9 if m.group(3) else None)
        bandwidth = None
        if any(b is not None for b in bws):
            if not all(b is not None for b in bws):
                raise PartexError("give a bandwidth (@GB/s) for every mesh axis or for none")
            bandwidth = bws
        return cls.create(axes, sizes, bandwidth)

    def slow_axes(self) -> tuple[str, ...]:
        """The axes whose links are slower than the fastest axis's, by the bandwidths given
        (``data=2@25,model=4@400``: ``data``): those that cross hosts or slices (DCN,
        InfiniBand) while the others stay within one (ICI, NVLink). No bandwidths: none known."""
        if not self.bandwidth:
            return ()
        top = max(self.bandwidth)
        return tuple(a for a, b in zip(self.axes, self.bandwidth) if b < top)

    def jax_mesh(self, devices=None):
        """A jax Mesh with Auto axis types (the default Explicit axes make ordinary model code
        raise ShardingTypeError), laid out on ``devices`` (default: all of JAX's) by
        ``device_grid``: on a job of several hosts (or TPU slices) the fast axes stay within
        one. PartexError when their number is not the mesh's size."""
        import jax
        from jax.sharding import AxisType, Mesh

        devices = list(devices if devices is not None else jax.devices())
        if len(devices) != self.size:
            per = collections.Counter(d.process_index for d in devices)
            procs = sorted(per)
            where = (f"{len(devices)} over {len(procs)} processes ("
                     + ", ".join(f"process {p}: {per[p]}" for p in procs) + ")" if len(procs) > 1 else str(len(devices)))
            raise PartexError(
                f"mesh {self.text()} needs {self.size} devices but JAX has {where}; "
                + (f"set JAX_NUM_CPU_DEVICES={self.size} (CPU) or " if len(procs) == 1 else "")
                + f"choose a mesh of {len(devices)} devices"
            )
        grid = device_grid(self, devices)
        if grid is None:  # one host or slice: JAX's own layout (TPU: by physical topology)
            return jax.make_mesh(self.sizes, self.axes, axis_types=(AxisType.Auto,) * len(self.axes),
                                 devices=devices)
        return Mesh(grid, self.axes, axis_types=(AxisType.Auto,) * len(self.axes))


def granule_key(device) -> int:
    """The unit of fast links a device belongs to: its TPU slice (ICI spans the hosts of a
    slice), or else its process (one host: NVLink / a node's links)."""
    return device.slice_index if device.platform == "tpu" else device.process_index


def hybrid_shape(spec: MeshSpec, granules: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(per-granule shape, across-granule shape) of ``spec`` over ``granules`` hosts/slices:
    the slow axes take the granules first, outermost first; fast axes only where the slow
    ones cannot hold them all (then with a warning: the plan counted them as fast)."""
    import warnings

    dcn = [1] * len(spec.axes)
    rest = granules
    slow = spec.slow_axes()
    order = [i for i, a in enumerate(spec.axes) if a in slow] + [i for i, a in enumerate(spec.axes) if a not in slow]
    for i in order:
        take = math.gcd(spec.sizes[i], rest)
        dcn[i], rest = take, rest // take
    if rest > 1:
        raise PartexError(f"mesh {spec.text()} cannot be laid over {granules} hosts/slices of "
                          f"{spec.size // granules} devices: no axes' sizes multiply to {granules}")
    fast_across = [spec.axes[i] for i in range(len(dcn)) if dcn[i] > 1 and spec.axes[i] not in slow]
    if fast_across:
        if slow:
            why = f"the slow axes ({', '.join(slow)}) do not span the {granules} hosts/slices"
        else:
            why = "the mesh gives no bandwidths (write e.g. data=2@25,model=4@400)"
        warnings.warn(f"mesh {spec.text()}: axis {', '.join(fast_across)} crosses hosts/slices: {why}",
                      stacklevel=3)
    ici = tuple(s // d for s, d in zip(spec.sizes, dcn))
    return ici, tuple(dcn)


def device_grid(spec: MeshSpec, devices):
    """The devices as an array of the mesh's shape, fast axes within one host or slice
    (``mesh_utils.create_hybrid_device_mesh``), or None where all devices share one (then
    ``jax.make_mesh`` lays them out)."""
    from jax.experimental import mesh_utils

    sizes = collections.Counter(granule_key(d) for d in devices)
    if len(sizes) == 1:
        return None
    if len(set(sizes.values())) > 1:
        raise PartexError("the hosts/slices hold different numbers of devices ("
                          + ", ".join(f"{k}: {n}" for k, n in sorted(sizes.items()))
                          + "); start every process with the same number of devices")
    ici, dcn = hybrid_shape(spec, len(sizes))
    return mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, process_is_granule=devices[0].platform != "tpu",
                                                allow_split_physical_axes=True)
