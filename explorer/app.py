"""The partex explorer's Panel script (``partex serve`` or ``make serve`` runs it with ``panel serve``).

Every browser session runs this script and gets its own state and search.
"""

import logging

import panel as pn

from partex.explorer._app import create_app, on_exception, page_title

_log = logging.getLogger("partex.explorer")
if not _log.handlers:  # the server's log shows the explorer's own lines (threads ending, slow callbacks)
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    _log.addHandler(_handler)
    _log.setLevel(logging.INFO)
    _log.propagate = False

pn.extension(notifications=False, exception_handler=on_exception)
# The page's models join the document at once: Bokeh recomputes the document's model graph
# once, not once per root the template adds (about half of a page's build on the server's
# event loop, which every other page waits on)
_doc = pn.state.curdoc
if _doc is not None:
    with _doc.models.freeze():
        _page = create_app()
        _page.servable(title=page_title(_page))
else:
    _page = create_app()
    _page.servable(title=page_title(_page))
