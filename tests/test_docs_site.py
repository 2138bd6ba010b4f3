"""The documentation builds as a site with ``mkdocs build --strict``: every page in the nav, no broken
link or anchor (``make docs`` builds and serves it)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra (mkdocs) is not installed")
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or "mkdocs"
    result = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                            capture_output=True, text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1",
                                                                             "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
    for page in ("index.html", "methods/eagle/index.html", "speculative-decoding/index.html"):
        assert (tmp_path / "site" / page).is_file(), page


def test_every_doc_page_is_in_the_nav():
    import yaml

    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    listed = {page for page in pages if page in nav}
    assert listed == pages, sorted(pages - listed)
    assert yaml.safe_load(nav.split("validation:")[0])["nav"]


def test_generated_reference_pages_match_the_code():
    """docs/reference/ is written from EngineConfig and the vLLM tables: a field or rule changed
    without rerunning scripts/gen_docs_reference.py fails here."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_docs_reference
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    for path, text in gen_docs_reference.render().items():
        assert path.is_file() and path.read_text() == text, f"{path} is stale: run python scripts/gen_docs_reference.py"
