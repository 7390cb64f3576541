"""The explorer's state and search runner without a browser: session files stay in their
folder, and a failure in the search process reaches the server's log with its traceback."""

from __future__ import annotations

import json
import os
import re

import logging
import time

import pytest

import partex
from partex.explorer._engine import Workspace
from partex.explorer._runner import ProcessRunner
from partex.explorer._state import ExplorerState
from partex.explorer._store import SessionStore


def wait_for(predicate, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_search_forked_while_a_plan_is_being_scored_on_its_workspace_still_runs():
    """The page scores plans on its workspace in worker threads (an upload, say) under the
    workspace's lock, and the search's child summarizes its best plan under its copy of that
    lock: a child forked while a thread held it must still make and summarize plans (the fork
    waits for the lock; the child takes a lock of its own)."""
    import threading

    session = partex.Session.from_spec("mlp", mesh="data=4,model=2", memory="3MiB")
    ws = Workspace(session.spec, session)
    held = threading.Event()
    real_step = session.step

    def step(n=1):  # what the forked child calls: scores under the lock, as a summary may
        with ws.lock:
            return real_step(n)

    session.step = step

    def scoring():
        with ws.lock:
            held.set()
            time.sleep(0.5)

    thread = threading.Thread(target=scoring)
    thread.start()
    held.wait()
    runner = ProcessRunner(session, ws, session="t")
    try:
        runner.step(5)
        snap = wait_for(lambda: (lambda s: s is not None and s.stats.simulations >= 5 and s)(runner.receive()),
                        timeout=60, what="the child's five simulations")
        assert not snap.error
    finally:
        runner.close()
        thread.join()


def test_a_failure_in_the_search_process_is_logged_with_its_traceback(caplog):
    session = partex.Session.from_spec("mlp", mesh="data=4,model=2", memory="3MiB")

    def broken_step(n=1):
        raise ValueError("a bug deep in the search")

    session.step = broken_step  # what the forked child will call
    runner = ProcessRunner(session, Workspace(session.spec, session), session="t")
    try:
        with caplog.at_level(logging.ERROR, logger="partex.explorer"):
            runner.step(5)
            snap = wait_for(lambda: (lambda s: s is not None and s.error and s)(runner.receive()),
                            what="the child's error")
        assert snap.error == "the search failed: ValueError: a bug deep in the search"  # one line on the page
        logged = "\n".join(r.getMessage() for r in caplog.records)
        assert "Traceback (most recent call last)" in logged and "broken_step" in logged, logged
    finally:
        runner.close()


def test_session_names_never_leave_the_sessions_folder(tmp_path):
    store = SessionStore(tmp_path)  # only the path rule, no model loaded
    assert store.path("my-run.2") == tmp_path / "my-run.2.json"
    for bad in ("../x", "/etc/passwd", "a/b", "..", ".hidden", ""):
        with pytest.raises(partex.PartexError, match="session name"):
            store.path(bad)


def _settle(st: ExplorerState, until, what: str, timeout: float = 120.0):
    def check():
        st.poll()
        return until()
    return wait_for(check, timeout=timeout, what=what)


def _load_scanned(st: ExplorerState) -> None:
    """The page, once its first model is loaded, on the scanned transformer (tiny, four
    layers) at a budget of 16 MiB."""
    _settle(st, lambda: st.phase == "ready" and not st.busy, "the model to load")
    st.model_name, st.preset, st.overrides = "transformer-scan", "tiny", "layers=4"
    st.budget_text = "16MiB"
    st.load()
    _settle(st, lambda: st.phase == "ready" and st.workspace.choice.spec == "transformer-scan" and not st.busy,
            "transformer-scan")


def test_verify_in_the_explorer_marks_a_plan_over_budget_and_the_best_moves_on(tmp_path):
    """The explorer's Verify does what Session.verify and the CLI's --verify do: the
    search's best plan, which XLA puts over the budget, is marked infeasible in the search
    (in its own process) and the page's best becomes another plan."""
    import math

    st = ExplorerState(sessions_dir=tmp_path)
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None, "the model to load")
        st.step_size = 100
        st.step()
        _settle(st, lambda: st.best is not None and st.stats.simulations >= 100, "a plan")
        budget = math.ceil(st.best.report.memory.peak)  # that plan, exactly at the budget
        st.margin_text = "0"  # (with no margin kept free: XLA needs ~3-13% more than predicted here)
        st.budget_text = str(budget)
        _settle(st, lambda: st.phase == "ready" and st.config.hw.budget == budget and not st.busy, "the new budget")
        st.step()
        _settle(st, lambda: st.best is not None and st.stats.simulations >= 100, "a plan under it")
        best = st.best
        st.shown_plan = "search"
        st.verify()
        _settle(st, lambda: st.verify_status.startswith(("done", "failed")), "XLA's verdict")
        out = st.verify_result
        assert out is not None and out.memory.xla > budget and not out.fits, (st.message, out)
        _settle(st, lambda: "marked infeasible" in st.message, "the plan marked infeasible")
        _settle(st, lambda: st.best is None or st.best.decisions != best.decisions, "the best to move on")
    finally:
        st.close()


def test_the_explorer_says_which_arguments_are_static(tmp_path):
    """A model whose args hold a non-array leaf loads, and the page's message names it as left
    out of the plan (as `partex analyze` lists it)."""
    model = tmp_path / "static_model.py"
    model.write_text(
        "import jax.numpy as jnp\n"
        "def make():\n"
        "    def step(state, x):\n"
        "        act = jnp.tanh if state['act'] == 'tanh' else jnp.sin\n"
        "        return jnp.sum(act(x @ state['w']))\n"
        "    return step, ({'w': jnp.ones((8, 16)), 'act': 'tanh'}, jnp.ones((4, 8)))\n")
    st = ExplorerState(sessions_dir=tmp_path, models_dir=tmp_path)
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None, "the demo model to load")
        st.model_name = "custom"
        st.custom_model = f"{model}:make"
        st.load()
        _settle(st, lambda: st.phase == "ready" and "static_model" in st.message, "the custom model to load")
        assert "static argument left out of the plan: state/act" in st.message, st.message
    finally:
        st.close()


# A models folder: a model, a file that imports a function it does not define, and a link
# that leads out of the folder to a file beside it.
MODEL = ("import jax.numpy as jnp\n"
         "from os import abort\n"
         "def make():\n"
         "    return (lambda x: jnp.sum(jnp.tanh(x @ x.T)), (jnp.ones((8, 16)),))\n")


def _models_folder(tmp_path):
    models, beside = tmp_path / "models", tmp_path / "beside"
    models.mkdir()
    beside.mkdir()
    (models / "mine.py").write_text(MODEL)
    (beside / "theirs.py").write_text(MODEL)
    (models / "link.py").symlink_to(beside / "theirs.py")
    return models, beside


def _refused(st: ExplorerState, text: str) -> str:
    """The page's own model ``text`` analysed: refused at the "custom" field (its message),
    the page staying on the model before."""
    before = st.workspace.choice
    st.model_name, st.custom_model = "custom", text
    st.load()
    _settle(st, lambda: not st.busy, f"{text} to be refused")
    assert st.workspace.choice == before and st.phase == "ready", (text, st.message)
    assert st.message_level == "refused" and st.message.startswith("not analysed: "), (text, st.message)
    assert st.message.endswith(f"; the page stays on {before.title}"), (text, st.message)
    return st.field_error["custom"]


def test_without_a_models_folder_the_page_loads_no_model_of_its_own(tmp_path, monkeypatch):
    """No --models-dir: any model of the user's own is refused at its field, a path as well as
    a module; and a saved session that names a module (a file put in the sessions folder) is
    refused too, before anything is imported: the gate is where every model loads, not in
    the form."""
    monkeypatch.delenv("PARTEX_MODELS_DIR", raising=False)
    models, _ = _models_folder(tmp_path)
    st = ExplorerState(sessions_dir=tmp_path / "sessions")
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None and not st.busy, "the demo model")
        for text in (f"{models}/mine.py:make", "os:abort"):
            why = _refused(st, text)
            assert why.startswith("models of your own are off on this server") and "--models-dir DIR" in why, why
        st.model_name = "transformer"  # the picker back on the page's model: the mark goes
        assert st.field_error == {}, st.field_error
        st.session_name = "mine"
        st.save_session()
        _settle(st, lambda: "saved session mine" in st.message, "the session to be saved")
        saved = tmp_path / "sessions" / "mine.json"
        doc = json.loads(saved.read_text())
        doc["model"]["spec"] = "os:abort"
        saved.write_text(json.dumps(doc))
        st.load_session("mine")
        _settle(st, lambda: not st.busy, "the session to be refused")
        assert st.message_level == "danger" and "models of your own are off on this server" in st.message, st.message
        assert st.workspace.choice.spec == "transformer" and st.phase == "ready"
    finally:
        st.close()


def test_a_model_of_your_own_loads_only_from_the_models_folder(tmp_path):
    """With a models folder, the page loads FILE.py:function inside it (a relative FILE is
    taken there; the model is then named by its real path) and refuses, at the field, with
    why: a module by name, a '..', a file outside the folder, a link that leads out of it, a
    function the file only imports, a name that is not one public function."""
    models, beside = _models_folder(tmp_path)
    root = os.path.realpath(models)
    st = ExplorerState(sessions_dir=tmp_path / "sessions", models_dir=models)
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None and not st.busy, "the demo model")
        for text, why in (("os:abort", f"is not a Python file in the models folder: name one as FILE.py:function "
                                       f"(this server loads models of your own from {root} only, never a module"),
                          ("../beside/theirs.py:make", f"'..' is not allowed here: name a file inside {root}"),
                          (f"{beside}/theirs.py:make", f"theirs.py is outside {root} (links resolved)"),
                          ("link.py:make", f"link.py is outside {root} (links resolved)"),
                          ("mine.py:abort", f"abort is not defined in {root}/mine.py (it comes from posix)"),
                          ("mine.py:jnp.sum", "after ':' name one public function of the file, not 'jnp.sum'"),
                          ("nothere.py:make", f"model file nothere.py does not exist in {root}")):
            said = _refused(st, text)
            assert why in said, (text, said)
        st.custom_model = "mine.py:make"
        st.load()
        _settle(st, lambda: st.phase == "ready" and not st.busy and st.workspace.choice.preset == "custom",
                "the model from the folder")
        assert st.workspace.choice.spec == f"{root}/mine.py:make" and st.field_error == {}, st.message
        assert st.forms.names(st.workspace.choice)  # the form's relative name is the model on the page

        # a saved session names its model by that real path, and loads again; one that names it
        # otherwise (what a verification would load anew from elsewhere) or names a module does not
        st.session_name = "mine"
        st.save_session()
        _settle(st, lambda: "saved session mine" in st.message, "the session to be saved")
        saved = tmp_path / "sessions" / "mine.json"
        doc = json.loads(saved.read_text())
        assert doc["model"]["spec"] == f"{root}/mine.py:make"
        st.model_name = "mlp"
        st.load()
        _settle(st, lambda: st.workspace.choice.spec == "mlp" and not st.busy, "the mlp")
        st.load_session("mine")
        _settle(st, lambda: "loaded session mine" in st.message and not st.busy, "the session to load")
        for spec, why in (("mine.py:make", f"the page loads that model only by its real path, {root}/mine.py:make"),
                          ("os:abort", "is not a Python file in the models folder")):
            doc["model"]["spec"] = spec
            saved.write_text(json.dumps(doc))
            st.model_name = "mlp"
            st.load()
            _settle(st, lambda: st.workspace.choice.spec == "mlp" and not st.busy, "the mlp")
            st.load_session("mine")
            _settle(st, lambda: not st.busy, f"the session naming {spec} to be refused")
            assert st.message_level == "danger" and why in st.message, st.message
            assert st.workspace.choice.spec == "mlp"
    finally:
        st.close()


def test_an_upload_over_the_limit_is_refused_unread(tmp_path):
    """A plan file over the page's upload limit is refused with its size and the limit in the
    banner; the page keeps what it shows and reads nothing."""
    st = ExplorerState(sessions_dir=tmp_path, upload_limit="1KiB")
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None and not st.busy, "the model to load")
        text = st.workspace.session.plan(strategy="megatron").dumps()
        assert len(text) > 1024
        st.upload_plan(text.encode(), "megatron.json")
        assert st.message_level == "danger" and not st.busy and st.uploaded is None
        assert st.message.startswith("megatron.json is ") and "over the 1.0 KiB this server takes" in st.message
        assert "partex serve --max-upload" in st.message, st.message
    finally:
        st.close()


def test_a_pin_that_stops_applying_is_set_aside_with_a_message_and_comes_back(tmp_path):
    """A budget nothing fits, then a mesh on which a pin does not apply.
    The page says so beside the budget's warning (one never hides the other), keeps the pin
    aside, and a mesh where it applies again brings it back."""
    st = ExplorerState(sessions_dir=tmp_path)
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None, "the model to load")
        st.budget_text = "1KiB"  # nothing fits
        _settle(st, lambda: st.phase == "ready" and st.config.hw.budget == 1024 and not st.busy, "the budget")
        heads = next(g.id for g in st.workspace.an.decision_groups if g.label == "heads")
        st.driver.decide("pin", heads, "model")
        _settle(st, lambda: any(st.workspace.an.decision_label(p) == "heads->model" for p in st.pins), "the pin")
        st.mesh_text = "data=1,model=8"  # heads (4) cannot be split 8 ways
        _settle(st, lambda: st.phase == "ready" and st.config.mesh.text() == "data=1,model=8" and not st.busy,
                "the new mesh")
        assert "no baseline fits" in st.message and "heads->model set aside until it applies again" in st.message
        assert st.message_level == "warning" and not st.pins
        assert [st.workspace.an.decision_label(p) for p in st.held[0]] == ["heads->model"]
        st.mesh_text = "data=4,model=2"
        _settle(st, lambda: st.phase == "ready" and st.config.mesh.text() == "data=4,model=2" and not st.busy,
                "the mesh back")
        assert [st.workspace.an.decision_label(p) for p in st.pins] == ["heads->model"] and st.held == ((), ())
    finally:
        st.close()


def test_the_page_says_what_is_going_on_when_idle_paused_or_choosing(tmp_path):
    """Pause replaces the "searching" message; a model or preset chosen but not analysed says
    to press Analyze; a full-size preset opens on the chip's HBM, not the tiny demo's 3 MiB."""
    st = ExplorerState(sessions_dir=tmp_path)
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None, "the model to load")
        assert not st.busy and not st.running  # the header's spinner is off
        st.run()
        assert st.running and st.message.startswith("searching on")
        st.pause()
        assert not st.running and st.message.startswith("paused after"), st.message
        st.preset = "t32"
        assert "press Analyze to load transformer (t32)" in st.message and st.budget_text == ""
        st.preset = "tiny"
        assert st.budget_text == "3MiB"
        st.budget_text = "5MiB"  # typed by the user: kept across presets
        _settle(st, lambda: st.phase == "ready" and not st.busy, "the new budget")
        st.preset = "t32"
        assert st.budget_text == "5MiB"
    finally:
        st.close()


def test_the_pause_message_counts_what_the_page_shows_once_the_search_stopped(tmp_path):
    """Pause says the count of the search's last snapshot (the one the KPI shows), not the
    one the page had when the button was pressed: the search stops between two chunks."""
    st = ExplorerState(sessions_dir=tmp_path)
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None, "the model to load")
        st.run()
        _settle(st, lambda: st.stats.simulations >= 20, "the search to run")
        # the search goes on past what the page last showed
        shown = st.stats.simulations
        wait_for(lambda: st.runner.receive().stats.simulations > shown, what="more simulations")
        st.pause()
        _settle(st, lambda: not st.runner.receive().running and st.stats is st.runner.receive().stats,
                "the search's last snapshot")
        final = st.stats.simulations
        assert final > shown
        assert st.message.startswith(f"paused after {final:,} simulations"), (st.message, final)
        assert st.message_level == "info"
    finally:
        st.close()


def test_a_refused_input_is_said_at_its_field_and_in_the_banner_until_fixed(tmp_path):
    """One rule for a bad mesh, override or session name: the field is marked with why; the
    banner says what was refused, why, and what stays in force (level "refused", no toast);
    when a good value is applied, the mark goes and the banner says again what it said before.
    A bad input tied to no field (an upload) goes to the banner as an error."""
    st = ExplorerState(sessions_dir=tmp_path)
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None and not st.busy, "the model to load")
        loaded = st.message
        st.mesh_text = "data=four"
        assert "cannot parse mesh" in st.field_error["mesh"] and st.config.mesh.text() == "data=4,model=2"
        assert st.message_level == "refused", st.message
        assert st.message.startswith("not applied: cannot parse mesh 'data=four'"), st.message
        assert st.message.endswith("; the page stays on data=4,model=2 (tpu-v4, budget 3.0 MiB)"), st.message
        st.mesh_text = "data=4,model=2"  # the mesh in force again
        assert st.field_error == {} and st.message == loaded and st.message_level == "success"

        st.overrides = "layers"  # no key=value: refused at once
        st.load()
        assert "malformed override 'layers'" in st.field_error["overrides"]
        assert st.message.startswith("not analysed: malformed override 'layers'"), st.message
        assert st.message.endswith("; the page stays on transformer (tiny)") and st.message_level == "refused"
        st.overrides = "layers=x"  # an unknown value: refused when the model builds
        st.load()
        _settle(st, lambda: not st.busy, "the load to fail")
        assert "bad value 'x' for transformer config key 'layers'" in st.field_error["overrides"], st.field_error
        assert st.message.startswith("not analysed: bad value 'x'") and st.workspace.choice.overrides == ()
        st.overrides = "layers=1"
        st.load()
        _settle(st, lambda: not st.busy and st.workspace.choice.overrides == ("layers=1",), "the override")
        assert st.field_error == {} and st.message_level == "success", st.message

        st.session_name = "../x"
        st.save_session()
        assert "session name" in st.field_error["session"] and st.message_level == "refused"
        assert st.message.startswith("not saved: session name") and st.message.endswith("; nothing was saved")

        st.upload_plan(b'{"format": "partex-plan", "ver', "broken.json")
        _settle(st, lambda: not st.busy, "the upload")
        assert st.message_level == "danger" and "broken.json" in st.message
    finally:
        st.close()


def test_a_mesh_refused_with_the_pipeline_leaves_the_page_as_it_was_and_says_so(tmp_path):
    """On a pipelined step (stack0 over stage), a mesh without a stage axis is refused: the
    configuration in force stays, the pipeline field says why and how to fix it, the mesh
    field is marked as not applied (still the mesh in force), and the banner says what was
    refused and what stays; a budget typed meanwhile that reads as the one in force is not
    marked. Clearing the pipeline applies both, and the banner says which pins the new step
    dropped, and that the pipeline's own layers->stage went with the old step."""
    st = ExplorerState(sessions_dir=tmp_path)
    try:
        _load_scanned(st)
        st.mesh_text = "stage=2,fsdp=4"
        st.pipeline_text = "stack0:stage:4:full"
        _settle(st, lambda: st.config.pipeline is not None and not st.busy, "the pipelined step")
        ffn = next(g.id for g in st.workspace.an.decision_groups if g.label == "ffn")
        st.pin(ffn, "fsdp")
        _settle(st, lambda: st.pins, "the pin")
        before = st.config

        st.mesh_text = "data=2,fsdp=2,model=2"
        assert st.config == before and not st.busy  # nothing was applied
        assert set(st.field_error) == {"pipeline", "mesh"}, st.field_error
        assert "has no axis 'stage'" in st.field_error["pipeline"] and "clear the pipeline" in st.field_error["pipeline"]
        assert st.field_error["mesh"] == "not applied: still stage=2,fsdp=4"
        assert st.message_level == "refused" and st.message.startswith(
            "not applied: pipeline stack0:stage:4:full: the mesh (data=2,fsdp=2,model=2) has no axis 'stage'")
        assert st.message.endswith("the page stays on stage=2,fsdp=4 with pipeline stack0:stage:4:full "
                                   "(tpu-v4, budget 16.0 MiB)"), st.message
        st.budget_text = "16 MiB"  # the budget in force, written otherwise: not marked
        assert set(st.field_error) == {"pipeline", "mesh"}, st.field_error

        st.pipeline_text = ""
        _settle(st, lambda: st.config.pipeline is None and not st.busy, "the new mesh without the pipeline")
        assert st.config.mesh.text() == "data=2,fsdp=2,model=2" and st.field_error == {}
        assert st.message_level == "warning" and st.pins == [], st.message
        assert ("another pipeline is another step, with groups of its own: dropped pin ffn->fsdp (pin again what "
                "still applies); the old step's own layers→stage went with it") in st.message, st.message
    finally:
        st.close()


def test_a_full_size_preset_says_its_budget_suggests_a_mesh_and_keeps_its_warning(tmp_path):
    """The full-size U-Net on data=4,model=2: the budget (the chip's HBM) is said in words; no
    baseline fits there, so the message names a larger mesh on which one does; running and
    pausing the search add to that warning instead of replacing it."""
    st = ExplorerState(sessions_dir=tmp_path)
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None, "the model to load")
        st.model_name = "unet"
        st.preset = "full"
        assert "budget: the chip's HBM, 32.0 GiB, for a full-size preset" in st.message, st.message
        st.load()
        _settle(st, lambda: st.phase == "ready" and not st.busy and st.workspace.choice.preset == "full",
                "the full-size U-Net", timeout=300)
        warning = st.message
        assert st.message_level == "warning" and "no baseline fits the budget of 32.0 GiB" in warning, warning
        assert "the chip's HBM, for a full-size preset" in warning
        assert re.search(r"on data=\d+,model=\d+ one does: try that mesh", warning), warning
        st.run()
        assert st.message.startswith(warning) and "searching on" in st.message
        # a full-size U-Net's first simulations take seconds each: the same wait as its loading
        _settle(st, lambda: st.stats.simulations > 0, "a simulation", timeout=300)
        st.pause()
        _settle(st, lambda: not st.runner.receive().running and st.stats is st.runner.receive().stats,
                "the search to stop")
        assert st.best is None or not st.best.report.fits  # (a plan that fits would end the warning)
        assert st.message_level == "warning" and st.message.startswith(warning), st.message
        assert f"paused after {st.stats.simulations:,} simulations" in st.message
    finally:
        st.close()


def test_no_larger_mesh_fitting_is_said_with_the_most_devices_tried(tmp_path):
    st = ExplorerState(sessions_dir=tmp_path)
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None, "the model to load")
        st.budget_text = "64KiB"
        _settle(st, lambda: st.phase == "ready" and not st.busy and st.config.hw.budget == 64 * 1024, "the budget")
        assert "no mesh up to 512 devices with these axes fits one either" in st.message, st.message
        assert st.message_level == "warning"
    finally:
        st.close()


def test_an_uploaded_plan_then_another_model_loads_and_the_search_goes_on(tmp_path):
    """Upload a plan and pin a group, then load another model: the page keeps the upload only
    for the same model (by the plan's signature), drops the pin with the model, loads the new
    one and its search steps."""
    st = ExplorerState(sessions_dir=tmp_path)
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None, "the model to load")
        text = st.workspace.session.plan(strategy="megatron").dumps()
        st.upload_plan(text.encode(), "megatron.json")
        _settle(st, lambda: st.uploaded is not None, "the upload")
        st.mesh_text = "data=2,model=4"  # same model, another mesh: the upload stays
        _settle(st, lambda: st.config.mesh.text() == "data=2,model=4" and "load" not in st.busy, "the new mesh")
        assert st.uploaded is not None and st.phase == "ready"
        st.pin(st.workspace.an.group_by_label("heads").id, "model")  # a pin on a group the mlp lacks
        _settle(st, lambda: st.pins, "the pin")
        st.model_name = "mlp"
        st.load()
        _settle(st, lambda: st.workspace.choice.spec == "mlp" and st.phase == "ready" and "load" not in st.busy,
                "the mlp to load")
        assert st.uploaded is None and st.pins == []  # another model's plan and pins do not apply here
        assert st.message_level != "danger", st.message
        st.step()
        _settle(st, lambda: st.stats.simulations >= st.step_size, "the mlp's search to step")
    finally:
        st.close()


def test_an_exception_in_a_jobs_result_is_one_line_and_the_session_goes_on(tmp_path, caplog, monkeypatch):
    """A bug while applying a finished job (here: installing a newly loaded mesh) shows one
    line on the page, logs its traceback, and leaves the page usable: the next load works."""
    st = ExplorerState(sessions_dir=tmp_path)
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None, "the model to load")

        def broken(loaded):
            raise RuntimeError("a bug while installing the model")

        monkeypatch.setattr(st.loading, "install", broken)
        with caplog.at_level(logging.ERROR, logger="partex.explorer"):
            st.mesh_text = "data=2,model=4"
            _settle(st, lambda: "load" not in st.busy and st.message_level == "danger", "the error")
        assert "internal error" in st.message and "a bug while installing the model" in st.message
        assert "Traceback" not in st.message and st.phase != "loading"
        assert any("a bug while installing the model" in (r.exc_text or "") or r.exc_info for r in caplog.records)
        monkeypatch.undo()
        st.mesh_text = "data=8"
        _settle(st, lambda: st.config.mesh.text() == "data=8" and st.phase == "ready", "the next mesh")
        st.step()
        _settle(st, lambda: st.stats.simulations >= st.step_size, "the search to step")
    finally:
        st.close()


def test_an_exception_in_a_page_callback_is_shown_on_that_page(tmp_path, caplog):
    """Panel hands an exception raised in a widget or periodic callback to the explorer's
    handler in the page's document context: that page shows one line, the log the traceback."""
    from bokeh.document import Document
    from panel.io.state import set_curdoc

    from partex.explorer import _app

    doc = Document()
    st = ExplorerState(sessions_dir=tmp_path)
    try:
        _app._STATES[doc] = st
        _settle(st, lambda: st.phase == "ready", "the model to load")
        try:
            raise KeyError("a bug in a button's handler")
        except KeyError as e:
            err = e
        with caplog.at_level(logging.ERROR, logger="partex.explorer"), set_curdoc(doc):
            _app.on_exception(err)
        assert st.message_level == "danger" and "a bug in a button's handler" in st.message
        assert any(r.exc_info for r in caplog.records)
        assert st.phase == "ready"  # the page goes on
    finally:
        st.close()


def test_a_bad_value_typed_while_a_new_mesh_loads_keeps_its_mark(tmp_path):
    """A mesh change starts a new search (a load job); a bad budget typed before it lands is
    marked at once, and the load's arrival does not wipe the mark: the page never says a
    value is in force that was refused. While the job runs, the page is busy with it."""
    st = ExplorerState(sessions_dir=tmp_path)
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None, "the model to load")
        # the mesh in force each time the load job leaves `busy` (what a page sees as done)
        seen = []
        st.param.watch(lambda e: seen.append(st.config.mesh.text()) if "load" in e.old and "load" not in e.new
                       else None, ["busy"])
        st.mesh_text = "data=2,model=4"
        assert "load" in st.busy and not st.field_error  # the job first, then the mark gone
        st.budget_text = "lots"
        assert "budget" in st.field_error, st.field_error
        _settle(st, lambda: "load" not in st.busy, "the new mesh's search")
        assert seen == ["data=2,model=4"], seen  # never done while the old mesh is still shown
        assert "budget" in st.field_error, st.field_error  # still marked: "lots" is not in force
        st.budget_text = "3MiB"
        assert not st.field_error
    finally:
        st.close()


def test_the_memory_bars_write_host_memory_apart_from_the_device_bar(tmp_path):
    """A model whose remat policy offloads its residuals to host memory: each plan's bar is
    its device memory, and the host memory it holds is written after it and in the hover."""
    from partex.explorer._charts import MemoryView, plan_rows

    st = ExplorerState(sessions_dir=tmp_path)
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None, "the model to load")
        st.model_name = "llama"
        st.overrides = "remat=qkv_proj_offloaded,seq=64"
        st.hardware = "tpu-v5p"
        st.budget_text = ""
        st.load()
        _settle(st, lambda: st.phase == "ready" and not st.busy and st.config.hw.name == "tpu-v5p"
                and "llama" in st.message and st.baselines, "the offloading llama on tpu-v5p")
        view = MemoryView(state=st)
        d = view.src.data
        notes = [n or o for n, o in zip(d["note"], d["note_over"])]
        rows = dict(zip(d["row"], zip(notes, d["host_txt"], d["peak_txt"])))
        assert rows and all("on the host" in note and host != "0 B" for note, host, _ in rows.values()), rows
        for name, r in plan_rows(st):
            m = r.report.memory
            assert m.host > 0 and rows[name][1] == partex.explorer._format.fmt_bytes(m.host)
            assert rows[name][2] == partex.explorer._format.fmt_bytes(m.peak)
        assert "offloaded to host memory" in view.caption.object
    finally:
        st.close()


def test_the_mesh_search_runs_beside_the_page_and_its_rows_go_with_the_model(tmp_path):
    """The Meshes card's search (``Session.search_meshes`` in a forked child): bad input is
    marked at its field and starts nothing; the rows come best first, are what the engine's
    search finds for the same request, and stay while the page moves to a mesh picked from
    them; another model clears them, and a model that can use none of the meshes says so."""
    st = ExplorerState(sessions_dir=tmp_path)
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None, "the model to load")
        for devices, topology, seconds, field in ((0, "", 5, "devices"), (8, "3x4", 5, "topology"),
                                                  (8, "2x", 5, "topology"), (8, "", 0, "seconds")):
            st.search_meshes(devices, topology, seconds, "4")
            assert set(st.field_error) == {field} and "meshes" not in st.busy and st.mesh_card.job is None, st.field_error
        st.search_meshes(8, "2x4@6.25", 3, "4")
        assert not st.field_error and "meshes" in st.busy
        _settle(st, lambda: "meshes" not in st.busy, "the mesh search")
        rows = st.mesh_rows
        assert st.message_level == "success" and st.mesh_status.startswith(f"{len(rows)} meshes of 8 devices (2x4@6.25)")
        want = {m.text() for m in partex.candidate_meshes(8, partex.Topology.parse("2x4@6.25"), 4)}
        assert {r.label for r in rows} == want and all("@6.25" in r.mesh for r in rows)
        steps = [r.step for r in rows]
        assert None not in steps and steps == sorted(steps), rows
        assert f"the best is {rows[0].label} at " in st.mesh_status
        picked = rows[-1]
        st.use_mesh(picked.mesh)
        _settle(st, lambda: st.phase == "ready" and st.config.mesh.text() == picked.label and not st.busy,
                "the picked mesh")
        assert st.config.mesh == partex.MeshSpec.parse(picked.mesh) and st.config.mesh.bandwidth  # links kept
        assert st.mesh_rows == rows
        st.model_name = "mlp"
        st.load()
        _settle(st, lambda: st.phase == "ready" and st.workspace.choice.spec == "mlp" and not st.busy, "the mlp")
        assert st.mesh_rows == [] and st.mesh_status == ""
        st.search_meshes(7, "", 3, "2")
        _settle(st, lambda: "meshes" not in st.busy, "the mesh search on 7 devices")
        assert st.message_level == "warning" and "can use none of them" in st.mesh_status, st.mesh_status
    finally:
        st.close()


def test_a_pipeline_typed_or_picked_from_the_meshes_runs_the_pipelined_step(tmp_path):
    """The Pipeline field: an axis the mesh lacks or a stack the model has not is marked at
    the field; a good one loads the pipelined step (the sidebar says its stages, microbatches,
    bubble and what each stage holds); the Meshes card's pipelined candidates carry their
    pipeline, and picking one sets both forms; an empty field is the step as written. The
    card's Pipelines choice leaves them out, or adds stages within one slice."""
    from partex.explorer._controls import pipeline_words

    st = ExplorerState(sessions_dir=tmp_path)
    try:
        _load_scanned(st)
        assert "may be pipelined: stack0 (4 layers, batch 8)" in pipeline_words(st.workspace, st.best)
        st.pipeline_text = "stack0:stage:4"
        assert "has no axis 'stage'" in st.field_error["pipeline"], st.field_error
        st.mesh_text = "stage=2,data=2,model=2"
        _settle(st, lambda: st.config.pipeline is not None and not st.busy, "the pipelined step")
        assert st.field_error == {} and st.config.pipeline == partex.Pipeline("stack0", "stage", 4)
        assert "stack0 pipelined over stage (stack0:stage:4, bubble 20%)" in st.message
        assert st.workspace.session.pipeline == st.config.pipeline
        _settle(st, lambda: st.best is not None, "a plan of the pipelined step")
        words = pipeline_words(st.workspace, st.best)
        assert "stack0 over stage: 2 stages, 4 microbatches, gpipe, bubble 20%, saving residuals" in words
        assert "each stage&#x27;s devices hold" in words
        st.pipeline_text = "stack9:stage:4"
        _settle(st, lambda: not st.busy and "pipeline" in st.field_error, "the refused pipeline")
        assert "no layer stack 'stack9'" in st.field_error["pipeline"] and st.config.pipeline.stack == "stack0"

        st.search_meshes(8, "2x4@25", 3, "2")
        _settle(st, lambda: "meshes" not in st.busy, "the mesh search")
        piped = [r for r in st.mesh_rows if r.pipeline]
        assert piped and all(r.mesh.startswith("stage=2@25") and r.bubble for r in piped)
        pick = piped[-1]
        st.use_mesh(pick.key)
        _settle(st, lambda: st.config.pipeline is not None and st.config.pipeline.text() == pick.pipeline
                and st.config.mesh.text() == pick.label and not st.busy, "the picked pipeline")
        assert st.pipeline_text == pick.pipeline and st.mesh_rows  # the rows stay: the same model
        assert json.loads(st.probe)["config"]["pipeline"] == pick.pipeline
        st.pipeline_text = ""
        _settle(st, lambda: st.config.pipeline is None and not st.busy, "the step as written")
        assert st.workspace.session.pipeline is None

        # the card's Pipelines choice: none at all, or stages within one slice too
        st.search_meshes(8, "2x4@25", 3, "2", "sideways")
        assert set(st.field_error) == {"pipelines"} and "meshes" not in st.busy, st.field_error
        st.search_meshes(8, "2x4@25", 3, "2", "never")
        _settle(st, lambda: "meshes" not in st.busy, "the mesh search without pipelines")
        assert st.mesh_rows and not any(r.pipeline for r in st.mesh_rows), st.mesh_rows
        st.search_meshes(8, "", 3, "2", "within a slice too")
        _settle(st, lambda: "meshes" not in st.busy, "the mesh search with stages within the slice")
        inside = [r for r in st.mesh_rows if r.pipeline]
        assert inside and all(r.mesh.startswith("stage=") and "@" not in r.mesh for r in inside), st.mesh_rows
    finally:
        st.close()


def test_an_explicit_mode_step_with_its_state_pinned_to_host_memory_verifies_in_the_explorer(tmp_path):
    """A step of the user's own in explicit sharding mode, the optimizer state pinned to host
    memory: the search's plan keeps it there, and Verify (XLA:CPU, which ignores memory
    spaces) judges the device part within the budget and lists the host part as unchecked."""
    from partex.explorer._engine import CUSTOM
    from partex.explorer._tables import VerifyView

    root = __import__("os").path.dirname(__import__("os").path.dirname(__file__))
    st = ExplorerState(sessions_dir=tmp_path, models_dir=f"{root}/scripts")
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None, "the model to load")
        st.model_name = CUSTOM
        st.custom_model = f"{root}/scripts/forms/explicit_reshard.py:make"
        st.budget_text = "100KiB"
        st.load()
        _settle(st, lambda: st.phase == "ready" and not st.busy and "explicit_reshard" in st.message
                and st.runner is not None, "the explicit-mode step")
        st.pin(partex.STATES.index("optimizer"), "memory:host")
        _settle(st, lambda: any(p.slot == "memory:host" for p in st.pins), "the pin")
        st.step_size = 40
        st.step()
        _settle(st, lambda: st.best is not None and st.stats.simulations >= 40, "a plan")
        st.shown_plan = "search"
        st.verify()
        _settle(st, lambda: st.verify_status.startswith(("done", "failed")), "XLA's verdict", timeout=300)
        out = st.verify_result
        assert out is not None and out.fits and out.host_unchecked, (st.message, st.verify_status)
        assert out.memory.xla > out.budget >= out.xla_memory["device"]
        table = VerifyView(state=st).table.view.object
        assert "host memory per device (not checked on this backend)" in table and "device part (fits" in table
    finally:
        st.close()


def test_use_this_mesh_on_the_pages_own_mesh_brings_the_rows_plan_into_its_search(tmp_path):
    """A Meshes card row on the mesh the page is on already: Use this mesh starts nothing new,
    and the row's plan joins the page's search, which goes on from it (its best reads that
    plan's step time before a simulation runs)."""
    from partex.explorer._meshes import MeshRow

    st = ExplorerState(sessions_dir=tmp_path)
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None and st.best is not None, "the model to load")
        warm = st.best.report.step_time
        found = partex.Session.from_analysis(st.workspace.base, mesh=st.config.mesh, hardware=st.config.hw)
        found.step(60)
        plan = found.best()
        assert plan.report.step_time < warm * (1 - 1e-9)
        mesh = st.config.mesh.text(links=True)
        st.mesh_rows = [MeshRow(mesh, st.config.mesh.text(), warm, plan.report.step_time, plan.report.mfu,
                                plan.report.memory.peak, 60, 1, "", "converged", plan=tuple(found.portable(plan.decisions)))]
        runner = st.runner
        st.use_mesh(mesh)
        _settle(st, lambda: st.best is not None and st.best.report.step_time < warm * (1 - 1e-9), "the row's plan")
        assert st.runner is runner and st.stats.simulations == 0
        assert st.best.report.step_time == pytest.approx(plan.report.step_time, rel=1e-12)
    finally:
        st.close()


def test_the_page_clock_counts_a_callback_inside_another_as_part_of_it():
    """A callback run inside another (a state's watcher inside the button that set the state)
    is one callback on the page's clock: the outer one's time, named with the inner one's
    part; the slowest callbacks are kept by name, slowest first."""
    from partex.explorer._loop import SLOWEST_KEPT, PageClock

    clock = PageClock("t")
    with clock.timed("the Run button"):
        with clock.timed("the headline"):
            time.sleep(0.03)
    assert clock.timings["callbacks"] == 1
    (what, ms, cpu), = clock.slowest
    assert what.startswith("the Run button; the headline ") and what.endswith(" ms") and ms >= 30 and cpu < ms
    for i in range(SLOWEST_KEPT + 2):
        with clock.timed(f"quick {i}"):
            pass
    assert clock.timings["callbacks"] == SLOWEST_KEPT + 3
    assert len(clock.slowest) == SLOWEST_KEPT and clock.slowest[0][0].startswith("the Run button")
    assert [c[1] for c in clock.slowest] == sorted((c[1] for c in clock.slowest), reverse=True)
    assert clock.timings["max_callback_ms"] == clock.slowest[0][1]


def test_every_change_a_view_hears_is_timed_on_the_page_clock(tmp_path):
    """The state's own watchers and a view's (through ``_widgets.on_change`` / ``on_click``)
    run as timed callbacks: a field typed in the sidebar, a button pressed, a state change
    made outside any callback each count once, and the probe names the slowest."""
    from partex.explorer._controls import MeshControls, SearchControls

    st = ExplorerState(sessions_dir=tmp_path)
    try:
        _settle(st, lambda: st.phase == "ready" and not st.busy, "the model to load")
        mesh, search = MeshControls(state=st), SearchControls(state=st)
        before = st.clock.timings["callbacks"]
        search.step_size.value = 7  # the page's widget: the bound state follows, in one callback
        assert st.step_size == 7 and st.clock.timings["callbacks"] == before + 1
        search.step.clicks += 1  # the Step button
        assert st.clock.timings["callbacks"] == before + 2
        st.hardware = mesh.hardware.options[-1]  # the state set apart from any callback: its watchers
        assert mesh.hardware.value == st.hardware and st.clock.timings["callbacks"] > before + 2
        st.prober.update()
        timings = json.loads(st.probe)["timings"]
        assert timings["slowest"][0][1] == timings["max_callback_ms"], timings
        assert all(isinstance(w, str) and w for w, _, _ in timings["slowest"]), timings
    finally:
        st.close()


def test_a_pin_asked_while_a_long_simulation_runs_never_holds_the_page():
    """On a large model one simulation takes seconds: a pin asked meanwhile returns at once,
    and its answer (the new pins) comes with a later poll, once the simulation ends."""
    session = partex.Session.from_spec("mlp", mesh="data=4,model=2", memory="3MiB")
    real_step = session.step

    def slow_step(n=1):
        time.sleep(1.5)
        return real_step(n)

    session.step = slow_step  # what the forked child will call
    ws = Workspace(session.spec, session)
    group = ws.an.decision_groups[0].id
    runner = ProcessRunner(session, ws, session="t")
    try:
        runner.step(1)
        time.sleep(0.3)  # the child is inside its simulation
        answers: list[tuple[bool, object]] = []
        t0 = time.perf_counter()
        runner.ask("pin", group, "data", done=lambda ok, value: answers.append((ok, value)))
        assert time.perf_counter() - t0 < 0.1
        assert not answers and not list(runner.answered())

        def answered():
            runner.receive()
            for done, ok, value in runner.answered():
                done(ok, value)
            return answers

        (ok, (pins, forbidden)), = wait_for(answered, what="the pin's answer")
        assert ok and [(p.group, p.slot) for p in pins] == [(group, "data")] and not forbidden
        assert time.perf_counter() - t0 > 0.5  # it came after the simulation under way
    finally:
        runner.close()


def test_a_step_says_the_count_its_simulations_end_at(tmp_path):
    """Step on a paused search: the banner says it steps, then, once its simulations have
    ended, the count the cards show (never the count of the pause before it)."""
    st = ExplorerState(sessions_dir=tmp_path)
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None, "the model to load")
        st.step_size = 20
        st.step()
        assert st.message == "stepping 20 simulations from 0"
        _settle(st, lambda: st.message.startswith("paused after"), "the first step's count")
        first = st.stats.simulations
        assert first >= 20 and st.message.startswith(f"paused after {first:,} simulations"), st.message
        st.step()
        _settle(st, lambda: st.stats.simulations >= first + 20 and not st.running
                and st.message.startswith("paused after"), "the second step's count")
        assert st.message.startswith(f"paused after {st.stats.simulations:,} simulations"), st.message
    finally:
        st.close()


def test_an_upload_carried_to_another_step_is_scored_there_or_set_aside(tmp_path):
    """An upload stays on the page when the model's step changes (here: its stack pipelined)
    only as a plan scored on the new step: its decisions never name the old analysis's groups
    (the Plan and Compare cards read them against the new one). One that does not apply there
    is set aside with a message, and the search goes on."""
    from partex.explorer._compare import CompareView
    from partex.explorer._tables import PlanView

    st = ExplorerState(sessions_dir=tmp_path)
    try:
        _load_scanned(st)
        st.step_size = 20
        st.step()
        _settle(st, lambda: st.best is not None and not st.running, "a plan")
        st.upload_plan(st.plan_json().encode(), "best.json")
        _settle(st, lambda: st.uploaded is not None, "the upload")
        views = PlanView(state=st), CompareView(state=st)  # they render the upload on every change
        st.shown_plan = "uploaded"
        st.mesh_text = "stage=2,data=2,model=2"
        st.pipeline_text = "stack0:stage:4"
        _settle(st, lambda: st.config.pipeline is not None and not st.busy, "the pipelined step")
        groups = len(st.workspace.an.groups)
        if st.uploaded is not None:
            assert all(d.group < groups for d in st.uploaded.decisions if hasattr(d, "group"))
        else:
            assert "the uploaded plan is no longer listed: it does not apply to the new step" in st.message
        st.step()
        _settle(st, lambda: st.stats.simulations >= 20 and not st.running, "a step on the pipelined step")
        assert "internal error" not in st.message, st.message
        assert views[0].which.value in views[0].which.options
    finally:
        st.close()


def test_an_upload_is_priced_on_the_pages_hardware_like_the_plans_beside_it(tmp_path):
    """An uploaded plan is listed beside the search's best and the baselines, so it is priced
    on the page's hardware and budget: after another hardware it is scored again there, and a
    file made for other hardware says so in the banner."""
    st = ExplorerState(sessions_dir=tmp_path)
    try:
        _settle(st, lambda: st.phase == "ready" and st.runner is not None, "the model to load")
        st.step_size = 10
        st.step()
        _settle(st, lambda: st.best is not None and not st.running, "a plan")
        text = st.plan_json()
        st.upload_plan(text.encode(), "best.json")
        _settle(st, lambda: st.uploaded is not None, "the upload")
        on_file, file_hw = st.uploaded.report.step_time, partex.Plan.loads(text).hardware.name
        assert file_hw == st.config.hw.name != "h100-80gb" and "(its file says" not in st.message, st.message
        st.hardware = "h100-80gb"
        _settle(st, lambda: st.config.hw.name == "h100-80gb" and not st.busy and st.uploaded is not None
                and st.uploaded.report.step_time != on_file, "the upload priced on h100-80gb")
        session = st.workspace.session
        expected = session.scored(partex.Plan.loads(text), hardware=session.hardware).report.step_time
        assert st.uploaded.report.step_time == pytest.approx(expected)
        st.upload_plan(text.encode(), "best.json")
        _settle(st, lambda: "uploaded plan" in st.message and not st.busy, "the upload again")
        assert f"on h100-80gb (its file says {file_hw})" in st.message, st.message
    finally:
        st.close()


def test_measure_refuses_plans_that_outgrow_this_machines_memory(tmp_path, monkeypatch):
    """On simulated CPU devices every device's memory is this machine's: a plan whose peak on
    each device times the devices is more than the machine has is never run (its process would
    be killed minutes later); the page says what it needs and where to measure it."""
    import partex.explorer._plancard as plancard

    st = ExplorerState(sessions_dir=tmp_path)
    try:
        _settle(st, lambda: st.phase == "ready" and not st.busy, "the model to load")
        monkeypatch.setattr(plancard, "measures_on_cpu", lambda: True)
        monkeypatch.setattr(plancard, "host_memory", lambda: 1024)  # 1 KiB: no plan fits in it
        st.measure()
        assert "measure" not in st.busy and st.message_level == "warning", st.message
        assert st.message.startswith("cannot measure here: the plans run on simulated CPU devices, which share this "
                                     "machine's 1.0 KiB of memory"), st.message
        assert "partex measure" in st.message and st.measure_status.startswith("not run: the smallest plan needs")
    finally:
        st.close()


def test_the_probe_is_written_once_when_a_callback_ends():
    """Work asked for ``later`` inside a callback (the state's JSON, asked for by each change
    the callback makes) runs once, when the outermost callback ends; outside any, at once."""
    from partex.explorer._loop import PageClock

    clock = PageClock("t")
    ran: list[str] = []
    with clock.timed("the Run button"):
        with clock.timed("the headline"):
            clock.later("probe", lambda: ran.append("first"))
            clock.later("probe", lambda: ran.append("second"))
        assert ran == []
    assert ran == ["second"]
    clock.later("probe", lambda: ran.append("now"))
    assert ran == ["second", "now"]


def _two_pages_on_one_slot(tmp_path):
    """Two pages on a server with one search slot (3 s turns on a clock the test moves: a turn
    ends when the test says), both loaded, the first searching. Returns (pool, its clock, first,
    second, settle(until, what): both pages polled until ``until()``); the caller closes the pages."""
    from partex.explorer._pool import SearchPool

    turn_clock = [0.0]
    pool = SearchPool(1, slice_seconds=3.0, clock=lambda: turn_clock[0])
    first = ExplorerState(sessions_dir=tmp_path, pool=pool)
    second = ExplorerState(sessions_dir=tmp_path, pool=pool)

    def settle(until, what):
        def check():
            for st in (first, second):
                st.poll()
            return until()
        return wait_for(check, timeout=120, what=what)

    try:
        settle(lambda: all(st.phase == "ready" and st.runner is not None and not st.busy for st in (first, second)),
               "both models to load")
        first.run()
        settle(lambda: first.stats.simulations > 0, "the first page's search")
    except BaseException:
        first.close()
        second.close()
        raise
    return pool, turn_clock, first, second, settle


def test_a_page_waiting_for_a_search_slot_shows_its_place_and_still_pins(tmp_path):
    """Two pages on a server with one search slot: the second's Run waits in the queue, and the
    page says its place (banner, the KPI's badge, the probe); it pins meanwhile. The first's
    turn over, the second searches while the first waits, its search held, not lost; a page
    that pauses leaves the queue, and one that closes gives its slot to the next."""
    from partex.explorer._charts import KpiView

    pool, turn_clock, first, second, settle = _two_pages_on_one_slot(tmp_path)
    both = (first, second)
    try:
        second.run()
        place = "queued: 1st of 1 waiting for a search slot (one runs at a time on this server)"
        assert second.running and second.search_queue == place and second.message.startswith(place), second.message
        probe = json.loads(second.probe)["queue"]
        assert probe == {"words": place, "state": "waiting", "place": 1, "waiting": 1, "slots": 1}, probe
        assert "badge queued" in KpiView(state=second)._pane.object
        heads = next(g.id for g in second.workspace.an.decision_groups if g.label == "heads")
        second.pin(heads, "model")  # the queued search still takes a pin (answered by the page's poll)
        settle(lambda: [second.workspace.an.decision_label(p) for p in second.pins] == ["heads->model"],
               "the queued page's pin")
        assert second.stats.simulations == 0
        # the first's turn (3 s) over: the second searches, the first waits with its search kept
        turn_clock[0] += pool.slice_seconds
        settle(lambda: second.stats.simulations > 0 and first.search_queue.startswith("queued: 1st of 1"),
               "the turns to rotate")
        assert first.message.startswith("its turn is over, queued: 1st of 1"), first.message
        settle(lambda: second.stats.simulations > 10, "the second page's search to go on")
        held = first.runner.receive().stats.simulations
        now = second.stats.simulations
        settle(lambda: second.stats.simulations > now + 10, "the second page's search to go on")
        assert first.runner.receive().stats.simulations == held  # held: no simulation while it waits
        first.pause()  # leaves the queue
        assert first.search_queue == "" and pool.waiting == []
        first.run()
        assert first.search_queue.startswith("queued: 1st of 1")
        second.close()  # its slot goes to the first at once
        settle(lambda: first.search_queue == "" and first.stats.simulations > held, "the first page's search back")
        assert pool.running == [first.session_id]
    finally:
        for st in both:
            st.close()


def test_a_mesh_search_takes_a_search_slot_queued_as_a_search_is(tmp_path):
    """Two pages on a server with one search slot. The second page's mesh search waits while
    the first page searches, its place in the card; it starts when the slot is free and keeps
    it to its end, the first page's search queued meanwhile. A page's own mesh search takes its
    own search's slot at once, that search held until the mesh search ends."""
    pool, turn_clock, first, second, settle = _two_pages_on_one_slot(tmp_path)
    both = (first, second)
    try:
        second.search_meshes(8, "2x4@6.25", 3, "4")
        place = "queued: 1st of 1 waiting for a search slot (one runs at a time on this server)"
        assert "meshes" in second.busy and second.mesh_card.job is None
        assert second.mesh_status.startswith(place), second.mesh_status
        turn_clock[0] += pool.slice_seconds  # the first's turn over: the mesh search starts
        settle(lambda: second.mesh_card.job is not None, "the queued mesh search to start")
        assert second.mesh_status.startswith("searching the "), second.mesh_status
        settle(lambda: first.search_queue.startswith("queued: 1st of 1") and second.mesh_rows,
               "the first page's search to wait, the mesh search's first round")
        held = first.runner.receive().stats.simulations
        turn_clock[0] += 10 * pool.slice_seconds  # the mesh search keeps its slot past any turn
        settle(lambda: "meshes" not in second.busy, "the mesh search")
        assert second.mesh_rows and second.message_level == "success", second.mesh_status
        assert first.runner.receive().stats.simulations == held  # held while the mesh search ran
        settle(lambda: first.search_queue == "" and first.stats.simulations > held, "the first page's search back")

        first.search_meshes(8, "2x4@6.25", 3, "4")  # its own search holds the slot: taken at once
        assert first.mesh_card.job is not None and first.mesh_status.startswith("searching the ")
        settle(lambda: first.search_queue.endswith("the page's mesh search has its slot until it ends"),
               "the page's search to lend its slot")
        settle(lambda: "meshes" not in first.busy, "the page's own mesh search")
        settle(lambda: first.search_queue == "" and pool.running == [first.session_id], "the page's search back")
    finally:
        for st in both:
            st.close()


def _two_pages_loading(turn_s: float, monkeypatch):
    """Page a's load holds its turn until released; page b then submits a load and a verify.
    Returns (a's release, b's verify done, what ran beside b's load, the results)."""
    import threading

    from partex.explorer import _loop

    monkeypatch.setattr(_loop, "PYTHON_TURNS", _loop.Turns(turn_s))
    a, b = _loop.Jobs("page-a"), _loop.Jobs("page-b")
    loading, release, verified, b_ran = (threading.Event() for _ in range(4))
    running: list[str] = []
    seen: dict[str, list[str]] = {}

    def a_load():
        running.append("a")
        loading.set()
        release.wait(60)
        running.remove("a")
        return "a loaded"

    def b_load():
        seen["b"] = list(running)  # what ran beside it
        b_ran.set()
        return "b loaded"

    a.submit("load", a_load, lambda v: None)
    assert loading.wait(60)
    b.submit("load", b_load, lambda v: None)
    b.submit("verify", lambda: verified.set() or "verified", lambda v: None)

    def results():
        deadline, out = time.monotonic() + 60, {}
        while len(out) < 3 and time.monotonic() < deadline:
            out.update({(j.name, f.kind): f.value for j in (a, b) for f in j.finished()})
            time.sleep(0.01)
        return out

    return release, verified, b_ran, seen, results


def test_pages_python_jobs_take_turns_and_a_verify_does_not_wait_for_them(monkeypatch):
    """Two pages' load jobs (Python the whole way) run one after the other within a turn;
    a verify (waiting on XLA) runs while a load holds the turn; each result reaches its page."""
    release, verified, b_ran, seen, results = _two_pages_loading(60.0, monkeypatch)
    assert verified.wait(60)  # not held by a's load
    assert "b" not in seen  # b's load waits its turn
    release.set()
    assert results() == {("page-a", "load"): "a loaded", ("page-b", "load"): "b loaded",
                         ("page-b", "verify"): "verified"}
    assert seen["b"] == []  # a's load had ended before b's began


def test_a_load_longer_than_its_turn_lets_the_next_one_run_beside_it(monkeypatch):
    """A load that holds the turn past its slice (a slow trace, or one its page no longer
    wants) keeps no other page's load waiting: the next runs beside it."""
    release, verified, b_ran, seen, results = _two_pages_loading(0.2, monkeypatch)
    assert b_ran.wait(60)  # while a's load still runs
    assert seen["b"] == ["a"]
    release.set()
    assert results()[("page-a", "load")] == "a loaded"
