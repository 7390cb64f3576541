"""The partex explorer's page as a Panel script, for ``panel serve explorer/app.py`` (each page built on
the server's event loop). ``partex serve`` (``make serve``) serves the same page built off the loop (``_server``).

Every browser session runs this script and gets its own state and search.
"""

import panel as pn

from partex.explorer._app import create_app, on_exception, page_title
from partex.explorer._server import build_page, show_log

show_log()
pn.extension(notifications=False, exception_handler=on_exception)
if pn.state.curdoc is not None:  # served: the page ``partex serve`` builds, here on the event loop
    build_page(pn.state.curdoc)
else:
    _page = create_app()
    _page.servable(title=page_title(_page))
