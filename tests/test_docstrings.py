"""Docstrings and comments state contracts, not history or one machine's figures: no CPU model
names, core counts, load averages or "used to" in any module, class or function docstring of the
package, nor in its comments (Python ``#`` and the C++ kernels' ``//``); measured figures live in
``benchmarks/results/`` and git history."""
from __future__ import annotations

import ast
import io
import re
import tokenize
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


def _comments(path: Path):
    """(line, text) of every comment: Python's by the tokenizer, the C++ sources' ``//`` lines."""
    text = path.read_text()
    if path.suffix == ".py":
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                yield tok.start[0], tok.string
        return
    for number, line in enumerate(text.splitlines(), 1):
        if "//" in line:
            yield number, line[line.index("//"):]


def test_no_machine_figures_or_history_in_comments():
    root = Path(draftwise.__file__).parent
    sources = sorted(root.rglob("*.py")) + sorted((root / "layers" / "csrc").glob("*.[ch]*"))
    found = [f"{path.relative_to(root)}:{number}: {comment.strip()}"
             for path in sources for number, comment in _comments(path) if MACHINE_OR_HISTORY.search(comment)]
    assert not found, "\n".join(found)


def test_the_check_finds_them(tmp_path):
    assert MACHINE_OR_HISTORY.search("a step takes 8 ms on a Zen 4 with 2 cores")
    assert MACHINE_OR_HISTORY.search("it used to copy the cache")
    assert not MACHINE_OR_HISTORY.search("the paged kernel reads each block once")
    (tmp_path / "a.py").write_text('x = "# not a comment"  # it used to copy\n')
    (tmp_path / "b.cpp").write_text("int x;  // 8 ms on a Zen 4\n")
    assert [(n, t) for n, t in _comments(tmp_path / "a.py")] == [(1, "# it used to copy")]
    assert all(MACHINE_OR_HISTORY.search(t) for name in ("a.py", "b.cpp") for _, t in _comments(tmp_path / name))
