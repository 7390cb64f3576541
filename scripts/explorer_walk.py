"""A walk through every card and action of the explorer on one model, as a user would take
it: each step's screenshot, wall time and the browser's console errors, and at the end the
page's own timings of its callbacks on the server's event loop (``partex-state``'s
``timings``: the slowest callback in wall and CPU time, and which one; the loop's largest lag).

Starts ``partex serve`` on a free port (8 simulated CPU devices, sessions in a temporary
folder), opens the page in headless Chromium at 1440x900, analyzes ``--model`` with
``--preset`` on ``--mesh`` and then takes each step: Run, Pause, Step; the Decision card (pin
a group to an axis, forbid one, release the pin); the graph (its search box, a click on a
group); the memory bars and the Baselines; the Plan card; the Meshes card (a short mesh
search, Use this mesh on a row with the most axes); Compare (swap); Verify with XLA; Measure;
the Teach walkthrough; download the plan, upload it back and take a search step; save and load
a session; Copy link; another hardware; another budget. Prints a table, writes it to
OUT/walk.json and each step's PNG to OUT; the server's log is OUT/server.log. Exits 1 if the
browser reported an error or a callback held the loop over ``--limit-ms``.

    .venv/bin/python scripts/explorer_walk.py [--out build/walk] [--model llama] [--preset 7b]
        [--mesh data=2,fsdp=2,model=2] [--limit-ms 200]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import signal
import sys
import tempfile
import time
from typing import Callable

from playwright.sync_api import Page, sync_playwright

from _browser import CHROMIUM, CHROMIUM_ARGS, VIEWPORT, chromium_missing, free_port, page_state, served, wait

ROOT = pathlib.Path(__file__).resolve().parents[1]
LONG = float(os.environ.get("WALK_LONG", 900.0))  # s: the longest any step may wait for the page (a 7b model's load or compile on a busy machine)


class Walk:
    """The page and what each step left: its name, wall time, screenshot and console errors."""

    def __init__(self, page: Page, out: pathlib.Path):
        self.page, self.out = page, out
        self.steps: list[dict] = []
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))

    # ------------------------------------------------------------------ the page
    def state(self) -> dict:
        return page_state(self.page)

    def until(self, predicate: Callable[[dict], object], what: str, timeout: float = LONG) -> dict:
        return wait(lambda: (lambda s: predicate(s) and s)(self.state()), timeout, what, "explorer_walk")

    def js(self, code: str, arg=None):
        return self.page.evaluate(code, arg)

    def model_value(self, name: str):
        return self.js("(n) => Bokeh.documents[0].get_model_by_name(n).value", name)

    def set_value(self, name: str, value) -> None:
        """Set a widget's value as the page does (the server hears of it at once)."""
        self.js("([n, v]) => { Bokeh.documents[0].get_model_by_name(n).value = v }", [name, value])

    def choose(self, name: str, option: str) -> None:
        """Pick an option of a select by its value or label."""
        found = self.js("""([name, want]) => {
            const m = Bokeh.documents[0].get_model_by_name(name);
            const o = m.options.find(o => Array.isArray(o) ? o.includes(want) : o === want);
            if (o === undefined) return false;
            const value = Array.isArray(o) ? o[0] : o;
            if (m.value !== value) m.value = value;
            return true }""", [name, option])
        if not found:
            raise SystemExit(f"explorer_walk: {name} has no option {option!r}")

    def click(self, label: str) -> None:
        self.page.get_by_role("button", name=label, exact=True).click()

    def enter(self, placeholder: str, text: str) -> None:
        box = self.page.locator(f"input[placeholder={json.dumps(placeholder)}]")
        box.fill(text)
        box.press("Enter")

    def card(self, title: str) -> None:
        """Scroll the card titled ``title`` to the top of the main column."""
        self.page.locator(".card-title", has_text=title).first.evaluate("e => e.scrollIntoView({block: 'start'})")
        self.page.mouse.move(0, 0)

    def ready(self, s: dict) -> bool:
        return s.get("phase") == "ready" and "load" not in s.get("busy", ())

    def run_until(self, sims: int, what: str) -> dict:
        """Run until ``sims`` more simulations have ended and there is a best plan; Pause."""
        before = self.state()["simulations"]
        self.click("▶ Run")
        try:
            return self.until(lambda s: s["simulations"] >= before + sims and s["best"], what)
        finally:
            self.click("❚❚ Pause")
            self.until(lambda s: not s["running"], "the search to pause")

    def groups(self) -> list[str]:
        """The labels of the groups drawn on the graph (not its clusters)."""
        return self.js("""() => { const f = Bokeh.documents[0].get_model_by_name('partex-graph');
            const d = f.renderers.find(r => r.data_source.data.gid !== undefined).data_source.data;
            return Array.from(d.label).filter((_, i) => d.gid[i] >= 0) }""")

    # ------------------------------------------------------------------ the steps
    def step(self, name: str, act: Callable[[], object], card: str | None = None) -> None:
        """Take one step: ``act()``, then scroll to ``card`` and screenshot; its wall time and
        the console errors it raised are kept."""
        errors_before = len(self.errors)
        t0 = time.monotonic()
        note = act()
        wall = time.monotonic() - t0
        if card:
            self.card(card)
        shot = self.out / f"{len(self.steps) + 1:02d}_{name.replace(' ', '_').replace('/', '-')}.png"
        self.page.wait_for_timeout(300)  # the last changes drawn
        self.page.screenshot(path=shot)
        s = self.state()
        lag = s.get("timings", {}).get("max_loop_lag_ms")  # the largest so far: where it rises, this step
        self.steps.append({"step": name, "wall_s": round(wall, 2), "max_loop_lag_ms": lag, "shot": shot.name,
                           "errors": self.errors[errors_before:], "message": s.get("message", ""),
                           "level": s.get("level", ""), "note": note if isinstance(note, str) else ""})
        print(f"{len(self.steps):>3}  {name:<34} {wall:7.2f} s  {s.get('level', ''):<8} {s.get('message', '')[:90]}",
              flush=True)


def walk(w: Walk, model: str, preset: str, mesh: str, tmp: pathlib.Path) -> None:
    w.until(w.ready, "the first model")
    w.step("page opened", lambda: None)

    def analyze():
        w.choose("partex-model", model)
        w.until(lambda s: preset in w.js("Bokeh.documents[0].get_model_by_name('partex-preset').options"),
                "the model's presets")
        w.choose("partex-preset", preset)
        w.enter("data=4,model=2", mesh)
        w.click("Analyze")
        w.until(lambda s: w.ready(s) and s["model"]["spec"] == model and s["model"]["preset"] == preset
                and s["config"]["mesh"] == mesh, f"{model} {preset} on {mesh}")
    w.step(f"analyze {model} {preset}", analyze, "Named dimensions")

    def run():
        w.click("▶ Run")
        w.until(lambda s: s["simulations"] >= 5 and s["best"] is not None, "the search to find a plan")
        w.card("Search")
        w.page.screenshot(path=w.out / "running.png")
    w.step("run", run, "Search")
    def pause():
        w.click("❚❚ Pause")
        w.until(lambda s: not s["running"], "the search to pause")
    w.step("pause", pause, "Search")

    def step_once():
        before = w.state()["simulations"]
        size = w.model_value("partex-step-size")
        w.click("Step")
        w.until(lambda s: s["simulations"] >= before + size and not s["running"]
                and s["message"].startswith("paused after"), "one Step and its count")
    w.step("step", step_once, "Search")

    groups = w.groups()
    axes = mesh.split(",")[-1].split("=")[0], mesh.split(",")[1].split("=")[0]
    pinned, forbidden = groups[0], groups[1] if len(groups) > 1 else groups[0]

    def decide(button: str, group: str, axis: str, want: Callable[[dict], object]):
        def act():
            w.choose("partex-pin-group", group)
            w.until(lambda s: s["selected"] == group, f"{group} selected")
            w.choose("partex-pin-axis", axis)
            wait(lambda: w.model_value("partex-pin-axis") == axis, 60, f"axis {axis}", "explorer_walk")
            w.click(button)
            w.until(want, f"{button} {group}->{axis}")
        return act

    w.step(f"pin {pinned}->{axes[0]}", decide("Pin", pinned, axes[0], lambda s: f"{pinned}->{axes[0]}" in s["pins"]),
           "Decision")
    w.step(f"forbid {forbidden}->{axes[1]}", decide("Forbid", forbidden, axes[1],
                                                     lambda s: f"{forbidden}->{axes[1]}" in s["forbidden"]), "Decision")
    w.step("run with the pin", lambda: w.run_until(3, "a pinned plan"), "Search")
    w.step(f"release {pinned}->{axes[0]}", decide("Release", pinned, axes[0],
                                                   lambda s: f"{pinned}->{axes[0]}" not in s["pins"]), "Decision")

    def search_box():
        # the graph's title of a group; the state names it by its label (plan files' name)
        target, before = groups[-1], w.state()["selected"]
        box = w.page.locator("input[placeholder='find a group: its label or a pytree path']")
        box.fill(target)
        box.press("Enter")
        s = w.until(lambda s: s["selected"] != before, f"the search box to find {target}")
        return f"typed {target}, selected {s['selected']}"
    w.step("graph search box", search_box, "Named dimensions")

    def tap():
        before = w.state()["selected"]
        title = w.js("""() => { const f = Bokeh.documents[0].get_model_by_name('partex-graph');
            const r = f.renderers.find(r => r.data_source.data.gid !== undefined);
            const d = r.data_source.data, sel = r.data_source.selected.indices;
            const i = Array.from(d.gid).findIndex((g, i) => g >= 0 && !sel.includes(i));
            r.data_source.selected.indices = [i]; return d.label[i] }""")
        s = w.until(lambda s: s["selected"] != before, f"a click to select {title}")
        return f"clicked {title}, selected {s['selected']}"
    w.step("graph click a group", tap, "Named dimensions")
    w.step("memory and baselines", lambda: None, "Memory per device")

    def plan_card():
        w.set_value("partex-plan-choice", "megatron")
        w.page.wait_for_timeout(500)
        w.card("Plan")
        w.page.screenshot(path=w.out / "plan_megatron.png")
        w.set_value("partex-plan-choice", "search")
    w.step("plan card", plan_card, "Plan")

    def meshes():
        w.set_value("partex-mesh-seconds", 20)
        w.click("Search meshes")
        s = w.until(lambda s: s["meshes"]["rows"] and "meshes" not in s["busy"], "the mesh search to end")
        return s["meshes"]["status"]
    w.step("search meshes", meshes, "Meshes")

    def use_mesh():
        rows = [r for r in w.state()["meshes"]["rows"] if r["step"] is not None]
        row = max(rows, key=lambda r: (r["mesh"].count(","), -r["step"]))
        key = row["form"] + (f" | {row['pipeline']}" if row["pipeline"] else "")
        w.set_value("partex-mesh-pick", key)
        wait(lambda: w.model_value("partex-mesh-pick") == key, 60, "the pick", "explorer_walk")
        w.click("Use this mesh")
        w.until(lambda s: w.ready(s) and s["config"]["mesh"] == row["mesh"], "the picked mesh")
        return row["mesh"]
    w.step("use this mesh", use_mesh, "Meshes")
    w.step("run on the mesh", lambda: w.run_until(3, "a plan"), "Named dimensions")

    def compare():
        w.card("Compare")
        w.page.screenshot(path=w.out / "compare_before_swap.png")
        w.click("⇄ Swap")
        w.page.wait_for_timeout(500)
    w.step("compare and swap", compare, "Compare")

    def verify():
        w.page.get_by_role("button", name=re.compile(r"^Verify .* with XLA$")).click()
        s = w.until(lambda s: s["verify"].startswith(("done", "failed")) and "verify" not in s["busy"], "XLA")
        return s["verify"]
    w.step("verify with XLA", verify, "Predicted vs XLA")

    def measure():
        w.click("Measure on this machine")
        s = w.until(lambda s: "measure" not in s["busy"] and s["measure"], "the measurement")
        return s["measure"]
    w.step("measure", measure, "Baselines")

    def teach():
        w.click("Teach")
        head = lambda: w.js("Bokeh.documents[0].get_model_by_name('partex-teach-head').text")  # noqa: E731
        wait(lambda: "Step 1 of" in head(), 60, "the walkthrough", "explorer_walk")
        total = int(head().split("Step 1 of ")[1].split("<")[0])
        for i in range(total):
            wait(lambda i=i: f"Step {i + 1} of {total}" in head(), 60, f"step {i + 1}", "explorer_walk")
            w.page.wait_for_timeout(600)
            w.page.mouse.move(0, 0)
            w.page.screenshot(path=w.out / f"teach_{i + 1}.png")
            if i + 1 < total:
                w.click("Next ▶")
        w.click("Close")
        return f"{total} steps"
    w.step("teach", teach)

    plan = tmp / "walk-plan.json"

    def download():
        with w.page.expect_download() as dl:
            w.page.get_by_text("Download plan JSON").click()
        dl.value.save_as(plan)
        return f"{plan.stat().st_size} bytes"
    w.step("download plan", download)

    def upload():
        w.page.locator("input[type=file]").set_input_files(plan)
        w.until(lambda s: s["uploaded"] is not None and "upload" not in s["busy"], "the upload")
    w.step("upload the plan", upload, "Compare")
    w.step("step after the upload", step_once, "Plan")

    def save():
        w.set_value("partex-session-name", "walk")
        w.click("Save")
        w.until(lambda s: "walk" in s["sessions"], "the session saved")
    w.step("save session", save)

    def restore():
        w.choose("partex-sessions", "walk")
        w.click("Load")
        w.until(lambda s: s["opened_session"] == "walk" and w.ready(s), "the session loaded")
    w.step("load session", restore, "Search")

    def copy_link():
        w.click("Copy link")
        w.page.wait_for_timeout(500)
        return w.js("Bokeh.documents[0].get_model_by_name('partex-link-note').text")
    w.step("copy link", copy_link)

    def hardware():
        w.choose("partex-hardware", "h100-80gb")
        w.until(lambda s: w.ready(s) and s["config"]["hardware"] == "h100-80gb", "the new hardware")
    w.step("hardware h100-80gb", hardware, "Memory per device")

    def budget():
        w.enter("empty: the chip's HBM", "40GiB")
        w.until(lambda s: w.ready(s) and s["config"]["budget"] == 40 * 2**30, "the new budget")
        w.run_until(3, "a plan under the budget")
    w.step("budget 40GiB", budget, "Memory per device")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "build" / "walk", help="screenshots and walk.json")
    ap.add_argument("--model", default="llama")
    ap.add_argument("--preset", default="7b")
    ap.add_argument("--mesh", default="data=2,fsdp=2,model=2")
    ap.add_argument("--limit-ms", type=float, default=200.0, help="the slowest callback allowed (wall ms)")
    args = ap.parse_args(argv)
    if missing := chromium_missing():
        print(f"explorer_walk: {missing}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the server stopped with the walk
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="partex-walk-"))
    port = free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="8", PARTEX_SESSIONS_DIR=str(tmp / "sessions"),
               PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "partex", "serve", "--port", str(port)]
    t0 = time.monotonic()
    with open(args.out / "server.log", "w") as log, served(command, port, env, log), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        ctx = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
        w = Walk(ctx.new_page(), args.out)
        w.page.goto(f"http://127.0.0.1:{port}/app")
        try:
            walk(w, args.model, args.preset, args.mesh, tmp)
        finally:
            final = w.state()
            browser.close()
    t = final.get("timings", {})
    slowest = t.get("slowest") or [["", 0, 0]]
    result = {
        "model": f"{args.model} {args.preset}", "mesh": args.mesh, "steps": w.steps, "walk_s": round(time.monotonic() - t0, 1),
        "console_errors": w.errors, "callbacks": t.get("callbacks"),
        "max_callback_ms": t.get("max_callback_ms"), "max_callback_cpu_ms": t.get("max_callback_cpu_ms"),
        "slowest": slowest, "max_loop_lag_ms": t.get("max_loop_lag_ms"),
        "load_average": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
    }
    (args.out / "walk.json").write_text(json.dumps(result, indent=1))
    print()
    print(f"{'step':<36} {'wall s':>8}  errors  {'loop lag so far ms':>18}")
    for s in w.steps:
        print(f"{s['step']:<36} {s['wall_s']:>8.2f}  {len(s['errors']):>6}  {s['max_loop_lag_ms'] or 0:>18.1f}")
    print(f"\nconsole errors: {len(w.errors)}")
    for e in w.errors:
        print(f"  {e[:300]}")
    print(f"callbacks timed: {result['callbacks']}; slowest {result['max_callback_ms']} ms wall, "
          f"{result['max_callback_cpu_ms']} ms CPU; loop lag at most {result['max_loop_lag_ms']} ms")
    for what, ms, cpu in slowest:
        print(f"  {ms:8.1f} ms ({cpu:6.1f} ms CPU)  {what[:150]}")
    print(f"load average {result['load_average']} on {result['cpus']} CPUs; written to {args.out / 'walk.json'}")
    over = (result["max_callback_ms"] or 0) > args.limit_ms
    return 1 if w.errors or over else 0


if __name__ == "__main__":
    sys.exit(main())
