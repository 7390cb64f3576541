"""The partex explorer (``partex.explorer``), a Panel app: ``partex serve`` (``make serve``).

It opens on the demo transformer (tiny) on a simulated data=4,model=2 mesh and shows the
named-dimension graph, memory against the budget, the search as it runs, the plan, the
baselines and XLA's view of the plan. Importing this package does not import Panel.

Served beyond this machine it asks for a password (``serve``'s ``auth_file``; a non-loopback
address without one is refused unless ``insecure``); its page loads models of its users' own
only from the folder ``models_dir`` names, and files up to ``max_upload`` bytes; at most
``search_workers`` pages' searches run at once, the others queued (``_pool``).
"""

from __future__ import annotations

import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Callable

from partex import PartexError, format_bytes

from ._access import (MAX_PAGES_ENV, MAX_UPLOAD, MAX_UPLOAD_ENV, MODELS_DIR_ENV, PASSWORD_ENV, SEARCH_WORKERS_ENV, check_exposure,
                      credentials, is_loopback, write_credentials)
from ._pool import SLICE_SECONDS, default_max_pages, default_workers, parse_workers

HERE = pathlib.Path(__file__).resolve().parent
APP = HERE / "app.py"  # the page as a script: ``panel serve`` serves it too (each page built on its event loop)
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


# Bokeh's own limit on one websocket message (its default): a file the page uploads travels
# in one, base64-encoded (4/3 of its size), and a larger message closes the page's connection
WEBSOCKET_MESSAGE = 20 * 2**20


def serve_command(port: int = 5006, address: str = "127.0.0.1", show: bool = False,
                  session_lifetime_ms: int = 5000, *, auth_file: str | None = None, origins=(),
                  max_upload: int | None = None) -> list[str]:
    """The server's command line (``_server``: Panel's server, each page built off its event
    loop). The static folder is served at /assets (Bokeh
    reserves /static for its own files); a closed tab's session, and its search thread,
    ends ``session_lifetime_ms`` after its connection closes. ``auth_file``: the path of a
    credentials file (``_access.write_credentials``) that Panel's basic auth asks for (the
    password itself is never on the command line); ``origins``: more ``HOST[:PORT]`` a
    browser may reach the page by (its websocket's origin; PORT defaults to ``port``);
    ``max_upload``: the largest file the page takes, whose websocket message must get
    through for the page to say that it is too large."""
    allowed = [f"{address}:{port}", f"localhost:{port}",
               *(o if ":" in o.rsplit("]", 1)[-1] else f"{o}:{port}" for o in origins)]
    cmd = [
        sys.executable, "-m", "partex.explorer._server",
        "--address", address, "--port", str(port),
        *(f"--allow-websocket-origin={o}" for o in dict.fromkeys(allowed)),
        # a closed tab's session ends within a second of its lifetime: its search process, and
        # its memory, with it
        "--unused-session-lifetime", str(session_lifetime_ms),
        "--check-unused-sessions", str(max(250, min(1000, session_lifetime_ms // 2))),
    ]
    if max_upload is not None:
        cmd += ["--websocket-max-message-size", str(max(WEBSOCKET_MESSAGE, 2 * max_upload))]
    if auth_file is not None:
        cmd += ["--basic-auth", auth_file]
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


def serve(port: int = 5006, address: str = "127.0.0.1", show: bool = False, profiles=(), *,
          auth_file: str | os.PathLike | None = None, insecure: bool = False,
          models_dir: str | os.PathLike | None = None, max_upload: int | None = None, origins=(),
          search_workers: int | str | None = None, max_pages: int | str | None = None) -> int:
    """Serve the explorer until interrupted (``partex serve``); returns panel's exit code.
    SIGTERM and SIGHUP are passed on to the panel server, which this process waits for, and
    the server ends with this process whatever ends it: a process manager or a test harness
    stopping ``partex serve`` leaves no server holding the port.

    ``profiles``: hardware profile files the hardware field offers. ``auth_file``: a file of
    credentials the page asks for (``_access.read_credentials``; None: ``$PARTEX_PASSWORD``,
    else none asked); an ``address`` other machines reach is refused without them unless
    ``insecure``. ``models_dir``: the folder the page may load models of its users' own from
    (``FILE.py:function`` inside it; None: the demo models only). ``max_upload``: the largest
    file the page takes, in bytes (None: ``_engine.MAX_UPLOAD``). ``origins``: more
    ``HOST[:PORT]`` a browser reaches the page by (``serve_command``). ``search_workers``: how
    many pages' searches run at once (None: ``$PARTEX_SEARCH_WORKERS``, else one fewer than the
    machine's cores, at least 1); the others wait their turn (``_pool``). ``max_pages``: how
    many pages may be open at once (None: ``$PARTEX_MAX_PAGES``, else what the machine's memory
    holds, ``_pool.default_max_pages``); a page past it is told the server is full. PartexError,
    before anything starts, for any of these that is wrong."""
    creds = credentials(auth_file, dict(os.environ))
    check_exposure(address, creds is not None, insecure)
    if models_dir is not None and not os.path.isdir(models_dir):
        raise PartexError(f"--models-dir {models_dir} is not a folder: name the folder the page may load models from")
    max_upload = MAX_UPLOAD if max_upload is None else int(max_upload)
    if max_upload <= 0:
        raise PartexError(f"--max-upload must be a positive size, got {max_upload} bytes")
    workers = _count(search_workers, "--search-workers", SEARCH_WORKERS_ENV, default_workers)
    pages = _count(max_pages, "--max-pages", MAX_PAGES_ENV, default_max_pages)
    env = dict(os.environ)
    env.pop(PASSWORD_ENV, None)  # read here; nothing the server runs needs it
    # analysis and search need no accelerator; the plans the page measures run on the
    # machine's own devices (``partex.plan._measure.DEVICE_PLATFORMS``)
    env.setdefault("PARTEX_DEVICE_PLATFORMS", os.environ.get("JAX_PLATFORMS", ""))
    env.setdefault("JAX_PLATFORMS", "cpu")
    if profiles:  # offered in the hardware field (``_engine.PROFILES``)
        env["PARTEX_HARDWARE_PROFILES"] = os.pathsep.join(os.path.abspath(p) for p in profiles)
    env.pop(MODELS_DIR_ENV, None)  # only the folder named here opens the page to models of its users' own
    if models_dir is not None:
        env[MODELS_DIR_ENV] = os.path.realpath(models_dir)
    env[MAX_UPLOAD_ENV] = str(max_upload)
    env[SEARCH_WORKERS_ENV] = str(workers)
    env[MAX_PAGES_ENV] = str(pages)
    private = tempfile.mkdtemp(prefix="partex-serve-")  # this user's only (0700)
    try:
        auth_path = None
        if creds is not None:
            auth_path = write_credentials(creds, private)
            env.pop("PANEL_BASIC_AUTH", None)  # Panel takes one or the other; ours is the one checked above
            env["PANEL_COOKIE_SECRET"] = secrets.token_urlsafe(32)  # signs the login cookie; in no command line
        print(f"partex explorer on http://{address}:{port}/app"
              + (" (password asked)" if creds is not None else "")
              + (f"; models of your own from {env[MODELS_DIR_ENV]}" if models_dir is not None else "")
              + f"; uploads up to {format_bytes(max_upload)}"
              + f"; {workers} search{'es' if workers > 1 else ''} at once, the others queued in turns of "
                f"{SLICE_SECONDS:.0f} s; at most {pages} page{'s' if pages > 1 else ''} open", flush=True)
        if creds is None and not is_loopback(address):
            print(f"partex: warning: --insecure: anyone who reaches {address}:{port} uses the explorer, and this "
                  "machine, with no password", file=sys.stderr, flush=True)
        return _run_server(serve_command(port, address, show, auth_file=auth_path, origins=origins,
                                         max_upload=max_upload), env)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _count(value: int | str | None, flag: str, name: str, default: Callable[[], int]) -> int:
    """A count given by ``flag`` (``value``), else in ``$name``, else ``default()``;
    PartexError naming where a bad one came from."""
    if value is not None:
        return parse_workers(value, flag)
    if os.environ.get(name, "").strip():
        return parse_workers(os.environ[name], name)
    return default()


def _run_server(cmd: list[str], env: dict[str, str]) -> int:
    """Run the panel server ``cmd`` until it ends (``serve``), passing SIGTERM and SIGHUP on."""
    proc = subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)

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
