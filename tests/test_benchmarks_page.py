"""``docs/benchmarks.md`` is what ``benchmarks/render_page.py`` makes of ``benchmarks/page.md`` and
the newest file of each benchmark in ``benchmarks/results/``: a new result, or an edit of the
template, without re-rendering fails here, as does a placeholder with no file or a benchmark whose
results the page never shows."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def render_page():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("render_page", ROOT / "benchmarks" / "render_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_is_rendered_from_the_newest_results(render_page):
    assert render_page.PAGE.read_text() == render_page.render(), \
        "docs/benchmarks.md is stale: run python benchmarks/render_page.py"


def test_every_benchmark_is_on_the_page_and_every_placeholder_has_results(render_page):
    shown = set(render_page.placeholders(render_page.TEMPLATE.read_text()))
    have = set(render_page.results_by_prefix())
    assert shown <= have, f"placeholders without results: {sorted(shown - have)}"
    unshown = have - shown - set(render_page.OFF_PAGE)
    assert not unshown, f"results the page never shows: {sorted(unshown)}"


def test_a_newer_result_replaces_the_older_one(render_page, tmp_path, monkeypatch):
    (tmp_path / "demo-2026-01-01.json").write_text('{"date": "2026-01-01", "tables": [], "notes": ["old"]}')
    (tmp_path / "demo-2026-01-01b.json").write_text('{"date": "2026-01-01", "tables": [], "notes": ["newer"]}')
    (tmp_path / "demo-extra-2026-02-01.json").write_text('{"notes": ["another benchmark"]}')
    monkeypatch.setattr(render_page, "RESULTS", tmp_path)
    monkeypatch.setattr(render_page, "ROOT", tmp_path)
    page = render_page.render("# T\n\n<!-- results: demo -->\n")
    assert "- newer" in page and "old" not in page and "another" not in page
    with pytest.raises(ValueError, match="missing"):
        render_page.render("<!-- results: missing -->\n")
