"""The sessions folder (``SessionStore``): the searches saved from the page, each a session
file that ``partex search --resume`` continues as well."""

from __future__ import annotations

import os
import pathlib
import re

from partex import PartexError

_SESSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class SessionStore:
    """Owns the sessions folder: the names saved in it and the file of each. A name that is not
    a plain file name (a path, '..') is refused, so nothing outside the folder is read or
    written. ``folder``: where the sessions are (None: ``$PARTEX_SESSIONS_DIR``, else
    ``sessions`` in the working directory)."""

    def __init__(self, folder: str | os.PathLike | None = None):
        self.folder = pathlib.Path(folder or os.environ.get("PARTEX_SESSIONS_DIR") or "sessions")

    def names(self) -> list[str]:
        """The saved sessions' names, sorted."""
        d = self.folder
        return sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []

    def path(self, name: str) -> pathlib.Path:
        """The file of session ``name``; PartexError for a name that is not a plain file name."""
        if not _SESSION_NAME.match(name or ""):
            raise PartexError(f"session name {name!r}: use letters, digits, '-', '_' or '.' (up to 64)")
        return self.folder / f"{name}.json"

    def save(self, runner, path: pathlib.Path, done) -> None:
        """Have ``runner``'s search write its session to ``path`` (a ``path(name)``), making the
        folder first (OSError where it cannot); ``done(ok, value)`` hears the search's answer
        (the runner's ``ask``: the search writes it between two chunks)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        runner.ask("save", str(path), done=done)
