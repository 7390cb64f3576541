"""How fast the explorer answers while its search runs: the benchmark behind the browser
test that checks the mechanism (tests/test_explorer.py::test_the_page_answers_while_the_search_runs).

Starts ``panel serve`` on a free port, opens the page in headless Chromium (Debian's
/usr/bin/chromium, as the browser tests), waits for the demo transformer, then for each of
``--runs`` rounds presses Run and sends ``--pings`` pings through the server's event loop
(the hidden ``partex-ping`` model, echoed back in ``partex-state``), then Pause. Prints the
time to the first view, the round trips (median, p90, max), the slowest callback on the
server's loop and its largest lag, the simulations made meanwhile and the load average.

    .venv/bin/python scripts/explorer_latency.py [--runs 3] [--pings 30] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from playwright.sync_api import sync_playwright

from _browser import CHROMIUM, CHROMIUM_ARGS, VIEWPORT, chromium_missing, free_port, page_state, served, wait
from partex.explorer import PING_JS, serve_command


def measure(runs: int, pings: int) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}/app"
    tmp = tempfile.mkdtemp(prefix="partex-latency-")
    env = dict(os.environ, JAX_PLATFORMS="cpu", PARTEX_SESSIONS_DIR=tmp)
    t0 = time.monotonic()
    with served(serve_command(port), port, env), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(url)
        wait(lambda: page_state(page).get("phase") == "ready", 300, "the model to load", "explorer_latency")
        first_view = time.monotonic() - t0
        trips: list[float] = []
        sims = 0
        for _ in range(runs):
            before = page_state(page).get("simulations", 0)
            page.get_by_role("button", name="▶ Run", exact=True).click()
            wait(lambda before=before: page_state(page).get("simulations", 0) > before, 300, "the search to start", "explorer_latency")
            trips += page.evaluate(PING_JS, pings)
            s = page_state(page)
            page.get_by_role("button", name="❚❚ Pause", exact=True).click()
            sims += s["simulations"] - before
        timings = page_state(page)["timings"]
        browser.close()
    trips.sort()
    return {"first_view_s": round(first_view, 2), "pings": len(trips),
            "ping_ms_median": round(statistics.median(trips), 1),
            "ping_ms_p90": round(trips[int(len(trips) * 0.9)], 1), "ping_ms_max": round(trips[-1], 1),
            "max_callback_ms": timings["max_callback_ms"], "max_loop_lag_ms": timings["max_loop_lag_ms"],
            "simulations_during_pings": sims, "load_average_1min": round(os.getloadavg()[0], 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="Run/ping/Pause rounds (default 3)")
    ap.add_argument("--pings", type=int, default=30, help="pings per round (default 30)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    if missing := chromium_missing():
        print(f"explorer_latency: {missing}", file=sys.stderr)
        return 2
    out = measure(args.runs, args.pings)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for k, v in out.items():
            print(f"{k:>26}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
