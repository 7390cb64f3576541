"""Every public export's docstring states its contract: each function, class and public
method of ``partex.__all__`` has a docstring, and it names each of its parameters.

The check walks ``partex.__all__`` with ``inspect``. A class's public members are those defined
in the class or in a partex base class (its mixins); members a class inherits from builtins,
``typing``, ``enum`` or ``abc`` and the methods ``dataclasses`` generates are not partex's to
document. A hand-written ``__init__``'s parameters are named in the class docstring or in the
``__init__`` docstring. Constants (``HARDWARE``, ``factor_rules``) hold no docstring of their own.
"""

from __future__ import annotations

import dataclasses
import inspect
import pathlib
import re

import partex

ROOT = pathlib.Path(__file__).resolve().parents[1]
UNNAMED = {"self", "cls"}  # with *args / **kwargs, the parameters a docstring need not name


def _where(fn) -> str:
    try:
        return str(pathlib.Path(inspect.getsourcefile(fn) or "?").resolve().relative_to(ROOT))
    except (TypeError, ValueError):
        return "?"


def _generated(fn) -> bool:
    """True for a method ``dataclasses`` or ``NamedTuple`` wrote (exec'd, so from no file)."""
    return fn.__code__.co_filename.startswith("<")


def _named(name: str, doc: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(name)}\b", doc) is not None


def parameter_gaps(fn, doc: str | None = None) -> list[str]:
    """The parameters of ``fn`` its docstring (or ``doc``, when given) does not name."""
    doc = inspect.getdoc(fn) if doc is None else doc
    params = inspect.signature(fn).parameters.values()
    return [p.name for p in params
            if p.name not in UNNAMED and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            and not _named(p.name, doc or "")]


def function_gaps(name: str, fn, doc: str | None = None) -> list[str]:
    """What ``fn``'s docstring lacks, one line each: no docstring, or each unnamed parameter."""
    doc = inspect.getdoc(fn) if doc is None else doc
    if not doc:
        return [f"{name}: no docstring ({_where(fn)})"]
    return [f"{name}: parameter {p} not named ({_where(fn)})" for p in parameter_gaps(fn, doc)]


def _partex_bases(cls) -> list[type]:
    return [c for c in cls.__mro__ if c.__module__.split(".")[0] == "partex"]


def class_gaps(name: str, cls) -> list[str]:
    """What ``cls``'s docstrings lack: the class's own, a hand-written ``__init__``'s
    parameters, and each public method, classmethod, staticmethod and property."""
    where = _where(cls)
    doc = cls.__dict__.get("__doc__")
    gaps = []
    if not doc or doc.startswith(f"{cls.__name__}("):  # dataclasses and NamedTuple write the signature
        doc = ""
        gaps.append(f"{name}: no docstring ({where})")
    init = cls.__dict__.get("__init__")
    if inspect.isfunction(init) and not _generated(init):
        both = doc + "\n" + (inspect.getdoc(init) or "")
        gaps += [f"{name}(): parameter {p} not named ({where})" for p in parameter_gaps(init, both)]
    seen: set[str] = set()
    for base in _partex_bases(cls):
        for key, member in vars(base).items():
            if key.startswith("_") or key in seen:
                continue
            seen.add(key)
            member = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
            if isinstance(member, property):
                if not inspect.getdoc(member):
                    gaps.append(f"{name}.{key}: no docstring ({_where(member.fget)})")
            elif inspect.isfunction(member) and not _generated(member):
                gaps += function_gaps(f"{name}.{key}", member)
    return gaps


def api_gaps() -> list[str]:
    """Every gap in ``partex.__all__``'s docstrings."""
    gaps = []
    for name in partex.__all__:
        obj = getattr(partex, name)
        if inspect.isclass(obj):
            gaps += class_gaps(name, obj)
        elif inspect.isfunction(obj):
            gaps += function_gaps(name, obj)
    return gaps


def test_every_public_export_documents_its_parameters():
    gaps = api_gaps()
    assert not gaps, f"{len(gaps)} docstring gaps in partex.__all__:\n" + "\n".join(gaps)


def test_check_catches_an_undocumented_parameter():
    def scale(x, factor, *rest, **options):
        """``x`` times two."""
        return x

    def bare(x):
        return x

    assert function_gaps("scale", scale) == [f"scale: parameter factor not named ({_where(scale)})"]
    assert function_gaps("bare", bare) == [f"bare: no docstring ({_where(bare)})"]


def test_check_needs_the_whole_name_and_reads_methods_and_constructors():
    class Thing:
        """A thing of ``size``."""  # "size", not "sizes"; the constructor's ``seed`` is missing

        def __init__(self, size, seed):
            self.size = size

        def grow(self, sizes):
            """``size`` doubled."""
            return sizes

        @property
        def area(self):
            return self.size

    Thing.__module__ = "partex.fake"  # the check reads the members of partex's own classes
    gaps = class_gaps("Thing", Thing)
    assert [g.split(" (")[0] for g in gaps] == ["Thing(): parameter seed not named",
                                                "Thing.grow: parameter sizes not named", "Thing.area: no docstring"]


def test_check_reads_the_signature_dataclasses_write_as_no_docstring():
    @dataclasses.dataclass(frozen=True)
    class Record:
        size: int

    Record.__module__ = "partex.fake"
    assert [g.split(" (")[0] for g in class_gaps("Record", Record)] == ["Record: no docstring"]
