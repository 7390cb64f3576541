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
create_app().servable(title="partex explorer")
