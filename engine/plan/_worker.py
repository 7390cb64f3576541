"""The fresh processes verify and measure run their work in, and the line they answer with.

A worker is ``python -m partex.plan.<module> SPEC`` (SPEC a JSON object) in an environment of
its own (``jax_num_cpu_devices`` must be set before JAX starts; a peak is the process's own).
It prints one marked line, ``{"partex-<tag>": ...}``, so that whatever the user's model prints
on stdout is not mistaken for it: the result, or bad input as one line (``error``: the
parent raises ``PartexError``), or anything else with its traceback (``crash``).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any, Callable

from .._errors import PartexError


def run_worker(module: str, tag: str, spec: dict, env: dict, timeout: float, what: str) -> Any:
    """Run ``module``'s worker on ``spec`` and return its result; ``what``: the work, for
    messages ("verify", "measuring dp")."""
    try:
        r = subprocess.run([sys.executable, "-m", module, json.dumps(spec)], env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        raise PartexError(f"{what} did not finish within {timeout:.0f} s") from None
    marker = f'{{"partex-{tag}"'
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(marker)]
    if not lines and r.returncode < 0:  # killed by a signal: the machine's doing, not partex's
        name = signal.Signals(-r.returncode).name if -r.returncode in signal.Signals._value2member_map_ else str(-r.returncode)
        why = (" (the system's out-of-memory killer, most often: the step needs more memory than this machine has; "
               "try a smaller preset, or run it on the devices it is planned for)" if name == "SIGKILL" else "")
        raise PartexError(f"{what}: its process was killed by {name}{why}")
    if not lines:  # the worker died (out of memory in the runtime, a crash): everything it said
        raise RuntimeError(f"{tag}'s worker process exited with code {r.returncode} and no result; "
                           f"its output:\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}")
    out = json.loads(lines[-1])[f"partex-{tag}"]
    if "error" in out:  # bad input, one line
        raise PartexError(out["error"])
    if "crash" in out:  # anything else keeps its traceback
        raise RuntimeError(f"{tag}'s worker process failed:\n{out['crash']}")
    return out["result"]


def worker_main(tag: str, work: Callable[[dict], Any]) -> None:
    """A worker's ``main``: ``work(spec)`` on the JSON spec of its command line, its result
    (JSON data) printed as the one marked line."""
    import traceback

    spec = json.loads(sys.argv[1])
    try:
        out: dict[str, Any] = {"result": work(spec)}
    except PartexError as e:
        out = {"error": str(e)}
    except Exception:  # the process's boundary: hand the whole traceback to the parent
        out = {"crash": traceback.format_exc()}
    print(json.dumps({f"partex-{tag}": out}))
