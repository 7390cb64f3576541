"""Browser tests of the rules the whole page keeps, driven as in tests/test_explorer.py (its
server, browser, page-state probe and failure on any console error or request leaving the
host), each doing what a user did and asserting what they should have seen:

- a change that is refused leaves every field and card on the state in force and says so,
  at the field and in the banner; a pin a change drops is said in the banner;
- only Analyze puts another model on the page; the model on the page named again in the
  picker comes back with its own preset and budget;
- a mesh axis has one colour on every mesh; the memory bars' labels stay legible over the
  budget's line; a button's description stays in the window; the walkthrough covers neither
  a card nor the sidebar and never scrolls the window; the Compare card's headline is not cut;
- a budget refused is said as it was typed; Verify says it is verifying while XLA compiles;
- the page's callbacks stay under 200 ms of the server's time.

Screenshots land in tests/screenshots/rules_*.png.
"""

from __future__ import annotations

import html
import io
import re

from PIL import Image

from partex.explorer import PING_JS

import test_explorer
from test_explorer import (SHOTS, VIEWPORT, _record, alert_text, analyze_on, choose, click, download_plan, pin, run_until, state,
                           wait_until)

# test_explorer's fixtures (its server, browser and tab; the check for console errors): pytest
# finds them here by name
chromium, server, tab = test_explorer.chromium, test_explorer.server, test_explorer.tab
console_summary, no_browser_errors = test_explorer.console_summary, test_explorer.no_browser_errors

MESH = "input[placeholder='data=4,model=2']"
PIPELINE = "input[placeholder='none; e.g. stack0:stage:8']"
BUDGET = "input[placeholder=\"empty: the chip's HBM\"]"
OVERRIDES = "input[placeholder='e.g. layers=4,batch=16']"
# the server's time (its loop thread's CPU) one callback of the page may take
CALLBACK_MS = 200

# Elements of the page (through the shadow roots the cards and widgets sit in) that match a
# CSS selector, with their box and, for a text, whether it is cut (wider than its box).
FIND = """(selector) => {
    const out = [];
    function walk(root) {
        for (const el of root.querySelectorAll("*")) {
            if (el.matches(selector)) {
                const r = el.getBoundingClientRect();
                out.push({x: r.left, y: r.top, right: r.right, bottom: r.bottom, text: el.textContent,
                          cut: el.scrollWidth > el.clientWidth + 1});
            }
            if (el.shadowRoot) walk(el.shadowRoot);
        }
    }
    walk(document);
    return out;
}"""


# The graph legend's axes (the entries with a colour swatch): name -> its colour.
LEGEND = """() => {
    const out = {};
    function walk(root) {
        for (const el of root.querySelectorAll("*")) {
            if (el.matches(".legend .lg") && el.querySelector("i[style]"))
                out[el.textContent.trim()] = el.querySelector("i").style.background;
            if (el.shadowRoot) walk(el.shadowRoot);
        }
    }
    walk(document);
    return out;
}"""


def _rgb(colour: str) -> str:
    """'#ea580c' as the page's style writes it: 'rgb(234, 88, 12)'."""
    return "rgb({}, {}, {})".format(*(int(colour[i:i + 2], 16) for i in (1, 3, 5)))


def _enter(page, selector: str, value: str) -> None:
    box = page.locator(selector)
    box.fill(value)
    box.press("Enter")


def _ready(page, check, what: str) -> dict:
    return wait_until(lambda: (lambda s: s["phase"] == "ready" and "load" not in s["busy"] and check(s) and s)(
        state(page)), what=what)


def _value(page, name: str):
    return page.evaluate("(n) => Bokeh.documents[0].get_model_by_name(n).value", name)


def _text(page, name: str) -> str:
    return page.evaluate("(n) => Bokeh.documents[0].get_model_by_name(n).text", name)


def _banner(page) -> str:
    """The banner's HTML, its text unescaped."""
    return html.unescape(alert_text(page))


def _marked(page, selector: str) -> bool:
    """Whether the form field is outlined as refused (its widget's ``invalid`` class)."""
    return "invalid" in (page.locator(selector).evaluate("e => e.getRootNode().host.className") or "")


def _shot(page, card: str, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    if card:
        page.locator(".card-title", has_text=card).first.evaluate(
            "e => { e.scrollIntoView({block: 'start'}); window.scrollTo(0, 0); }")
    page.mouse.move(0, 0)
    page.screenshot(path=SHOTS / f"rules_{name}.png")


def _overlap(a: dict, b: dict) -> bool:
    return a["x"] < b["right"] and b["x"] < a["right"] and a["y"] < b["bottom"] and b["y"] < a["bottom"]


def _fast(s: dict, what: str) -> None:
    """The page's callbacks took the server under CALLBACK_MS each (its loop thread's CPU time:
    on a busy machine the wall time also counts other processes'; both are recorded)."""
    t = s["timings"]
    _record(**{f"{what}_max_callback_ms": t["max_callback_ms"], f"{what}_max_callback_cpu_ms": t["max_callback_cpu_ms"]})
    assert t["max_callback_cpu_ms"] < CALLBACK_MS, t


# --------------------------------------------------------------------------- refused changes

def test_a_mesh_refused_with_the_pipeline_leaves_every_card_on_the_step_in_force(tab, tmp_path):
    """On a pipelined step (stack0 over stage on stage=2,fsdp=4, a pin, the plan uploaded
    back), the mesh data=2,fsdp=2,model=2 is refused: no card moves, the pipeline field says
    why and how to fix it, the mesh field is marked as not applied, and the banner (no longer
    the upload's green line) says what was refused and what stays. Clearing the pipeline
    applies the mesh, and the banner says the pin and the pipeline's own layers→stage went."""
    analyze_on(tab, "transformer-scan", "tpu-v4", "16MiB", "layers=4")
    _enter(tab, MESH, "stage=2,fsdp=4")
    _ready(tab, lambda s: s["config"]["mesh"] == "stage=2,fsdp=4", "the stage mesh")
    _enter(tab, PIPELINE, "stack0:stage:4:full")
    _ready(tab, lambda s: s["config"]["pipeline"] == "stack0:stage:4:full", "the pipelined step")
    pin(tab, "ffn", "fsdp")
    run_until(tab, lambda s: s["best"] is not None, what="a plan of the pipelined step")
    plan = download_plan(tab, tmp_path / "plan.json")
    tab.locator("input[type=file]").set_input_files(str(plan))
    wait_until(lambda: "uploaded plan" in _banner(tab) and "stage=2,fsdp=4" in _banner(tab),
               what="the upload's message")
    before = state(tab)

    _enter(tab, MESH, "data=2,fsdp=2,model=2")
    s = wait_until(lambda: (lambda s: "pipeline" in s["field_error"] and s)(state(tab)), what="the mesh refused")
    assert s["config"] == before["config"] and "load" not in s["busy"] and s["pins"] == ["ffn->fsdp"], s
    assert s["field_error"]["mesh"] == "not applied: still stage=2,fsdp=4", s["field_error"]
    assert "has no axis 'stage'" in s["field_error"]["pipeline"], s["field_error"]
    assert "clear the pipeline" in s["field_error"]["pipeline"], s["field_error"]
    assert _marked(tab, MESH) and _marked(tab, PIPELINE)
    banner = wait_until(lambda: (lambda t: "not applied" in t and t)(_banner(tab)), what="the refusal's banner")
    assert "alert refused" in banner and "✓" not in banner and "uploaded plan" not in banner, banner
    assert "the mesh (data=2,fsdp=2,model=2) has no axis 'stage'" in banner, banner
    assert "the page stays on stage=2,fsdp=4 with pipeline stack0:stage:4:full" in banner, banner
    assert "stage=2,fsdp=4" in _text(tab, "kpis")  # the cards are on the step in force, as the banner says
    note = _text(tab, "partex-field-error-mesh")
    assert "mesh: not applied: still stage=2,fsdp=4" in note and "has no axis" in note, note
    assert tab.locator("[data-toast]", has_text="not applied").count() == 0  # said at the field and the banner
    _shot(tab, "", "refused_mesh")

    _enter(tab, PIPELINE, "")
    s = _ready(tab, lambda s: s["config"]["mesh"] == "data=2,fsdp=2,model=2", "the mesh without the pipeline")
    assert s["config"]["pipeline"] is None and s["field_error"] == {} and s["pins"] == [], s
    assert s["level"] == "warning" and ("another pipeline is another step, with groups of its own: dropped pin "
                                        "ffn->fsdp (pin again what still applies); the old step's own layers→stage "
                                        "went with it") in s["message"], s["message"]
    assert "dropped pin ffn->fsdp" in _banner(tab)
    _shot(tab, "", "refused_then_applied")
    _fast(state(tab), "pipelined_step_refused_then_applied")


def test_a_budget_refused_is_said_as_typed(tab):
    _enter(tab, BUDGET, "-1GiB")
    s = wait_until(lambda: (lambda s: "budget" in s["field_error"] and s)(state(tab)), what="the budget refused")
    assert s["field_error"]["budget"] == "memory size '-1GiB' is not a positive size: write e.g. 16GiB, 512MiB or 1.5e9"
    assert s["config"]["budget"] == 3 * 2**20 and s["level"] == "refused"
    assert "1073741824" not in _text(tab, "partex-field-error-mesh") + _banner(tab)
    _shot(tab, "", "refused_budget")
    _enter(tab, BUDGET, "3MiB")
    s = wait_until(lambda: (lambda s: not s["field_error"] and s)(state(tab)), what="the budget in force again")
    assert s["level"] == "success" and "refused" not in _banner(tab), s["message"]


# --------------------------------------------------------------------------- the model on the page

def test_only_analyze_replaces_the_model_and_what_another_model_drops_is_said(tab):
    """The page on llama (7b) with a pin and a few simulations; the picker on llama (tiny).
    Clearing an override and pressing Enter leaves the 7b session as it was (only Analyze
    loads another model). Your own model, then llama again: the picker is on 7b and its
    budget again. Another model analysed: the banner says which pins it dropped."""
    choose(tab, "partex-model", "llama (demo)")
    wait_until(lambda: "7b" in tab.evaluate("Bokeh.documents[0].get_model_by_name('partex-preset').options"),
               what="llama's presets")
    choose(tab, "partex-preset", "7b")
    click(tab, "Analyze")
    _ready(tab, lambda s: s["model"]["preset"] == "7b", "llama (7b)")
    assert _value(tab, "partex-budget") == ""  # the chip's HBM, a full-size preset's
    pin(tab, "ffn", "model")
    click(tab, "Step")
    before = wait_until(lambda: (lambda s: s["simulations"] > 0 and not s["running"] and s)(state(tab)),
                        what="a few simulations")

    choose(tab, "partex-preset", "tiny")
    wait_until(lambda: (lambda m: "press Analyze to load llama (tiny)" in m and "the page still shows llama (7b)" in m)(
        state(tab)["message"]), what="the note that Analyze loads it")
    _enter(tab, OVERRIDES, "layers=2")
    _enter(tab, OVERRIDES, "")
    tab.evaluate(PING_JS, 3)  # the server has handled the Enter (its events come in order)
    s = state(tab)
    assert s["model"] == before["model"] and "load" not in s["busy"] and s["phase"] == "ready", s
    assert s["pins"] == ["ffn->model"] and s["simulations"] >= before["simulations"], s
    assert s["message"] == "press Analyze to load llama (tiny); the page still shows llama (7b)", s["message"]
    _shot(tab, "", "enter_keeps_the_model")

    choose(tab, "partex-model", "your own model: file.py:function")
    wait_until(lambda: "press Analyze to load your model" in state(tab)["message"], what="your own model's note")
    choose(tab, "partex-model", "llama (demo)")
    wait_until(lambda: _value(tab, "partex-preset") == "7b", what="the page's preset again")
    s = wait_until(lambda: (lambda s: "press Analyze" not in s["message"] and s)(state(tab)),
                   what="the note gone: the picker names the page's model")
    assert _value(tab, "partex-budget") == "" and s["model"] == before["model"], s

    choose(tab, "partex-model", "transformer (demo)")
    click(tab, "Analyze")
    s = _ready(tab, lambda s: s["model"]["spec"] == "transformer", "the transformer")
    assert s["pins"] == [] and s["level"] == "warning", s
    assert ("another model: llama (7b)'s decisions do not carry over: dropped pin ffn->model (pin again what "
            "still applies)") in s["message"], s["message"]
    _shot(tab, "", "another_model_drops_pins")
    _fast(state(tab), "llama_7b_then_transformer")


# --------------------------------------------------------------------------- views

def test_an_axis_keeps_its_colour_on_every_mesh(tab):
    """model is one colour on data=4,model=2 and on data=2,fsdp=2,model=2 (in the legend and
    on a node pinned to it); so is data."""
    pin(tab, "ffn", "model")
    seen = []
    for mesh in ("data=4,model=2", "data=2,fsdp=2,model=2"):
        if state(tab)["config"]["mesh"] != mesh:
            _enter(tab, MESH, mesh)
            _ready(tab, lambda s, mesh=mesh: s["config"]["mesh"] == mesh and s["pins"] == ["ffn->model"], mesh)

        def drawn(mesh=mesh):
            legend = tab.evaluate(LEGEND)
            fills = tab.evaluate("""() => {
                const d = Bokeh.documents[0].get_model_by_name('partex-graph').renderers
                    .find(r => r.data_source.data.gid !== undefined).data_source.data;
                return Object.fromEntries(Array.from(d.label).map((l, i) => [l, d.fill[i]])) }""")
            axes = mesh.replace("=", ",").split(",")[::2]
            # drawn once the pinned ffn is in model's colour (the legend writes rgb(), the graph hex)
            return (all(a in legend for a in axes) and _rgb(fills["ffn"]) == legend["model"]) and (legend, fills)

        legend, fills = wait_until(drawn, what=f"the legend of {mesh}")
        seen.append((legend, fills))
        _shot(tab, "Named dimensions", f"axis_colours_{len(seen)}")
    (legend_a, fills_a), (legend_b, fills_b) = seen
    assert legend_a["model"] == legend_b["model"] and legend_a["data"] == legend_b["data"], (legend_a, legend_b)
    assert len(set(legend_b.values())) == len(legend_b), legend_b  # three axes, three colours
    assert fills_a["ffn"] == fills_b["ffn"], (fills_a["ffn"], fills_b["ffn"])


def test_the_memory_bars_labels_stay_legible_over_the_budget_line(tab):
    """At 4 MiB the budget's dashed red line runs through some bars' labels (dp+remat's,
    zero3+remat's): where a label spans it, none of the line's red shows through the label."""
    _enter(tab, BUDGET, "4MiB")
    _ready(tab, lambda s: s["config"]["budget"] == 4 * 2**20, "the 4 MiB budget")
    tab.locator(".card-title", has_text="Memory per device").first.evaluate("e => e.scrollIntoView({block: 'start'})")
    tab.mouse.move(0, 0)

    def laid_out():
        # the budget line's x and each row's label span and middle, in the window's pixels
        return tab.evaluate("""() => {
            const fig = Bokeh.documents[0].get_model_by_name('partex-memory');
            const view = Bokeh.index.find_one(fig);
            if (!view || !fig.y_range.factors.length) return null;
            const box = view.el.getBoundingClientRect(), frame = view.frame;
            const span = fig.center.find(m => m.constructor.name === 'Span');
            const d = fig.renderers.find(r => r.data_source.data.note !== undefined).data_source.data;
            const ctx = document.createElement('canvas').getContext('2d');
            ctx.font = '12px helvetica';
            const rows = Array.from(d.row).map((row, i) => {
                const note = d.note[i] || d.note_over[i];
                const x = box.left + frame.x_scale.compute(d.total[i]) + 6;
                return {row, note, x, right: x + ctx.measureText(note).width,
                        y: box.top + frame.y_scale.compute(row)} });
            return {line: box.left + frame.x_scale.compute(span.location), rows} }""")

    layout = wait_until(laid_out, what="the memory chart")
    crossed = [r for r in layout["rows"] if r["x"] + 4 < layout["line"] < r["right"] - 4]
    assert crossed, layout  # at 4 MiB the line crosses some labels
    shot = Image.open(io.BytesIO(tab.screenshot())).convert("RGB")
    SHOTS.mkdir(parents=True, exist_ok=True)
    shot.save(SHOTS / "rules_memory_labels.png")
    for r in crossed:
        x, y = round(layout["line"]), round(r["y"])
        red = [(i, j) for i in range(x - 1, x + 2) for j in range(y - 3, y + 4)
               if (lambda p: p[0] > 180 and p[1] < 110 and p[2] < 110)(shot.getpixel((i, j)))]
        assert not red, f"the budget line shows through {r['row']}'s label {r['note']!r} at {red}"


def test_a_buttons_description_stays_in_the_window(tab):
    """The descriptions of the buttons near the window's right edge (the Meshes card's Search
    meshes, the Decision card's Release) show on their left, in the window."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    for card, label in (("Meshes", "Search meshes"), ("Decision", "Release")):
        tab.locator(".card-title", has_text=card).first.evaluate("e => e.scrollIntoView({block: 'start'})")
        tab.get_by_role("button", name=label, exact=True).hover()
        tip = wait_until(lambda: next((t for t in tab.evaluate(FIND, ".bk-tooltip-content") if t["right"] > t["x"]),
                                      None), what=f"{label}'s description")
        tab.screenshot(path=SHOTS / f"rules_tooltip_{label.split()[0].lower()}.png")  # the pointer on the button
        assert 0 <= tip["x"] and tip["right"] <= VIEWPORT["width"], (label, tip)
        tab.mouse.move(0, 0)
        wait_until(lambda: not any(t["right"] > t["x"] for t in tab.evaluate(FIND, ".bk-tooltip-content")),
                   what=f"{label}'s description to go")


def test_the_walkthrough_covers_no_card_nor_the_sidebar_and_never_scrolls_the_window(tab):
    """Every step: the window is not scrolled (only the main column is), and the walkthrough's
    panel overlaps neither the card it points at nor the sidebar's sections (it sits between
    them, in the sidebar); after Finish the window is still where it was."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    click(tab, "Teach")
    head = lambda: _text(tab, "partex-teach-head")  # noqa: E731
    wait_until(lambda: "Step 1 of" in head(), what="the first step")
    total = int(head().split("Step 1 of ")[1].split("<")[0])
    for i in range(total):
        step = f"Step {i + 1} of {total}"
        wait_until(lambda step=step: step in head(), what=step)
        mark = f"|{i + 1}"
        target = wait_until(lambda mark=mark: (lambda t: t.endswith(mark) and t)(_text(tab, "partex-teach-target")),
                            what=f"{step}'s card").split("|")[0]
        wait_until(lambda: tab.evaluate("window._pxTeach ? window._pxTeach.style.outlineWidth : ''") == "3px",
                   what=f"{step}'s card outlined")
        (panel,) = [p for p in tab.evaluate(FIND, ".px-teach") if p["right"] > p["x"]]
        cards = [c for c in tab.evaluate(FIND, ".card-title") if c["text"].strip() == target]
        sections = tab.evaluate(FIND, ".side-section")
        assert tab.evaluate("[window.scrollX, window.scrollY, document.scrollingElement.scrollTop]") == [0, 0, 0]
        assert cards and not _overlap(panel, cards[0]), (panel, cards)
        assert not any(_overlap(panel, s) for s in sections), (panel, sections)
        assert 0 <= panel["y"] and panel["bottom"] <= VIEWPORT["height"], panel
        tab.mouse.move(0, 0)
        tab.screenshot(path=SHOTS / f"rules_teach_{i + 1}.png")
        click(tab, "Finish ✓" if i + 1 == total else "Next ▶")
    wait_until(lambda: not _text(tab, "partex-teach-target"), what="the walkthrough to close")
    assert tab.evaluate("[window.scrollX, window.scrollY, document.scrollingElement.scrollTop]") == [0, 0, 0]


def test_the_compare_headline_is_not_cut(tab):
    """Compare megatron+remat with zero3+remat: every figure and line of the headline shows
    whole (none cut with an ellipsis)."""
    choose(tab, "partex-compare-a", "megatron+remat")
    choose(tab, "partex-compare-b", "zero3+remat")
    wait_until(lambda: "zero3+remat" in _text(tab, "partex-compare-head"), what="the two plans compared")
    _shot(tab, "Compare", "compare_head")
    texts = wait_until(lambda: [t for t in tab.evaluate(FIND, ".kpis.wrap .k-sub, .kpis.wrap .k-value")
                                if t["right"] > t["x"]], what="the headline drawn")
    assert len(texts) == 10 and not [t["text"] for t in texts if t["cut"]], texts
    assert any(re.search(r"iB → .+iB per device", t["text"]) for t in texts), texts


def test_verify_says_it_is_verifying(tab):
    """While XLA compiles the dp plan, the Verify card's tables say it is verifying it, not
    "press Verify"; then they hold XLA's figures."""
    tab.get_by_role("button", name="dp", exact=True).click()
    click(tab, "Verify 'dp' with XLA")
    # (XLA's compile runs in a fresh process: seconds, JAX's import alone)
    table = wait_until(lambda: (lambda t: "verifying" in t and t)(_text(tab, "partex-verify-table")),
                       what="the table to say it is verifying")
    assert state(tab)["verify"].startswith("running")
    assert "verifying the dp plan: XLA is compiling it" in table and "press Verify" not in table, table
    assert "verifying the dp plan" in _text(tab, "partex-explain-table")
    _shot(tab, "Predicted vs XLA", "verifying")
    s = wait_until(lambda: (lambda s: s["verify"].startswith(("done", "failed")) and s)(state(tab)), timeout=600,
                   what="verify to finish")
    assert s["verify"].startswith("done") and "peak memory per device" in _text(tab, "partex-verify-table"), s
