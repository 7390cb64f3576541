"""Plans that keep values in host memory, from the search to XLA: an explicit-mode step
searched with the optimizer state in host memory, verified (its device part judged on
XLA:CPU, which ignores memory spaces, its host part said to be unchecked) and applied; a
search that cannot fit names the limit that binds (device or host memory) and by how much;
and one default memory margin, whichever way the hardware is named."""

from __future__ import annotations

import argparse

import jax
import numpy as np
import pytest

import _libcheck as lc
import partex
from partex.cli import _hardware, main
from test_forms import load

MESH = "data=4,model=2"


def _host_plan(s: partex.Session) -> partex.Plan:
    """The search's plan with the optimizer state pinned to host memory."""
    s.pin("optimizer", "memory:host")
    s.step(40)
    plan = s.best_plan()
    assert plan is not None, s.stats().no_fit
    assert any(d.axis == "memory:host" for d in plan.decisions), plan.decisions
    return plan


def test_an_explicit_mode_step_with_its_state_in_host_memory_is_searched_verified_and_applied():
    """The explicit-axes step keeps its typed shardings; the plan keeps the optimizer state in
    host memory, and apply traces the step with that state's typed sharding on the device
    (as the search analysed it): verify runs it with the step's numerics, judges its device
    part within the budget and reports the host part as unchecked; applied to the arguments
    as the user holds them, it returns the unsharded step's values."""
    mod = load("explicit_reshard")
    made = mod.make()
    fn, args, names = lc.unpack(made)
    s = lc.session(made, mesh=MESH, memory="100KiB")
    plan = _host_plan(s)
    assert plan.host_inputs
    out = s.verify(plan, run=True, mark=False)
    assert out.numerics.ok, out.numerics
    assert out.xla_memory["host_resident"] > 0 and out.host_unchecked >= out.xla_memory["host_resident"]
    x = out.xla_memory
    assert x["device"] == out.memory.xla - x["host_resident"] - x["offloaded"] - x["cpu_only"] and not x["offloaded"]
    assert out.fits and out.xla_memory["device"] <= out.budget < out.memory.xla, out.xla_memory
    with jax.set_mesh(mod.mesh(args)):
        want = jax.jit(fn)(*args)
    got = partex.apply_plan(plan, fn, axis_names=names)(*mod.make()[1])
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)


def test_the_cli_searches_and_verifies_an_explicit_mode_step_with_host_memory(tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = main(["search", f"{lc.ROOT}/scripts/forms/explicit_reshard.py:make", "--mesh", MESH, "--memory", "100KiB",
               "--simulations", "40", "--pin", "optimizer=memory:host", "--verify", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "optimizer state->memory:host" in text and "not checked" in text and ": fits" in text, text
    assert main(["verify", f"{lc.ROOT}/scripts/forms/explicit_reshard.py:make", str(out), "--run"]) == 0
    text = capsys.readouterr().out
    assert "numerics: ok" in text and "less 32.0 KiB of arguments and results in host memory" in text, text


def test_verify_on_xla_cpu_judges_the_device_part_of_a_step_that_offloads_to_host():
    """The step's own remat policy offloads each layer's residual to pinned host memory;
    XLA:CPU keeps it on the device, so its figure is above the device's: verify takes out the
    offloaded residuals (at their predicted peak) and the arguments in host memory, and a
    budget between the two figures fits, with the host part reported unchecked."""
    mod = load("offload_remat")
    made = mod.make()
    s = lc.session(made, mesh=MESH)
    plan = s.plan(strategy="zero3")
    probe = s.verify(plan, mark=False)
    x = probe.xla_memory
    assert x["offloaded"] > 0 and probe.host_unchecked >= x["offloaded"]
    assert x["device"] == x["total"] - x["host_resident"] - x["offloaded"] - x["cpu_only"]
    between = (x["device"] + x["total"]) / 2
    s2 = lc.session(made, mesh=MESH, memory=between)
    out = s2.verify(s2.plan(strategy="zero3"), run=True, mark=False)
    assert out.fits and not out.marked_infeasible and out.numerics.ok
    assert out.memory.xla > out.budget


@pytest.mark.parametrize("memory, host, binds", [
    ("400KiB", "40KiB", "host memory binds: plans within the 400.0 KiB per-device budget need 64.0 KiB of host "
                        "memory per device at the least, 28.0 KiB over the 36.0 KiB of host memory per device (the "
                        "host's 40.0 KiB less its 10% margin)"),
    ("100KiB", "10MiB", "device memory binds: the smallest device memory found is"),
    ("100KiB", "0", "device and host memory both bind: the smallest device memory found is"),
])
def test_a_search_that_cannot_fit_names_the_limit_that_binds(capsys, tmp_path, memory, host, binds):
    """The step offloads 64 KiB per device to host memory itself: with too little host memory
    the error names the host's limit and its figures (not a device figure under the
    budget), with too little device memory the device's; the CLI exits 2 with one line, and
    the API's ``search`` says the same."""
    rc = main(["search", f"{lc.ROOT}/scripts/forms/offload_remat.py:make", "--mesh", MESH, "--memory", memory,
               "--host-memory", host, "--simulations", "30", "--out", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert binds in err, err
    assert ("--host-memory" in err) == ("host memory" in binds), err
    fn, args, _ = lc.unpack(load("offload_remat").make())
    hw = partex.get_hardware("tpu-v4", memory_budget=partex.parse_bytes(memory),
                             host_memory_bytes=0.0 if host == "0" else partex.parse_bytes(host))
    with pytest.raises(partex.PartexError, match=binds.split(":")[0]):
        partex.search(fn, args, mesh=MESH, hardware=hw, simulations=30)


def test_one_default_memory_margin_for_the_cli_the_api_and_every_preset():
    """A preset by name or by object, the bare ``Hardware`` and the CLI keep the same share
    free, so the same model, budget and seed give the same plan from each."""
    cli = _hardware(argparse.Namespace(**dict.fromkeys(
        ("peak_flops", "hbm_bandwidth", "link_bandwidth", "link_latency", "host_bandwidth", "hbm", "host_memory",
         "memory", "margin", "overlap", "hardware"))))
    margins = {partex.as_hardware("tpu-v4").memory_margin, partex.get_hardware("tpu-v4").memory_margin,
               partex.HARDWARE["h100-80gb"].memory_margin, cli.memory_margin,
               partex.Hardware("x", 1e12, 1e9, 1e11, 1e10, 1e-6).memory_margin}
    assert margins == {0.1}
    m = partex.demo_models.build("transformer", "tiny")
    by_name = partex.Session(m.fn, m.args, mesh=MESH, hardware="tpu-v4", memory="2MiB", seed=0)
    by_object = partex.Session(m.fn, m.args, mesh=MESH, hardware=partex.get_hardware("tpu-v4"), memory="2MiB",
                               seed=0)
    by_name.step(30)
    by_object.step(30)
    assert by_name.hardware == by_object.hardware
    assert by_name.best().decisions == by_object.best().decisions
