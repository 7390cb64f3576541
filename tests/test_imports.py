"""The engine's modules import one another without a cycle, so each stage of the pipeline
can be read (and tested) with only the stages below it.

Every ``from . import`` / ``from .x import`` counts, inside functions too; only imports
under ``if TYPE_CHECKING:`` (annotations, never run) are left out.
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


def _type_checking_only(tree: ast.Module) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            skip.update(id(n) for child in node.body for n in ast.walk(child))
    return skip


def import_graph() -> nx.DiGraph:
    """Module -> the package modules it imports (relative imports, at any depth)."""
    graph = nx.DiGraph()
    for path in ENGINE.rglob("*.py"):
        me = _module(path)
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        graph.add_node(me)
        tree = ast.parse(path.read_text())
        skip = _type_checking_only(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level == 0 or id(node) in skip:
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
    """The walk sees imports inside functions: two modules that import each other there
    make a cycle."""
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "_a.py").write_text("def f():\n    from ._b import g\n    return g\n")
    (tmp_path / "_b.py").write_text("from ._a import f\n\ndef g():\n    return f\n")
    (tmp_path / "_c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._a import f\n")
    monkeypatch.setattr(f"{__name__}.ENGINE", tmp_path)
    graph = import_graph()
    assert sorted(map(sorted, nx.simple_cycles(graph))) == [["partex._a", "partex._b"]]
    assert not graph.has_edge("partex._c", "partex._a")


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
    plan.apply(lambda x: x)
except ImportError:
    print("apply needs JAX")
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "partex.tracing._program" not in r.stdout and "partex.analysis._analysis" not in r.stdout, r.stdout
    assert r.stdout.rstrip().endswith("apply needs JAX"), r.stdout


BOTTOM = {"_errors", "_decisions", "_profile", "_mesh", "_results"}  # import nothing of partex but each other
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
