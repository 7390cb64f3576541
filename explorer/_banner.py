"""Where a message of the page goes (``Banner``): at the form field a bad input came from, or
in the banner line, with the standing warning that later messages add to."""

from __future__ import annotations

from typing import Any, Callable

from ._slice import ParamSlice

# The form fields a bad input can be shown at (the sidebar's, always in view): the message
# goes there and nowhere else. Said also in the banner and a toast it was shown three times,
# the toast covering the page; a message tied to no field (a broken upload, a failed
# verification, the search's own failure) has no such place and goes to the banner and toast.
MODEL_FIELDS = ("overrides", "custom")
CONFIG_FIELDS = ("mesh", "hardware", "budget", "margin", "pipeline")
MESH_SEARCH_FIELDS = ("devices", "topology", "pipelines", "seconds")  # the Meshes card's form, where the user is
FORM_FIELDS = (*MODEL_FIELDS, *CONFIG_FIELDS, "session", *MESH_SEARCH_FIELDS)


def one_line(text: Any) -> str:
    """A message as the banner shows it: its runs of whitespace made single spaces."""
    return " ".join(str(text).split())


class Banner:
    """Where the page's messages go. Owns the form fields' marks (``field_error``: a bad
    input's message at the field it came from, one of FORM_FIELDS) and the standing warning:
    no plan fits, said once; later info messages (searching, paused) add to it, never replace
    it, until a plan fits or another model or mesh loads.

    ``page``: the state's ``field_error``, and its ``message`` (read). ``notify(text, level)``
    writes the banner line (the state's ``notify``, which views call too). ``hidden()``: the
    model field the form does not show (the model picker shows one of two)."""

    def __init__(self, page: ParamSlice, notify: Callable[[Any, str], None], hidden: Callable[[], str]):
        self.page = page
        self.notify = notify
        self.hidden = hidden
        self.standing = ""

    @property
    def line(self) -> str:
        """The banner's line as the page shows it."""
        return self.page.message

    def bad_input(self, e: Exception | str) -> None:
        """A bad input's message, shown once: at the form field it came from, or (tied to no
        shown field) in the banner."""
        field = getattr(e, "field", None)
        if field in FORM_FIELDS and field != self.hidden():
            self.page.set(field_error={field: str(e)})
        else:
            self.notify(e, "danger")

    def clear(self, *fields: str) -> None:
        """The inputs of ``fields`` are good (applied, or no longer shown): their marks go."""
        marks = self.page.field_error
        if any(f in marks for f in fields):
            self.page.set(field_error={k: v for k, v in marks.items() if k not in fields})

    def say(self, text: str) -> None:
        """An info message; with a standing warning, after it (the warning stays)."""
        if self.standing:
            self.notify(f"{self.standing}; {text}", "warning")
        else:
            self.notify(text, "info")
