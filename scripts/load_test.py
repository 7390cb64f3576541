"""A class on one server: N browser pages on one ``partex serve``, each pressing Run.

Starts ``partex serve`` on a free port (``--search-workers`` as given, else its default),
opens N pages in one headless Chromium (one context each, the browser at a lower priority),
waits for each to be ready, presses Run on each, lets them search ``--search-seconds``, then
closes every tab. Reports the time to ready per page (median, max), the simulations each page
reached after its search time, the pages seen waiting with their place in the queue, the
server's peak memory with its children (RSS summed, and PSS: shared pages counted once), the
most child processes at once and the memory each search holds alone (USS), the server's event-loop lag (p50, p95, max: while the pages loaded, and while they searched), the
console errors, and the child processes left ``--after-close`` seconds after the tabs
closed (and how long they took to go). Prints a table and writes JSON; exits 1 on a console
error or a child left.

    .venv/bin/python scripts/load_test.py --pages 5 [--search-seconds 60] [--search-workers K] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psutil
from _browser import CHROMIUM, CHROMIUM_ARGS, free_port, page_state, served, wait
from partex.explorer import PING_JS
from playwright.sync_api import sync_playwright

ROOT = pathlib.Path(__file__).resolve().parents[1]
BROWSER_NICENESS = 10  # the browser is the machine's guest: the server and its searches come first
READY_S = 600.0


class Monitor:
    """Samples ``partex serve`` and every process under it (the panel server, its searches,
    verifications) every ``period`` s in a thread: the peak RSS and PSS summed, and the most
    children of the panel server at once."""

    def __init__(self, pid: int, period: float = 0.5):
        self.root = psutil.Process(pid)
        self.period = period
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_children = 0
        self.children_now = 0
        self.children_uss = 0  # the searches' own memory (USS), summed, at the last sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def server(self) -> psutil.Process | None:
        """The panel server: ``partex serve``'s child."""
        kids = self.root.children()
        return kids[0] if kids else None

    def searches(self) -> list[psutil.Process]:
        server = self.server()
        try:
            return server.children(recursive=True) if server is not None else []
        except psutil.NoSuchProcess:
            return []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            rss = pss = 0
            for p in procs:
                try:
                    info = p.memory_full_info()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                rss += info.rss
                pss += getattr(info, "pss", info.rss)
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            searches = self.searches()
            self.children_now = len(searches)
            self.peak_children = max(self.peak_children, self.children_now)
            self.children_uss = sum(_uss(c) for c in searches)
            self._stop.wait(self.period)


def _uss(p: psutil.Process) -> int:
    """The memory only ``p`` holds (a forked search shares the rest with the server)."""
    try:
        info = p.memory_full_info()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0
    return getattr(info, "uss", info.rss)


def _cpu(procs) -> float:
    """The CPU seconds (user + system) ``procs`` have used."""
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        total += t.user + t.system
    return total


def _lag(page) -> dict[int, int]:
    """The server's loop-lag histogram ({ms: ticks}, 10 ms bins) now: a ping first, so that the
    page's state JSON is written anew."""
    page.evaluate(PING_JS, 1)
    return {int(k): v for k, v in page_state(page)["timings"]["lag_histogram"].items()}


def _minus(a: dict[int, int], b: dict[int, int]) -> dict[int, int]:
    return {k: a[k] - b.get(k, 0) for k in a if a[k] - b.get(k, 0) > 0}


def _lag_figures(hist: dict[int, int]) -> dict:
    """Ticks, p50, p95 and max (ms: the upper edges of their 10 ms bins) of a lag histogram."""
    n = sum(hist.values())
    out: dict = {"ticks": n}
    for name, q in (("p50", 0.5), ("p95", 0.95)):
        seen = 0
        for ms in sorted(hist):
            seen += hist[ms]
            if seen >= q * n:
                out[name] = ms + 10
                break
    out["max"] = max(hist) + 10 if hist else 0
    return out


def run(pages: int, search_s: float, workers: int | None, after_close_s: float) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}/app"
    tmp = tempfile.mkdtemp(prefix="partex-load-")
    env = dict(os.environ, JAX_PLATFORMS="cpu", PARTEX_SESSIONS_DIR=tmp)
    cmd = [sys.executable, "-m", "partex", "serve", "--port", str(port)]
    if workers is not None:
        cmd += ["--search-workers", str(workers)]
    log = open(os.path.join(tmp, "server.log"), "w")
    errors: list[str] = []
    out: dict = {"pages": pages, "search_seconds": search_s, "load_before": os.getloadavg()}
    with served(cmd, port, env, log=log) as server:
        monitor = Monitor(server.pid)
        monitor.start()
        # the browser, started from here, inherits this process's priority in all its threads
        # (a process's niceness set from outside is its first thread's only); the server,
        # started already, keeps its own
        os.nice(BROWSER_NICENESS)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            tabs = []
            for i in range(pages):
                ctx = browser.new_context(viewport={"width": 1440, "height": 900})
                page = ctx.new_page()
                page.on("console", lambda m, i=i: errors.append(f"page {i}: {m.text}") if m.type == "error" else None)
                page.on("pageerror", lambda e, i=i: errors.append(f"page {i}: {e}"))
                tabs.append({"page": page, "ctx": ctx, "opened": time.monotonic()})
                page.goto(url, wait_until="commit")
            deadline = time.monotonic() + READY_S
            while any("ready_s" not in t for t in tabs) and time.monotonic() < deadline:
                for t in tabs:
                    if "ready_s" not in t and page_state(t["page"]).get("phase") == "ready":
                        t["ready_s"] = time.monotonic() - t["opened"]
                time.sleep(0.2)
            lag_loading = _lag(tabs[0]["page"])  # the server's loop until every page was ready
            me = psutil.Process()
            cpu0 = (_cpu([monitor.server()]), _cpu(monitor.searches()), _cpu(me.children(recursive=True)),
                    time.monotonic())
            for t in tabs:  # Run on every page, at once
                t["ready_timings"] = page_state(t["page"]).get("timings", {})
                t["page"].get_by_role("button", name="▶ Run", exact=True).click()
                t["run_at"] = time.monotonic()
                t["places"] = []
            while any("simulations" not in t for t in tabs):
                for t in tabs:
                    if "simulations" in t:
                        continue
                    s = page_state(t["page"])
                    words = s.get("queue", {}).get("words", "")
                    if words and words not in t["places"]:
                        t["places"].append(words)
                    if time.monotonic() - t["run_at"] >= search_s:
                        t["simulations"] = s.get("simulations", 0)
                        # Pause: the page's state JSON is written anew (with its timings), and the slot freed
                        t["page"].get_by_role("button", name="❚❚ Pause", exact=True).click()
                time.sleep(0.5)
            for t in tabs:
                page = t["page"]
                t["timings"] = wait(lambda page=page: (lambda s: not s.get("running") and s.get("timings"))(
                    page_state(page)), 60, "a page to pause")
            lag_all = _lag(tabs[0]["page"])
            wall = time.monotonic() - cpu0[3]
            cpu = {"server": (_cpu([monitor.server()]) - cpu0[0]) / wall,
                   "searches": (_cpu(monitor.searches()) - cpu0[1]) / wall,
                   "browser": (_cpu(me.children(recursive=True)) - cpu0[2]) / wall}
            peak_during = monitor.peak_children
            searching = monitor.children_now
            children_uss = monitor.children_uss
            closed = time.monotonic()
            for t in tabs:
                t["ctx"].close()
            browser.close()
        freed_s = None
        while time.monotonic() - closed < after_close_s:
            if freed_s is None and monitor.children_now == 0:
                freed_s = time.monotonic() - closed
            time.sleep(0.25)
        left = monitor.searches()
        monitor.stop()
        ready = [t.get("ready_s", float("nan")) for t in tabs]
        sims = [t.get("simulations", 0) for t in tabs]
        out.update({
            "ready_s": {"median": round(statistics.median(ready), 1), "max": round(max(ready), 1),
                        "each": [round(r, 1) for r in ready]},
            "simulations": {"min": min(sims), "median": statistics.median(sims), "max": max(sims), "each": sims},
            "queued_pages": sum(1 for t in tabs if t["places"]),
            "places_seen": [t["places"][:3] for t in tabs],
            "peak_rss_mib": round(monitor.peak_rss / 2**20), "peak_pss_mib": round(monitor.peak_pss / 2**20),
            "peak_children": max(peak_during, monitor.peak_children),
            "search_uss_mib_each": round(children_uss / max(1, searching) / 2**20, 1),
            # the server's one loop, every page's: while the pages loaded, then while they searched
            "loop_lag_ms": {"loading": _lag_figures(lag_loading),
                            "searching": _lag_figures(_minus(lag_all, lag_loading)),
                            "all": _lag_figures(lag_all)},
            "cpu_cores_while_searching": {k: round(v, 2) for k, v in cpu.items()},
            "max_callback_ms": max(t["timings"].get("max_callback_ms", 0.0) for t in tabs),
            "console_errors": errors,
            "children_freed_s": None if freed_s is None else round(freed_s, 1),
            "children_left": len(left),
            "load_after": os.getloadavg(),
            "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
            "server_log": log.name,
        })
    log.close()
    return out


def table(r: dict) -> str:
    rows = [
        ("pages", r["pages"]),
        ("time to ready (s), median / max", f"{r['ready_s']['median']} / {r['ready_s']['max']}"),
        (f"simulations after {r['search_seconds']:.0f} s, min / median / max",
         f"{r['simulations']['min']} / {r['simulations']['median']} / {r['simulations']['max']}"),
        ("pages seen queued (with their place)", r["queued_pages"]),
        ("peak memory, server + children: RSS / PSS (MiB)", f"{r['peak_rss_mib']} / {r['peak_pss_mib']}"),
        ("peak child processes", r["peak_children"]),
        ("a search process's own memory, USS (MiB)", r["search_uss_mib_each"]),
        ("event loop lag while searching (ms), p50 / p95 / max",
         "{p50} / {p95} / {max} ({ticks} ticks)".format(**{"p50": "-", "p95": "-", **r["loop_lag_ms"]["searching"]})),
        ("event loop lag while the pages loaded (ms), p50 / p95 / max",
         "{p50} / {p95} / {max} ({ticks} ticks)".format(**{"p50": "-", "p95": "-", **r["loop_lag_ms"]["loading"]})),
        ("slowest callback (ms)", r["max_callback_ms"]),
        ("cores used while searching: server / searches / browser",
         " / ".join(str(v) for v in r["cpu_cores_while_searching"].values())),
        ("console errors", len(r["console_errors"])),
        ("children gone after closing (s)", r["children_freed_s"]),
        ("children left after closing", r["children_left"]),
        ("load average before / after", f"{r['load_before'][0]:.2f} / {r['load_after'][0]:.2f}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=5, help="browser pages on the one server (default 5)")
    ap.add_argument("--search-seconds", type=float, default=60.0, help="each page's search time (default 60)")
    ap.add_argument("--search-workers", type=int, default=None,
                    help="partex serve --search-workers (default: its own)")
    ap.add_argument("--after-close", type=float, default=30.0,
                    help="seconds after the tabs close when no child may be left (default 30)")
    ap.add_argument("--json", default="build/load_test.json",
                    help="where to write the figures (default build/load_test.json)")
    args = ap.parse_args(argv)
    if not os.path.exists(CHROMIUM):
        print(f"load_test: {CHROMIUM} is missing: run `make chromium`", file=sys.stderr)
        return 2
    r = run(args.pages, args.search_seconds, args.search_workers, args.after_close)
    print(table(r))
    for line in r["console_errors"][:20]:
        print(f"console error: {line}")
    out = pathlib.Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(r, indent=1))
    print(f"figures in {out}")
    return 1 if r["console_errors"] or r["children_left"] else 0


if __name__ == "__main__":
    sys.exit(main())
