"""Browser tests of the walkthrough (Teach) and of the page's messages, driven as in
tests/test_explorer.py (its server, browser, page-state probe and failure on any console
error or request leaving the host): the walkthrough's panel never covers the card a step
points at and leaves the page as it found it; a bad input is said at its field and in the
banner, with no toast; the pause's count is the KPI's; a full-size preset says its budget
and a mesh that fits.

Screenshots of every step of the walkthrough land in tests/screenshots/teach_step_*.png.
"""

from __future__ import annotations

import re

from test_explorer import (  # noqa: F401  (fixtures: chromium, server, tab, no_browser_errors, console_summary)
    SHOTS, VIEWPORT, alert_text, chromium, choose, click, console_summary, no_browser_errors, run_until, server,
    state, tab, wait_until,
)

# The rectangles (viewport coordinates) of the walkthrough's overlay and of the card whose
# title is given: the card found from its title, as a user reads it, through shadow roots.
RECTS = """(title) => {
    function find(root, test) {
        for (const el of root.querySelectorAll("*")) {
            if (test(el)) return el;
            if (el.shadowRoot) { const hit = find(el.shadowRoot, test); if (hit) return hit; }
        }
        return null;
    }
    const has = (name) => (el) => el.classList && el.classList.contains(name);
    let card = find(document, (e) => has("card-title")(e) && e.textContent.trim() === title);
    while (card && !has("px-card")(card))
        card = card.parentElement || (card.getRootNode() instanceof ShadowRoot ? card.getRootNode().host : null);
    const pop = find(document, has("px-teach"));
    const box = (el) => { if (!el) return null; const r = el.getBoundingClientRect();
                          return {x: r.left, y: r.top, right: r.right, bottom: r.bottom}; };
    return {card: box(card), pop: box(pop)};
}"""


def _overlap(a: dict, b: dict) -> bool:
    return a["x"] < b["right"] and b["x"] < a["right"] and a["y"] < b["bottom"] and b["y"] < a["bottom"]


def _box(bb: dict) -> dict:
    return {"x": bb["x"], "y": bb["y"], "right": bb["x"] + bb["width"], "bottom": bb["y"] + bb["height"]}


def _text(page, name: str) -> str:
    return page.evaluate("(n) => Bokeh.documents[0].get_model_by_name(n).text", name)


def _value(page, name: str):
    return page.evaluate("(n) => Bokeh.documents[0].get_model_by_name(n).value", name)


def test_teach_never_covers_its_target_says_what_compare_shows_and_leaves_the_page_as_it_was(tab):
    """For every step the overlay's box is clear of the card the step points at (and, on
    the Verify step, of the Verify button); the Compare step names the plans and figures the
    Compare card shows; Finish puts back the shown plan, the selected group and the compared
    plans, so Verify verifies the plan the user had chosen."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    before = state(tab)
    verify_btn = tab.get_by_role("button", name="Verify 'search' with XLA")
    assert verify_btn.count() == 1  # the search's plan is the one shown
    # the Compare card follows the search's plan in its own patch: read it once it has
    wait_until(lambda: _value(tab, "partex-compare-a") == "search", what="Compare's A to follow the search")
    compare_before = (_value(tab, "partex-compare-a"), _value(tab, "partex-compare-b"))
    click(tab, "Teach")
    wait_until(lambda: "Step 1 of" in _text(tab, "partex-teach-head"), what="the first step")
    total = int(_text(tab, "partex-teach-head").split("Step 1 of ")[1].split("<")[0])
    for i in range(total):
        wait_until(lambda: f"Step {i + 1} of {total}" in _text(tab, "partex-teach-head"), what=f"step {i + 1}")
        target = wait_until(lambda: (lambda t: t.endswith(f"|{i + 1}") and t)(_text(tab, "partex-teach-target")),
                            what=f"step {i + 1}'s card").split("|")[0]

        def placed():
            r = tab.evaluate(RECTS, target)
            return r if r["card"] and r["pop"] and r["pop"]["right"] > r["pop"]["x"] and not _overlap(
                r["card"], r["pop"]) else None

        try:
            rects = wait_until(placed, what=f"the overlay off {target}")
        finally:
            tab.mouse.move(0, 0)
            tab.screenshot(path=SHOTS / f"teach_step_{i + 1}.png")
        pop = rects["pop"]
        assert 0 <= pop["y"] and pop["bottom"] <= VIEWPORT["height"] and 0 <= pop["x"], pop  # all of it in view
        if target == "Predicted vs XLA":
            btn = tab.get_by_role("button", name="Verify 'zero3' with XLA")
            assert not _overlap(_box(btn.bounding_box()), pop), (btn.bounding_box(), pop)
        if target == "Compare":
            body = _text(tab, "partex-teach-step")
            a, b = _value(tab, "partex-compare-a"), _value(tab, "partex-compare-b")
            assert (a, b) == ("megatron", "zero3")
            assert f"A is <b>{a}</b> and B is <b>{b}</b>" in body, body
            head, colls = _text(tab, "partex-compare-head"), _text(tab, "partex-compare-collectives")
            # the step's figures are the card's: "X → Y" as its tiles write them, or A's and
            # B's cells of its table (the communication per step)
            pairs = re.findall(r"(\d[\d.]* [^\s,<]+) → (\d[\d.]* [^\s,<]+)", body)
            assert len(pairs) == 3, body
            for x, y in pairs:
                assert f"{x} → {y}" in head or (f">{x}<" in colls and f">{y}<" in colls), (x, y, head, colls)
        if i + 1 < total:
            click(tab, "Next ▶")
    click(tab, "Finish ✓")
    wait_until(lambda: not _text(tab, "partex-teach-target"), what="the walkthrough to close")
    after = wait_until(lambda: (lambda s: s["selected"] == before["selected"] and s)(state(tab)),
                       what="the selected group put back")
    # the compared plans come back in the Compare card's own patch, after the selection's
    wait_until(lambda: (_value(tab, "partex-compare-a"), _value(tab, "partex-compare-b")) == compare_before,
               what=f"Compare to show {compare_before} again")
    wait_until(lambda: verify_btn.count() == 1, what="Verify to verify the search's plan again")
    assert after["selected"] == before["selected"]


def test_a_bad_input_is_said_at_its_field_and_in_the_banner_and_clears_when_fixed(tab):
    """A bad mesh: the field is outlined with its message under it, and the banner says it was
    not applied and what stays (no toast: the field says it where the user typed). The good
    mesh clears the mark and the banner says again what it said. A bad config override shows
    at the overrides field, and Enter there applies the overrides to the model on the page."""
    loaded = alert_text(tab)
    mesh = tab.locator("input[placeholder='data=4,model=2']")
    mesh.fill("data=four")
    mesh.press("Enter")
    note = tab.locator("[role=alert]", has_text="mesh: cannot parse mesh")
    wait_until(lambda: note.count() == 1 and note.first.is_visible(), what="the mesh's message at its field")
    assert tab.locator("[data-toast]", has_text="cannot parse mesh").count() == 0
    banner = wait_until(lambda: (lambda t: "not applied: cannot parse mesh" in t and t)(alert_text(tab)),
                        what="the refusal in the banner")
    assert "the page stays on data=4,model=2" in banner and state(tab)["level"] == "refused", banner
    mesh.fill("data=4,model=2")
    mesh.press("Enter")
    wait_until(lambda: not state(tab)["field_error"] and note.count() == 0, what="the mark to clear")
    wait_until(lambda: alert_text(tab) == loaded, what="the banner's line before the refusal")

    overrides = tab.locator("input[placeholder='e.g. layers=4,batch=16']")
    overrides.fill("layers=x")
    overrides.press("Enter")
    s = wait_until(lambda: (lambda s: s["field_error"].get("overrides") and s)(state(tab)),
                   what="the override refused at its field")
    assert "bad value 'x'" in s["field_error"]["overrides"] and s["model"]["overrides"] == []
    wait_until(lambda: tab.locator("[role=alert]", has_text="config overrides: bad value 'x'").count() == 1,
               what="its message")
    assert s["message"].startswith("not analysed: bad value 'x'") and s["message"].endswith(
        "the page stays on transformer (tiny)"), s["message"]
    overrides.fill("layers=1")
    overrides.press("Enter")  # no Analyze: Enter applies it to the model on the page
    wait_until(lambda: (lambda s: s["model"]["overrides"] == ["layers=1"] and s["phase"] == "ready"
                        and not s["field_error"])(state(tab)), what="the override applied by Enter")


def test_the_pause_message_counts_what_the_kpi_shows(tab):
    run_until(tab, lambda s: s["simulations"] >= 100, what="the search to run")
    s = wait_until(lambda: (lambda s: not s["running"] and s["message"].startswith("paused after") and s)(state(tab)),
                   what="the pause")

    def agreed():
        s = state(tab)
        n = f"{s['simulations']:,}"
        kpi = _text(tab, "kpis")
        return s["message"].startswith(f"paused after {n} simulations") and f">{n}<" in kpi and s

    wait_until(agreed, what=f"the message's count to be the KPI's (message: {state(tab)['message']!r})")


def test_a_full_size_preset_says_its_budget_and_a_mesh_that_fits(tab):
    """The full-size U-Net on the default mesh: the message says the budget became the
    chip's HBM, that no baseline fits there and on which mesh one does; Run and Pause keep
    that warning, adding the pause's count."""
    choose(tab, "partex-model", "unet")
    choose(tab, "partex-preset", "full")
    wait_until(lambda: "budget: the chip's HBM, 32.0 GiB, for a full-size preset" in state(tab)["message"],
               what="the budget said in words")
    click(tab, "Analyze")
    s = wait_until(lambda: (lambda s: s["phase"] == "ready" and s["model"]["preset"] == "full" and s)(state(tab)),
                   what="the full-size U-Net")
    warning = s["message"]
    assert s["level"] == "warning" and "no baseline fits the budget of 32.0 GiB" in warning, warning
    assert re.search(r"on data=\d+,model=\d+ one does: try that mesh", warning), warning
    # a warning shows as a toast too, fixed in the window's top right corner
    toast = tab.locator("[data-toast]", has_text="no baseline fits")
    wait_until(lambda: toast.count() == 1 and toast.first.is_visible(), what="the warning's toast")
    box = toast.first.bounding_box()
    assert box is not None and 0 <= box["y"] < VIEWPORT["height"] / 2 and box["x"] > VIEWPORT["width"] / 2, box
    SHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=SHOTS / "toast_warning.png")
    run_until(tab, lambda s: s["simulations"] > 0, what="a simulation")
    s = wait_until(lambda: (lambda s: not s["running"] and "paused after" in s["message"] and s)(state(tab)),
                   what="the pause")
    assert s["level"] == "warning" and s["message"].startswith(warning), s["message"]
    wait_until(lambda: f"paused after {state(tab)['simulations']:,} simulations" in state(tab)["message"],
               what="the pause's count")
