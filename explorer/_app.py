"""Assemble one browser session's page: its own ExplorerState, the views handed that
state, the template, and the session's clock (poll) and teardown."""

from __future__ import annotations

import logging
import weakref

import panel as pn
from panel.io.callbacks import PeriodicCallback
from bokeh.models import CustomJS, Div

from ._charts import KpiView, MemoryView, SearchView
from ._compare import CompareView
from ._controls import FileControls, MeshControls, ModelControls, SearchControls
from ._graph import DecisionView, GraphView
from ._meshes import MeshesView
from ._pool import server_pages, server_pool
from ._share import LinkControls
from ._state import ExplorerState
from ._tables import BaselinesView, PlanView, VerifyView
from ._teach import CompareChoice, TeachView
from ._format import esc
from ._loop import server_loop_lag
from ._widgets import CSS, button, html, on_change, on_click, page_callback

log = logging.getLogger("partex.explorer")

POLL_MS = 200  # how often the page picks up the search's progress and finished jobs
TICK_MS = 100  # the event-loop lag monitor's period
TOAST_MS = 10_000  # how long a warning or an error stays in the corner
TOAST_COLOURS = {"warning": ("#fffbeb", "#fde68a", "#92400e"), "danger": ("#fef2f2", "#fecaca", "#991b1b")}
ACCENT = "#1d4ed8"
PANEL_DIST = "static/extensions/panel/"  # where panel serve serves Panel's own CSS and JS
OFFLINE_JS = "assets/offline.js"  # maps CDN addresses onto this server's copies (static/offline.js)

# Each page's state, by its Bokeh document: an exception in one of its callbacks is reported
# on that page (``on_exception``).
_STATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def on_exception(exc: BaseException) -> None:
    """Panel's ``exception_handler``: an exception in a widget, button or periodic callback.
    Panel calls it in the page's own document context; the page gets one line and goes on,
    the server's log keeps the traceback."""
    state = _STATES.get(pn.state.curdoc) if pn.state.curdoc is not None else None
    if state is None or not isinstance(exc, Exception):
        log.error("partex: exception in a callback", exc_info=exc)
        return
    state.internal_error("handling that", exc)


def _card(title: str, body, subtitle: str = "", **kw) -> pn.Column:
    """A titled panel. (A pn.Card would do, but Bokeh's DataTable fails to render inside
    one: "SlickGrid Cannot find stylesheet".)"""
    head = f"<div class='card-head'><span class='card-title'>{title}</span>" + (
        f"<span class='card-sub'>{subtitle}</span>" if subtitle else "") + "</div>"
    kw.setdefault("sizing_mode", "stretch_width")
    return pn.Column(html(head, sizing_mode="stretch_width", margin=(0, 0)), body, css_classes=["px-card"],
                     stylesheets=[CSS], margin=(6, 6), **kw)


class ProbeView(pn.viewable.Viewer):
    """Hidden models for tests and scripts: ``partex-state`` (a Div whose text is the state
    as JSON) and ``partex-ping`` (a Div whose text, set by the page, the state echoes back
    at once: a round trip through the server's event loop, with none of Panel's debouncing
    of widget events)."""

    def __init__(self, state: ExplorerState, **params):
        super().__init__(**params)
        self.div = Div(text=state.probe, name="partex-state", visible=False)
        on_change(state, state.clock, "the state's probe", lambda e: setattr(self.div, "text", e.new), ["probe"])
        self.ping = Div(text="", name="partex-ping", visible=False)

        def ping(attr, old, new):
            with page_callback(state.clock, "a ping"):
                state.ping = new

        self.ping.on_change("text", ping)
        self._panel = pn.Row(pn.pane.Bokeh(self.div, visible=False), pn.pane.Bokeh(self.ping, visible=False),
                             visible=False, height=0, margin=0)

    def __panel__(self):
        return self._panel


# Scroll the main column to the card a walkthrough step points at (its title, before "|") and
# outline it. Only the card's own column scrolls (the window never does: scrollIntoView would
# scroll it too, leaving the page shifted under the header). The walkthrough's panel
# (.px-teach) sits in the sidebar, below the search controls, where it covers nothing; it is
# scrolled into the sidebar's view if it is out of it. A card not on the page yet is looked
# for again (up to 30 s) while the step lasts; found, it is kept in view until the step
# changes or the user scrolls, clicks or types (cards above it may still be laid out, a table
# may scroll the page). An empty text clears the outline. The cards sit in nested shadow roots.
POINT_AT_CARD = """
const want = cb_obj.text.split("|")[0];
if (window._pxTeach) { window._pxTeach.style.outline = ""; window._pxTeach = null; }
if (!want) return;
function find(root, test) {
  for (const el of root.querySelectorAll("*")) {
    if (test(el)) return el;
    if (el.shadowRoot) { const hit = find(el.shadowRoot, test); if (hit) return hit; }
  }
  return null;
}
const up = (el) => el.parentElement || (el.getRootNode() instanceof ShadowRoot ? el.getRootNode().host : null);
const has = (name) => (el) => el.classList && el.classList.contains(name);
// the element's own scrolling column (the main column, the sidebar), never the window
function column(el) {
  for (let node = up(el); node && node !== document.body && node !== document.documentElement; node = up(node)) {
    const overflow = getComputedStyle(node).overflowY;
    if ((overflow === "auto" || overflow === "scroll") && node.scrollHeight > node.clientHeight) return node;
  }
  return null;
}
function reveal(el) {
  const box = column(el);
  if (box) box.scrollTop += el.getBoundingClientRect().top - box.getBoundingClientRect().top;
}
const step = cb_obj.text;
const since = performance.now();
// The card is pointed at once it is on the page (a busy page may still be drawing it), as
// long as the step is this one.
function point() {
  if (cb_obj.text !== step) return;
  const el = find(document, (e) => has("card-title")(e) && e.textContent.trim() === want);
  if (!el) {
    if (performance.now() - since < 30000) requestAnimationFrame(point);
    return;
  }
  let card = el;
  while (card && !has("px-card")(card)) card = up(card);
  card = card || el;
  reveal(card);
  card.style.outline = "3px solid #f59e0b";
  card.style.outlineOffset = "2px";
  window._pxTeach = card;
  // Cards above it may still be drawing (a chart's or table's late layout moves everything
  // below), and a table may scroll the page to a row: the card is kept in view until the
  // step changes or the user scrolls, clicks or types.
  let userMoved = false;
  const moved = () => { userMoved = true; };
  for (const ev of ["wheel", "touchmove", "keydown", "mousedown"])
    window.addEventListener(ev, moved, {once: true, passive: true});
  const keep = setInterval(() => {
    if (window._pxTeach !== card || userMoved) { clearInterval(keep); return; }
    const b = card.getBoundingClientRect();
    if (b.top < -5 || b.top > window.innerHeight - 60) reveal(card);
  }, 250);
}
function showPanel() {
  const pop = find(document, has("px-teach"));
  if (!pop || !pop.offsetWidth) return;
  const r = pop.getBoundingClientRect();
  if (r.top < 0 || r.bottom > window.innerHeight) reveal(pop);
}
point();
requestAnimationFrame(showPanel);
"""


class TeachPointer(pn.viewable.Viewer):
    """A hidden Div (``partex-teach-target``) whose text is the card the walkthrough's step
    points at: the page scrolls to that card and outlines it (``POINT_AT_CARD``)."""

    def __init__(self, teach: TeachView, **params):
        super().__init__(**params)
        self.div = Div(text="", name="partex-teach-target", visible=False)
        self.div.js_on_change("text", CustomJS(code=POINT_AT_CARD))
        self._n = 0

        def point(e):
            self._n += 1  # a new text every time: two steps in a row may point at one card
            self.div.text = f"{e.new}|{self._n}" if e.new else ""

        on_change(teach, teach.state.clock, "the walkthrough's pointer", point, ["target"])
        self._panel = pn.pane.Bokeh(self.div, visible=False, height=0, margin=0)

    def __panel__(self):
        return self._panel


class Fast(pn.theme.Fast):
    """The Fast design less its web font: it adds Google's Open Sans as a ``font`` resource
    (twice in the page) even with ``font_url=""``, a request that fails on an air-gapped
    cluster on every load. Every resource the page loads then comes from this server. (Named
    ``Fast``: Panel finds a design's own files under its class name.)"""

    _resources = {k: v for k, v in pn.theme.Fast._resources.items() if k != "font"}


class MessageView(pn.viewable.Viewer):
    """The state's message: a banner at the top of the main column (``partex-alert``) and,
    for a warning or an error, a toast fixed at the top right of the window for TOAST_MS
    (``partex-toast``): the main column scrolls on its own, and the user may be anywhere in
    it. A refused input has no toast: its field, where the user typed, says it. ``timed``: a
    server's page, where the toast's timer can run."""

    def __init__(self, state: ExplorerState, timed: bool, **params):
        super().__init__(**params)
        self.state, self.timed = state, timed
        self.alert = html(name="partex-alert", margin=(4, 6))
        self.toast = html(name="partex-toast", margin=0, visible=False,
                          styles={"position": "fixed", "top": "64px", "right": "24px", "z-index": "1000",
                                  "max-width": "560px", "box-shadow": "0 6px 24px rgba(15, 23, 42, 0.18)",
                                  "border-radius": "8px"})
        self.shown = 0
        on_change(state, state.clock, "the message", self._show, ["message", "message_level"])
        self._show()
        self._panel = pn.Column(self.alert, self.toast, sizing_mode="stretch_width", margin=0)

    def __panel__(self):
        return self._panel

    def _hide_toast_later(self, n: int):
        def hide():
            with page_callback(self.state.clock, "the toast hidden"):
                if self.shown == n:
                    self.toast.visible = False
        return hide

    def _show(self, *_):
        state = self.state
        icon = {"success": "✓", "info": "ℹ", "warning": "⚠", "danger": "✕", "refused": "✕"}[state.message_level]
        text = (f"<div class='alert {state.message_level}' role='alert'><b>{icon}</b> {esc(state.message)}</div>"
                if state.message else "")
        self.alert.object = text
        self.shown += 1
        if text and state.message_level in ("warning", "danger"):
            # inline colours: a pane shown after the page loaded does not get the stylesheet
            bg, border, fg = TOAST_COLOURS[state.message_level]
            self.toast.object = (f"<div role='status' data-toast='1' style='background:{bg};border:1px solid "
                                 f"{border};color:{fg};border-radius:8px;padding:10px 14px;font-size:13.5px;"
                                 f"line-height:1.35'><b>{icon}</b> {esc(state.message)}</div>")
            self.toast.visible = True
            if self.timed:
                n = self.shown
                pn.state.add_periodic_callback(self._hide_toast_later(n), period=TOAST_MS, count=1)
        else:
            self.toast.visible = False


def _busy_spinner(state: ExplorerState):
    """The header's spinner: it shows real work (a search running, a model loading, a
    compile), not Panel's own indicator, which turns with every periodic poll of the page."""
    busy = pn.indicators.LoadingSpinner(value=True, size=22, color="light", bgcolor="dark", margin=(14, 16),
                                        visible=False)

    def show_busy(*_):
        value = bool(state.busy) or (state.running and not state.search_queue)  # queued: no work yet
        if busy.visible != value:
            busy.visible = value

    on_change(state, state.clock, "the header's spinner", show_busy, ["busy", "running", "search_queue"])
    return busy


TITLE = "partex explorer"
FULL_TITLE = "partex explorer: the server is full"


class FullPage(pn.viewable.Viewer):
    """What a page past the server's limit of open pages shows (``PageLimit``): why, and
    what to do; no model, no search. Its window's title says it too (``page_title``)."""

    def __init__(self, limit: int, **params):
        super().__init__(**params)
        bg, border, fg = TOAST_COLOURS["warning"]  # inline: this page has none of the explorer's stylesheet
        self._panel = pn.Column(html(
            f"<div role='alert' style='background:{bg};border:1px solid {border};color:{fg};border-radius:8px;"
            f"padding:14px 18px;font:15px/1.45 Inter, system-ui, sans-serif;max-width:720px;margin:48px auto'>"
            f"<b>⚠ This partex explorer is full.</b> {limit} page{'s are' if limit > 1 else ' is'} open, the most "
            "its server serves at once (its operator sets <code>partex serve --max-pages</code>). Close a tab "
            "of it, or reload this page in a minute.</div>", name="partex-full"), sizing_mode="stretch_width")

    def __panel__(self):
        return self._panel


def page_title(page) -> str:
    """The window's title of a page ``create_app`` made."""
    return FULL_TITLE if isinstance(page, FullPage) else TITLE


def create_app(sessions_dir: str | None = None) -> pn.template.FastListTemplate | FullPage:
    """One browser session's page; on a server, a page past its limit of open pages
    (``--max-pages``) gets a ``FullPage`` instead."""
    doc = pn.state.curdoc
    ctx = getattr(doc, "session_context", None) if doc is not None else None
    if ctx is not None:
        pages = server_pages()
        if not pages.open(ctx.id):
            log.warning("partex: a page refused: %d %s open, the most this server serves at once (--max-pages)",
                        pages.limit, "pages are" if pages.limit > 1 else "page is")
            return FullPage(pages.limit)
        try:
            return _page(ctx, doc, sessions_dir)
        except BaseException:
            pages.close(ctx.id)
            raise
    return _page(None, doc, sessions_dir)


def _page(ctx, doc, sessions_dir: str | None) -> pn.template.FastListTemplate:
    session_id = ctx.id[:8] if ctx is not None else ""
    if doc is not None:
        # Panel resolves a component's stylesheets against the page's dist_url, which it sets
        # only when it renders the page; a component made before that gets the CDN's address.
        # Set it first: every stylesheet then comes from this server (static/offline.js
        # catches any address that slips through).
        rel = pn.state.rel_path
        doc.template_variables.setdefault("dist_url", f"{rel}/{PANEL_DIST}" if rel else PANEL_DIST)
    # a link's query (``_link``): the page opens on the state it names; a served page's search
    # takes turns at the server's search slots
    state = ExplorerState(sessions_dir=sessions_dir, session_id=session_id,
                          link=pn.state.session_args if ctx is not None else None,
                          pool=server_pool() if ctx is not None else None)
    if doc is not None:
        _STATES[doc] = state

    message = MessageView(state, timed=ctx is not None)
    graph = GraphView(state=state)
    decision = DecisionView(state=state)
    compare = CompareView(state=state)
    teach = TeachView(state=state, compare=CompareChoice(compare))
    main = [
        pn.Column(message, TeachPointer(teach), KpiView(state=state), ProbeView(state),
                  sizing_mode="stretch_width", margin=(0, 0)),
        pn.Row(
            _card("Named dimensions", graph,
                  "decision groups · edges: they meet in a tensor · red: conflicts", height=620),
            _card("Decision", decision, "inspect, pin or forbid a group", width=430, height=620,
                  sizing_mode="fixed"),
            sizing_mode="stretch_width",
        ),
        _card("Search", SearchView(state=state), "Monte Carlo tree search over (group, axis) decisions"),
        pn.Row(
            _card("Memory per device", MemoryView(state=state), "stacked by kind, against the budget",
                  width=540, sizing_mode=None),
            _card("Baselines", BaselinesView(state=state), "hand-written strategies on the same cost model"),
            sizing_mode="stretch_width",
        ),
        _card("Meshes", MeshesView(state=state),
              "the mesh's shape as a decision: factorisations of the devices, each searched with the plan"),
        _card("Compare", compare, "two plans side by side: what B changes against A"),
        _card("Plan", PlanView(state=state), "PartitionSpecs and the collectives they imply"),
        _card("Predicted vs XLA", VerifyView(state=state), "the cost model checked against the compiler"),
    ]
    sidebar = [
        SearchControls(state=state),
        teach,  # below the search controls (the walkthrough's Search step asks for Run), covering nothing
        ModelControls(state=state),
        MeshControls(state=state),
        FileControls(state=state),
        LinkControls(state=state),
    ]
    busy = _busy_spinner(state)
    teach_btn = button("partex-teach", "Teach", color="light", variant="outline", width=110,
                       margin=(12, 8), description="A guided walkthrough of the model on the page, step by step")
    on_click(teach_btn, state.clock, "the Teach button", teach.start)
    template = pn.template.FastListTemplate(
        design=Fast,
        busy_indicator=None,
        header=[pn.Row(teach_btn, busy)],
        title=TITLE,
        logo="assets/logo.svg",
        favicon="assets/logo.svg",
        sidebar=sidebar,
        main=main,
        main_layout=None,
        sidebar_width=330,
        accent=ACCENT,
        header_background="#0f172a",
        header_color="#f8fafc",
        theme_toggle=False,
        font="Inter, 'Segoe UI', system-ui, -apple-system, sans-serif",
        font_url="",
        main_max_width="1500px",
    )
    template.config.css_files = [CSS]
    template.config.js_files = {"partex_offline": OFFLINE_JS}
    if ctx is not None:
        def poll():
            with page_callback(state.clock, "the page's poll") as done:
                done += state.poll()

        # a background callback: Panel does not count it in its (server-wide) busy state, whose
        # bookkeeping around every poll of every page was a fifth of the loop's work with
        # twenty pages open; stopped with the page's session (Bokeh drops its callbacks)
        PeriodicCallback(callback=poll, period=POLL_MS, background=True, log=False).start()
        state.clock.lag = server_loop_lag(TICK_MS)

        def destroyed(session_context):
            state.close()
            server_pages().close(ctx.id)

        pn.state.on_session_destroyed(destroyed)
    return template
