"""What the scripts that drive the explorer in a browser share: Debian's headless Chromium
(Playwright's own browser download does not work here), the page's state as JSON (the hidden
``partex-state`` model), a polling wait, a free port and a server started in a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.request
from typing import Any, Callable, Iterator

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1440, "height": 900}


def page_state(page) -> dict:
    """The page's state (``partex-state``: explorer/_probe.py) as JSON data; {} before it is
    on the page."""
    text = page.evaluate("""() => { const d = window.Bokeh && Bokeh.documents[0];
        const m = d && d.get_model_by_name('partex-state'); return m ? m.text : null }""")
    return json.loads(text) if text else {}


def wait(predicate: Callable[[], Any], timeout: float, what: str, script: str = "explorer"):
    """Poll ``predicate()`` until it returns something truthy and return that; exit naming
    ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"{script}: timed out after {timeout:.0f} s waiting for {what}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(command: list[str], port: int, env: dict[str, str], log=subprocess.DEVNULL,
           timeout: float = 300) -> Iterator[subprocess.Popen]:
    """The server ``command`` (listening on ``port``) running in a subprocess with ``env``
    (its output to ``log``), once it answers; stopped on leaving."""
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    def up():  # a static file: each GET of /app would make a session that loads a model
        if server.poll() is not None:
            raise SystemExit(f"the server exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/assets/logo.svg", timeout=30) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        wait(up, timeout, "the server to answer")
        yield server
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()


def chromium_missing() -> str | None:
    """Why the browser cannot start, or None."""
    return None if os.path.exists(CHROMIUM) else f"{CHROMIUM} is missing: run `make chromium`"
