"""The partex explorer: ``panel serve explorer/app.py`` (or ``make serve`` / ``partex serve``).

Every browser session runs this script and gets its own state and search.
"""

import logging
import pathlib
import sys

try:
    import explorer  # noqa: F401  (installed with `pip install -e .`)
except ImportError:  # a plain checkout: the repository root holds the packages
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import panel as pn

from explorer._app import create_app

_log = logging.getLogger("partex.explorer")
if not _log.handlers:  # the server's log shows the explorer's own lines (threads ending, slow callbacks)
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    _log.addHandler(_handler)
    _log.setLevel(logging.INFO)
    _log.propagate = False

pn.extension(notifications=False)

import gc as _gc, time as _time  # DEBUG
if not getattr(_gc, "_px_dbg", False):
    _gc._px_dbg = True
    _t = {}
    def _cb(phase, info):
        if phase == "start":
            _t["t"] = _time.perf_counter()
        else:
            ms = (_time.perf_counter() - _t["t"]) * 1e3
            if ms > 20:
                _log.warning("GC gen%d pause %.0f ms collected %d", info["generation"], ms, info["collected"])
    _gc.callbacks.append(_cb)
create_app().servable(title="partex explorer")
