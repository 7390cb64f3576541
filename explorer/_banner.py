"""Where a message of the page goes (``Banner``): at the form field a bad input came from and
in the banner line, with the standing warning that later messages add to."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from ._slice import ParamSlice

# The form fields a bad input can be shown at (the sidebar's, always in view; the Meshes
# card's, where the user is): the field is outlined and its message is under it. A message
# tied to no field (a broken upload, a failed verification, the search's own failure) has no
# such place and goes to the banner and the toast.
MODEL_FIELDS = ("overrides", "custom")
CONFIG_FIELDS = ("mesh", "hardware", "budget", "margin", "pipeline")
MESH_SEARCH_FIELDS = ("devices", "topology", "pipelines", "seconds")  # the Meshes card's form, where the user is
FORM_FIELDS = (*MODEL_FIELDS, *CONFIG_FIELDS, "session", *MESH_SEARCH_FIELDS)

# The banner's level for a refused input: drawn as a warning, with no toast (the field's mark
# says it where the user typed it; a toast over the page said it a third time).
REFUSED = "refused"

# What the banner calls a refusal, by the form the field belongs to
REFUSAL_VERBS = {**dict.fromkeys(MODEL_FIELDS, "not analysed"), **dict.fromkeys(CONFIG_FIELDS, "not applied"),
                 "session": "not saved", **dict.fromkeys(MESH_SEARCH_FIELDS, "no mesh search started")}


def _form_of(field: str) -> tuple[str, ...]:
    """The fields of the form ``field`` belongs to."""
    return next(f for f in (MODEL_FIELDS, CONFIG_FIELDS, MESH_SEARCH_FIELDS, ("session",)) if field in f)


def one_line(text: Any) -> str:
    """A message as the banner shows it: its runs of whitespace made single spaces."""
    return " ".join(str(text).split())


class Banner:
    """Where the page's messages go. Owns the form fields' marks (``field_error``: field ->
    message, for the fields of FORM_FIELDS), the standing warning (no plan fits, said once;
    later info messages, searching or paused, add to it, never replace it, until a plan fits
    or another model or mesh loads) and the aside: a line said in place of the banner's until
    it is over (a refused input, until its field reads well; a model chosen but not analysed),
    when the line it replaced comes back.

    One rule for a refused input, wherever it was typed: the page stays on the state in force,
    the field is marked with why (and how to fix it), the fields changed with it are marked as
    not applied, and the banner says what was refused, why, and what stays in force.

    ``page``: the state's ``field_error``, and its ``message`` and ``message_level`` (read).
    ``notify(text, level)`` writes the banner line (the state's ``notify``, which views call
    too). ``hidden()``: the model field the form does not show (the model picker shows one of
    two). ``in_force(field)``: what stays in force when the input of ``field`` is refused, in
    words ("the page stays on data=4,model=2 ..."); ``kept(field)``: the value in force of a
    field not applied ("data=4,model=2")."""

    def __init__(self, page: ParamSlice, notify: Callable[[Any, str], None], hidden: Callable[[], str],
                 in_force: Callable[[str], str], kept: Callable[[str], str]):
        self.page = page
        self.notify = notify
        self.hidden = hidden
        self.in_force = in_force
        self.kept = kept
        self.standing = ""
        self._aside: str | None = None  # the aside's line, while the banner says it
        self._refused: tuple[str, ...] = ()  # the form whose refusal the aside says
        self._replaced: tuple[str, str] = ("", "info")  # the line and level the aside replaced

    @property
    def line(self) -> str:
        """The banner's line as the page shows it."""
        return self.page.message

    def bad_input(self, e: Exception | str, unapplied: Iterable[str] = ()) -> None:
        """A refused input (``e``, a PartexError naming its ``field``): its message at that
        field, the other fields of its form in ``unapplied`` (those whose value is not the one
        in force) marked as not applied, and the refusal in the banner until the field reads
        well. Tied to no shown field: the banner alone, as an error."""
        field = getattr(e, "field", None)
        if field not in FORM_FIELDS or field == self.hidden():
            self.notify(e, "danger")
            return
        form = _form_of(field)
        marks = {field: str(e)}
        for f in unapplied:
            if f in form and f not in marks:
                marks[f] = f"not applied: still {self.kept(f)}"
        self.page.set(field_error=marks)
        self.aside(f"{REFUSAL_VERBS[field]}: {e}; {self.in_force(field)}", REFUSED)
        self._refused = form

    def mark(self, marks: dict[str, str]) -> None:
        """Mark form fields whose value was refused where no one typed it (a link's, opened
        with the page): each field with why, as ``bad_input`` marks one; what the page says of
        it is the caller's line. Fields the form does not show are left out."""
        shown = {f: text for f, text in marks.items() if f in FORM_FIELDS and f != self.hidden()}
        if shown:
            self.page.set(field_error={**self.page.field_error, **shown})

    def clear(self, *fields: str) -> None:
        """The inputs of ``fields`` are good (applied, or no longer shown): their marks go; with
        the last mark of the refused form, the refusal's line in the banner gives way to the line
        it replaced."""
        marks = self.page.field_error
        if any(f in marks for f in fields):
            self.page.set(field_error={k: v for k, v in marks.items() if k not in fields})
        if self._refused and not any(f in self.page.field_error for f in self._refused):
            self._refused = ()
            if self._aside is not None and self.page.message_level == REFUSED:
                self.back()

    def say(self, text: str) -> None:
        """An info message; with a standing warning, after it (the warning stays)."""
        if self.standing:
            self.notify(f"{self.standing}; {text}", "warning")
        else:
            self.notify(text, "info")

    def aside(self, text: str, level: str) -> None:
        """Say ``text`` in place of the banner's line until ``back``."""
        if self._aside is None or self.line != self._aside:  # (an aside replacing an aside keeps the first's line)
            self._replaced = (self.line, self.page.message_level)
        self.notify(text, level)
        self._aside = self.line

    def back(self) -> None:
        """The aside is over: the line it replaced comes back, unless a newer message has
        replaced the aside."""
        if self._aside is not None and self.line == self._aside:
            self.notify(*self._replaced)
        self._aside = None
