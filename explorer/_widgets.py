"""Panel widgets whose Bokeh model carries a stable ``name``, so that tests and scripts
find them with ``Bokeh.documents[0].get_model_by_name(key)`` (Panel uses a widget's own
``name`` as its label and does not forward it to the model)."""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterable, Iterator

import panel as pn
from bokeh.core.enums import SizingModeType
from bokeh.models import Div, Tooltip
from panel.io import unlocked

CSS = "assets/explorer.css"  # the static folder, served at /assets (``_server``)


def bokeh_update(fn):
    """For view methods that change raw Bokeh models. Panel runs a widget's change event
    without the document lock, and Bokeh refuses model changes made that way; Panel's own
    models collect theirs under ``unlocked()`` and send them itself: so do these."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with unlocked():
            return fn(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def page_callback(clock, what: str) -> Iterator[list[str]]:
    """The body of one of the page's callbacks that does ``what``: timed on the page's clock
    (``_loop.PageClock.timed``; the body may add what else it did to the list it is handed),
    and the Bokeh changes of all its views sent to the page together, as one message, when it
    ends (each view's change sent on its own, a new model on the page is some fifty messages,
    each serialised on the event loop)."""
    with clock.timed(what) as done, unlocked():
        yield done


@functools.cache
def keyed(base: type) -> type:
    class Keyed(base):
        def __init__(self, key: str, *args, **params):
            super().__init__(*args, **params)
            self._key = key

        def _get_model(self, doc, root=None, parent=None, comm=None):
            model = super()._get_model(doc, root, parent, comm)
            model.name = self._key
            return model

    Keyed.__name__ = Keyed.__qualname__ = base.__name__
    return Keyed


def button(key: str, label: str, **params) -> pn.widgets.Button:
    return keyed(pn.widgets.Button)(key, label=label, **params)


def tip_left(text: str) -> Tooltip:
    """A widget's description shown on its left: Panel shows a description on the right, off
    the window for a widget near the window's right edge."""
    return Tooltip(content=text, position="left", attachment="left")


def text_input(key: str, label: str, **params) -> pn.widgets.TextInput:
    return keyed(pn.widgets.TextInput)(key, label=label, **params)


def select(key: str, label: str, **params) -> pn.widgets.Select:
    return keyed(pn.widgets.Select)(key, label=label, **params)


def on_click(button, clock, what: str, fn: Callable[[], Any]) -> None:
    """Run ``fn()`` when ``button`` is pressed, as one of the page's callbacks that does
    ``what`` (``page_callback``: timed on ``clock``, a ``_loop.PageClock``)."""

    def clicked(event):
        with page_callback(clock, what):
            fn()

    button.on_click(clicked)


def on_change(obj, clock, what: str, fn: Callable[..., Any], names: Iterable[str]) -> None:
    """Run ``fn(*events)`` when any of the parameters ``names`` of ``obj`` (a widget, the
    page's state, a view) changes, as one of the page's callbacks that does ``what``
    (``page_callback``: timed on ``clock``; one run inside another callback, as a state's
    watcher inside the button that set the state, counts as part of that one)."""

    def changed(*events):
        with page_callback(clock, what):
            fn(*events)

    obj.param.watch(changed, list(names))


def bind(widget, state, name: str, attr: str = "value", *, clock=None) -> None:
    """Two-way link between widget.<attr> and state.<name>; with a ``clock`` (a
    ``_loop.PageClock``), each way is one of the page's timed callbacks (``on_change``)."""
    setattr(widget, attr, getattr(state, name))
    to_state, to_widget = (lambda e: setattr(state, name, e.new)), (lambda e: setattr(widget, attr, e.new))
    if clock is None:
        widget.param.watch(to_state, [attr])
        state.param.watch(to_widget, [name])
    else:
        on_change(widget, clock, f"the {name} field", to_state, [attr])
        on_change(state, clock, f"the {name} field shown", to_widget, [name])


class Html(pn.viewable.Viewer):
    """HTML styled by the explorer's stylesheet, as a plain Bokeh Div: replacing its text
    is one string sent to the page, showing or hiding it one flag. (Updating a pn.pane.HTML
    rebuilds its stylesheet models, which makes Bokeh re-walk the whole document: ~100 ms
    on this page.)"""

    def __init__(self, text: str = "", *, name: str | None = None, sizing_mode: SizingModeType = "stretch_width",
                 margin=(5, 10), visible: bool = True, styles: dict | None = None, **params):
        super().__init__()
        # visible and styles on the Div itself: the pane hands its own to the Div only when
        # one of them changes (see ``visible``)
        self.div = Div(text=text, name=name, sizing_mode=sizing_mode, disable_math=True, visible=visible,
                       styles=styles or {})
        # Panel sets the model's stylesheets from the pane's
        self._pane = pn.pane.Bokeh(self.div, sizing_mode=sizing_mode, margin=margin, stylesheets=[CSS], **params)

    @property
    def object(self) -> str:
        return self.div.text

    @object.setter
    @bokeh_update
    def object(self, text: str) -> None:
        if text != self.div.text:
            self.div.text = text

    @property
    def visible(self) -> bool:
        return self.div.visible

    @visible.setter
    @bokeh_update
    def visible(self, value: bool) -> None:
        # the Div alone (the pane's model): a pane's visible set anew makes Panel set all its
        # overridden properties on the model again, its stylesheets among them, and Bokeh then
        # walks the whole document (~130 ms, a toast shown)
        if value != self.div.visible:
            self.div.visible = value

    def __panel__(self):
        return self._pane


def html(text: str = "", **params) -> Html:
    return Html(text, **params)
