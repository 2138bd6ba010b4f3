"""The house's layout: draftwise's packages import each other in one direction only.

Reads every module's imports (``ast``, nothing is executed) and folds them to the package
level (``draftwise.engine``, ``draftwise.spec_decode``, ...; top-level modules count as their
own node). The graph must have no cycle, and the layers named in the README keep their order:
a draft token's path (proposer -> speculation -> scheduler -> runner -> sample -> rollback)
crosses each package once. Other engines' interfaces (``draftwise.compat``) are imported only at
the edge, where a user's arguments enter (``EDGE``).
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


def _imports(path: Path, names: bool = False) -> set[str]:
    """The draftwise modules ``path`` imports; with ``names``, ``from m import x`` also gives ``m.x``
    (so ``from .. import compat`` names the package it imports)."""
    module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module.removesuffix(".__init__")
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("draftwise"):
                source = node.module
            else:
                continue
            found.add(source)
            if names:
                found.update(f"{source}.{alias.name}" for alias in node.names)
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
    assert not graph.get("kernels"), graph.get("kernels")  # the C++ kernels and their build: the bottom


# Where a user's arguments enter draftwise, so where other engines' names are read (draftwise.compat):
EDGE = (
    "engine/arg_utils.py",  # EngineArgs: LLM's keywords and the engine flags, vLLM's names among them
    "cli.py",  # draftwise generate / serve / bench: the command lines
    "server",  # the HTTP server: vLLM's server flags and request fields
    "config/__init__.py",  # EngineConfig: every speculative_config reaches the core through it, built or not
    "__init__.py",  # ``import draftwise``: vLLM's module paths (draftwise.v1.metrics.reader, ...) made importable
)


def compat_importers() -> list[str]:
    """The modules outside ``draftwise/compat`` and ``EDGE`` that import ``draftwise.compat``."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("compat/") or any(rel == edge or rel.startswith(edge + "/") for edge in EDGE):
            continue
        if any(m == "draftwise.compat" or m.startswith("draftwise.compat.") for m in _imports(path, names=True)):
            found.append(rel)
    return found


def test_only_the_edge_imports_compat():
    """Core packages never import ``draftwise.compat``: only the ``EDGE`` does, the few modules where a
    user's arguments, config and requests enter (``EngineArgs``, the CLI, the server, and ``EngineConfig``,
    which every ``speculative_config`` passes, also when it is built directly). The edge translates or
    strips another engine's names before core code sees them, so the core holds draftwise's own names
    only. Compat may import the core; compat importing the edge would close a cycle, which
    ``test_no_import_cycle_between_packages`` refuses (``engine`` is one node there: ``arg_utils``
    keeps vLLM's place for ``EngineArgs``, and compat imports nothing of ``engine``)."""
    assert all((ROOT / edge).exists() for edge in EDGE), EDGE
    config = ROOT / "config" / "__init__.py"
    assert any(m.startswith("draftwise.compat.") for m in _imports(config))  # the reader sees them
    assert compat_importers() == []


def test_speculative_state_changes_only_through_its_methods():
    """``Sequence.spec`` (``spec_state.py``) has one owner: no module assigns its fields; they change
    through ``SpecState``'s methods (``set_drafts``, ``roll_back``, ...), so "who moved the drafter's
    position?" has one answer per method."""
    import dataclasses

    from draftwise.sequence.spec_state import SpecState

    fields = {f.name for f in dataclasses.fields(SpecState)}
    offenders = []
    for path in ROOT.rglob("*.py"):
        if path.name == "spec_state.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                for leaf in ast.walk(target):
                    if (isinstance(leaf, ast.Attribute) and leaf.attr in fields
                            and isinstance(leaf.value, ast.Attribute) and leaf.value.attr == "spec"):
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} .spec.{leaf.attr}")
    assert not offenders, offenders


def test_the_design_page_maps_every_package():
    """``docs/design.md`` has a bullet for each package of draftwise, so its map stays whole."""
    design = (ROOT.parent / "docs" / "design.md").read_text()
    bullets = [line for line in design.splitlines() if line.startswith("- ")]
    packages = sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))
    unmapped = [name for name in packages if not any(f"`{name}/" in line for line in bullets)]
    assert not unmapped, f"packages docs/design.md does not map: {unmapped}"
