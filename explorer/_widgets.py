"""Panel widgets whose Bokeh model carries a stable ``name``, so that tests and scripts
find them with ``Bokeh.documents[0].get_model_by_name(key)`` (Panel uses a widget's own
``name`` as its label and does not forward it to the model)."""

from __future__ import annotations

import functools

import panel as pn

CSS = "assets/explorer.css"  # served by `panel serve --static-dirs assets=static`


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
    return keyed(pn.widgets.Button)(key, name=label, **params)


def text_input(key: str, label: str, **params) -> pn.widgets.TextInput:
    return keyed(pn.widgets.TextInput)(key, name=label, **params)


def select(key: str, label: str, **params) -> pn.widgets.Select:
    return keyed(pn.widgets.Select)(key, name=label, **params)


def bind(widget, state, name: str, attr: str = "value") -> None:
    """Two-way link between widget.<attr> and state.<name>."""
    setattr(widget, attr, getattr(state, name))
    widget.param.watch(lambda e: setattr(state, name, e.new), [attr])
    state.param.watch(lambda e: setattr(widget, attr, e.new), [name])


def html(text: str = "", **params) -> pn.pane.HTML:
    """An HTML pane styled by the explorer's stylesheet (panes live in a shadow DOM)."""
    params.setdefault("stylesheets", [CSS])
    return pn.pane.HTML(text, **params)
