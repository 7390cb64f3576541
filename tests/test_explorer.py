"""Browser tests of the explorer: a real ``partex serve`` server (``serve_command``) in a subprocess,
driven by Playwright with Debian's chromium (Playwright's own browser download does not
work here). Page state is read from the hidden Bokeh model ``partex-state`` (the session's
state as JSON). Nothing here is skipped: without chromium the tests fail.

Screenshots of the main views at 1440x900 land in tests/screenshots/ (gitignored), with
timings.json (first view after server start, the page's worst stall while searching).
"""

from __future__ import annotations

import re
import contextlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from playwright.sync_api import Page, sync_playwright

from partex import Plan
from partex.explorer import PING_JS, serve_command

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHOTS = ROOT / "tests" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1440, "height": 900}
# How long a test waits for something the page must do. Generous on purpose: an outcome never
# depends on how busy the machine is (a pass takes a second or two; a busy CI machine, much
# longer). How fast the page is, is measured and recorded (timings.json), not asserted.
WAIT_S = 180.0


def wait_until(predicate, timeout: float = WAIT_S, interval: float = 0.05, what: str = "condition"):
    """Poll predicate() until it returns something truthy; return that, or fail after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, proc: subprocess.Popen, url: str, log: pathlib.Path, started: float):
        self.proc, self.url, self.log, self.started = proc, url, log, started
        self.first_view_s: float | None = None
        self.up_s: float | None = None  # until the server answered
        self.sessions: pathlib.Path | None = None  # where its sessions are saved

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def start_server(tmp: pathlib.Path, sessions: pathlib.Path, **env_extra: str):
    """The explorer's server in a subprocess on a free port, saving sessions under ``sessions``
    (``env_extra``: more of its environment)."""
    port = _free_port()
    log = tmp / f"server-{port}.log"
    env = dict(os.environ, PARTEX_SESSIONS_DIR=str(sessions), JAX_PLATFORMS="cpu",
               PYTHONUNBUFFERED="1", **env_extra)
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(serve_command(port, session_lifetime_ms=1000), cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/app"

    def up():
        # a static file, not the app: each GET of /app makes a session that loads a model,
        # which on a busy machine only makes the next answer slower
        if proc.poll() is not None:
            raise AssertionError(f"panel serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/assets/logo.svg", timeout=30) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        wait_until(up, timeout=WAIT_S, interval=0.1, what="panel serve to answer")
        server = Server(proc, url, log, started)
        server.up_s = time.monotonic() - started
        server.sessions = sessions
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("explorer")
    # models of the page's own from the repository (scripts/tower.py, scripts/constrained_mlp.py)
    with start_server(tmp, tmp / "sessions", PARTEX_MODELS_DIR=str(ROOT)) as s:
        yield s


@pytest.fixture(scope="module")
def chromium():
    assert os.path.exists(CHROMIUM), f"{CHROMIUM} is missing: run `make chromium` (apt-get install chromium)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def state(page: Page) -> dict:
    text = page.evaluate("""() => {
        const doc = window.Bokeh && Bokeh.documents[0];
        const m = doc && doc.get_model_by_name('partex-state');
        return m ? m.text : null }""")
    return json.loads(text) if text else {}


# What went wrong in any page while a test ran: console errors, uncaught page errors, failed
# requests and requests that leave this host (the explorer must work air-gapped). Every
# browser test fails on any of them (``no_browser_errors``).
PROBLEMS: list[str] = []
WARNINGS: list[str] = []  # console warnings, counted for the notes, not failed on
LOCAL = ("http://127.0.0.1:", "http://localhost:", "ws://127.0.0.1:", "ws://localhost:", "data:", "blob:",
         "about:")


def watch(page: Page) -> Page:
    def console(msg):
        if msg.type == "error":
            PROBLEMS.append(f"console error: {msg.text}")
        elif msg.type == "warning":
            WARNINGS.append(msg.text)

    def request(req):
        if not req.url.startswith(LOCAL):
            PROBLEMS.append(f"request leaving the host: {req.url}")

    page.on("console", console)
    page.on("pageerror", lambda exc: PROBLEMS.append(f"page error: {exc} {getattr(exc, 'stack', '')[:1500]}"))
    page.on("requestfailed", lambda req: PROBLEMS.append(f"failed request: {req.url} ({req.failure})")
            if not req.url.startswith(LOCAL[-3:]) else None)
    page.on("request", request)
    return page


@pytest.fixture(scope="module", autouse=True)
def console_summary():
    """The console warnings of the whole module, counted (tests/screenshots/console.json)."""
    WARNINGS.clear()
    yield
    counts: dict[str, int] = {}
    for w in WARNINGS:
        counts[w[:200]] = counts.get(w[:200], 0) + 1
    SHOTS.mkdir(parents=True, exist_ok=True)
    (SHOTS / "console.json").write_text(json.dumps({"warnings": counts}, indent=1))


@pytest.fixture(autouse=True)
def no_browser_errors():
    PROBLEMS.clear()
    yield
    problems, counts = list(PROBLEMS), {}
    for p in problems:
        counts[p] = counts.get(p, 0) + 1
    assert not problems, "the pages reported:\n" + "\n".join(f"{n} x {p}" for p, n in counts.items())


def open_page(browser, server: Server) -> Page:
    ctx = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
    page = watch(ctx.new_page())
    page.goto(server.url)
    wait_until(lambda: state(page).get("phase") == "ready", what="the model to load")
    return page


@pytest.fixture
def tab(chromium, server):
    p = open_page(chromium, server)
    yield p
    p.context.close()


def memory_notes(page: Page) -> list:
    """The note written after each bar of the memory chart (a row's in note where it fits,
    in note_over where it does not)."""
    return page.evaluate("""() => {
        const fig = Bokeh.documents[0].get_model_by_name('partex-memory');
        const r = fig.renderers.find(r => r.data_source.data.note !== undefined);
        const d = r.data_source.data;
        return Array.from(d.note).map((n, i) => n || d.note_over[i]) }""")


def analyze_on(page: Page, model: str, hardware: str, budget: str = "", overrides: str = "") -> None:
    """Analyze ``model`` (with its config ``overrides``) on ``hardware`` under ``budget``
    (empty: the chip's HBM) from the sidebar, and wait until the page has it."""
    choose(page, "partex-model", model)
    if overrides:
        page.locator("input[placeholder='e.g. layers=4,batch=16']").fill(overrides)
    choose(page, "partex-hardware", hardware)
    box = page.locator("input[placeholder=\"empty: the chip's HBM\"]")
    box.fill(budget)
    box.press("Enter")
    click(page, "Analyze")
    wait_until(lambda: (lambda s: s.get("phase") == "ready" and model in str((s.get("model") or {}).get("spec"))
                        and s["config"]["hardware"] == hardware)(state(page)), timeout=2 * WAIT_S,
               what=f"{model} on {hardware}")


def click(page: Page, label: str) -> None:
    page.get_by_role("button", name=label, exact=True).click()


def set_model_value(page: Page, name: str, value) -> None:
    """Set a widget's value as the page would (the server hears of it at once)."""
    page.evaluate("([n, v]) => { Bokeh.documents[0].get_model_by_name(n).value = v }", [name, value])


def run_until(page: Page, predicate, what: str, timeout: float = WAIT_S) -> dict:
    click(page, "▶ Run")
    try:
        return wait_until(lambda: (lambda s: predicate(s) and s)(state(page)), timeout=timeout, what=what)
    finally:
        click(page, "❚❚ Pause")


def choose(page: Page, name: str, option: str) -> None:
    """Pick an option of a select by its label (or value), as the page would."""
    found = page.evaluate("""([name, want]) => {
        const m = Bokeh.documents[0].get_model_by_name(name);
        const o = m.options.find(o => Array.isArray(o) ? o.includes(want) : o === want);
        if (o === undefined) return false;
        const value = Array.isArray(o) ? o[0] : o;
        if (m.value !== value) m.value = value;
        return true }""", [name, option])
    assert found, f"{name} has no option {option!r}"


def select_group(page: Page, group: str) -> None:
    """Choose a group in the decision form (as a click on its node does) and wait until the
    server has it (the page's first render may still be setting the form)."""

    def chosen():
        choose(page, "partex-pin-group", group)
        return state(page)["selected"] == group

    wait_until(chosen, what=f"{group} to be selected")


def pin(page: Page, group: str, axis: str) -> None:
    select_group(page, group)
    choose(page, "partex-pin-axis", axis)
    wait_until(lambda: page.evaluate("Bokeh.documents[0].get_model_by_name('partex-pin-axis').value") == axis,
               what=f"axis {axis}")
    click(page, "Pin")
    wait_until(lambda: f"{group}->{axis}" in state(page)["pins"], what=f"{group}->{axis} to be pinned")


def alert_text(page: Page) -> str:
    return page.evaluate("Bokeh.documents[0].get_model_by_name('partex-alert').text")


# --------------------------------------------------------------------------- the tests

def test_page_opens_on_the_demo_transformer(chromium, server):
    page = open_page(chromium, server)
    try:
        server.first_view_s = time.monotonic() - server.started
        s = state(page)
        assert s["model"] == {"spec": "transformer", "preset": "tiny", "overrides": []}
        assert s["config"]["mesh"] == "data=4,model=2"
        assert set(s["baselines"]) >= {"replicated", "dp", "megatron", "zero3"}
        assert s["level"] == "success", s["message"]
        nodes = page.evaluate("""() => {
            const fig = Bokeh.documents[0].get_model_by_name('partex-graph');
            const r = fig.renderers.find(r => r.data_source.data.gid !== undefined);
            return Array.from(r.data_source.data.label) }""")
        assert {"batch", "seq", "d_model", "ffn", "heads", "vocab"} <= set(nodes)
        assert page.get_by_text("Named dimensions", exact=True).is_visible()
        _record(first_view_s=round(server.first_view_s, 2), server_up_s=round(server.up_s, 2))
    finally:
        page.context.close()


def test_search_improves_the_best_plan(tab):
    before = state(tab)
    assert before["simulations"] == 0 and not before["running"]
    start = before["best"]["step_time"] if before["best"] else float("inf")  # the search may seed one
    # simulations run too: the search's seed can set a best before its first simulation ends
    # (on a busy machine the Pause then came with none run)
    s = run_until(tab, lambda s: s["best"] is not None and s["best"]["step_time"] < start and s["simulations"] > 0,
                  what="the best plan to improve")
    assert s["best"]["fits"] and s["history"] >= 1
    wait_until(lambda: not state(tab)["running"], what="the search to pause")
    paused = state(tab)["simulations"]
    assert paused > before["simulations"]
    click(tab, "Step")
    wait_until(lambda: state(tab)["simulations"] >= paused + 50, what="one Step of 50 simulations")


def test_pin_a_decision_and_resume(tab):
    pin(tab, "ffn", "model")
    wait_until(lambda: "pinned ffn->model" in state(tab)["message"], what="the pin's message")
    s = run_until(tab, lambda s: s["best"] is not None and s["simulations"] >= 100,
                  what="the resumed search to find a plan")
    assert {"group": "ffn", "axis": "model", "pinned": True} in [
        {k: d[k] for k in ("group", "axis", "pinned")} for d in s["best"]["decisions"]]
    assert "ffn->model" in s["pins"]
    assert "from the pinned ffn->model" in s["message"]


def download_plan(page: Page, path: pathlib.Path) -> pathlib.Path:
    """Press Download plan JSON and save the file at ``path``."""
    with page.expect_download() as dl:
        page.get_by_text("Download plan JSON").click()
    dl.value.save_as(path)
    return path


def test_downloaded_plan_is_valid_and_carries_the_pin(tab, tmp_path):
    pin(tab, "heads", "model")
    run_until(tab, lambda s: s["best"] is not None, what="a plan to download")
    path = download_plan(tab, tmp_path / "plan.json")
    data = json.loads(path.read_text())
    assert data["format"] == "partex-plan"
    plan = Plan.load(path)
    assert any(d.group == "heads" and d.axis == "model" and d.pinned for d in plan.decisions)
    assert plan.mesh.text() == "data=4,model=2"
    assert "params/layers/0/wq" in plan.inputs


def test_bad_input_shows_a_message_and_the_session_goes_on(tab):
    tab.locator("input[type=file]").set_input_files(
        files=[{"name": "broken.json", "mimeType": "application/json", "buffer": b'{"format": "partex-plan", "ver'}])
    s = wait_until(lambda: (lambda s: s["level"] == "danger" and s)(state(tab)), what="an error message")
    assert "broken.json is not valid JSON" in s["message"]
    # the banner is its own model: its change reaches the page in a patch of its own
    shown = wait_until(lambda: (lambda t: "broken.json" in t and t)(alert_text(tab)), what="the banner's message")
    assert "Traceback" not in shown
    assert tab.get_by_role("alert").is_visible()

    # a file over the server's upload limit (4 MiB unless partex serve --max-upload says otherwise)
    tab.locator("input[type=file]").set_input_files(
        files=[{"name": "huge.json", "mimeType": "application/json", "buffer": b" " * (5 * 2**20)}])
    s = wait_until(lambda: (lambda s: "huge.json" in s["message"] and s)(state(tab)), what="the upload refused")
    assert s["level"] == "danger" and "huge.json is 5.0 MiB, over the 4.0 MiB this server takes" in s["message"], s
    wait_until(lambda: "over the 4.0 MiB" in alert_text(tab), what="the banner's message")

    mesh = tab.locator("input[placeholder='data=4,model=2']")
    mesh.fill("data=four")
    mesh.press("Enter")
    s = wait_until(lambda: (lambda s: "cannot parse mesh" in s["field_error"].get("mesh", "") and s)(state(tab)),
                   what="the mesh error")
    assert s["config"]["mesh"] == "data=4,model=2"  # the old mesh stays in effect
    mesh.fill("data=4,model=2")
    mesh.press("Enter")

    budget = tab.locator("input[placeholder=\"empty: the chip's HBM\"]")
    budget.fill("64KiB")
    budget.press("Enter")
    s = wait_until(lambda: (lambda s: "no baseline fits" in s["message"] and s["phase"] == "ready" and s)(state(tab)),
                   what="the budget warning")
    assert s["level"] == "warning"

    budget.fill("3MiB")
    budget.press("Enter")
    wait_until(lambda: state(tab)["config"]["budget"] == 3 * 2**20, what="the budget to be restored")

    # the page's own model: a file in the server's models folder (the repository here), and only there
    choose(tab, "partex-model", "your own model: file.py:function")
    custom = tab.locator("input[placeholder='my_model.py:make_step']")
    for text, why in (("os:abort", "is not a Python file in the models folder"),
                      ("/tmp/elsewhere.py:make", f"/tmp/elsewhere.py is outside {ROOT}"),
                      ("scripts/no_such_file.py:make", "model file scripts/no_such_file.py does not exist")):
        custom.fill(text)
        custom.press("Enter")
        click(tab, "Analyze")
        def refused(why=why):
            now = state(tab)
            return now if why in now["field_error"].get("custom", "") and now["phase"] == "ready" else None

        s = wait_until(refused, what=f"{text} refused")
        assert s["model"]["spec"] == "transformer" and s["message"].startswith("not analysed: "), s  # the model stays
        note = tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-field-error-model').text")
        assert why in note, note  # said at the field, in the page

    click(tab, "Step")
    wait_until(lambda: state(tab)["simulations"] >= 50, what="the session to go on")


def test_save_and_load_a_session(tab):
    pin(tab, "heads", "model")
    click(tab, "Step")
    saved = wait_until(lambda: state(tab)["simulations"] >= 50 and state(tab)["simulations"], what="a Step")
    set_model_value(tab, "partex-session-name", "browser-test")
    click(tab, "Save")
    wait_until(lambda: "saved session browser-test" in state(tab)["message"], what="the session to be saved")
    click(tab, "Release")  # heads->model is still chosen in the form
    wait_until(lambda: state(tab)["pins"] == [], what="the pin to be released")
    choose(tab, "partex-sessions", "browser-test")
    click(tab, "Load")
    # the search resumes where it was saved: its statistics come back with it
    s = wait_until(lambda: (lambda s: "loaded session browser-test" in s["message"] and s["simulations"] >= saved
                            and s)(state(tab)), what="the saved session to load")
    assert s["pins"] == ["heads->model"], s


def test_a_saved_session_loads_in_a_restarted_server(chromium, server, tab, tmp_path):
    """Sessions are files: a fresh server process (a restart) loads what the old one saved."""
    pin(tab, "ffn", "model")
    set_model_value(tab, "partex-session-name", "before-restart")
    click(tab, "Save")
    wait_until(lambda: "saved session before-restart" in state(tab)["message"], what="the session to be saved")
    with start_server(tmp_path, server.sessions) as fresh:
        page = open_page(chromium, fresh)
        try:
            assert state(page)["pins"] == []
            choose(page, "partex-sessions", "before-restart")
            click(page, "Load")
            s = wait_until(lambda: (lambda s: "loaded session before-restart" in s["message"] and s)(state(page)),
                           what="the saved session to load in the new server")
            assert "ffn->model" in s["pins"], s
        finally:
            page.context.close()


def _cli(*argv: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "partex", *argv, "--json"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_one_session_file_between_the_cli_and_the_explorer(chromium, server, tmp_path):
    """A search saved by `partex search` opens in the explorer and continues there; the
    session the explorer then saves resumes with `partex search --resume`."""
    server.sessions.mkdir(parents=True, exist_ok=True)
    cli_state = server.sessions / "from-cli.json"
    d = _cli("search", "transformer", "--mesh", "data=4,model=2", "--memory", "3MiB", "--simulations", "40",
             "--pin", "ffn=model", "--state", str(cli_state), "--out", str(tmp_path / "cli.json"))
    assert d["simulations"] == 40
    page = open_page(chromium, server)  # a fresh page lists the sessions folder as it is now
    try:
        choose(page, "partex-sessions", "from-cli")
        click(page, "Load")
        s = wait_until(lambda: (lambda s: "loaded session from-cli" in s["message"] and s["simulations"] >= 40
                                and s)(state(page)), what="the CLI's session to load")
        assert s["pins"] == ["ffn->model"] and s["config"]["budget"] == 3 * 1024**2, s
        click(page, "Step")  # it continues: 50 more simulations on the tree the CLI grew
        wait_until(lambda: state(page)["simulations"] >= 90, what="the loaded search to go on")
        set_model_value(page, "partex-session-name", "from-explorer")
        click(page, "Save")
        wait_until(lambda: "saved session from-explorer" in state(page)["message"], what="the explorer's save")
    finally:
        page.context.close()
    d = _cli("search", "transformer", "--resume", str(server.sessions / "from-explorer.json"), "--simulations",
             "10", "--out", str(tmp_path / "resumed.json"))
    assert d["simulations"] >= 100  # 40 by the CLI, 50+ in the explorer, 10 more here
    plan = Plan.load(tmp_path / "resumed.json")
    assert any(x.group == "ffn" and x.axis == "model" and x.pinned for x in plan.decisions)


def verify_in_page(tab, plan: str) -> dict:
    """Show a plan in the Plan view, press Verify, wait for XLA's verdict."""
    tab.get_by_role("button", name=plan, exact=True).click()
    click(tab, f"Verify '{plan}' with XLA")
    s = wait_until(lambda: (lambda s: s["verify"].startswith(("done", "failed")) and s)(state(tab)), timeout=600,
                   what="verify to finish")
    assert s["verify"].startswith("done"), s["message"]
    return s


def test_verify_puts_xla_beside_the_prediction(tab):
    verify_in_page(tab, "megatron")
    table = tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-verify-table').text")
    assert "peak memory per device" in table and "all-reduce bytes" in table


def test_verify_explains_which_line_made_each_collective(tab):
    """zero3 on the tiny transformer: XLA's collectives with their source lines and the
    decision behind each (the weight gathers: d_model on data), >= 90% of the bytes matched."""
    verify_in_page(tab, "zero3")
    head = tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-explain-head').text")
    table = tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-explain-table').text")
    share = int(head.split("</b>: ")[1].split("%")[0])
    assert share >= 90, head
    assert "_transformer.py:" in table and "params/layers/0/w1" in table and "d_model-&gt;data" in table, table
    tab.locator(".card-title", has_text="Predicted vs XLA").first.evaluate("e => e.scrollIntoView({block: 'start'})")
    SHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=SHOTS / "verify_explain_zero3.png")


def test_two_pages_have_independent_state(chromium, server, tab):
    other = open_page(chromium, server)
    try:
        pin(tab, "vocab", "model")
        run_until(tab, lambda s: s["simulations"] >= 100, what="the first tab's search")
        a, b = state(tab), state(other)
        assert a["session"] != b["session"]
        assert b["pins"] == [] and b["simulations"] == 0 and not b["running"]
        assert a["pins"] == ["vocab->model"]
    finally:
        other.context.close()


def test_the_page_answers_while_the_search_runs(tab):
    """The search runs in a process of its own, so the server's event loop stays free: while
    the search runs, the server answers every ping from the tab (a round trip through its
    event loop) and the search goes on meanwhile. How fast it answers depends on the machine:
    the round trips, the slowest callback and the loop's lag are recorded in timings.json
    (scripts/explorer_latency.py reports them), not asserted."""
    click(tab, "▶ Run")
    try:
        wait_until(lambda: state(tab)["simulations"] > 0, what="the search to start")
        before = state(tab)["simulations"]
        trips = tab.evaluate(PING_JS, 30)  # unanswered for 60 s: fewer than 30, fails below
        s = state(tab)
    finally:
        click(tab, "❚❚ Pause")
    assert len(trips) == 30, f"the server answered {len(trips)} of 30 pings while the search ran"
    assert s["running"] and s["simulations"] > before  # the search went on while the server answered
    assert s["search_pid"] != s["server_pid"]
    t = s["timings"]
    trips.sort()
    _record(ping_ms_median=round(trips[len(trips) // 2], 1), ping_ms_p90=round(trips[int(len(trips) * 0.9)], 1),
            ping_ms_max=round(trips[-1], 1), max_callback_ms=t["max_callback_ms"],
            max_loop_lag_ms=t["max_loop_lag_ms"], simulations_during_pings=s["simulations"] - before,
            load_average=os.getloadavg()[0])


def test_closing_a_tab_stops_its_search(chromium, server):
    page = open_page(chromium, server)
    click(page, "▶ Run")
    wait_until(lambda: state(page)["simulations"] > 0, what="the search to start")
    session = state(page)["session"]
    page.context.close()
    wait_until(lambda: f"search stopped (session {session})" in server.log_text(),
               what="the closed tab's search to stop")


def test_the_steps_own_shardings_show_as_the_users_pins(tab):
    choose(tab, "partex-model", "your own model: file.py:function")
    custom = tab.locator("input[placeholder='my_model.py:make_step']")
    custom.fill(str(ROOT / "scripts" / "constrained_mlp.py") + ":make")
    custom.press("Enter")
    click(tab, "Analyze")
    wait_until(lambda: "constrained_mlp.py:make" in str(state(tab)["model"]["spec"]) and state(tab)["phase"] == "ready",
               what="the constrained model to load")
    chips = tab.locator(".chip.user")
    wait_until(lambda: chips.count() == 2, what="the user's pins")
    texts = sorted(chips.all_inner_texts())
    # a dim a user sharding leaves replicated (w2's output dim under the jit's P("model", None))
    # is replicated in that value only: no pin on its group; x[0] shows by its title, its role
    assert texts == ["yours: batch→data", "yours: params/w1[1]→model"], texts
    assert "constrained_mlp.py:23" in chips.first.get_attribute("title")
    SHOTS.mkdir(parents=True, exist_ok=True)
    chips.first.scroll_into_view_if_needed()
    tab.screenshot(path=SHOTS / "user_shardings.png")


def test_a_tight_budget_shows_the_recompute_the_plan_takes(tab):
    """At 1 MiB per device no sharding alone fits the tiny transformer: the search's plan
    recomputes its layer stack, the plan shows the decision (a chip naming the stack) and
    what it saves, the memory bars give the peak without it, and the graph marks the
    layers' own groups with the kind."""
    budget = tab.locator("input[placeholder=\"empty: the chip's HBM\"]")
    budget.fill("1MiB")
    budget.press("Enter")
    wait_until(lambda: state(tab)["config"]["budget"] == 2**20 and state(tab)["phase"] == "ready",
               what="the 1 MiB budget")
    s = run_until(tab, lambda s: s["best"] is not None and any(d["axis"].startswith("recompute:")
                                                                 for d in s["best"]["decisions"]),
                  what="a plan that recomputes")
    assert s["best"]["fits"]
    chip = tab.locator(".chip.remat", has_text="stack0→recompute:").first  # the Plan card's
    wait_until(lambda: chip.count() > 0, what="the recompute chip")
    assert "2 layers from" in chip.get_attribute("title")
    head = tab.locator(".plan-head").first
    # (the plan may keep its optimizer state in host memory too)
    assert re.search(r"recompute (and host memory save|saves) ", head.inner_text()), head.inner_text()
    caption = tab.locator(".caption", has_text="What recompute and host memory save").first
    wait_until(lambda: caption.count() > 0 and "search:" in caption.inner_text(), what="the memory caption")
    notes = memory_notes(tab)
    assert any("without recompute" in n for n in notes), notes
    # the graph marks the groups local to the recomputed layers (ffn, heads), not batch
    nodes = tab.evaluate("""() => {
        const fig = Bokeh.documents[0].get_model_by_name('partex-graph');
        const r = fig.renderers.find(r => r.data_source.data.sub !== undefined);
        const d = r.data_source.data;
        return Object.fromEntries(Array.from(d.label).map((l, i) => [l, d.sub[i] || d.sub_rc[i]])) }""")
    rc = tab.evaluate("""() => {
        const d = Bokeh.documents[0].get_model_by_name('partex-graph').renderers
            .find(r => r.data_source.data.sub_rc !== undefined).data_source.data;
        return Array.from(d.label).filter((l, i) => d.sub_rc[i]) }""")
    assert "ffn" in rc and "batch" not in rc, rc  # drawn in the recompute colour
    kind = next(d["axis"] for d in s["best"]["decisions"] if d["axis"].startswith("recompute:")).split(":")[1]
    assert nodes["ffn"].endswith("↻ " + kind) and "↻" not in nodes["batch"], nodes
    SHOTS.mkdir(parents=True, exist_ok=True)
    tab.locator(".card-title", has_text="Named dimensions").first.evaluate("e => e.scrollIntoView({block: 'start'})")
    tab.screenshot(path=SHOTS / "recompute_graph.png")
    tab.locator(".card-title", has_text="Plan").first.evaluate("e => e.scrollIntoView({block: 'start'})")
    tab.screenshot(path=SHOTS / "recompute_plan.png")
    tab.locator(".card-title", has_text="Memory per device").first.evaluate("e => e.scrollIntoView({block: 'start'})")
    tab.screenshot(path=SHOTS / "recompute_memory.png")


def test_an_offload_decision_shows_as_a_recompute_one_with_its_host_memory(tab):
    """The scanned transformer on tpu-v5p at 700 KiB per device: the search keeps the layer
    stack's matmul outputs in host memory (``recompute:offload``) and the optimizer state
    there between steps (``memory:host``); each plan chip names what it covers and says where
    it goes, and the memory bar writes the host memory after it."""
    analyze_on(tab, "transformer-scan", "tpu-v5p", budget="700KiB")
    wait_until(lambda: state(tab)["config"]["budget"] == 700 * 1024, what="the 700 KiB budget")
    s = run_until(tab, lambda s: s["best"] is not None and {"recompute:offload", "memory:host"}
                  <= {d["axis"] for d in s["best"]["decisions"]}, what="a plan that offloads")
    assert s["best"]["fits"]
    chip = tab.locator(".chip.remat", has_text="stack0→recompute:offload").first
    wait_until(lambda: chip.count() > 0, what="the offload chip")
    assert "host memory" in chip.get_attribute("title")
    state_chip = tab.locator(".chip.remat", has_text="optimizer state→memory:host").first
    wait_until(lambda: state_chip.count() > 0, what="the optimizer state's chip")
    assert "kept in host memory between steps" in state_chip.get_attribute("title")
    notes = wait_until(lambda: (lambda n: n if n and any("on the host" in x for x in n) else None)(memory_notes(tab)),
                       what="host memory in the notes")
    assert any("on the host" in n for n in notes), notes
    SHOTS.mkdir(parents=True, exist_ok=True)
    tab.locator(".card-title", has_text="Plan").first.evaluate("e => e.scrollIntoView({block: 'start'})")
    chip.hover()
    tab.screenshot(path=SHOTS / "offload_plan.png")
    tab.locator(".card-title", has_text="Memory per device").first.evaluate("e => e.scrollIntoView({block: 'start'})")
    tab.screenshot(path=SHOTS / "offload_memory.png")


def test_screenshots_of_the_main_views(tab):
    SHOTS.mkdir(parents=True, exist_ok=True)
    pin(tab, "ffn", "model")
    run_until(tab, lambda s: s["best"] is not None and s["simulations"] >= 150, what="a plan to show")
    select_group(tab, "seq")  # the group with the attention conflict
    tab.mouse.move(0, 0)
    tab.screenshot(path=SHOTS / "overview.png")
    shots = {"overview.png"}
    for title, name in (("Named dimensions", "graph"), ("Search", "search"), ("Memory per device", "memory"),
                        ("Baselines", "baselines"), ("Plan", "plan"), ("Predicted vs XLA", "verify")):
        header = tab.locator(".card-title", has_text=title).first
        header.evaluate("e => { e.scrollIntoView({block: 'start'}); window.scrollTo(0, 0); }")
        tab.screenshot(path=SHOTS / f"{name}.png")
        shots.add(f"{name}.png")
    for f in shots:
        assert (SHOTS / f).stat().st_size > 10_000, f


def _record(**items) -> None:
    """Keep measurements next to the screenshots (and print them: `pytest -s`)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / "timings.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(items)
    path.write_text(json.dumps(data, indent=1))
    print(json.dumps(items), file=sys.stderr)


def test_bad_input_from_the_plan_and_verify_views_is_seen_where_the_user_is(chromium, server, tab):
    """With the main column scrolled to Verify (or Plan), a bad mesh or budget shows at the
    field typed in (outlined, its message under it, in view), once: no toast repeats it; the
    old mesh and budget stay in force; a good value clears the field's mark."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    for card, field, bad, shot in (("Predicted vs XLA", "data=4,model=2", "data=3,model=2", "bad_mesh_verify.png"),
                                   ("Plan", "empty: the chip's HBM", "lots", "bad_budget_plan.png")):
        tab.locator(".card-title", has_text=card).first.evaluate("e => e.scrollIntoView({block: 'start'})")
        box = tab.locator(f'input[placeholder="{field}"]')
        before = state(tab)
        box.fill(bad)
        box.press("Enter")
        s = wait_until(lambda: (lambda s: s.get("field_error") and s)(state(tab)), what=f"{bad!r} refused")
        assert s["config"] == before["config"], s  # the old ones in force
        name, text = next(iter(s["field_error"].items()))
        assert name == ("mesh" if "model" in bad else "budget"), s["field_error"]
        note = tab.locator("[role=alert]", has_text=text[:40])
        top = wait_until(lambda: note.count() and note.first.bounding_box(), what="the field's message")
        assert 0 <= top["y"] < VIEWPORT["height"], top  # in view, not scrolled away
        assert tab.locator("[data-toast]", has_text=text[:40]).count() == 0
        assert "invalid" in (box.evaluate("e => e.getRootNode().host.className") or "")
        tab.screenshot(path=SHOTS / shot)
        box.fill(field if "model" in bad else "3MiB")
        box.press("Enter")
        wait_until(lambda: (lambda s: not s.get("field_error") and "load" not in s["busy"])(state(tab)),
                   what="the mark to clear and the good value to load")


def _graph_nodes(page: Page) -> list[dict]:
    """The graph's drawn nodes: key, label, line under it, whether a cluster."""
    return page.evaluate("""() => {
        const r = Bokeh.documents[0].get_model_by_name('partex-graph').renderers
            .find(r => r.data_source.data.key !== undefined);
        const d = r.data_source.data;
        return Array.from(d.key).map((k, i) => ({key: k, label: d.label[i], sub: d.sub[i] || d.sub_rc[i],
                                                 cluster: d.gid[i] < 0})) }""")


def _load(page: Page, model: str = "", custom: str = "", timeout: float = 2 * WAIT_S) -> dict:
    if custom:
        choose(page, "partex-model", "custom")
        box = page.locator("input[placeholder='my_model.py:make_step']")
        box.fill(custom)
        box.press("Enter")
    else:
        choose(page, "partex-model", model)
    click(page, "Analyze")
    want = custom or model
    return wait_until(lambda: (lambda s: s.get("phase") == "ready" and want in str((s.get("model") or {}).get("spec"))
                               and s)(state(page)), timeout=timeout, what=f"{want} to load")


def _drawn_groups(nodes: list[dict]) -> int:
    return sum(int(n["sub"].split()[0]) if n["cluster"] else 1 for n in nodes)


def test_a_large_model_graph_is_clusters_that_open_and_a_search_finds_any_group(tab):
    """U-Net (52 groups) and a tower of 110 distinct blocks (222 groups): the first view
    draws at most 14 nodes, clusters counting the rest (every group drawn or counted);
    clicking a cluster opens it; the search box finds a group by a pytree path, opens the
    clusters around it and selects it."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    graph = tab.locator(".card-title", has_text="Named dimensions").first
    for spec, custom, total, shot in (("unet", "", 52, "graph_unet.png"),
                                      ("", "scripts/tower.py:make", 222, "graph_200.png")):
        _load(tab, spec, custom)
        legend = tab.locator(".legend").first
        wait_until(lambda: f"of {total} groups" in legend.inner_text(), what=f"the {total}-group legend")
        nodes = _graph_nodes(tab)
        assert len(nodes) <= 14 and any(n["cluster"] for n in nodes), nodes
        assert _drawn_groups(nodes) == total, nodes
        graph.evaluate("e => e.scrollIntoView({block: 'start'})")
        tab.mouse.move(0, 0)
        tab.screenshot(path=SHOTS / shot)
        if spec == "unet":  # its plan's tables fit their columns (long paths wrap, no column cut)
            click(tab, "megatron")
            wait_until(lambda: "params/" in tab.evaluate(
                "Bokeh.documents[0].get_model_by_name('partex-plan-specs').text"), what="the megatron plan")
            plan = tab.locator(".card-title", has_text="Plan").first
            plan.evaluate("e => e.scrollIntoView({block: 'start'})")
            tab.screenshot(path=SHOTS / "plan_unet.png")
            wide = tab.locator(".grid-wrap").evaluate_all(
                "els => els.filter(e => e.offsetParent && e.scrollWidth > e.clientWidth + 1).length")
            assert wide == 0, f"{wide} tables scroll sideways"
    # a click on a cluster (as a tap selects its index) opens it: its groups or sub-clusters show
    nodes = _graph_nodes(tab)
    big = max((i for i, n in enumerate(nodes) if n["cluster"]), key=lambda i: int(nodes[i]["sub"].split()[0]))
    tab.evaluate("""(i) => { const r = Bokeh.documents[0].get_model_by_name('partex-graph').renderers
        .find(r => r.data_source.data.key !== undefined); r.data_source.selected.indices = [i] }""", big)
    wait_until(lambda: nodes[big]["key"] not in [n["key"] for n in _graph_nodes(tab)], what="the cluster to open")
    assert _drawn_groups(_graph_nodes(tab)) == 222
    # the search box: a pytree path of block 57's gate weight -> its hidden dim, drawn and selected
    box = tab.locator("input[placeholder='find a group: its label or a pytree path']")
    box.fill("params/57/gate dim 1")
    box.press("Enter")
    s = wait_until(lambda: (lambda s: s["selected"] == "57/down[0]" and s)(state(tab)), what="the found group")
    labels = [n["label"] for n in _graph_nodes(tab)]
    assert "57/down[0]" in labels, labels  # (no two boxes overlap: tests/test_graph_layout.py)
    tab.mouse.move(0, 0)
    graph.evaluate("e => e.scrollIntoView({block: 'start'})")
    tab.screenshot(path=SHOTS / "graph_200_found.png")
    box.fill("no_such_thing")
    box.press("Enter")
    note = tab.locator(".field-msg", has_text="no_such_thing")
    wait_until(lambda: note.count() > 0, what="the search's message")
    assert state(tab)["selected"] == s["selected"]  # nothing else changed


def test_compare_two_plans_side_by_side(tab):
    run_until(tab, lambda s: s["best"] is not None and s["simulations"] >= 100, what="a plan to compare")
    choose(tab, "partex-compare-a", "search")
    choose(tab, "partex-compare-b", "dp")
    table = lambda: tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-compare-decisions').text")  # noqa: E731
    wait_until(lambda: "<th>dp</th>" in table() or ">dp<" in table(), what="the dp column")
    head = tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-compare-head').text")
    assert "search" in head and "dp" in head, head
    colls = tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-compare-collectives').text")
    assert "all-reduce" in colls and "step time" in colls, colls
    tab.locator(".card-title", has_text="Compare").first.evaluate("e => e.scrollIntoView({block: 'start'})")
    tab.mouse.move(0, 0)
    tab.screenshot(path=SHOTS / "compare.png")


def test_teach_walks_through_the_model_pointing_at_each_card(tab):
    """Each step of the walkthrough scrolls its card into view and outlines it; its actions
    show on the page (the conflicted group in the Decision card, a baseline in the Plan card)."""
    click(tab, "Teach")
    head = lambda: tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-teach-head').text")  # noqa: E731
    wait_until(lambda: "Step 1 of" in head(), what="the first step")
    total = int(head().split("Step 1 of ")[1].split("<")[0])
    assert total >= 7
    pointer = lambda: tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-teach-target').text")  # noqa: E731
    seen, pointed = [], ""
    for i in range(total):
        wait_until(lambda: f"Step {i + 1} of {total}" in head(), what=f"step {i + 1}")
        # the pointer's text is new on every step shown ("card|n"); the step's head and its
        # pointer reach the browser in separate messages, so wait for the pointer's own
        pointed = wait_until(lambda: (lambda t: t if t and t != pointed else None)(pointer()),
                             what=f"step {i + 1}'s pointer")
        wait_until(lambda: tab.evaluate("window._pxTeach ? window._pxTeach.style.outlineWidth : ''") == "3px",
                   what=f"step {i + 1}'s card outlined")
        target = pointed.split("|")[0]
        card = tab.locator(".card-title", has_text=target).first
        wait_until(lambda: (lambda b: b and -5 <= b["y"] < VIEWPORT["height"] - 60)(card.bounding_box()),
                   what=f"{target} scrolled into view (at {card.bounding_box()})")
        seen.append(target)
        if target == "Decision" and "conflict" in head().lower():
            assert state(tab)["selected"] == "seq"  # the conflicted group shown
        tab.mouse.move(0, 0)
        tab.screenshot(path=SHOTS / f"teach_{i + 1}.png")
        if i + 1 < total:
            click(tab, "Next ▶")
    assert {"Named dimensions", "Decision", "Plan", "Memory per device", "Predicted vs XLA", "Compare"} <= set(seen), seen
    click(tab, "Close")
    wait_until(lambda: not tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-teach-target').text"),
               what="the walkthrough to close")
    assert not tab.evaluate("!!window._pxTeach")  # the outline cleared


def test_host_memory_is_written_apart_from_the_device_bars(tab):
    """A llama whose remat policy offloads q/k/v to host memory, on tpu-v5p: each memory bar
    is the device's, and the host memory the plan holds is written after it."""
    analyze_on(tab, "llama", "tpu-v5p", overrides="remat=qkv_proj_offloaded,seq=64")
    notes = wait_until(lambda: (lambda n: n if n and all("on the host" in x for x in n) else None)(memory_notes(tab)),
                       what="host memory in the notes")
    assert all(" + " in n for n in notes), notes
    caption = tab.locator(".caption", has_text="offloaded to host memory").first
    wait_until(lambda: caption.count() > 0, what="the memory caption on host memory")
    SHOTS.mkdir(parents=True, exist_ok=True)
    tab.locator(".card-title", has_text="Memory per device").first.evaluate("e => e.scrollIntoView({block: 'start'})")
    tab.screenshot(path=SHOTS / "host_memory.png")
