"""The explorer's server: ``partex serve`` runs ``python -m partex.explorer._server`` as its
child (``serve_command`` writes its command line; its options are ``panel serve``'s).

Every page is one Bokeh document, built when its browser asks for it. Built by a function
(not a script, as ``panel serve app.py`` would), Bokeh builds it in a worker thread, off the
event loop that every open page's callbacks run on: a page's build (its views, then Panel's
document: 1-2 s of Python on the demo transformer) no longer holds every other page up. The
builds run one at a time, in one thread (``PAGE_BUILDERS``): the loop then shares the
interpreter with one of them, not with one per page opening at once, and takes it back
within the switch interval (``_loop.SWITCH_INTERVAL``) whenever one of its timers is due.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import logging
import sys
from typing import Sequence, cast

PAGE_BUILDERS = 1  # pages built at once, each in a thread of its own


def build_page(doc) -> None:
    """Build one browser session's page into ``doc`` (in Bokeh's worker thread): the views
    (``create_app``), then Panel's document, its models added to ``doc`` at once (Bokeh
    recomputes the document's model graph once, not once per root the template adds)."""
    import panel as pn
    from panel.io.state import set_curdoc
    from panel.template.base import BaseTemplate
    from panel.viewable import Viewable

    from ._app import create_app, page_title

    with set_curdoc(doc), doc.models.freeze():
        page = create_app()
        shown = page if isinstance(page, BaseTemplate) else cast(Viewable, pn.panel(page))  # a full server's
        shown.server_doc(doc=doc, title=page_title(page))


def application():
    """The explorer as a Panel application whose pages ``build_page`` builds (Bokeh runs a
    function application's builds in a worker thread)."""
    from bokeh.application.handlers.function import FunctionHandler
    from panel.io.application import Application

    return Application(FunctionHandler(build_page))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m partex.explorer._server", allow_abbrev=False,
                                 description="The partex explorer's server (partex serve starts it).")
    ap.add_argument("--address", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5006)
    ap.add_argument("--allow-websocket-origin", action="append", default=[], metavar="HOST[:PORT]")
    ap.add_argument("--unused-session-lifetime", type=int, default=5000, metavar="MS")
    ap.add_argument("--check-unused-sessions", type=int, default=1000, metavar="MS")
    ap.add_argument("--websocket-max-message-size", type=int, default=None, metavar="BYTES")
    ap.add_argument("--basic-auth", default=None, metavar="FILE", help="a credentials file (_access.write_credentials)")
    ap.add_argument("--show", action="store_true")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import panel as pn
    from panel.io.server import get_server

    from . import STATIC
    from ._app import TICK_MS, on_exception
    from ._loop import SWITCH_INTERVAL, server_loop_lag

    show_log()
    pn.extension(notifications=False, exception_handler=on_exception)
    sys.setswitchinterval(SWITCH_INTERVAL)  # the loop takes the interpreter back from a page's build at once
    extra = {}
    if args.websocket_max_message_size is not None:
        extra["websocket_max_message_size"] = args.websocket_max_message_size
    server = get_server(
        {"app": application()},  # pyright: ignore[reportArgumentType]  (an Application is served as it is)
        port=args.port, address=args.address, websocket_origin=args.allow_websocket_origin or None,
        static_dirs={"assets": str(STATIC)}, basic_auth=args.basic_auth, show=args.show,
        warm=True,  # built once before the first tab: imports done and the demo model traced
        start=False, verbose=False, title="partex explorer",
        unused_session_lifetime_milliseconds=args.unused_session_lifetime,
        check_unused_sessions_milliseconds=args.check_unused_sessions, **extra)
    loop = server.io_loop
    # Bokeh builds pages in the loop's default executor: first thing once the loop runs
    loop.add_callback(lambda: asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(PAGE_BUILDERS, thread_name_prefix="partex-page")))
    server_loop_lag(TICK_MS, loop=loop)  # the server's lag monitor, on its loop from the start
    server.run_until_shutdown()  # as ``panel serve``: until SIGTERM or Ctrl-C, then its sessions closed
    return 0


def show_log() -> None:
    """The server's log shows the explorer's own lines (threads ending, slow callbacks)."""
    log = logging.getLogger("partex.explorer")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


if __name__ == "__main__":
    sys.exit(main())
