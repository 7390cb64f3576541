"""The session file: one JSON document (format ``partex-session``, documented in the README).

It holds the model (its MODEL spec, or only its name and signature for a function given in
Python; a pipelined layer stack, ``partex.Pipeline``), the mesh, the hardware, the pins and forbids, and the whole search (tree,
evaluations, best plan, statistics, RNG). It names no other file and holds no pickle: loading
it executes nothing from it, and a tampered or foreign file gets one clear line.
``Session.save`` / ``Session.load`` read and write it through this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

from . import demo_models
from ._errors import PartexError
from ._loader import LoadedModel, ModelAnalysis, analyze_loaded
from ._mesh import Hardware, MeshSpec
from .plan._pipelined import Pipeline, pipelined
from .plan._plan import _hardware_from_json
from .plan._specs import signature_of
from .planner._search import Restored, Search

if TYPE_CHECKING:
    from ._session import Session

FORMAT = "partex-session"
VERSION = 1


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """How to build the model again: a demo name or ``module:attr`` / ``path/file.py:attr``,
    with the demo preset and config overrides (``["layers=4"]``)."""

    spec: str
    preset: str = "tiny"
    overrides: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"spec": self.spec, "preset": self.preset, "overrides": list(self.overrides)}

    @property
    def title(self) -> str:
        extra = f" [{', '.join(self.overrides)}]" if self.overrides else ""
        return f"{self.spec} ({self.preset}){extra}"


def model_spec(spec: str, preset: str, overrides) -> ModelSpec:
    """A ModelSpec from the command line's or the file's spelling (overrides as ``k=v``
    texts or a mapping; a ``module:attr`` has no preset)."""
    if isinstance(overrides, Mapping):
        overrides = [f"{k}={v}" for k, v in overrides.items()]
    if spec not in demo_models.MODELS:  # presets are the demo models'; a module:attr has none
        preset = "custom"
    return ModelSpec(spec, preset, tuple(str(o) for o in (overrides or ())))


def session_json(s: Session) -> dict:
    """The session as JSON data."""
    an = s.analysis
    m = s.model.model

    def named(decs):
        return [{"group": an.subject_label(d), "axis": d.slot} for d in decs]

    return {
        "format": FORMAT,
        "version": VERSION,
        "saved": time.strftime("%Y-%m-%d %H:%M:%S"),
        "model": s.spec.to_json() if s.spec else {"spec": None, "name": m.name},
        "signature": signature_of(s.program),
        "mesh": s.mesh.to_json(),
        "hardware": s.hardware.to_json(),
        "seed": s.seed,
        "warm_start": s.warm_start,
        "user_shardings": s.user_shardings,
        **({"pipeline": s.pipeline.to_json()} if s.pipeline is not None else {}),
        "pins": named(s.pins),
        "forbidden": named(s.forbidden),
        "search": s._search.state(s._pins),
    }


def write_session(s: Session, path: str | os.PathLike) -> None:
    """Write the session to ``path`` atomically (never a half-written file)."""
    text = json.dumps(session_json(s), separators=(",", ":"))
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
    """A session file's JSON (checked by ``session_parts``)."""
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


def session_parts(d: Any, *, where: str, fn, args, axis_names, analyses: Callable[[ModelSpec], ModelAnalysis]
                  ) -> tuple[ModelAnalysis, ModelSpec | None, MeshSpec, Hardware, int, bool, Restored, str]:
    """What a Session is made of, read from its file's JSON and checked field by field: the
    model (rebuilt from its spec with ``analyses``, or ``fn`` and ``args``), its spec, the mesh,
    the hardware, the seed, warm start, the resumed search (with its cost model and pins) and the user-shardings mode."""
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
        mesh = MeshSpec.from_json(d["mesh"])
        hw = _hardware_from_json(d["hardware"])
        seed = int(d["seed"])
        warm = bool(d.get("warm_start", True))
        user = str(d.get("user_shardings", "keep"))
        state = d["search"]
        if not isinstance(state, dict):
            raise TypeError("its search is not an object")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise PartexError(f"{where} is not a valid partex session ({type(e).__name__}: {e})") from None
    if fn is not None:
        if args is None:
            raise PartexError("Session.load(path, fn=..., args=...): give the example args too")
        model = analyze_loaded(LoadedModel(m.get("name") or getattr(fn, "__name__", "fn"), fn, tuple(args),
                                           axis_names, "custom", None))
        spec = None
    elif spec is None:
        raise PartexError(f"{where} was saved from a function ({m.get('name')!r}), not a MODEL spec: "
                          "load it with Session.load(path, fn=..., args=...)")
    else:
        model = analyses(spec)
    if d.get("pipeline") is not None:  # the step it searched: its stack pipelined
        model = pipelined(model, Pipeline.from_json(d["pipeline"], where), mesh)
    sig = d.get("signature")
    if not isinstance(sig, dict) or sig.get("inputs") != signature_of(model.program)["inputs"]:
        raise PartexError(f"{where} was saved for another model (its inputs' shapes differ from "
                          f"{spec.title if spec else 'this function'}'s): start a new session")
    try:
        restored = Search.from_state(model, mesh, hw, state, user_shardings=user)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise PartexError(f"{where}: its search cannot be resumed ({type(e).__name__}: {e})") from None
    return model, spec, mesh, hw, seed, warm, restored, user
