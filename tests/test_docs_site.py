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
