"""A plan on a cluster: two JAX processes of 4 CPU devices each form one 8-device job
(gloo collectives, the coordinator on a free loopback port) and train the tiny transformer
under a searched plan; the mesh keeps its fast axes within one host."""

import dataclasses
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import warnings

import jax
import numpy as np
import pytest

import demo_models
import partex
from partex._mesh import device_grid
from partex.plan._verify import NUMERICS_RTOL

WORKER = pathlib.Path(__file__).with_name("_two_process.py")
MESH = "data=2@25,model=4@400"  # data crosses the two hosts (25 GB/s), model within one (400)
STEPS = 3
JOB_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(tmp_path, plans: list[str], steps: int = STEPS, timeout: float = JOB_TIMEOUT_S,
            devices: tuple[int, ...] = (4, 4), model: tuple[str, dict] = ("transformer", {})) -> list[dict]:
    """Start one worker per plan file (process i applies plans[i] on devices[i] CPU
    devices); wait for both, bounded: when one fails the other gets 60 s to finish, then
    both are killed. Output goes to files (a full pipe would block a worker)."""
    port = free_port()
    procs, logs = [], []
    for i, plan in enumerate(plans):
        env = {**os.environ, "JAX_NUM_CPU_DEVICES": str(devices[i]), "JAX_PLATFORMS": "cpu"}
        log = open(tmp_path / f"process{i}.log", "w+")
        spec = {"process_id": i, "port": port, "plan": plan, "steps": steps, "model": model}
        procs.append(subprocess.Popen([sys.executable, str(WORKER), json.dumps(spec)], stdout=log,
                                      stderr=subprocess.STDOUT, env=env, text=True))
        logs.append(log)
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):  # one failed: the other may wait on it
                deadline = min(deadline, time.monotonic() + 60)
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    out = []
    for p, log in zip(procs, logs):
        log.seek(0)
        text = log.read()
        log.close()
        lines = [ln for ln in text.splitlines() if ln.startswith('{"partex-two-process"')]
        assert lines, f"a worker exited with {p.returncode} and no result (timeout {timeout} s?):\n{text[-4000:]}"
        result = json.loads(lines[-1])["partex-two-process"]
        assert "crash" not in result, result["crash"]
        out.append({**result, "returncode": p.returncode})
    return out


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """A searched plan of the tiny transformer on MESH under a budget that forces data and
    model sharding (and recompute), and the data-parallel hand plan, as plan files."""
    d = tmp_path_factory.mktemp("plans")
    s = partex.Session.from_spec("transformer", mesh=MESH, memory="1MiB", seed=0)
    s.step(300)
    searched = s.best_plan()
    assert searched is not None
    axes = {d.axis for d in searched.decisions}
    assert {"data", "model"} <= axes, axes  # a plan that uses both axes, or the test shows little
    searched.save(d / "searched.json")
    s.plan(strategy="dp").save(d / "dp.json")
    return {"searched": str(d / "searched.json"), "dp": str(d / "dp.json")}


def losses_here(plan: partex.Plan | None, steps: int = STEPS, model: tuple[str, dict] = ("transformer", {})
                ) -> list[float]:
    """The same training steps in this process: under the plan on its 8 devices, or
    unsharded (plan None) on one."""
    model = demo_models.build(model[0], "tiny", model[1])
    step = partex.apply_plan(plan, model.fn) if plan else jax.jit(model.fn)
    params, opt_state, batch = partex.shard_inputs(plan, model.args) if plan else model.args
    out = []
    for _ in range(steps):
        params, opt_state, loss = step(params, opt_state, batch)
        out.append(float(loss))
    return out


def test_two_processes_train_as_one_job_with_the_losses_of_one_process(tmp_path, plans):
    t0 = time.perf_counter()
    job = run_job(tmp_path, [plans["searched"]] * 2)
    wall = time.perf_counter() - t0
    plan = partex.Plan.load(plans["searched"])
    one_process = losses_here(plan)
    unsharded = losses_here(None)
    for r in job:
        assert r["returncode"] == 0, r
        ok = r["ok"]
        assert (ok["processes"], ok["devices"], ok["local_devices"]) == (2, 8, 4)
        # the fast axis (model) lies within one host: each data row is one process's devices
        assert ok["axes"] == ["data", "model"]
        assert [set(row) for row in ok["layout"]] == [{0}, {1}], ok["layout"]
        # a value of one process only is refused with the two ways to make a global array
        assert "shard_inputs" in ok["host_value_error"] and "make_array_from_process_local_data" in \
            ok["host_value_error"]
        assert ok["local_batch_equal"]  # make_array_from_process_local_data: the same global batch
        for got, one, ref in zip(ok["losses"], one_process, unsharded):
            assert abs(got - one) <= NUMERICS_RTOL * abs(one), (ok["losses"], one_process)
            assert abs(got - ref) <= NUMERICS_RTOL * abs(ref), (ok["losses"], unsharded)
    assert job[0]["ok"]["losses"] == job[1]["ok"]["losses"]
    assert len(set(job[0]["ok"]["losses"])) == STEPS  # training moves the loss
    print(f"two-process job: {wall:.1f} s for {STEPS} steps (start, trace, compile, run)")


def test_a_pipeline_whose_stages_cross_the_processes_trains_as_one_job(tmp_path):
    """transformer-scan's stack in two stages, the stage axis across the two processes (the
    slow link): the activations cross it by collective permute each tick; three steps give
    the losses of the same plan in one process and of the unsharded step."""
    model = ("transformer-scan", {"layers": 4})
    s = partex.Session.from_spec(model[0], preset="tiny", overrides=["layers=4"], mesh="stage=2@25,data=2@400,model=2@400",
                                 pipeline="stack0:stage:4")
    plan = s.plan(strategy="megatron")
    assert plan.pipeline is not None
    plan.save(tmp_path / "pipelined.json")
    job = run_job(tmp_path, [str(tmp_path / "pipelined.json")] * 2, model=model)
    one_process = losses_here(plan, model=model)
    unsharded = losses_here(None, model=model)
    for r in job:
        assert r["returncode"] == 0, r
        ok = r["ok"]
        assert ok["axes"] == ["stage", "data", "model"]
        assert [set(row) for row in ok["layout"]] == [{0}, {1}], ok["layout"]  # one stage per process
        assert ok["local_batch_equal"]
        for got, one, ref in zip(ok["losses"], one_process, unsharded):
            assert abs(got - one) <= NUMERICS_RTOL * abs(one), (ok["losses"], one_process)
            assert abs(got - ref) <= NUMERICS_RTOL * abs(ref), (ok["losses"], unsharded)
    assert job[0]["ok"]["losses"] == job[1]["ok"]["losses"] and len(set(job[0]["ok"]["losses"])) == STEPS


def test_processes_that_apply_different_plans_stop_with_one_clear_error(tmp_path, plans):
    job = run_job(tmp_path, [plans["searched"], plans["dp"]], steps=1)
    for r in job:
        assert r["returncode"] == 2, r
        assert "applies another plan" in r["error"] and "same plan file" in r["error"], r["error"]


def test_processes_with_different_device_counts_stop_with_one_clear_error(tmp_path, plans):
    job = run_job(tmp_path, [plans["searched"]] * 2, steps=1, devices=(4, 2))
    for r in job:
        assert r["returncode"] == 2, r
        assert "needs 8 devices but JAX has 6 over 2 processes (process 0: 4, process 1: 2)" in r["error"], r["error"]


# --------------------------------------------------------------------------- topology

@dataclasses.dataclass(frozen=True)
class FakeDevice:
    """What the layout reads of a device: its id, host (process) and TPU slice."""
    id: int
    process_index: int
    platform: str = "cpu"
    device_kind: str = "cpu"
    slice_index: int = 0
    coords: tuple = (0, 0, 0)  # a TPU chip's place in its slice's torus
    core_on_chip: int = 0


def hosts_of(grid) -> np.ndarray:
    return np.vectorize(lambda d: d.process_index)(grid)


@pytest.mark.parametrize("order", ["by host", "interleaved", "reversed"])
def test_fast_axes_stay_within_a_host_whatever_the_device_order(order):
    """Two simulated hosts of 4 devices, listed in any order: with data=2@25,model=4@400
    every model group is one host's; with the axes the other way round likewise."""
    host = {"by host": lambda i: i // 4, "interleaved": lambda i: i % 2, "reversed": lambda i: 1 - i // 4}[order]
    devices = [FakeDevice(i, host(i)) for i in range(8)]
    grid = hosts_of(device_grid(partex.MeshSpec.parse(MESH), devices))
    assert grid.shape == (2, 4)
    assert all(len(set(row)) == 1 for row in grid) and set(grid[:, 0]) == {0, 1}  # model within, data across
    grid = hosts_of(device_grid(partex.MeshSpec.parse("model=4@400,data=2@25"), devices))
    assert grid.shape == (4, 2) and all(len(set(col)) == 1 for col in grid.T)
    # a slow axis larger than the hosts: part of it within a host, the fast axis never across
    grid = hosts_of(device_grid(partex.MeshSpec.parse("data=4@25,model=2@400"), devices))
    assert all(len(set(row)) == 1 for row in grid) and sorted(grid[:, 0]) == [0, 0, 1, 1]


def test_tpu_slices_are_the_granules_and_one_host_keeps_jax_layout():
    """On TPU, ICI spans the hosts of a slice: two slices of two hosts each, the fast axis
    within a slice (across its two hosts), the slow one across slices."""
    devices = [FakeDevice(i, process_index=i // 2, platform="tpu", device_kind="fake", slice_index=i // 4,
                          coords=(i % 2, i % 4 // 2, 0)) for i in range(8)]
    grid = device_grid(partex.MeshSpec.parse(MESH), devices)
    slices = np.vectorize(lambda d: d.slice_index)(grid)
    assert [set(row) for row in slices] == [{0}, {1}]
    assert [len(set(row)) for row in hosts_of(grid)] == [2, 2]  # a model group spans a slice's hosts
    # one host (the simulated devices of one process): JAX's own layout
    assert device_grid(partex.MeshSpec.parse(MESH), [FakeDevice(i, 0) for i in range(8)]) is None


def test_layout_warns_when_a_fast_axis_must_cross_hosts_and_refuses_uneven_hosts():
    devices = [FakeDevice(i, i // 4) for i in range(8)]
    with pytest.warns(UserWarning, match="gives no bandwidths"):
        device_grid(partex.MeshSpec.parse("data=2,model=4"), devices)
    with pytest.warns(UserWarning, match=r"axis model crosses hosts.*slow axes \(data\) do not span"):
        device_grid(partex.MeshSpec.parse("data=1@25,model=8@400"), devices)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        device_grid(partex.MeshSpec.parse(MESH), devices)
    uneven = [FakeDevice(i, 0 if i < 6 else 1) for i in range(8)]
    with pytest.raises(partex.PartexError, match="different numbers of devices"):
        device_grid(partex.MeshSpec.parse(MESH), uneven)


def test_plan_records_its_slow_axes_and_builds_shardings_for_an_init(plans):
    plan = partex.Plan.load(plans["searched"])
    assert json.loads(plan.dumps())["mesh"]["slow_axes"] == ["data"]
    assert partex.MeshSpec.parse("data=4,model=2").slow_axes() == ()
    model = demo_models.build("transformer", "tiny")
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), model.args)
    shardings = partex.plan_shardings(plan, abstract)
    flat = [s for s in jax.tree_util.tree_leaves(shardings[:2])]
    assert flat and all(isinstance(s, jax.sharding.NamedSharding) for s in flat)
    # a jitted init creates the state already sharded, as the plan places it
    params = jax.jit(lambda: model.args[0], out_shardings=shardings[0])()
    for path, x, s in zip(plan.signature["inputs"], jax.tree_util.tree_leaves(params),
                          jax.tree_util.tree_leaves(shardings[0])):
        assert x.sharding.is_equivalent_to(s, x.ndim), path
    with pytest.raises(partex.PartexError, match="array leaves"):
        partex.plan_shardings(plan, abstract[:2])
    wrong = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct((3,) + x.shape[1:], x.dtype)
                                   if x.ndim else x, abstract)
    with pytest.raises(partex.PartexError, match="here but"):
        partex.plan_shardings(plan, wrong)
