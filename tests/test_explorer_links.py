"""Browser tests of links to a page's state, driven as in tests/test_explorer.py (its server,
browser, page-state probe and failure on any console error or request leaving the host): a
link copied from one page opens the same state in another, a saved session's too, and a bad
link says what in it was wrong and opens the rest.

Screenshots land in tests/screenshots/link_*.png.
"""

from __future__ import annotations

import urllib.parse

import test_explorer
from test_explorer import (SHOTS, VIEWPORT, alert_text, analyze_on, click, pin, select_group, set_model_value, state,
                           wait_until, watch)

# test_explorer's fixtures (its server, browser and the check for console errors): pytest finds
# them here by name
chromium, server = test_explorer.chromium, test_explorer.server
console_summary, no_browser_errors = test_explorer.console_summary, test_explorer.no_browser_errors

MESH = "input[placeholder='data=4,model=2']"
MARGIN = "input[placeholder='0.1']"
OVERRIDES = "input[placeholder='e.g. layers=4,batch=16']"
# what of a page's state a link carries, as the probe shows it
CARRIED = ("model", "config", "pins", "forbidden", "opened_session", "link")


def forbid(page, group: str, axis: str) -> None:
    select_group(page, group)
    test_explorer.choose(page, "partex-pin-axis", axis)
    wait_until(lambda: page.evaluate("Bokeh.documents[0].get_model_by_name('partex-pin-axis').value") == axis,
               what=f"axis {axis}")
    click(page, "Forbid")
    wait_until(lambda: f"{group}->{axis}" in state(page)["forbidden"], what=f"{group}->{axis} to be forbidden")


def type_in(page, selector: str, text: str) -> None:
    box = page.locator(selector)
    box.fill(text)
    box.press("Enter")


def copy_link(page) -> str:
    """Press Copy link and return what it put in the clipboard (the field shows the same)."""
    field = lambda: page.evaluate("Bokeh.documents[0].get_model_by_name('partex-link').value")  # noqa: E731
    wait_until(lambda: state(page)["link"] and field().endswith("?" + state(page)["link"]), what="the link")
    page.get_by_role("button", name="Copy link", exact=True).click()
    wait_until(lambda: "copied" in page.evaluate("Bokeh.documents[0].get_model_by_name('partex-link-note').text"),
               what="the link to be copied")
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied == field(), (copied, field())
    return copied


def open_link(context, url: str):
    page = watch(context.new_page())
    page.goto(url)
    wait_until(lambda: (lambda s: s.get("phase") == "ready" and not s.get("busy") and s.get("link"))(state(page)),
               what="the link's state to load")
    return page


# the text selected in the page's link field ('' for none)
SELECTED_LINK = """() => {
    const walk = (root) => {
        for (const el of root.querySelectorAll("textarea")) if (el.value.includes("?model=")) return el;
        for (const el of root.querySelectorAll("*")) {
            if (el.shadowRoot) { const hit = walk(el.shadowRoot); if (hit) return hit; }
        }
        return null;
    };
    const el = walk(document);
    return el ? el.value.slice(el.selectionStart, el.selectionEnd) : "";
}"""


def sidebar_shot(page, name: str, note: str = "copied to the clipboard") -> None:
    """The sidebar scrolled to the Link section's note, in tests/screenshots/<name>.png."""
    page.get_by_text(note).scroll_into_view_if_needed()
    page.screenshot(path=SHOTS / name)


def test_a_copied_link_opens_the_same_state_in_a_new_tab(chromium, server):
    ctx = chromium.new_context(viewport=VIEWPORT)
    ctx.grant_permissions(["clipboard-read", "clipboard-write"])
    page = watch(ctx.new_page())
    try:
        page.goto(server.url)
        wait_until(lambda: state(page).get("phase") == "ready", what="the model to load")
        analyze_on(page, "transformer", "a100-40gb", budget="8MiB")
        type_in(page, OVERRIDES, "layers=3")  # Enter: the model on the page again, with them
        wait_until(lambda: (state(page)["model"] or {}).get("overrides") == ["layers=3"] and
                   state(page)["phase"] == "ready", what="the overrides")
        type_in(page, MESH, "data=2,model=4")
        type_in(page, MARGIN, "0.2")
        wait_until(lambda: (lambda c: c["mesh"] == "data=2,model=4" and c["margin"] == 0.2)(state(page)["config"]),
                   what="the new mesh and margin")
        pin(page, "ffn", "model")
        forbid(page, "heads", "data")
        before = state(page)
        assert before["model"] == {"spec": "transformer", "preset": "tiny", "overrides": ["layers=3"]}
        url = copy_link(page)
        assert url.startswith(server.url + "?") and "pin=ffn-%3Emodel" in url and "forbid=heads-%3Edata" in url, url
        sidebar_shot(page, "link_copied.png")

        other = open_link(ctx, url)
        after = state(other)
        assert {k: after[k] for k in CARRIED} == {k: before[k] for k in CARRIED}, (after, before)
        assert after["message"].startswith("opened a link: transformer (tiny) [layers=3]"), after["message"]
        assert after["level"] == "success" and after["field_error"] == {}
        # the forms show the link's state, and the search starts from its pins
        shown = other.evaluate("""() => Object.fromEntries(['partex-model', 'partex-preset', 'partex-overrides',
            'partex-mesh', 'partex-hardware', 'partex-budget', 'partex-margin'].map(
            n => [n, Bokeh.documents[0].get_model_by_name(n).value]))""")
        assert shown == {"partex-model": "transformer", "partex-preset": "tiny", "partex-overrides": "layers=3",
                         "partex-mesh": "data=2,model=4", "partex-hardware": "a100-40gb", "partex-budget": "8MiB",
                         "partex-margin": "0.2"}, shown
        s = test_explorer.run_until(other, lambda s: s["best"] is not None and s["simulations"] >= 20,
                                    what="the search from the link's pins")
        taken = {(d["group"], d["axis"]) for d in s["best"]["decisions"] if d["pinned"]}
        assert ("ffn", "model") in taken and ("heads", "data") not in taken, s["best"]

        # a saved session, loaded, then a forbid released: the link loads it with the page's pins
        set_model_value(page, "partex-session-name", "linked")
        click(page, "Save")
        wait_until(lambda: "saved session linked" in state(page)["message"], what="the session to be saved")
        test_explorer.choose(page, "partex-sessions", "linked")
        click(page, "Load")
        wait_until(lambda: state(page)["opened_session"] == "linked" and state(page)["phase"] == "ready",
                   what="the saved session to load")
        select_group(page, "heads")
        test_explorer.choose(page, "partex-pin-axis", "data")
        click(page, "Release")
        wait_until(lambda: state(page)["forbidden"] == [], what="the forbid to be released")
        before = state(page)
        url = copy_link(page)
        assert "session=linked" in url and "forbid" not in url, url
        third = open_link(ctx, url)
        after = state(third)
        assert {k: after[k] for k in CARRIED} == {k: before[k] for k in CARRIED}, (after, before)
        assert "opened a link: loaded session linked" in after["message"], after["message"]
    finally:
        ctx.close()


def test_a_bad_link_says_what_was_wrong_and_opens_the_rest(chromium, server):
    query = urllib.parse.urlencode([("model", "no-such-model"), ("mesh", "data=four"), ("hardware", "a100-40gb"),
                                    ("budget", "8MiB"), ("pin", "nope->model"), ("pin", "ffn->model"),
                                    ("colour", "blue")])
    ctx = chromium.new_context(viewport=VIEWPORT)
    # as on a plain http address other than localhost: no clipboard API for the page
    ctx.add_init_script("Object.defineProperty(window, 'isSecureContext', {get: () => false})")
    page = open_link(ctx, f"{server.url}?{query}")
    try:
        s = wait_until(lambda: (lambda s: s["field_error"] and s)(state(page)), what="the mesh field's mark")
        assert s["model"]["spec"] == "transformer" and s["config"]["mesh"] == "data=4,model=2"  # the defaults
        assert s["config"]["hardware"] == "a100-40gb" and s["config"]["budget"] == 8 * 2**20  # the rest applied
        assert s["pins"] == ["ffn->model"], s["pins"]
        assert "cannot parse mesh 'data=four'" in s["field_error"]["mesh"], s["field_error"]
        assert s["level"] == "warning"
        for said in ("the link's model 'no-such-model' is none of the page's", "the link's mesh 'data=four' was not "
                     "applied", "the page opened on data=4,model=2", "the link's pin nope->model was not applied: "
                     "unknown dimension 'nope'", "the link's 'colour' is no parameter partex reads"):
            assert said in s["message"], (said, s["message"])
        shown = wait_until(lambda: (lambda t: "no-such-model" in t and t)(alert_text(page)), what="the banner")
        assert "Traceback" not in shown
        assert page.get_by_role("alert").first.is_visible()
        # the mesh field keeps the link's text, marked as a refused input's
        assert page.locator(MESH).input_value() == "data=four"
        page.screenshot(path=SHOTS / "link_bad.png")

        # Copy link with no clipboard API: the link is selected in its field, and copied where
        # the browser still lets a page copy a selection
        page.get_by_role("button", name="Copy link", exact=True).click()
        note = wait_until(lambda: page.evaluate("Bokeh.documents[0].get_model_by_name('partex-link-note').text"),
                          what="the copy's note")
        assert "copied to the clipboard" in note or "copy it with Ctrl+C" in note, note
        selected = page.evaluate(SELECTED_LINK)
        assert selected == s["link"] or selected.endswith("?" + s["link"]), (selected, s["link"])
        sidebar_shot(page, "link_no_clipboard.png", note="copied to the clipboard" if "copied" in note else "Ctrl+C")
    finally:
        ctx.close()
