"""Docstrings state contracts, not history or one machine's figures: no CPU model names, core
counts, load averages or "used to" in any module, class or function docstring of the package
(measured figures live in ``benchmarks/results/`` and git history)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import draftwise

MACHINE_OR_HISTORY = re.compile(r"\bZen ?\d\b|\bEPYC\b|Sapphire Rapids|\b\d+ cores\b|load average|\bused to\b", re.I)


def _docstrings(path: Path):
    tree = ast.parse(path.read_text())
    for node in [tree, *ast.walk(tree)]:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                yield getattr(node, "name", "module"), doc


def test_no_machine_figures_or_history_in_docstrings():
    root = Path(draftwise.__file__).parent
    found = [f"{path.relative_to(root)}:{name}: {line.strip()}"
             for path in sorted(root.rglob("*.py")) for name, doc in _docstrings(path)
             for line in doc.splitlines() if MACHINE_OR_HISTORY.search(line)]
    assert not found, "\n".join(found)


def test_the_check_finds_them():
    assert MACHINE_OR_HISTORY.search("a step takes 8 ms on a Zen 4 with 2 cores")
    assert MACHINE_OR_HISTORY.search("it used to copy the cache")
    assert not MACHINE_OR_HISTORY.search("the paged kernel reads each block once")
