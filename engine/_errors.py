"""User-facing errors: one clear line that says what was wrong and how to fix it."""

from __future__ import annotations


class PartexError(Exception):
    """A bad input from the user. The CLI prints ``partex: <message>`` and exits with 2;
    the explorer shows the message. Never raised for bugs in partex itself.

    ``message``: what was wrong and how to fix it, kept to one line; ``field``: the input that
    was wrong (``"mesh"``, ``"memory"``), where known, so that a form shows the message there."""

    exit_code = 2

    def __init__(self, message: str, field: str | None = None):
        # One line only: callers may embed JAX's own message, which can span lines.
        super().__init__(" ".join(str(message).split()))
        self.field = field  # the input that was wrong ("mesh", "memory", ...), where known: a
        #                     form shows the message at that field
