"""The explorer on measured hardware: a profile offered in the hardware field (``partex serve
--hardware-profile``), and the Baselines card's Measure action, which runs the listed plans
on this machine's devices (here simulated CPU devices) and shows each one's measured step
time beside its prediction. A real server and Debian's chromium, as tests/test_explorer.py;
the screenshot lands in tests/screenshots/measure.png."""

from __future__ import annotations

import pytest

from partex._profile import from_measurements, load_measurements

from test_explorer import (SHOTS, analyze_on, click, console_summary, no_browser_errors, open_page,  # noqa: F401
                           start_server, state, wait_until)
from test_explorer import chromium  # noqa: F401  (the browser fixture)

from conftest import ROOT

PROFILE_NAME = "NVIDIA H200 (profile)"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("measure")
    profile = tmp / "h200.json"
    from_measurements(load_measurements(ROOT / "tests" / "fixtures" / "h200" / "micro.json"),
                      source="micro.json").save(profile)
    with start_server(tmp, tmp / "sessions", PARTEX_HARDWARE_PROFILES=str(profile)) as s:
        yield s


def test_a_profile_prices_the_page_and_measure_runs_the_plans(chromium, server):  # noqa: F811
    page = open_page(chromium, server)
    try:
        options = page.evaluate("() => Bokeh.documents[0].get_model_by_name('partex-hardware').options")
        assert PROFILE_NAME in str(options) and "tpu-v4" in str(options)
        analyze_on(page, "mlp", PROFILE_NAME, budget="64MiB")
        s = state(page)
        assert s["config"]["hardware"] == PROFILE_NAME and s["baselines"]
        click(page, "Measure on this machine")
        done = wait_until(lambda: (lambda st: str(st.get("measure", "")).startswith(("done", "failed"))
                                   and "measure" not in st["busy"] and st)(state(page)), what="the plans to be measured")
        assert done["measure"].startswith("done"), done["measure"]
        measured = done["measured"]
        assert set(measured) >= set(done["baselines"]) - {k for k, v in measured.items() if v is None}
        for name, m in measured.items():
            assert m["error"] is None, (name, m["error"])
            assert m["step_time_s"] > 0 and m["predicted_step_time_s"] > 0 and m["platform"] == "cpu"
            assert m["devices"] == 8 and m["time_ratio"] is not None
        table = wait_until(lambda: (lambda t: "pred/meas" in t and t)(page.evaluate(
            "Bokeh.documents[0].get_model_by_name('partex-baselines').text")), what="the measured column")
        assert table.count("pred/meas") == len(measured)
        page.locator(".card-title", has_text="Baselines").first.evaluate("e => e.scrollIntoView({block: 'start'})")
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "measure.png"), full_page=False)
    finally:
        page.context.close()
