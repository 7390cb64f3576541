"""verify: compile a plan with XLA on simulated CPU devices and compare with the prediction.

The compile runs in a fresh process (``jax_num_cpu_devices`` must be set before JAX starts)
from ShapeDtypeStructs, so nothing is allocated and a 40B-parameter model can be checked.
XLA's per-device memory is argument + output + temp - alias; the collectives come from the
compiled HLO, weighted by loop trip counts. With ``run`` (small configs) the plan is also
executed and its outputs compared with the unsharded function, each output leaf within a
tolerance calibrated on the step's own sensitivity to rounding (``_numerics``).

On XLA:CPU a reduce-scatter is emitted as an all-reduce of the whole partial result
followed by a local slice (checked in tests/test_hlo.py); on CPU the prediction compared is
therefore the cost model's ``lowering="cpu"`` variant, which models exactly that.
"""

from __future__ import annotations

import os
import time

from .._errors import PartexError
from .._loader import load_model
from .._mesh import format_bytes
from .._results import CollectiveCompared, Compared, VerifyReport, WorkCompared
from ..cost import KINDS  # the one list of collective kinds
from ..tracing._jax import cache_key_with_metadata
from ..tracing._program import abstract, dynamic_args
from ._explain import backend_notes, explain
from ._export import RulesFunction, flax_rules, rules_context
from ._hlo import collective_bytes_by_kind, memory_stats, parse_collectives
# the numerics' figures, re-exported: callers compare runs with them
from ._numerics import NUMERICS_FLOOR as NUMERICS_FLOOR
from ._numerics import NUMERICS_RTOL as NUMERICS_RTOL
from ._numerics import compare_outputs as compare_outputs
from ._numerics import numerics, reference_run, to_host
from ._plan import Plan
from ._planned import apply_plan
from ._promote import is_low
from ._worker import run_worker, worker_main

# XLA:CPU's scheduler: by default it schedules for thread concurrency, starting every op whose
# operands are ready (a weight's all-gather) as early as it can, and it expands optimisation
# barriers before scheduling; ``CPU_SCHEDULE_FLAG`` picks its memory-minimising scheduler
# instead. Neither is what TPU/GPU do, and neither is always closer: the memory scheduler
# places a ZeRO-3 weight's backward re-gather where it is needed (T48 zero3 + re-gather:
# 24.5 GiB instead of 31.3) but puts T32's recomputed attention at sequence 2048 at 53 GiB
# (18.3 with the default). Verify uses XLA's default, as a user's own compile does, and
# reports which scheduler gave its figure (``"xla_cpu_scheduler"``); XLA_FLAGS set by the
# user pass through to verify's worker. The flag is read when JAX starts its CPU backend (a
# per-compile ``compiler_options`` entry is accepted and ignored on jax 0.12).
CPU_SCHEDULE_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def verify(model: str, plan_path: str, *, preset: str = "tiny", overrides: list[str] | None = None,
           run: bool = False, timeout: float = 1800, constrain: bool = True, export: str | None = None,
           explain: bool = False) -> VerifyReport:
    """Verify one plan in a fresh process; returns the comparison dict (see ``_worker``)."""
    return verify_many(model, [plan_path], preset=preset, overrides=overrides, run=run, timeout=timeout,
                       constrain=constrain, export=export, explain=explain)[0]


def verify_many(model: str, plan_paths: list[str], *, preset: str = "tiny",
                overrides: list[str] | None = None, run: bool = False, timeout: float = 1800,
                constrain: bool = True, export: str | None = None, explain: bool = False) -> list[VerifyReport]:
    """Verify several plans of one model (all on meshes of one size) in one fresh process."""
    plans = [Plan.load(p) for p in plan_paths]  # fail early, with a clear message, here
    sizes = {p.mesh.size for p in plans}
    if len(sizes) != 1:
        raise PartexError("verify_many needs plans whose meshes have the same number of devices")
    env = dict(os.environ)
    env["JAX_NUM_CPU_DEVICES"] = str(sizes.pop())
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("PARTEX_JAX_CACHE", os.path.join(os.getcwd(), ".jax_cache"))
    spec = {"model": model, "plans": [os.path.abspath(p) for p in plan_paths], "preset": preset,
            "overrides": list(overrides or []), "run": run, "constrain": constrain, "export": export,
            "explain": explain}
    results = run_worker("partex.plan._verify", "verify", spec, env, timeout, "verify")
    return [VerifyReport.from_json(r) for r in results]


def verify_loaded(model, plan, *, run: bool = False, constrain: bool = True, export: str | None = None,
                  explain: bool = False) -> VerifyReport:
    """Verify a plan in this process, on the first ``plan.mesh.size`` of JAX's devices (a
    function given in Python cannot be re-built in a fresh process). ``export`` ("specs",
    "flax-rules"): also compile that export alone; ``out["comparison"]`` holds both."""
    import jax

    n = plan.mesh.size
    if jax.device_count() < n:
        raise PartexError(
            f"verify needs {n} devices for mesh {plan.mesh.text()} and this process has {jax.device_count()}: "
            f"start Python with JAX_NUM_CPU_DEVICES={n} (and JAX_PLATFORMS=cpu), or use a MODEL spec "
            "(partex.Session.from_spec) so that partex compiles in a fresh process")
    spec = {"model": model.name, "preset": model.preset, "run": run, "constrain": constrain, "export": export,
            "explain": explain}
    return _verify_with_export(model, plan, spec, n, mesh=plan.mesh.jax_mesh(jax.devices()[:n]))


def _work(compiled, cm, decisions) -> tuple[WorkCompared, WorkCompared]:
    """Per-device FLOPs and bytes accessed, predicted beside XLA's HloCostAnalysis
    (``compiled.cost_analysis()``). XLA counts a while loop's body once, whatever its trip
    count: the prediction compared counts loop bodies once too (``predicted_per_step``:
    every trip). XLA counts transcendental ops apart from its FLOPs; partex counts each
    element of an elementwise op as one FLOP: the XLA figure compared is FLOPs plus
    transcendentals."""
    ca = compiled.cost_analysis()
    ca = (ca[0] if ca else {}) if isinstance(ca, (list, tuple)) else (ca or {})
    flops, nbytes = cm.work(decisions, loops_once=True)
    step_flops, step_bytes = cm.work(decisions)
    transcendentals = float(ca.get("transcendentals", 0.0))
    xla_flops = float(ca.get("flops", 0.0)) + transcendentals
    xla_bytes = float(ca.get("bytes accessed", 0.0))
    c_flops, c_bytes = Compared.of(flops, xla_flops), Compared.of(nbytes, xla_bytes)
    return (WorkCompared(c_flops.predicted, c_flops.xla, c_flops.ratio, step_flops, transcendentals),
            WorkCompared(c_bytes.predicted, c_bytes.xla, c_bytes.ratio, step_bytes))


def _worker(spec: dict) -> list[VerifyReport]:
    import jax

    n = int(os.environ.get("JAX_NUM_CPU_DEVICES", "1"))
    jax.config.update("jax_num_cpu_devices", n)
    cache = os.environ.get("PARTEX_JAX_CACHE")
    if cache:
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)

    model = load_model(spec["model"], spec["preset"], spec["overrides"])
    return [_verify_with_export(model, Plan.load(path), spec, n) for path in spec["plans"]]


def _verify_with_export(model, plan, spec: dict, n: int, mesh=None) -> VerifyReport:
    """``_verify_one``, and with ``spec["export"]`` the export's figures beside the plan's."""
    out = _verify_one(model, plan, spec, n, mesh)
    if spec.get("export"):
        out = out.replace(comparison=_side_by_side(out, _export_figures(model, plan, spec, n, mesh), spec["export"]))
    return out


def host_resident_bytes(compiled) -> int:
    """Per device, the bytes of a compiled step's arguments and results in pinned host
    memory (their shardings' memory kind), a donated argument and the result that takes its
    buffer once."""
    import math

    import jax

    def share(sharding, aval) -> int:  # an ArgInfo or a ShapeDtypeStruct: shape and dtype
        if getattr(sharding, "memory_kind", None) != "pinned_host":
            return 0
        return math.prod(sharding.shard_shape(aval.shape)) * aval.dtype.itemsize

    ins = jax.tree_util.tree_leaves(compiled.input_shardings[0])
    infos = jax.tree_util.tree_leaves(compiled.args_info)
    donated = sum(share(s, i) for s, i in zip(ins, infos) if i.donated)
    args = sum(share(s, i) for s, i in zip(ins, infos))
    outs = sum(share(s, o) for s, o in zip(jax.tree_util.tree_leaves(compiled.output_shardings),
                                          jax.tree_util.tree_leaves(compiled.out_info)))
    return args + outs - min(donated, outs)


def _compile(lowered):
    """XLA's compile; an op this backend cannot compile (XLA:CPU has no ragged all-to-all) is
    the platform's limit, not the plan's: one clear line."""
    import jax

    try:
        return lowered.compile()
    except jax.errors.JaxRuntimeError as e:
        first = str(e).strip().splitlines()[0]
        if not first.startswith("UNIMPLEMENTED"):
            raise
        raise PartexError(f"XLA on {jax.devices()[0].platform} cannot compile this step ({first}): verify it on "
                          "a backend that can (scripts/accelerator_check.py runs plans on a GPU or TPU)") from e


def _device_part(mem: dict, compiled, bound, decisions, on_cpu) -> tuple[float | None, tuple[str, ...]]:
    """On XLA:CPU, which ignores memory spaces and lowers some ops unlike TPU and GPU, the
    device's share of XLA's figure on the plan's own hardware (set as ``mem["device"]``):
    XLA's total less the arguments and results the plan keeps in pinned host memory
    (``mem["host_resident"]``: their shardings say so, exact), less the intermediates the
    step or the plan offloads to host memory, which XLA:CPU keeps on the device
    (``mem["offloaded"]``, at their predicted peak), and less what only XLA:CPU holds by the
    prediction (``mem["cpu_only"]``: interpreted Pallas kernels' loop state, ``ragged_dot``
    rolled out densely, threefry's rolled rounds, reduce-scatters as all-reduces: the CPU
    prediction ``on_cpu`` less the hardware's, where above it). So the device part is the
    hardware's prediction plus what XLA:CPU needs beyond its own prediction: the model's
    error, measured. Returns the host memory per device the plan predicts, which nothing here
    can check (None where it keeps nothing there), and a note when ``cpu_only`` counts."""
    own = bound.cost_model.evaluate(decisions).memory  # priced as the plan's hardware lowers it
    mem["host_resident"] = host_resident_bytes(compiled)
    mem["offloaded"] = own.host_offloaded
    mem["cpu_only"] = max(0.0, on_cpu.peak - own.peak - mem["host_resident"] - mem["offloaded"])
    mem["device"] = mem["total"] - mem["host_resident"] - mem["offloaded"] - mem["cpu_only"]
    notes = ()
    if mem["cpu_only"] > 0.01 * mem["total"]:
        notes = (f"XLA:CPU holds about {format_bytes(mem['cpu_only'])} per device that "
                 f"{bound.plan.hardware.name} does not, by the prediction (ops XLA:CPU lowers its own way); the "
                 f"device part judged is {format_bytes(mem['device'])}: the {bound.plan.hardware.name} prediction "
                 f"{format_bytes(own.peak)} plus XLA:CPU's {format_bytes(mem['total'] - on_cpu.peak)} beyond its "
                 "own prediction",)
    return (own.host if own.host > 0 or mem["host_resident"] else None), notes


def _verify_one(model, plan, spec: dict, n: int, mesh=None) -> VerifyReport:
    import jax

    t0 = time.perf_counter()
    planned = apply_plan(plan, model.fn, mesh=mesh, axis_names=model.axis_names,
                         constrain=spec.get("constrain", True))
    mesh = planned.mesh

    lowered = planned.lower(*jax.tree_util.tree_map(abstract, model.args))
    t1 = time.perf_counter()
    cpu = jax.devices()[0].platform == "cpu"
    if spec.get("explain"):
        # source lines come from the HLO's metadata, which the persistent compilation cache
        # leaves out of its key: a cached executable would carry the lines of whatever
        # version of the code compiled it first
        with cache_key_with_metadata():
            compiled = _compile(lowered)
    else:
        compiled = _compile(lowered)
    t2 = time.perf_counter()
    mem: dict[str, float] = dict(memory_stats(compiled))
    text = compiled.as_text()
    assert text is not None  # XLA's executables carry their HLO text
    colls = parse_collectives(text, mesh)
    xla_bytes = collective_bytes_by_kind(colls)

    bound = planned.bound  # the program apply traced and analysed, the plan's decisions on it
    assert bound is not None  # lower() built it
    program, decisions = bound.program, list(bound.decisions)
    # predicted as XLA lowers it here (XLA:CPU: reduce-scatter = all-reduce + slice)
    cm = bound.priced("cpu" if cpu else "tpu")
    report = cm.evaluate(decisions, detail=True)
    # on TPU and GPU XLA reports host memory apart already, and lowers as the prediction does
    mem.update(host_resident=0, offloaded=0.0, cpu_only=0.0, device=mem["total"])
    host_unchecked, memory_notes = _device_part(mem, compiled, bound, decisions, report.memory) if cpu else (None, ())
    explained = None
    if spec.get("explain"):  # XLA's collectives by source line, matched to the predicted ones

        explained = explain(text, cm, report, plan, program.arg_names)
    pred_bytes: dict[str, float] = dict.fromkeys(KINDS, 0.0)
    for k, v in report.collective_bytes.items():
        if k in pred_bytes:  # (host transfers are copies, not collectives: none of XLA's kinds)
            pred_bytes[k] += v
    m = report.memory
    flops, bytes_accessed = _work(compiled, cm, decisions)
    return VerifyReport(
        model=spec["model"], preset=spec["preset"], mesh=plan.mesh.text(), strategy=plan.strategy, devices=n,
        memory=Compared.of(m.peak, mem["total"]), arguments=Compared.of(m.arguments, mem["argument"]),
        xla_memory=mem,
        predicted_memory={"arguments": m.arguments, "outputs": m.outputs, "temporaries": m.temporaries,
                          "alias": m.alias, **{f"at_peak_{k}": v for k, v in m.breakdown.items()}},
        collectives={k: CollectiveCompared.of(pred_bytes.get(k, 0.0), xla_bytes.get(k, 0)) for k in KINDS},
        constraints={"values": planned.num_constraints[0], "operands": planned.num_constraints[1]},
        constrained=planned.constrain, fits=mem["device"] <= plan.hardware.budget, budget=plan.hardware.budget,
        host_unchecked=host_unchecked,
        lower_seconds=round(t1 - t0, 2), compile_seconds=round(t2 - t1, 2),
        flops=flops, bytes_accessed=bytes_accessed, explain=explained,
        # on CPU, which XLA:CPU scheduler gave the memory figure (see CPU_SCHEDULE_FLAG)
        xla_cpu_scheduler=(("memory" if CPU_SCHEDULE_FLAG in os.environ.get("XLA_FLAGS", "") else "concurrency")
                           if cpu else None),
        numerics=numerics(model, planned) if spec["run"] else None, notes=backend_notes(program) + memory_notes)


def _xla_figures(lowered, mesh) -> dict:
    """XLA's per-device memory and collective bytes by kind of a lowered function."""
    compiled = lowered.compile()
    mem = memory_stats(compiled)
    colls = collective_bytes_by_kind(parse_collectives(compiled.as_text(), mesh))
    return {"memory": mem["total"], "xla_memory": mem, "collectives": {k: colls.get(k, 0) for k in KINDS}}


def _export_figures(model, plan, spec: dict, n: int, mesh=None) -> dict:
    """XLA's figures of an export alone: ``specs`` (input and output shardings, XLA's
    propagation for the rest) or ``flax-rules`` (the rules' input shardings, the model's
    own logical constraints under the rules); with ``run``, its numerics."""
    import jax

    fmt = spec["export"]
    if fmt == "specs":
        planned = apply_plan(plan, model.fn, mesh=mesh, axis_names=model.axis_names, constrain=False)
        out = _xla_figures(planned.lower(*jax.tree_util.tree_map(abstract, model.args)), planned.mesh)
        if spec["run"]:
            out["numerics"] = numerics(model, planned).to_json()
        return out
    if fmt != "flax-rules":
        raise PartexError(f"unknown export format {fmt!r}; valid: specs, flax-rules")

    rules = flax_rules(plan, model)
    mesh = mesh if mesh is not None else plan.jax_mesh(jax.devices()[:n])
    rf = RulesFunction(model.fn, model.args, model.axis_names, rules.rules, mesh, donate=plan.donate)
    out = _xla_figures(rf.lower(*model.args), mesh)
    out["rules"] = rules.to_json()
    if spec["run"]:
        if any(is_low(v.dtype) for v in rf.program.values):
            out["numerics_skipped"] = "the step computes in 16-bit floats: rules alone run it as written"
        else:
            host = jax.tree_util.tree_map(to_host, dynamic_args(model.args))
            calibration = reference_run(list(rf.program.output_paths), jax.jit(rf.split), host)
            with rules_context(rules.rules, mesh):
                got = rf.jitted(*host)
            out["numerics"] = calibration.compare(jax.tree_util.tree_leaves(got))
    return out


def _side_by_side(full: VerifyReport, alone: dict, fmt: str) -> dict:
    import jax

    plan = {"memory": full.memory.xla, "collectives": {k: c.xla_bytes for k, c in full.collectives.items()},
            "fits": full.fits}
    alone["fits"] = alone["memory"] <= full.budget
    if full.numerics is not None:
        plan["numerics"] = full.numerics.to_json()
    return {"format": fmt, "budget": full.budget,
            "devices": full.devices, "platform": jax.devices()[0].platform, "plan": plan, "export": alone}


def main() -> None:
    worker_main("verify", lambda spec: [r.to_json() for r in _worker(spec)])


if __name__ == "__main__":
    main()
