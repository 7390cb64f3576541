"""``partex serve`` starts ``panel serve`` as a child: stopping the command (SIGTERM, as a
process manager or a test harness does, or SIGKILL) must stop the server too, leaving no
orphan holding the port. Served beyond this machine it asks for a password (or is refused,
in one line, unless --insecure); the password never shows on a command line; a request
without the login gets no session."""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    try:
        text = pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def alive(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie has ended: only its exit status is left


def stop(proc: subprocess.Popen) -> None:
    """End a ``partex serve`` started by a test (SIGTERM, then SIGKILL after 30 s)."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_stopping_partex_serve_stops_its_panel_server(how):
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen([sys.executable, "-m", "partex", "serve", "--port", str(free_port())], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = None
    try:
        server = wait_for(lambda: children(proc.pid), 60, "the panel server to start")[0]
        time.sleep(1.0)  # let it get going (imports, the warm run)
        assert alive(server)
        proc.send_signal(how)
        proc.wait(timeout=30)
        wait_for(lambda: not alive(server), 30, f"the panel server {server} to end after {how.name}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if server is not None and alive(server):  # the failure this test is about: do not leave it
            os.kill(server, signal.SIGKILL)


# --------------------------------------------------------------------------- beyond this machine

def _serve(argv, monkeypatch):
    """``partex serve ARGV`` in this process, the panel server replaced by a recorder: returns
    the exit code and what the server would have been started with (None: not started)."""
    import partex.explorer as explorer
    from partex.cli import main

    started = {}

    def run_server(cmd, env):
        auth = cmd[cmd.index("--basic-auth") + 1] if "--basic-auth" in cmd else None
        started.update(cmd=cmd, env=env, auth=json.loads(pathlib.Path(auth).read_text()) if auth else None,
                       mode=oct(os.stat(auth).st_mode & 0o777) if auth else None)
        return 0

    monkeypatch.setattr(explorer, "_run_server", run_server)
    return main(["serve", *argv]), started or None


@pytest.mark.parametrize("address", ["0.0.0.0", "", "::", "192.168.1.5", "myhost.example"])
def test_serving_beyond_this_machine_without_a_password_is_refused_in_one_line(address, monkeypatch, capsys):
    monkeypatch.delenv("PARTEX_PASSWORD", raising=False)
    code, started = _serve(["--address", address], monkeypatch)
    err = capsys.readouterr().err
    assert code == 2 and started is None, (code, err)
    assert err.count("\n") == 1 and err.startswith(f"partex: error: --address {address or repr(address)} lets other machines reach"), err
    assert "ask for a password with --auth-file FILE" in err and "or pass --insecure" in err, err


@pytest.mark.parametrize("address", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_serving_on_this_machine_asks_for_nothing(address, monkeypatch, capsys):
    monkeypatch.delenv("PARTEX_PASSWORD", raising=False)
    code, started = _serve(["--address", address], monkeypatch)
    assert code == 0 and started is not None and started["auth"] is None
    assert "--basic-auth" not in started["cmd"] and capsys.readouterr().err == ""


def test_insecure_must_be_written_out_and_is_said_on_start(monkeypatch, capsys):
    monkeypatch.delenv("PARTEX_PASSWORD", raising=False)
    with pytest.raises(SystemExit) as e:  # an abbreviation counts for nothing
        _serve(["--address", "0.0.0.0", "--insec"], monkeypatch)
    assert e.value.code == 2
    capsys.readouterr()
    code, started = _serve(["--address", "0.0.0.0", "--insecure"], monkeypatch)
    assert code == 0 and started is not None and started["auth"] is None
    assert "partex: warning: --insecure: anyone who reaches 0.0.0.0:5006" in capsys.readouterr().err


@pytest.mark.parametrize("content, creds", [("s3cret-Pass\n", "s3cret-Pass"),
                                            ('{"ada": "pw-1", "alan": "pw-2"}', {"ada": "pw-1", "alan": "pw-2"})])
def test_the_password_reaches_the_server_in_a_private_file_never_its_command_line(content, creds, tmp_path,
                                                                                 monkeypatch, capsys):
    """--auth-file (one password, or user: password): the panel server gets a copy only this
    user reads, by its path; the command line holds no password, and the login cookie's
    secret is in its environment. PARTEX_PASSWORD works as one password, and stays behind."""
    monkeypatch.delenv("PARTEX_PASSWORD", raising=False)
    auth = tmp_path / "auth"
    auth.write_text(content)
    code, started = _serve(["--address", "0.0.0.0", "--auth-file", str(auth)], monkeypatch)
    assert code == 0 and started is not None and started["auth"] == creds and started["mode"] == "0o600"
    words = creds.values() if isinstance(creds, dict) else [creds]
    assert not any(w in " ".join(started["cmd"]) or w in capsys.readouterr().out for w in words)
    assert len(started["env"]["PANEL_COOKIE_SECRET"]) >= 32
    assert not pathlib.Path(started["cmd"][started["cmd"].index("--basic-auth") + 1]).exists()  # gone with it

    monkeypatch.setenv("PARTEX_PASSWORD", "from-the-env")
    code, started = _serve(["--address", "0.0.0.0"], monkeypatch)
    assert code == 0 and started is not None and started["auth"] == "from-the-env"
    assert "PARTEX_PASSWORD" not in started["env"] and "from-the-env" not in " ".join(started["cmd"])


@pytest.mark.parametrize("argv, said", [
    (["--auth-file", "/no/such/file"], "--auth-file /no/such/file: cannot read it"),
    (["--auth-file", "TWO_LINES"], "holds 2 lines: give a JSON object"),
    (["--auth-file", "EMPTY_USER"], "every user name and password must be a non-empty string"),
    (["--models-dir", "/no/such/folder"], "--models-dir /no/such/folder is not a folder"),
    (["--max-upload", "lots"], "--max-upload 'lots' is not a positive size"),
    (["--max-upload", "0"], "--max-upload '0' is not a positive size"),
    (["--search-workers", "0"], "--search-workers '0' is not a positive whole number"),
    (["--search-workers", "two"], "--search-workers 'two' is not a positive whole number"),
    (["--max-pages", "0"], "--max-pages '0' is not a positive whole number"),
])
def test_bad_serving_options_are_one_line_before_anything_starts(argv, said, tmp_path, monkeypatch, capsys):
    (tmp_path / "TWO_LINES").write_text("first-secret\nsecond-secret\n")
    (tmp_path / "EMPTY_USER").write_text('{"ada": "", "alan": "a-secret"}')
    argv = [str(tmp_path / a) if a in ("TWO_LINES", "EMPTY_USER") else a for a in argv]
    code, started = _serve(argv, monkeypatch)
    err = capsys.readouterr().err
    assert code == 2 and started is None and err.count("\n") == 1 and said in err, err
    assert "secret" not in err  # the file's content is never echoed


def test_the_page_gets_the_models_folder_and_upload_limit_and_nothing_else_opens_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PARTEX_MODELS_DIR", str(tmp_path))  # a stray variable opens nothing
    code, started = _serve(["--max-upload", "1MiB"], monkeypatch)
    assert code == 0 and started is not None
    assert "PARTEX_MODELS_DIR" not in started["env"] and started["env"]["PARTEX_MAX_UPLOAD"] == str(2**20)
    code, started = _serve(["--models-dir", str(tmp_path)], monkeypatch)
    assert started is not None and started["env"]["PARTEX_MODELS_DIR"] == os.path.realpath(tmp_path)


@pytest.mark.parametrize("flag, variable, said", [
    ("--search-workers", "PARTEX_SEARCH_WORKERS", "; 3 searches at once, the others queued in turns of 15 s"),
    ("--max-pages", "PARTEX_MAX_PAGES", "; at most 3 pages open"),
])
def test_the_server_gets_its_search_workers_and_page_limit_and_says_them(flag, variable, said, monkeypatch,
                                                                           capsys):
    """--search-workers (--max-pages), else PARTEX_SEARCH_WORKERS (PARTEX_MAX_PAGES), else
    the default (one fewer than the cores; what three quarters of the machine's memory holds
    at 512 MiB a page): the panel server gets the count in its environment, and the start
    line says it."""
    from partex.explorer._pool import default_max_pages, default_workers

    default = {"PARTEX_SEARCH_WORKERS": default_workers, "PARTEX_MAX_PAGES": default_max_pages}[variable]
    monkeypatch.delenv(variable, raising=False)
    code, started = _serve([flag, "3"], monkeypatch)
    assert code == 0 and started is not None and started["env"][variable] == "3"
    assert said in capsys.readouterr().out
    monkeypatch.setenv(variable, "5")
    code, started = _serve([], monkeypatch)
    assert started is not None and started["env"][variable] == "5"
    monkeypatch.delenv(variable)
    code, started = _serve([], monkeypatch)
    assert started is not None and started["env"][variable] == str(default())


def test_the_default_page_limit_is_what_the_machines_memory_holds():
    from partex.explorer._pool import default_max_pages

    assert default_max_pages(4 * 2**30) == 6 and default_max_pages(int(23.5 * 2**30)) == 35
    assert default_max_pages(2**20) == 1


def test_a_page_past_the_servers_limit_is_told_it_is_full_until_one_closes(tmp_path):
    """A real server with --max-pages 1: a first page gets the explorer (its session, its
    model); a second, while the first is open, gets the server-is-full message and nothing
    else; once the first page's session ends (it never connected: the server ends it within
    seconds), a page gets the explorer again."""
    import urllib.request

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PARTEX_SESSIONS_DIR=str(tmp_path / "sessions"))
    env.pop("PARTEX_PASSWORD", None)
    log = tmp_path / "server.log"

    def get(path):
        with urllib.request.urlopen(base + path, timeout=120) as r:
            return r.status, r.read().decode(errors="replace")

    def up():
        if proc.poll() is not None:
            raise AssertionError(f"partex serve exited with {proc.returncode}: {log.read_text()[-3000:]}")
        try:
            return get("/assets/logo.svg")[0] == 200
        except OSError:
            return False

    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "partex", "serve", "--port", str(port), "--max-pages", "1"],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(up, 180, "the server")
        status, first = get("/app")
        assert status == 200 and "<title>partex explorer</title>" in first
        assert "a page refused" not in log.read_text()
        status, second = get("/app")
        assert status == 200 and "<title>partex explorer: the server is full</title>" in second
        assert "partex: a page refused: 1 page is open, the most this server serves at once" in log.read_text()
        wait_for(lambda: "<title>partex explorer</title>" in get("/app")[1], 120,
                 "a page once the first one's session ended")
    finally:
        stop(proc)


def test_with_a_password_a_page_fetched_without_it_gets_no_session(tmp_path):
    """A real server with --auth-file: the app, its files and its websocket answer a request
    without the login cookie with the login page or 403, and never with a session (a page
    with its session's token); a wrong password gets no cookie; the right one gets the app."""
    import http.cookiejar
    import urllib.error
    import urllib.parse
    import urllib.request

    password = "Tr0ub4dor-and-3"
    (tmp_path / "auth").write_text(json.dumps({"teacher": password}))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k != "PARTEX_PASSWORD"}
    env.update(JAX_PLATFORMS="cpu", PARTEX_SESSIONS_DIR=str(tmp_path / "sessions"))
    log = tmp_path / "server.log"

    class Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None  # a redirect is an answer to look at, not to follow

    def get(url, opener, data=None):
        try:
            with opener.open(url, data=data, timeout=60) as r:
                return r.status, r.headers, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.headers, ""

    def login_page():
        if proc.poll() is not None:
            raise AssertionError(f"partex serve exited with {proc.returncode}: {log.read_text()[-3000:]}")
        try:
            return get(f"{base}/login", urllib.request.build_opener(Stay))[0] == 200
        except OSError:
            return False

    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "partex", "serve", "--port", str(port), "--auth-file",
                                 str(tmp_path / "auth")], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(login_page, 180, "the login page")
        stranger = urllib.request.build_opener(Stay)
        for path in ("/app", "/assets/logo.svg"):
            status, headers, body = get(base + path, stranger)
            assert status == 302 and "login" in headers["Location"], (path, status, headers)
            assert "token" not in body
        assert get(f"{base}/app/ws", stranger)[0] == 403

        jar = http.cookiejar.CookieJar()
        user = urllib.request.build_opener(Stay, urllib.request.HTTPCookieProcessor(jar))
        wrong = urllib.parse.urlencode({"username": "teacher", "password": "guess"}).encode()
        status, headers, _ = get(f"{base}/login", user, wrong)
        assert status == 302 and "error=" in headers["Location"] and not list(jar)
        assert get(f"{base}/app", user)[0] == 302
        right = urllib.parse.urlencode({"username": "teacher", "password": password}).encode()
        assert get(f"{base}/login", user, right)[0] == 302 and {c.name for c in jar} >= {"user"}
        status, _, body = get(f"{base}/app", user)
        assert status == 200 and "token" in body  # the session the stranger never got

        server = children(proc.pid)[0]
        argv = pathlib.Path(f"/proc/{server}/cmdline").read_bytes().decode()
        assert "--basic-auth" in argv and password not in argv and password not in log.read_text()
    finally:
        stop(proc)


def test_browsers_reach_the_page_by_the_names_allowed():
    from partex.explorer import serve_command

    cmd = serve_command(5006, "0.0.0.0", origins=["partex.example.edu", "10.0.0.7:80", "[::1]:8080"], max_upload=2**25)
    allowed = [c.split("=", 1)[1] for c in cmd if c.startswith("--allow-websocket-origin=")]
    assert allowed == ["0.0.0.0:5006", "localhost:5006", "partex.example.edu:5006", "10.0.0.7:80", "[::1]:8080"]
    assert cmd[cmd.index("--websocket-max-message-size") + 1] == str(2**26)  # twice a limit over Bokeh's 20 MiB


def test_a_page_is_built_off_the_servers_event_loop(monkeypatch):
    """``partex serve``'s application: Bokeh builds each page (its views and Panel's
    document, seconds of Python) in a worker thread, not on the event loop that every open
    page's callbacks wait on; the page it builds is the explorer's, with its session."""
    import asyncio
    import threading
    import types

    from bokeh.server.contexts import ApplicationContext
    from tornado.ioloop import IOLoop

    from partex.explorer import _app, _server

    built_in = []
    create_app = _app.create_app

    def recorded(*args, **kwargs):
        built_in.append(threading.get_ident())
        return create_app(*args, **kwargs)

    monkeypatch.setattr(_app, "create_app", recorded)

    async def open_page():
        context = ApplicationContext(_server.application(), io_loop=IOLoop.current(), url="/app")
        request = types.SimpleNamespace(arguments={}, cookies={}, headers={}, path="/app", uri="/app",
                                        protocol="http", host="127.0.0.1")
        session = await context.create_session_if_needed("partex-test-page", request)
        try:
            names = {m.name for m in session.document.models if m.name}
            return threading.get_ident(), names
        finally:
            await context._shutdown_sessions()

    loop_thread, names = asyncio.run(open_page())
    assert built_in and built_in[0] != loop_thread
    assert {"partex-state", "partex-teach-target"} <= names, sorted(names)[:20]
