"""The engine's modules import one another without a cycle, so each stage of the pipeline
can be read (and tested) with only the stages below it; JAX's internals are reached through
one adapter; no class or function grows past what a reader can hold.

Every ``from . import`` / ``from .x import`` counts: inside functions and under
``if TYPE_CHECKING:`` too (an annotation's import is a dependency a reader follows as well).
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import networkx as nx

ENGINE = pathlib.Path(__file__).resolve().parent.parent / "engine"


def _module(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ENGINE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["partex", *parts])


def import_graph() -> nx.DiGraph:
    """Module -> the package modules it imports (relative imports, at any depth)."""
    graph = nx.DiGraph()
    for path in ENGINE.rglob("*.py"):
        me = _module(path)
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        graph.add_node(me)
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            if node.module:
                graph.add_edge(me, target)
            else:  # from . import name: a submodule (the demo models live in a folder of their own)
                graph.add_edges_from((me, f"{target}.{alias.name}") for alias in node.names)
    return graph


def test_the_engine_imports_without_a_cycle():
    graph = import_graph()
    assert len(graph) > 20 and graph.number_of_edges() > 40  # it read the package
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c + [c[0]]) for c in cycles[:10])


def test_a_cycle_is_found_where_there_is_one(tmp_path, monkeypatch):
    """The walk sees imports inside functions and under ``TYPE_CHECKING``: two modules that
    import each other there make a cycle."""
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "_a.py").write_text("def f():\n    from ._b import g\n    return g\n")
    (tmp_path / "_b.py").write_text("from ._a import f\n\ndef g():\n    return f\n")
    (tmp_path / "_c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._d import h\n")
    (tmp_path / "_d.py").write_text("from ._c import TYPE_CHECKING\n\ndef h():\n    return TYPE_CHECKING\n")
    (tmp_path / "_e.py").write_text("from ._a import f\n")
    monkeypatch.setattr(f"{__name__}.ENGINE", tmp_path)
    graph = import_graph()
    assert sorted(map(sorted, nx.simple_cycles(graph))) == [["partex._a", "partex._b"], ["partex._c", "partex._d"]]
    assert graph.has_edge("partex._e", "partex._a") and not graph.has_edge("partex._a", "partex._e")


def test_a_plan_file_is_read_checked_and_written_without_jax(tmp_path):
    """``Plan`` is data: its module and what it imports load with JAX unavailable (the package
    stood in for by a bare one, so that only ``_plan``'s own imports run), and a plan file
    loads, checks and saves there; applying it is what needs JAX."""
    script = f"""
import sys, types
sys.modules["jax"] = None  # any import of JAX fails
pkg = types.ModuleType("partex")
pkg.__path__ = [{str(ENGINE)!r}]
sys.modules["partex"] = pkg
from partex.plan._plan import Plan
plan = Plan.load({str(ENGINE.parent / "tests" / "fixtures" / "transformer.plan.json")!r})
plan.save({str(tmp_path / "again.json")!r})
assert Plan.load({str(tmp_path / "again.json")!r}) == plan
print(sorted(m for m in sys.modules if m.startswith("partex")))
try:
    from partex.plan._planned import apply_plan
except ImportError:
    print("apply needs JAX")
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "partex.tracing._program" not in r.stdout and "partex.analysis._analysis" not in r.stdout, r.stdout
    assert r.stdout.rstrip().endswith("apply needs JAX"), r.stdout


BOTTOM = {"_errors", "_decisions", "_profile", "_mesh", "_options", "_results"}  # import nothing of partex but each other
LAYERS = {  # each stage of the pipeline and what it may import (its package docstring says so)
    "tracing": BOTTOM,
    "analysis": BOTTOM | {"tracing"},
    "cost": BOTTOM | {"tracing", "analysis"},
    "plan": BOTTOM | {"tracing", "analysis", "cost", "_loader"},
    "planner": BOTTOM | {"tracing", "analysis", "cost", "plan"},
}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_each_stage_imports_only_the_stages_before_it():
    graph = import_graph()
    assert set(LAYERS) <= {_layer(m) for m in graph}  # the stages are there
    bad = sorted(f"{a} imports {b}" for a, b in graph.edges
                 if _layer(a) in LAYERS and _layer(b) != _layer(a) and _layer(b) not in LAYERS[_layer(a)])
    bad += sorted(f"{a} imports {b}" for a, b in graph.edges
                  if _layer(a) in BOTTOM and _layer(b) not in BOTTOM)
    assert not bad, bad


ROOT = ENGINE.parent
ADAPTER = ENGINE / "tracing" / "_jax.py"  # the one module that imports JAX's internals
LONGEST_CLASS, LONGEST_FUNCTION = 400, 120  # lines, as ``ast`` counts them (docstrings included)


def _sources() -> list[pathlib.Path]:
    return sorted([*ENGINE.rglob("*.py"), *(ROOT / "explorer").rglob("*.py")])


def test_only_the_adapter_imports_jax_internals():
    """``jax._src`` is JAX's private API: partex reaches it through ``tracing._jax`` alone, so
    a JAX release that moves it breaks one module."""
    reach = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom) else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if any(n == "jax._src" or n.startswith("jax._src.") for n in names) and path != ADAPTER:
                reach.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert ADAPTER.exists()
    assert not reach, reach


def _too_long(tree: ast.Module) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(tree):
        lines = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
        if isinstance(node, ast.ClassDef) and lines > LONGEST_CLASS:
            out.append((f"class {node.name}", lines))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and lines > LONGEST_FUNCTION:
            out.append((f"def {node.name}", lines))
    return out


def test_no_class_or_function_is_too_long_to_read():
    long = [f"{path.relative_to(ROOT)}: {what} ({n} lines)"
            for path in _sources() for what, n in _too_long(ast.parse(path.read_text()))]
    assert not long, long


def test_a_long_class_or_function_is_found():
    body = "\n".join(f"    x{i} = {i}" for i in range(LONGEST_FUNCTION))
    tree = ast.parse(f"def f():\n{body}\n\nclass C:\n    def g(self):\n        pass\n")
    assert _too_long(tree) == [("def f", LONGEST_FUNCTION + 1)]
