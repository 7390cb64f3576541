"""The parameters a part of the page's state may touch (``ParamSlice``).

The page's parameters live on one ``param.Parameterized`` (the views watch them there); each
part of the state is handed a slice of them: those it sets, and those it only reads. A part
cannot set another part's parameter by accident, and its slice says what it touches.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import param


class ParamSlice:
    """Some parameters of ``owner``, by name: ``names`` are read and set (``page.name = v``
    sets ``owner.name``), ``reads`` only read. ``set`` sets several at once (their watchers
    run once, after all are set, as ``owner.param.update`` does); ``batch`` groups several
    assignments into one such batch. A name outside the slice is refused with the names it
    has."""

    __slots__ = ("_owner", "names", "reads")

    def __init__(self, owner: param.Parameterized, *names: str, reads: tuple[str, ...] = ()):
        missing = [n for n in (*names, *reads) if n not in owner.param]
        if missing:
            raise ValueError(f"{', '.join(missing)}: not parameters of {type(owner).__name__}")
        self._owner = owner
        self.names = frozenset(names)
        self.reads = frozenset(reads) | self.names

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ParamSlice.__slots__:  # not set yet
            raise AttributeError(name)
        if name not in self.reads:
            raise AttributeError(f"{name!r} is not in this slice of {type(self._owner).__name__}: it reads "
                                 f"{', '.join(sorted(self.reads))}")
        return getattr(self._owner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ParamSlice.__slots__:
            object.__setattr__(self, name, value)
        else:
            self._check_settable(name)
            setattr(self._owner, name, value)

    def _check_settable(self, *names: str) -> None:
        outside = sorted(set(names) - self.names)
        if outside:
            raise AttributeError(f"cannot set {', '.join(outside)}: this slice of {type(self._owner).__name__} "
                                 f"sets {', '.join(sorted(self.names))}")

    def set(self, **values: Any) -> None:
        """Set ``values`` (parameter name -> value) together."""
        self._check_settable(*values)
        self._owner.param.update(**values)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """The watchers of everything set inside run once, when the block ends."""
        with param.parameterized.batch_call_watchers(self._owner):
            yield
