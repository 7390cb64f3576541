"""MODEL specs: a registered demo name, ``module:attr`` or ``path/file.py:attr``.

``attr`` is a callable returning ``(fn, example_args)`` or ``(fn, example_args,
axis_names)``; example args may be ``jax.ShapeDtypeStruct`` pytrees. ``axis_names`` (optional)
mirrors the args with one logical axis name per dim, like flax's logical partitioning, and
only makes labels readable.

A spec someone other than the operator names (the explorer's page) is confined to a folder
(``models_dir``, ``file_spec_in``): a Python file inside it and a function that file defines,
never a module by name nor anything the file imports.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import pathlib
import sys
import warnings
from typing import Any, Callable, Mapping

import jax

from . import demo_models
from ._errors import PartexError
from .analysis._analysis import analyze
from .tracing._program import path_str, trace


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A model ready to trace: its ``name``, the step ``fn`` and its example ``args``, the
    inputs' logical ``axis_names`` (or None), and a demo model's ``preset`` and ``config``
    (``"custom"`` and None for any other)."""

    name: str
    fn: Callable
    args: tuple
    axis_names: Any = None
    preset: str = "tiny"
    config: Any = None


@dataclasses.dataclass(frozen=True)
class ModelAnalysis:
    """A model traced and analysed: the LoadedModel, its Program and its Analysis."""

    model: LoadedModel
    program: Any  # Program
    analysis: Any  # Analysis
    trace_seconds: float
    pipeline: Any = None  # the Pipeline its step runs (``plan._pipeline_decision.pipelined``), None: the step as written
    base: Any = None  # with a pipeline: the ModelAnalysis of the step as written
    work_flops: float | None = None  # with a pipeline: the FLOPs of the step as written (its MFU's work)


def analyze_loaded(model: LoadedModel) -> ModelAnalysis:
    """Trace a loaded model and run the named-dimension analysis."""
    import time

    t0 = time.perf_counter()
    program = trace(model.fn, model.args)
    t1 = time.perf_counter()
    analysis = analyze(program, axis_names_by_value(program, model.axis_names))
    return ModelAnalysis(model, program, analysis, t1 - t0)


def analyze_model(spec: str, preset: str = "tiny", overrides=None, *,
                  models_dir: str | os.PathLike | None = None) -> ModelAnalysis:
    """Load a MODEL ``spec`` (``load_model``, with ``preset``, ``overrides`` and
    ``models_dir``), trace it and run the named-dimension analysis. Returns a ``ModelAnalysis``."""
    return analyze_loaded(load_model(spec, preset, overrides, models_dir=models_dir))


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """How to build the model again: a demo name or ``module:attr`` / ``path/file.py:attr``,
    with the demo preset and config overrides (``["layers=4"]``)."""

    spec: str
    preset: str = "tiny"
    overrides: tuple[str, ...] = ()

    def to_json(self) -> dict:
        """``{"spec", "preset", "overrides"}`` as JSON data (a plan's ``model``, a session file's)."""
        return {"spec": self.spec, "preset": self.preset, "overrides": list(self.overrides)}

    def within(self, folder: str | os.PathLike) -> "ModelSpec":
        """This spec confined to ``folder``: a demo model as it is; any other as
        ``REALPATH.py:attr`` of a Python file inside ``folder`` (``file_spec_in``, whose
        PartexError says what was refused)."""
        if self.spec in demo_models.MODELS:
            return self
        return dataclasses.replace(self, spec=file_spec_in(self.spec, folder))

    @property
    def title(self) -> str:
        """``spec (preset)``, with the overrides in brackets where there are any."""
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


def analyze_spec(spec: ModelSpec) -> ModelAnalysis:
    """The model a ``ModelSpec`` names, loaded, traced and analysed (``analyze_model``)."""
    return analyze_model(spec.spec, spec.preset, list(spec.overrides))


def demo_names() -> list[str]:
    return list(demo_models.MODELS)


def load_model(spec: str, preset: str = "tiny", overrides: list[str] | dict | None = None, *,
               models_dir: str | os.PathLike | None = None) -> LoadedModel:
    """Resolve a MODEL ``spec`` to a function and example args, a ``LoadedModel``: a demo
    model's name, built at ``preset`` with ``overrides`` (``["layers=4"]`` or a dict), or
    ``module:attr`` / ``path/file.py:attr`` naming a callable that returns ``(fn,
    example_args)`` or ``(fn, example_args, axis_names)`` (which takes no overrides).
    ``models_dir``: where a spec someone else named may come from (a server's page): then
    only ``FILE.py:attr`` with FILE inside that folder (``file_spec_in``) and ``attr`` a
    function the file defines itself; None: any spec (the operator's own command line). Bad
    input -> PartexError."""
    if not spec or not isinstance(spec, str):
        raise PartexError("no MODEL given: name a demo model "
                          f"({', '.join(demo_names())}) or module:attr / path/file.py:attr")
    if spec in demo_models.MODELS:
        try:
            ov = demo_models.parse_overrides(list(overrides)) if isinstance(overrides, (list, tuple)) else overrides
            m = demo_models.build(spec, preset, ov)
        except demo_models.DemoModelError as e:
            raise PartexError(str(e)) from None
        return LoadedModel(spec, m.fn, tuple(m.args), m.axis_names, m.preset, m.config)
    if models_dir is not None:
        spec = file_spec_in(spec, models_dir)
    if ":" not in spec:
        raise PartexError(
            f"unknown model {spec!r}: use a demo model ({', '.join(demo_names())}) "
            "or module:attr / path/file.py:attr naming a callable that returns (fn, example_args)"
        )
    if overrides:
        raise PartexError("--config applies to demo models only; configure your own model in its factory")
    target, attr = spec.rsplit(":", 1)
    module = _import(target)
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise PartexError(f"{target} has no attribute {attr!r}; check the name after ':'")
        obj = getattr(obj, part)
    if models_dir is not None and getattr(obj, "__module__", None) != module.__name__:
        # a name the file imports (``from os import abort``) is not the file's model
        raise PartexError(f"{attr} is not defined in {target} (it comes from "
                          f"{getattr(obj, '__module__', None) or 'elsewhere'}): name a function the file defines")
    if not callable(obj):
        raise PartexError(f"{spec} is a {type(obj).__name__}, not a callable: it must be a function "
                          "that returns (fn, example_args)")
    try:
        result = obj()
    except Exception as e:  # the user's factory failed: show its own message
        hint = ""
        if "Number of devices" in str(e) and jax.devices()[0].platform == "cpu":
            hint = (" (it builds a mesh over more devices than this process has: on CPU, set "
                    "JAX_NUM_CPU_DEVICES to the mesh's size)")
        raise PartexError(f"{spec}() raised {type(e).__name__}: {e}{hint}") from e
    if not isinstance(result, (tuple, list)) or len(result) not in (2, 3):
        raise PartexError(f"{spec}() returned {type(result).__name__}; it must return "
                          "(fn, example_args) or (fn, example_args, axis_names)")
    fn, args, *rest = result
    if not callable(fn):
        raise PartexError(f"{spec}() returned a {type(fn).__name__} as fn; expected a callable")
    if not isinstance(args, (tuple, list)):
        args = (args,)
    return LoadedModel(spec, fn, tuple(args), rest[0] if rest else None, "custom", None)


def file_spec_in(spec: str, folder: str | os.PathLike) -> str:
    """``spec`` (``FILE.py:attr``; FILE relative to ``folder`` or absolute) as
    ``REALPATH.py:attr``, where REALPATH is FILE's absolute path with every link resolved and
    lies inside ``folder`` (its own links resolved too): how a server confines the models its
    page names to the folder its operator chose. PartexError for a module name, a ``..``, a
    file outside the folder (a link that leads out included) or missing, or an ``attr`` that
    is not one public name."""
    root = os.path.realpath(folder)
    only = f"this server loads models of your own from {root} only"
    target, colon, attr = str(spec or "").strip().rpartition(":")
    if not colon or not target.endswith(".py") or "\0" in target:
        raise PartexError(f"{spec!r} is not a Python file in the models folder: name one as FILE.py:function "
                          f"({only}, never a module by name)")
    if ".." in pathlib.PurePath(target).parts:
        raise PartexError(f"{target}: '..' is not allowed here: name a file inside {root} ({only})")
    if not attr.isidentifier() or attr.startswith("_"):
        raise PartexError(f"{spec}: after ':' name one public function of the file, not {attr!r}")
    path = os.path.realpath(os.path.join(root, target))  # an absolute target stays itself
    if os.path.commonpath([root, path]) != root:
        raise PartexError(f"{target} is outside {root} (links resolved): {only}")
    if not os.path.isfile(path):
        raise PartexError(f"model file {target} does not exist in {root}")
    return f"{path}:{attr}"


def _import(target: str):
    if target.endswith(".py") or os.sep in target:
        path = os.path.abspath(target)
        if not os.path.exists(path):
            raise PartexError(f"model file {target} does not exist")
        name = "partex_user_" + os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise PartexError(f"cannot import {target}: not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            raise PartexError(f"importing {target} failed: {type(e).__name__}: {e}") from e
        return module
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        raise PartexError(f"cannot import module {target!r}: {e}; is it on PYTHONPATH?") from e
    except Exception as e:
        raise PartexError(f"importing {target} failed: {type(e).__name__}: {e}") from e


def axis_names_by_value(program, axis_names) -> dict[int, tuple]:
    """Match an axis_names pytree to the program's input leaves: it mirrors the args, with a
    tuple of names (str or None, one per dim) or a PartitionSpec of logical names (flax's
    ``nn.get_partition_spec``) where the args have an array, or a prefix of them (one spec
    where the args have a box around the array, as jit's ``in_shardings`` allows). The args'
    own structure says where its leaves are, so containers with no leaves (optax's
    ``EmptyState()``, an empty NamedTuple) match as they are. Names only label: a tree that
    does not mirror the args, or a leaf whose names do not fit its rank, is left out with a
    warning naming it, and the rest is kept."""
    if axis_names is None:
        return {}
    from jax.sharding import PartitionSpec

    names = tuple(axis_names) if isinstance(axis_names, list) else axis_names
    names = names if isinstance(names, tuple) else (names,)
    # names mirror the whole args, static (non-array) leaves included
    tree = program.full_tree if program.static_inputs else program.in_tree
    try:
        per_leaf = tree.flatten_up_to(names)
    except (ValueError, TypeError):
        # a prefix of the args, as jit's in_shardings may be: flax's nn.get_partition_spec of a
        # boxed (LogicallyPartitioned) state puts one spec where the args have a box
        def is_names(x) -> bool:
            return x is None or isinstance(x, PartitionSpec) or (
                isinstance(x, tuple) and len(x) > 0 and all(n is None or isinstance(n, str) for n in x)
                and any(isinstance(n, str) for n in x))

        try:
            like = jax.tree_util.tree_unflatten(tree, [0] * tree.num_leaves)
            per_leaf = tree.flatten_up_to(jax.tree.broadcast(names, like, is_leaf=is_names))
        except (ValueError, TypeError):
            per_leaf = None
        if per_leaf is None:
            return _names_by_path(program, names, is_names)
    if program.static_inputs:
        per_leaf = program.dynamic_leaves(per_leaf)
    return _checked_names(program, per_leaf)


def _names_by_path(program, names, is_names) -> dict[int, tuple]:
    """axis_names that do not mirror the args: each leaf takes the names at its own path, or
    at the longest prefix of it that has names; a warning names the first leaf left without
    and the first names that match no leaf."""
    given: dict[str, Any] = {}
    stray = []
    for kp, n in jax.tree_util.tree_flatten_with_path(names, is_leaf=is_names)[0]:
        k = getattr(kp[0], "idx", None) if kp else None
        if k is None or k >= len(program.arg_names):
            stray.append(path_str("axis_names", kp))
            continue
        given[path_str(program.arg_names[k], kp[1:])] = n
    per_leaf, missing, used = [], [], set()
    for vid, path in zip(program.inputs, program.input_paths):
        q = path
        while q and q not in given:
            q = q.rpartition("/")[0]
        per_leaf.append(given.get(q))
        used.add(q)
        if not q and program.values[vid].shape:
            missing.append(path)
    stray += [q for q in given if q not in used]
    problems = ([f"no names for {missing[0]}" + (f" (and {len(missing) - 1} more leaves)" if len(missing) > 1 else "")]
                if missing else []) + ([f"names for {stray[0]} match no argument" + (
                    f" (and {len(stray) - 1} more)" if len(stray) > 1 else "")] if stray else [])
    if problems:
        warnings.warn(f"partex: axis_names do not mirror the example args: {'; '.join(problems)}; the names "
                      "that match a leaf's path are used", stacklevel=3)
    return _checked_names(program, per_leaf)


def _checked_names(program, per_leaf) -> dict[int, tuple]:
    from jax.sharding import PartitionSpec

    out = {}
    for vid, path, n in zip(program.inputs, program.input_paths, per_leaf):
        rank = len(program.values[vid].shape)
        if n is None:
            continue
        if isinstance(n, PartitionSpec):  # flax's nn.get_partition_spec / logical specs
            n = tuple(e if e is None or isinstance(e, str) else "+".join(map(str, e)) for e in n)
            n = n + (None,) * (rank - len(n))
        if not (isinstance(n, tuple) and len(n) == rank and all(x is None or isinstance(x, str) for x in n)):
            warnings.warn(f"partex: axis_names for {path} (rank {rank}) are {n!r}: expected a tuple of {rank} "
                          "names (str or None); that leaf is left unnamed", stacklevel=2)
            continue
        out[vid] = tuple(n)
    return out
