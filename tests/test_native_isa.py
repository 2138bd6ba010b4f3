"""The C++ kernels built for a lesser ISA level than this CPU's, AVX2 without AVX-512 or VNNI
(``-march=x86-64-v3``, what a Zen 3 runs), compute the GGUF linears exactly as the files' weights
times the rounded activations, batch invariant, and give an attention row the same output under
every schedule: ``test_gguf_linear.py`` and ``test_row_invariance.py`` run in a subprocess whose
library is built with ``DRAFTWISE_NATIVE_MARCH``. (A build without AVX2, ``x86-64-v2``, is not run
here: no machine the project supports lacks AVX2, and each build costs the suite ~40 s.)"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftwise.kernels import native
from draftwise.kernels.cpu_info import cpu_signature

TESTS = Path(__file__).parent


@pytest.mark.slow
@pytest.mark.parametrize("march", ["x86-64-v3"])
def test_kernels_built_for_a_lesser_isa(march):
    if not native.load():
        pytest.skip("the C++ CPU kernels did not build")
    if march == "x86-64-v3" and "avx2" not in cpu_signature()["flags"]:
        pytest.skip("this CPU has no AVX2")
    env = {**os.environ, native.MARCH_ENV: march}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(TESTS / "test_gguf_linear.py"),
               str(TESTS / "test_row_invariance.py"), "-k", "not bundled"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, cwd=TESTS.parent, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout.splitlines()[-1]


def test_the_build_key_names_compiler_and_flags(monkeypatch):
    """Another compiler, compiler version or flag set is another library, never a stale one."""
    key = native.build_key()
    native.build_key.cache_clear()
    try:
        monkeypatch.setattr(native, "_flags", lambda: ["-O2"])
        assert native.build_key() != key
        native.build_key.cache_clear()
        monkeypatch.setattr(native, "_compiler_version", lambda compiler: "g++ (other) 99.1")
        assert native.build_key() != key
    finally:
        monkeypatch.undo()
        native.build_key.cache_clear()
    assert native.build_key() == key
