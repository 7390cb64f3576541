"""verify's numerics: a plan's sharded run against the unsharded step, each output leaf held
to a tolerance calibrated on the step's own sensitivity to rounding.

A sharded run sums in another order than the unsharded one (partial sums and an all-reduce,
other tilings), so its outputs differ by rounding. Most steps keep that at a few ulps, and a
fixed tolerance (``NUMERICS_RTOL`` of a leaf's scale) tells a correct plan from a wrong one.
Some steps amplify rounding, and there a fixed tolerance cries wolf on correct plans:

- a quantiser (int8 or float8, one scale per tensor) rounds a value that moved by an ulp to
  the next level wherever it sat near a boundary, and the step carries that whole quantum on;
- Adam divides a gradient by its own RMS: a parameter whose gradient is zero in exact
  arithmetic (an attention key bias: softmax ignores a shift along the keys) gets rounding
  noise as gradient, and a whole ``lr``-sized step in a direction the noise picks.

(A step in bfloat16/float16 is compared computed in float32, and off CPU at full float32
matmul precision: see ``calibrate``.)

So each leaf's tolerance is calibrated on the unsharded step itself: it runs again
``NUMERICS_NOISE_RUNS`` times with its float inputs moved by up to ``NUMERICS_NOISE_ULPS``
ulps (seeded, at random per element: ``perturbed``), and a leaf's *noise* is the largest RMS
distance of those runs from the unperturbed one. A plan's leaf is flagged only when its
distance from the unsharded run exceeds ``NUMERICS_NOISE_FACTOR`` times that noise, and never
within ``NUMERICS_RTOL`` of its scale: the fixed tolerance stays the floor, so a
well-conditioned leaf is held exactly as tightly as before (its noise, ~1e-7 of its scale,
times the factor is below it). A misplaced shard or a missing collective moves a leaf by its
own size, far beyond either; a leaf that is rounding noise through and through (a key bias
after Adam) gets a tolerance of its own size, as it must: nothing can be checked there, and
every other leaf still is.

Why a few ulps and not one: a quantiser's flips are rare events, and at one ulp the unsharded
int8 fixture (tests/numerics_models/quant.py) flipped nothing in 3 of 4 runs, while the
sharded plan, whose intermediates differ by several ulps (a reordered sum of n terms: ~sqrt(n)),
flipped; in 7 of 8 seeds the three runs saw no flip and the plan was flagged. At up to 4 ulps
every run flips and the correct plan sits at <= 0.21 of its tolerance over 8 seeds (1 ulp:
1.12). Adam's noise saturates at ``lr`` whatever the size of the rounding (a correct plan's
distance is 0.8-1.6x the noise there), and a smooth leaf's noise grows 4x but stays under the
fixed tolerance. Measured on every fixture x dp/megatron/zero3 x 5 seeds: correct plans at
<= 0.20 of their tolerance; a misplaced shard or a missing all-reduce at 900x to 3x10^4 of it
(tests/numerics_models/table.py).

Why perturbed inputs rather than a float64 reference: the check must run the step as written,
and a float64 run is another step. Under ``jax_enable_x64`` ``jax.random.normal`` and
``bernoulli`` draw other numbers from the same key (other dropout masks), default dtypes
widen, and what the step casts to float32 itself (flax's ``dtype=``, Keras's autocast, a
quantiser's scale) stays float32; accelerators have no fast float64. One float32 run's
distance from a float64 one is also a single sample of the noise. Perturbed inputs need no
rewrite of the step, leave integers, quantised values and PRNG keys exactly as they are
(quantisers still quantise, dropout draws the same mask), run on any backend at the precision
verify compares at, and sample the noise as often as asked. A sharded run's rounding enters at
intermediates, the perturbation at the inputs; every intermediate depends on the inputs, and
moves by its condition number times what they moved, as it does when reordered.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import numpy as np

from .._errors import PartexError
from .._results import Numerics
from ..tracing._program import StaticSplit
from ._apply import constrained_function
from ._plan_constraints import USER_SHARDING
from ._promote import is_low

NUMERICS_RTOL = 1e-4  # the least tolerance, of an output leaf's scale (see compare_outputs)
NUMERICS_FLOOR = 1e-3  # a leaf's scale is at least this times the largest leaf of its output, in RMS
NUMERICS_NOISE_RUNS = 3  # runs of the unsharded step with its inputs moved by a few ulps
NUMERICS_NOISE_ULPS = 4  # how far they move, at most (module docstring)
NUMERICS_NOISE_FACTOR = 8.0  # a leaf is flagged beyond this times its noise (module docstring)
NUMERICS_SEED = 0  # the perturbations' RNG: the same seed, the same tolerances

# what perturbed moves: the precisions verify computes in (16-bit floats are compared
# computed in float32, and a float8 input is a quantised value, not a measurement)
_PERTURBED = frozenset({np.dtype(np.float32), np.dtype(np.float64)})


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x)))) if x.size else 0.0


def _whole(x: np.ndarray) -> bool:
    with np.errstate(invalid="ignore"):
        return bool(np.all(np.mod(x, 1) == 0))


def perturbed(leaves: Sequence[Any], seed: int, ulps: int = NUMERICS_NOISE_ULPS, widen: bool = False) -> list:
    """``leaves`` with every element of every float32/float64 array moved by a random whole
    number of ulps in [-ulps, ulps] (``seed``), at the precision JAX computes it in (a
    float64 leaf without x64: float32's). With ``widen`` the 16-bit float arrays become
    float32 first (for a step computed in float32). Left as they are: integers, float8,
    PRNG keys, and float arrays of whole numbers (masks, counts, one-hot labels, a zero
    initialisation: data that no rounding produced, which a step may compare or cast to an
    index)."""
    rng = np.random.default_rng(seed)
    out = []
    for x in leaves:
        dtype = getattr(x, "dtype", None)
        if isinstance(x, np.ndarray) and widen and is_low(dtype):
            x = x.astype(np.float32)
        if isinstance(x, np.ndarray) and x.dtype in _PERTURBED and not _whole(x):
            y = x.astype(jax.dtypes.canonicalize_dtype(x.dtype))
            with np.errstate(invalid="ignore"):  # an inf or NaN input stays as it is
                step = np.where(np.isfinite(y), rng.integers(-ulps, ulps + 1, y.shape) * np.spacing(y), 0)
            x = np.asarray(y + step.astype(y.dtype))
        out.append(x)
    return out


def step_noise(run: Callable[..., Any], args: Sequence[Any], ref: Sequence[Any], *,
               runs: int = NUMERICS_NOISE_RUNS, seed: int = NUMERICS_SEED, widen: bool = False,
               numbers: Callable[[Any], Any] = np.asarray) -> list[float]:
    """Per output leaf of ``run(*args)`` (whose leaves are ``ref``), the largest RMS distance
    from ``ref`` of ``runs`` runs on ``perturbed`` arguments: the step's own noise.
    ``numbers`` turns an output leaf into an array (a PRNG key: its key data)."""
    leaves, tree = jax.tree_util.tree_flatten(tuple(args))
    ref = [np.asarray(x, dtype=np.float64) for x in ref]
    noise = [0.0] * len(ref)
    for k in range(runs):
        moved = jax.tree_util.tree_unflatten(tree, perturbed(leaves, seed + k, widen=widen))
        got = [np.asarray(numbers(x), dtype=np.float64) for x in jax.tree_util.tree_leaves(run(*moved))]
        if len(got) != len(ref):
            raise AssertionError(f"the perturbed step returned {len(got)} leaves, the step {len(ref)}")
        noise = [max(n, _rms(a - b)) for n, a, b in zip(noise, got, ref)]
    return noise


def compare_outputs(paths: list[str], ref: list, got: list, rtol: float = NUMERICS_RTOL,
                    floor: float = NUMERICS_FLOOR, noise: Sequence[float] | None = None,
                    factor: float = NUMERICS_NOISE_FACTOR) -> dict:
    """Compare a sharded run's output leaves with the unsharded run's.

    Each leaf's error is the RMS of the difference over its *scale*: the larger of its own
    RMS and ``floor`` times the RMS of the largest leaf of the same output (the same element
    of the output tuple: the new parameters, the optimizer state, the loss). A leaf whose
    true value is zero (Adam's moments of a key bias, ~1e-19) is judged against its output's
    scale, not against itself.

    Its tolerance is ``rtol`` of its scale, or with ``noise`` (the step's own RMS noise per
    leaf, ``step_noise``) ``factor`` times that noise when larger: a plan is flagged only
    where it moves a leaf clearly beyond what rounding moves it in the unsharded step.

    The result names the leaf nearest to (or furthest beyond) its tolerance:
    ``worst_output``, its error ``max_rel_err``, its ``tolerance`` and ``noise`` (over its
    scale; None uncalibrated), so that ``ok`` is ``max_rel_err <= tolerance``; also
    ``largest_rel_err`` / ``largest_output`` (the largest error of any leaf, which may sit
    where the noise allows it) and ``loss_rel_err`` (the scalar float outputs')."""
    if noise is not None and len(noise) != len(ref):
        raise AssertionError(f"{len(noise)} noise figures for {len(ref)} output leaves")
    floats = [np.issubdtype(np.asarray(x).dtype, np.floating) for x in ref]
    ref = [np.asarray(x, dtype=np.float64) for x in ref]
    got = [np.asarray(x, dtype=np.float64) for x in got]
    top = [p.split("/")[1] if p.count("/") >= 1 else p for p in paths]
    # an output's scale is that of its float leaves: a key's bits or a step count beside the
    # parameters (RMS ~1e9 for key data) would otherwise hide every error there
    biggest: dict[str, float] = {}
    for t, b, f in zip(top, ref, floats):
        biggest[t] = max(biggest.get(t, 0.0), _rms(b) if f else 0.0)
    worst = {"margin": 0.0, "err": 0.0, "path": None, "tol": rtol, "noise": None}
    largest, largest_path, loss_err = 0.0, None, None
    for i, (path, t, a, b) in enumerate(zip(paths, top, got, ref)):
        scale = max(_rms(b), floor * biggest[t])
        diff = _rms(a - b)
        err = diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)
        rel_noise = None
        tol = rtol
        if noise is not None and math.isfinite(noise[i]):  # a perturbed run's NaN calibrates nothing
            rel_noise = noise[i] / scale if scale > 0 else (0.0 if noise[i] == 0 else math.inf)
            tol = max(rtol, factor * rel_noise)
        if a.ndim == 0 and np.issubdtype(b.dtype, np.floating):
            loss_err = err if loss_err is None else max(loss_err, err)
        if err > largest or (math.isnan(err) and not math.isnan(largest)):
            largest, largest_path = err, path
        margin = err / tol if not math.isnan(err) else math.inf
        if margin > worst["margin"]:
            worst = {"margin": margin, "err": err, "path": path, "tol": tol, "noise": rel_noise}
    return {"max_rel_err": worst["err"], "worst_output": worst["path"], "loss_rel_err": loss_err,
            "ok": bool(worst["err"] <= worst["tol"]), "tolerance": worst["tol"], "floor": floor,
            "noise": worst["noise"], "noise_factor": factor if noise is not None else None,
            "largest_rel_err": largest, "largest_output": largest_path}


def _is_key(x) -> bool:  # typed PRNG keys (jax.random.key) have no numpy form
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.numpy.issubdtype(dtype, jax.dtypes.prng_key)


def to_host(x):
    return x if _is_key(x) else np.asarray(x)


def _to_numbers(x):
    return np.asarray(jax.random.key_data(x) if _is_key(x) else x)


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The unsharded step's outputs (``ref``, by output ``paths``) and each leaf's noise
    (``step_noise``; None: not calibrated), what a sharded run is compared with."""

    paths: list[str]
    ref: list[np.ndarray]
    noise: list[float] | None
    runs: int
    computed_in: str | None = None

    def compare(self, got: Sequence[Any]) -> dict:
        """``compare_outputs`` of the output leaves ``got`` with these."""
        out = compare_outputs(self.paths, self.ref, [_to_numbers(x) for x in got], noise=self.noise)
        out["noise_runs"] = self.runs
        if self.computed_in is not None:
            out["computed_in"] = self.computed_in
        return out


def calibrate(model, planned, *, runs: int = NUMERICS_NOISE_RUNS,
              seed: int = NUMERICS_SEED) -> tuple[Calibration, Callable[[], list]]:
    """The unsharded step on ``model.args`` (``runs`` perturbed runs calibrate each leaf's
    tolerance; 0: the fixed tolerance alone), and a function that runs ``planned`` on them
    and returns its output leaves, computed as the reference is."""
    leaves = jax.tree_util.tree_leaves(model.args)
    if any(isinstance(x, jax.ShapeDtypeStruct) for x in leaves):
        raise PartexError("--run needs real example arrays: use a small preset (e.g. --preset tiny)")

    # the array leaves only, in and out: static leaves (a name, an enum) are closed over
    split = StaticSplit(model.fn, model.args)
    host = jax.tree_util.tree_map(to_host, split.args)
    planned.build(model.args)
    program = planned.program
    # A step computing in bfloat16/float16 is compared in float32: the same ops at the same
    # shardings, without the 16-bit rounding whose noise (signs of ~0 gradients flipped, Adam
    # turning them into whole updates) would be as large as a misplaced shard's error.
    low = sorted({str(v.dtype) for v in program.values if is_low(v.dtype)})
    # Off CPU the comparison is at full float32 precision too: GPUs take TF32 (a 10-bit
    # mantissa) for float32 matmuls by default, and a recomputed forward fused otherwise than
    # the reference's differs by that rounding, which Adam turns into whole steps (an H200:
    # 0.013 of a leaf's scale with recompute at the default precision, 2e-6 at full). The
    # check is of where the shards are, not of the backend's precision.
    accelerator = planned.mesh.devices.flat[0].platform != "cpu"
    computed_in = None
    if low or accelerator:
        dropped = {op.id: None for op in program.ops if op.primitive in USER_SHARDING}  # the unsharded reference
        reference = jax.jit(constrained_function(program, planned.mesh, {}, {}, dropped, promote=True))
        jitted = planned.float32(model.args)
        computed_in = (f"float32 (the step's {', '.join(low)} promoted)" if low
                       else "float32 at full matmul precision (not the backend's default TF32)")
    else:  # the step as the user runs it (an explicit-mode step: on its arguments' own shardings)
        reference, jitted = split.placed(jax.jit(split)), planned.build(model.args)
    with split.run_context():
        calibration = reference_run(list(program.output_paths), reference, host, runs=runs, seed=seed,
                                    widen=bool(low), computed_in=computed_in)

    def run_planned() -> list:  # a donated key: a copy, not the caller's; host arrays, which jit places as the plan has them
        return jax.tree_util.tree_leaves(jitted(*jax.tree_util.tree_map(
            lambda x: x.copy() if _is_key(x) else x, host)))

    return calibration, run_planned


def reference_run(paths: list[str], reference: Callable[..., Any], host: Sequence[Any], *,
                  runs: int = NUMERICS_NOISE_RUNS, seed: int = NUMERICS_SEED, widen: bool = False,
                  computed_in: str | None = None) -> Calibration:
    """The unsharded ``reference`` run on the host arrays ``host`` (its output leaves are
    ``paths``) and, over ``runs`` perturbed runs, each leaf's noise."""
    ref = [_to_numbers(x) for x in jax.tree_util.tree_leaves(reference(*host))]
    noise = step_noise(reference, host, ref, runs=runs, seed=seed, widen=widen, numbers=_to_numbers) if runs else None
    return Calibration(paths, ref, noise, runs, computed_in)


def run_numerics(model, planned, *, runs: int = NUMERICS_NOISE_RUNS, seed: int = NUMERICS_SEED) -> dict:
    """Run ``planned`` and the unsharded step on ``model.args`` and compare them, each leaf
    calibrated (``calibrate``): ``compare_outputs``'s dict, with ``noise_runs`` and, where
    the comparison ran in float32, ``computed_in``."""
    calibration, run_planned = calibrate(model, planned, runs=runs, seed=seed)
    return calibration.compare(run_planned())


def numerics(model, planned) -> Numerics:
    """``run_numerics`` as verify reports it."""
    return Numerics.from_json(run_numerics(model, planned))
