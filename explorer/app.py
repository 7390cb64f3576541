"""The partex explorer's page as a Panel script, for ``panel serve explorer/app.py`` (each page built on
the server's event loop). ``partex serve`` (``make serve``) serves the same page built off the loop (``_server``).

Every browser session runs this script and gets its own state and search.
"""

import panel as pn

from partex.explorer._app import create_app, on_exception, page_title
from partex.explorer._server import show_log

show_log()
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
