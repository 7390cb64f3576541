"""A new user's first hour in the explorer, in one browser tab and one server: the
walkthrough, Run and Pause, a pin, Download, the same plan uploaded back, another mesh,
another model, Verify, Compare, and bad inputs with their corrections. Every step must leave
the page usable (no stuck "loading", no error left standing once corrected), the browser
must see no console error and no request leave the host (``no_browser_errors``), and the
server's log must hold no traceback. Screenshots: tests/screenshots/newcomer_*.png.
"""

from __future__ import annotations

import json

from partex import Plan

from test_explorer import (  # noqa: F401  (fixtures: pytest finds them by name here)
    SHOTS, chromium, choose, click, console_summary, no_browser_errors, open_page, pin, run_until, server, state,
    wait_until,
)


def _shot(page, card: str, name: str) -> None:
    page.locator(".card-title", has_text=card).first.evaluate("e => e.scrollIntoView({block: 'start'})")
    page.mouse.move(0, 0)
    page.screenshot(path=SHOTS / f"newcomer_{name}.png")


def _text(page, name: str) -> str:
    return page.evaluate("(n) => Bokeh.documents[0].get_model_by_name(n).text", name)


def _ready(page, what: str, check=lambda s: True) -> dict:
    return wait_until(lambda: (lambda s: s["phase"] == "ready" and "load" not in s["busy"] and check(s) and s)(
        state(page)), what=what)


def _fix(page, placeholder: str, bad: str, good: str, field: str) -> None:
    """Type a bad value: it is refused at its field and the old configuration stays; type
    the good one: the mark clears, the search is rebuilt on it and no error is left standing."""
    box = page.locator(f'input[placeholder="{placeholder}"]')
    before = state(page)["config"]
    box.fill(bad)
    box.press("Enter")
    s = wait_until(lambda: (lambda s: field in s["field_error"] and s)(state(page)), what=f"{bad!r} refused")
    assert s["config"] == before, s  # the configuration in force did not change
    box.fill(good)
    box.press("Enter")
    # accepted: the mark gone and the search rebuilt on it (a load job, which a busy machine
    # takes a while to finish)
    s = wait_until(lambda: (lambda s: not s["field_error"] and s["phase"] == "ready" and "load" not in s["busy"]
                            and s)(state(page)), what=f"{good!r} accepted")
    assert s["level"] != "danger", s["message"]


def test_a_newcomers_first_hour(chromium, server, tmp_path):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = open_page(chromium, server)
    try:
        # the walkthrough, start to end: it leaves the page as it found it
        click(page, "Teach")
        wait_until(lambda: "Step 1 of" in _text(page, "partex-teach-head"), what="the walkthrough")
        total = int(_text(page, "partex-teach-head").split("Step 1 of ")[1].split("<")[0])
        for i in range(1, total):
            click(page, "Next ▶")
            wait_until(lambda: f"Step {i + 1} of {total}" in _text(page, "partex-teach-head"), what=f"step {i + 1}")
        click(page, "Finish ✓")
        wait_until(lambda: not _text(page, "partex-teach-target"), what="the walkthrough to close")
        wait_until(lambda: page.get_by_role("button", name="Verify 'search' with XLA").count() == 1,
                   what="the search's plan shown again")

        # Run, Pause: the message's count is the page's
        run_until(page, lambda s: s["best"] is not None and s["simulations"] >= 100, what="a plan")
        wait_until(lambda: (lambda s: not s["running"] and s["message"].startswith(
            f"paused after {s['simulations']:,} simulations"))(state(page)), what="the pause's message")

        # a pin, and the search resumed from it
        pin(page, "heads", "model")
        n = state(page)["simulations"]
        run_until(page, lambda s: s["best"] is not None and s["simulations"] >= n + 50 and any(
            d["group"] == "heads" and d["pinned"] for d in s["best"]["decisions"]), what="a plan with the pin")
        _shot(page, "Named dimensions", "search")

        # Download, then upload the same file
        with page.expect_download() as dl:
            page.get_by_text("Download plan JSON").click()
        path = tmp_path / "plan.json"
        dl.value.save_as(path)
        plan = Plan.load(path)
        assert any(d.group == "heads" and d.axis == "model" and d.pinned for d in plan.decisions)
        page.locator("input[type=file]").set_input_files(
            files=[{"name": "plan.json", "mimeType": "application/json", "buffer": path.read_bytes()}])
        s = wait_until(lambda: (lambda s: s["uploaded"] and s)(state(page)), what="the upload")
        assert s["uploaded"] == "data=4,model=2" and s["level"] == "success", s["message"]
        _shot(page, "Plan", "uploaded")

        # another mesh (the upload is still this model's plan), then another model
        mesh = page.locator("input[placeholder='data=4,model=2']")
        mesh.fill("data=2,model=4")
        mesh.press("Enter")
        s = _ready(page, "the new mesh", lambda s: s["config"]["mesh"] == "data=2,model=4")
        assert s["uploaded"] == "data=4,model=2" and s["level"] != "danger", s["message"]
        choose(page, "partex-model", "mlp")
        click(page, "Analyze")
        s = _ready(page, "the mlp", lambda s: s["model"]["spec"] == "mlp")
        assert s["uploaded"] is None and s["level"] != "danger", s["message"]  # another model's plan is dropped
        click(page, "Step")
        wait_until(lambda: state(page)["simulations"] >= 50, what="the mlp's search to step")

        # Verify a baseline against XLA
        page.get_by_role("button", name="megatron", exact=True).click()
        click(page, "Verify 'megatron' with XLA")
        s = wait_until(lambda: (lambda s: s["verify"].startswith(("done", "failed")) and s)(state(page)),
                       timeout=600, what="verify to finish")
        assert s["verify"].startswith("done"), s["message"]
        assert "peak memory per device" in _text(page, "partex-verify-table")
        _shot(page, "Predicted vs XLA", "verify")

        # Compare two plans
        choose(page, "partex-compare-a", "dp")
        choose(page, "partex-compare-b", "megatron")
        wait_until(lambda: "megatron" in _text(page, "partex-compare-head") and "dp" in _text(
            page, "partex-compare-head"), what="dp against megatron")
        _shot(page, "Compare", "compare")

        # bad inputs and their corrections
        _fix(page, "data=4,model=2", "data=3,model=2", "data=4,model=2", "mesh")
        _fix(page, "empty: the chip's HBM", "lots", "3MiB", "budget")
        _fix(page, "e.g. layers=4,batch=16", "layers=x", "", "overrides")
        page.locator("input[type=file]").set_input_files(
            files=[{"name": "notes.txt", "mimeType": "text/plain", "buffer": b"not a plan"}])
        s = wait_until(lambda: (lambda s: s["level"] == "danger" and s)(state(page)), what="the bad upload refused")
        assert "notes.txt" in s["message"] and "Traceback" not in s["message"]
        n = state(page)["simulations"]  # before the click: a Step of the tiny mlp may be done before a read after it
        click(page, "Step")  # the session goes on
        wait_until(lambda: state(page)["simulations"] >= n + 50, what="the search to go on")
        _shot(page, "Named dimensions", "end")
        final = state(page)
        assert final["phase"] == "ready" and final["model"]["spec"] == "mlp", final
    finally:
        page.context.close()
    log = server.log_text()
    assert "Traceback" not in log and "internal error" not in log, log[-4000:]
    (SHOTS / "newcomer.json").write_text(json.dumps({"simulations": final["simulations"]}))
