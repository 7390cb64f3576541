"""``partex serve`` starts ``panel serve`` as a child: stopping the command (SIGTERM, as a
process manager or a test harness does, or SIGKILL) must stop the server too, leaving no
orphan holding the port."""

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
