"""The Python SDK's modules do not import each other: no circles.

``docs/architecture.md`` promises that no two modules of a package depend
on each other, directly or through others; this keeps the promise for the
``trainyard`` package. Every import of a ``trainyard`` module counts,
wherever it is: at the top of a file or deferred inside a function (a
lazy import still makes the circle, only later). Imports under
``if TYPE_CHECKING:`` are left out: they never run, and name a type for
the annotations only. The package's ``__init__`` is the parent of every
module and may import them all; a module importing the package itself
would be a circle with it. No server is needed.
"""

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set

PACKAGE = Path(__file__).resolve().parents[2] / "sdk" / "python" / "trainyard"
ROOT = "trainyard"


def _module_name(path: Path) -> str:
    return ROOT if path.stem == "__init__" else f"{ROOT}.{path.stem}"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, modules: Set[str]) -> Set[str]:
    """The package's modules that ``tree`` imports, outside TYPE_CHECKING."""
    found: Set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == ROOT or alias.name.startswith(ROOT + "."):
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level > 1:
                base: Optional[str] = None  # outside the package
            elif node.level == 1:
                base = f"{ROOT}.{node.module}" if node.module else ROOT
            else:
                base = node.module if node.module and (node.module == ROOT or node.module.startswith(ROOT + ".")) else None
            if base is not None:
                found.add(base)
                # ``from . import fit`` imports the module ``fit``.
                for alias in node.names:
                    if f"{base}.{alias.name}" in modules:
                        found.add(f"{base}.{alias.name}")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m in modules}


def _graph() -> Dict[str, Set[str]]:
    files = sorted(PACKAGE.glob("*.py"))
    modules = {_module_name(f) for f in files}
    graph = {}
    for f in files:
        name = _module_name(f)
        graph[name] = _imports(ast.parse(f.read_text(), str(f)), modules) - {name}
    return graph


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """One cycle (first module repeated at the end) through each module on one."""
    cycles: List[List[str]] = []
    on_a_cycle: Set[str] = set()
    for start in sorted(graph):
        if start in on_a_cycle:
            continue
        stack = [(start, [start])]
        seen: Set[str] = set()
        while stack:
            node, path = stack.pop()
            if start in graph.get(node, ()):
                cycles.append(path + [start])
                on_a_cycle.update(path)
                break
            for nxt in sorted(graph.get(node, ())):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    return cycles


def test_the_sdk_modules_import_each_other_only_one_way():
    graph = _graph()
    assert "trainyard.client" in graph and "trainyard.fit" in graph, graph
    cycles = _cycles(graph)
    assert not cycles, "modules that import each other: " + "; ".join(" → ".join(c) for c in cycles)


def test_a_deferred_import_counts():
    tree = ast.parse("def f():\n    from .fit import fit\n")
    assert _imports(tree, {"trainyard.fit"}) == {"trainyard.fit"}
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .fit import Run\n")
    assert _imports(tree, {"trainyard.fit"}) == set()
    assert _cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]
