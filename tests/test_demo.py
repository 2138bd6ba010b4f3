"""``make demo`` prints its side-by-side table, each speculative output equal to plain decoding's."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo.py"


@pytest.mark.slow
def test_demo_prints_each_method_beside_plain_and_equal_outputs():
    result = subprocess.run([sys.executable, str(DEMO)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith(("code edit", "chat"))]
    assert [row[2] if row[0] == "code" else row[1] for row in rows] == ["plain", "ngram", "suffix", "plain", "eagle3"]
    assert all(line.endswith("= plain") for line in result.stdout.splitlines()[1:] if line.strip())
