"""The session file: one JSON document (format ``partex-session``, documented in docs/python-api.md).

It holds the model (its MODEL spec, or only its name and signature for a function given in
Python; a pipelined layer stack, ``partex.Pipeline``), the mesh, the hardware, the pins and forbids, and the whole search (tree,
evaluations, best plan, statistics, RNG). It names no other file and holds no pickle: loading
it executes nothing from it, and a tampered or foreign file gets one clear line.
``SessionFile`` is the document as a dataclass: ``to_json`` writes it, ``from_json`` reads
and checks it field by field; ``Session.save`` / ``Session.load`` go through it, and
``SessionFile.model`` builds the model it names again. The search's state stays JSON here:
``planner.Search.from_state`` reads it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
import time
from typing import Any, Callable, Protocol

from ._errors import PartexError
from ._loader import LoadedModel, ModelAnalysis, ModelSpec, analyze_loaded, analyze_spec, model_spec
from ._mesh import Hardware, MeshSpec
from .plan._pipeline_decision import Pipeline, pipelined
from .plan._plan import _hardware_from_json
from .plan._specs import signature_of
from ._sessionstate import SessionState

FORMAT = "partex-session"
VERSION = 1


@dataclasses.dataclass(frozen=True)
class SessionFile:
    """One session file's content.

    spec: the MODEL spec (None: a function given in Python, known by ``name`` and ``signature``).
    name: the function's name (a MODEL spec's session: None).
    signature: the step's inputs and outputs (``plan._specs.signature_of``), to refuse
      another model's file.
    mesh, hardware, seed, warm_start, user_shardings, pipeline: the session's configuration.
    pins, forbidden: ``[{"group": label, "axis": slot}]``, for a reader of the file (the
      search's state holds the pins the search resumes with).
    search: the search's state (``planner.Search.state``), as JSON.
    saved: when it was written (local time, ``YYYY-mm-dd HH:MM:SS``).
    """

    spec: ModelSpec | None
    name: str | None
    signature: dict
    mesh: MeshSpec
    hardware: Hardware
    seed: int
    warm_start: bool
    user_shardings: str
    pipeline: Pipeline | None
    pins: tuple[dict, ...]
    forbidden: tuple[dict, ...]
    search: dict
    saved: str = ""

    def to_json(self) -> dict:
        """The file's JSON document (``format``: ``partex-session``)."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "saved": self.saved or time.strftime("%Y-%m-%d %H:%M:%S"),
            "model": self.spec.to_json() if self.spec else {"spec": None, "name": self.name},
            "signature": self.signature,
            "mesh": self.mesh.to_json(),
            "hardware": self.hardware.to_json(),
            "seed": self.seed,
            "warm_start": self.warm_start,
            "user_shardings": self.user_shardings,
            **({"pipeline": self.pipeline.to_json()} if self.pipeline is not None else {}),
            "pins": list(self.pins),
            "forbidden": list(self.forbidden),
            "search": self.search,
        }

    @classmethod
    def from_json(cls, d: Any, where: str = "session") -> "SessionFile":
        """A file's JSON read back and checked field by field: a foreign or tampered
        document gets one ``PartexError`` line naming ``where``."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise PartexError(f"{where} is not a partex session: expected \"format\": \"{FORMAT}\"")
        if d.get("version") != VERSION:
            raise PartexError(f"{where} is a partex session of version {d.get('version')!r}; this partex "
                              f"reads version {VERSION}")
        try:
            m = d["model"]
            spec = None
            if m.get("spec") is not None:
                spec = model_spec(str(m["spec"]), str(m["preset"]), [str(x) for x in m["overrides"]])
            state = d["search"]
            if not isinstance(state, dict):
                raise TypeError("its search is not an object")
            pipeline = Pipeline.from_json(d["pipeline"], where) if d.get("pipeline") is not None else None
            return cls(spec=spec, name=m.get("name"), signature=d.get("signature") or {}, mesh=MeshSpec.from_json(d["mesh"]),
                       hardware=_hardware_from_json(d["hardware"]), seed=int(d["seed"]),
                       warm_start=bool(d.get("warm_start", True)), user_shardings=str(d.get("user_shardings", "keep")),
                       pipeline=pipeline, pins=tuple(d.get("pins", ())), forbidden=tuple(d.get("forbidden", ())),
                       search=state, saved=str(d.get("saved", "")))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise PartexError(f"{where} is not a valid partex session ({type(e).__name__}: {e})") from None

    def model(self, *, where: str, fn: Callable | None, args, axis_names,
              analyses: Callable[[ModelSpec], ModelAnalysis]) -> ModelAnalysis:
        """The model the file was saved for, built again: from its spec with ``analyses``,
        or from ``fn`` and ``args`` (a function session); pipelined as it was; refused
        (``PartexError``) where its inputs are not the file's."""
        if fn is not None:
            if args is None:
                raise PartexError("Session.load(path, fn=..., args=...): give the example args too")
            model = analyze_loaded(LoadedModel(self.name or getattr(fn, "__name__", "fn"), fn, tuple(args),
                                               axis_names, "custom", None))
        elif self.spec is None:
            raise PartexError(f"{where} was saved from a function ({self.name!r}), not a MODEL spec: "
                              "load it with Session.load(path, fn=..., args=...)")
        else:
            model = analyses(self.spec)
        if self.pipeline is not None:  # the step it searched: its stack pipelined
            model = pipelined(model, self.pipeline, self.mesh)
        sig = self.signature
        if not isinstance(sig, dict) or sig.get("inputs") != signature_of(model.program)["inputs"]:
            spec = self.spec if fn is None else None
            raise PartexError(f"{where} was saved for another model (its inputs' shapes differ from "
                              f"{spec.title if spec else 'this function'}'s): start a new session")
        return model


def write_session(doc: SessionFile, path: str | os.PathLike) -> None:
    """Write the session to ``path`` atomically (never a half-written file)."""
    text = json.dumps(doc.to_json(), separators=(",", ":"))
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".partex-", suffix=".tmp", dir=folder)
    except OSError as e:
        raise PartexError(f"cannot write session {path}: {e.strerror} ({folder})") from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as open() would create it, not mkstemp's 0600
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)  # never a half-written session
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def read_session(path: str | os.PathLike) -> Any:
    """A session file's JSON (checked by ``SessionFile.from_json``)."""
    where = os.fspath(path)
    try:
        with open(where) as f:
            text = f.read()
    except OSError as e:
        raise PartexError(f"cannot read session {where}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise PartexError(f"{where} is not a partex session (not a text file)") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise PartexError(f"{where} is not a partex session: not valid JSON (line {e.lineno}: {e.msg})") from None


class Saved(Protocol):
    """What ``SessionFiles`` reads of the session it is part of."""

    spec: ModelSpec | None
    model: ModelAnalysis
    mesh: MeshSpec
    hardware: Hardware
    seed: int
    warm_start: bool
    _state: SessionState

    @property
    def pipeline(self) -> Pipeline | None: ...

    @property
    def user_shardings(self) -> str: ...

    @property
    def pins(self) -> list: ...

    @property
    def forbidden(self) -> list: ...

    @property
    def program(self) -> Any: ...

    @property
    def analysis(self) -> Any: ...

    def _set(self, model: ModelAnalysis, spec: ModelSpec | None, mesh: MeshSpec, hw: Hardware, seed: int,
             warm_start: bool, state: SessionState) -> None: ...


class SessionFiles:
    """The ``Session``'s methods that write it to its file and read it back."""

    def to_json(self: Saved) -> dict:
        """The session as JSON data (``SessionFile``; the format is documented in docs/python-api.md)."""
        return session_file(self).to_json()

    def save(self: Saved, path: str | os.PathLike) -> None:
        """Write the session to ``path`` (one JSON file, written atomically). Returns None."""
        write_session(session_file(self), path)

    @classmethod
    def load(cls, path: str | os.PathLike, *, fn: Callable | None = None, args=None, axis_names=None,
             analyses: Callable[[ModelSpec], ModelAnalysis] | None = None) -> Any:
        """Resume the session saved at ``path`` (by ``save``, ``partex search`` or the
        explorer). A MODEL-spec session re-builds its model from the spec (``analyses(spec)``
        if given, e.g. a cache); a session of a function given in Python needs ``fn`` and
        ``args`` (``axis_names``: the inputs' logical axis names, labels only). Returns the
        session; PartexError for a file that is not a session, or one saved for another model."""
        return cls.from_json(read_session(path), where=os.fspath(path), fn=fn, args=args, axis_names=axis_names,
                             analyses=analyses)

    @classmethod
    def from_json(cls, d: Any, *, where: str = "session", fn=None, args=None, axis_names=None,
                  analyses: Callable[[ModelSpec], ModelAnalysis] | None = None) -> Any:
        """A session from its file's JSON ``d`` (``to_json``); ``where`` names the document in
        errors; ``fn``, ``args``, ``axis_names`` and ``analyses`` as ``load``'s. Returns the
        session; PartexError as ``load``'s."""
        f = SessionFile.from_json(d, where)
        model = f.model(where=where, fn=fn, args=args, axis_names=axis_names, analyses=analyses or analyze_spec)
        try:
            state = SessionState.resumed(model, f.mesh, f.hardware, f.search, f.user_shardings)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            raise PartexError(f"{where}: its search cannot be resumed ({type(e).__name__}: {e})") from None
        self: Saved = cls.__new__(cls)  # type: ignore[assignment]
        self._set(model, None if fn is not None else f.spec, f.mesh, f.hardware, f.seed, f.warm_start, state)
        return self


def session_file(s: Saved) -> SessionFile:
    """The session ``s`` as its file's content."""
    def named(decs):
        return tuple({"group": s.analysis.subject_label(d), "axis": d.slot} for d in decs)

    return SessionFile(spec=s.spec, name=None if s.spec else s.model.model.name,
                       signature=signature_of(s.program), mesh=s.mesh, hardware=s.hardware, seed=s.seed,
                       warm_start=s.warm_start, user_shardings=s.user_shardings, pipeline=s.pipeline,
                       pins=named(s.pins), forbidden=named(s.forbidden),
                       search=s._state.search.state(s._state.pins))
