"""The partex explorer (``partex.explorer``), a Panel app: ``partex serve`` (``make serve``).

It opens on the demo transformer (tiny) on a simulated data=4,model=2 mesh and shows the
named-dimension graph, memory against the budget, the search as it runs, the plan, the
baselines and XLA's view of the plan. Importing this package does not import Panel.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
APP = HERE / "app.py"
# The stylesheet and logo: ``partex/static`` in an installed wheel, ``static/`` beside
# ``explorer/`` in the repository (an editable install maps the packages onto its folders).
STATIC = next((d for d in (HERE.parent / "static", HERE.parents[1] / "static") if (d / "explorer.css").is_file()),
              HERE.parent / "static")


# Round trips through a page's server, run in the page (Playwright's ``page.evaluate(PING_JS,
# n)``): n times, set the hidden ``partex-ping`` model's text to a new token and wait until the
# server echoes it back in ``partex-state`` (see ``ProbeView``), 60-120 ms apart. Returns the
# round trips in ms; a ping unanswered for 60 s ends the list early.
PING_JS = """async (n) => {
    const doc = Bokeh.documents[0];
    const ping = doc.get_model_by_name('partex-ping');
    const probe = doc.get_model_by_name('partex-state');
    const out = [];
    for (let i = 0; i < n; i++) {
        const token = `p${i}-${Math.random()}`;
        const t0 = performance.now();
        ping.text = token;
        while (JSON.parse(probe.text).ping !== token) {
            if (performance.now() - t0 > 60000) return out;
            await new Promise(r => setTimeout(r, 2));
        }
        out.push(performance.now() - t0);
        await new Promise(r => setTimeout(r, 60 + Math.random() * 60));
    }
    return out }"""


def serve_command(port: int = 5006, address: str = "127.0.0.1", show: bool = False,
                  session_lifetime_ms: int = 5000) -> list[str]:
    """The ``panel serve`` command line. The static folder is served at /assets (Bokeh
    reserves /static for its own files); a closed tab's session, and its search thread,
    ends ``session_lifetime_ms`` after its connection closes."""
    cmd = [
        sys.executable, "-m", "panel", "serve", str(APP),
        "--address", address, "--port", str(port),
        "--static-dirs", f"assets={STATIC}",
        f"--allow-websocket-origin={address}:{port}",
        f"--allow-websocket-origin=localhost:{port}",
        "--unused-session-lifetime", str(session_lifetime_ms),
        "--check-unused-sessions", str(max(500, session_lifetime_ms // 2)),
        "--warm",  # run the app once at start: imports done and the demo model traced before the first tab
    ]
    if show:
        cmd.append("--show")
    return cmd


def _die_with_parent() -> None:
    """In the panel server's process, before it starts (Linux): the kernel sends it SIGTERM
    when this process dies, however it dies (SIGKILL included)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def serve(port: int = 5006, address: str = "127.0.0.1", show: bool = False, profiles=()) -> int:
    """Serve the explorer until interrupted (``partex serve``); returns panel's exit code.
    SIGTERM and SIGHUP are passed on to the panel server, which this process waits for, and
    the server ends with this process whatever ends it: a process manager or a test harness
    stopping ``partex serve`` leaves no server holding the port."""
    env = dict(os.environ)
    # analysis and search need no accelerator; the plans the page measures run on the
    # machine's own devices (``partex.plan._measure.DEVICE_PLATFORMS``)
    env.setdefault("PARTEX_DEVICE_PLATFORMS", os.environ.get("JAX_PLATFORMS", ""))
    env.setdefault("JAX_PLATFORMS", "cpu")
    if profiles:  # offered in the hardware field (``_engine.PROFILES``)
        env["PARTEX_HARDWARE_PROFILES"] = os.pathsep.join(os.path.abspath(p) for p in profiles)
    print(f"partex explorer on http://{address}:{port}/app", flush=True)
    proc = subprocess.Popen(serve_command(port, address, show), env=env,
                            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)

    def forward(signum, frame):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    old = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return proc.wait()
    except KeyboardInterrupt:
        return 130
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


__all__ = ["serve", "serve_command", "APP", "STATIC", "PING_JS"]
