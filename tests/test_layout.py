"""The house's layout: draftwise's packages import each other in one direction only.

Reads every module's imports (``ast``, nothing is executed) and folds them to the package
level (``draftwise.engine``, ``draftwise.spec_decode``, ...; top-level modules count as their
own node). The graph must have no cycle, and the layers named in the README keep their order:
a draft token's path (proposer -> speculation -> scheduler -> runner -> sample -> rollback)
crosses each package once.
"""
from __future__ import annotations

import ast
from pathlib import Path

import draftwise

ROOT = Path(draftwise.__file__).parent


def _node(module: str) -> str:
    """``draftwise.engine.model_runner`` -> ``engine``; ``draftwise.sequence`` -> ``sequence``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _imports(path: Path) -> set[str]:
    module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module.removesuffix(".__init__")
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[:len(package.split(".")) - node.level + 1]
            found.add(".".join(base + ([node.module] if node.module else [])))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("draftwise"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("draftwise"))
    return found


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        source = _node(".".join(path.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__"))
        for target in map(_node, _imports(path)):
            if target and source and target != source:
                graph.setdefault(source, set()).add(target)
    return graph


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return False


def test_no_import_cycle_between_packages():
    graph = package_graph()
    cycles = sorted((a, b) for a, targets in graph.items() for b in targets if _reaches(graph, b, a))
    assert not cycles, f"package imports that close a cycle: {cycles}"


def test_the_layers_point_one_way():
    graph = package_graph()
    assert "engine" not in graph.get("spec_decode", set())
    for low in ("sample", "paged", "layers", "models"):
        assert not _reaches(graph, low, "engine") and not _reaches(graph, low, "spec_decode"), low
    assert not _reaches(graph, "sample", "paged") and not _reaches(graph, "paged", "sample")
