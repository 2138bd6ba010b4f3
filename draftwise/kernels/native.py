"""Build and load draftwise's C++ CPU kernels (``kernels/csrc``), once per machine.

The kernels, one folder of ``csrc`` per concern (``csrc/library.cpp`` lists them):
``attention/`` (``draftwise_cpu::paged_attention``, attention of every CPU row over the paged
cache, ``layers/attention.py``), ``gguf/`` (``gguf_linear`` / ``gguf_repack``, linears on GGUF
blocks, ``layers/gguf_linear.py``), ``linear/`` (``packed_linear``, a ``PackedLinear`` inside a
compiled graph, ``layers/linear.py``), ``norm/`` (``rms_norm``, ``layers/common.py``),
``sampling/`` (``uniform_noise``, the sampler's noise, ``sample/logits.py``) and ``stack/``
(``DecoderStack``, ``models/decoder_stack.py``).
``load()`` compiles every ``csrc/**/*.cpp`` with the system's C++ compiler for
this CPU (``-march=native``: the kernel is built on the machine it runs on) against
the installed torch, caches the library under ``~/.cache/draftwise/native`` keyed by
the source, torch version, CPU, compiler and flags (``build_key``), and registers
``torch.ops.draftwise_cpu.*``. It returns False, and logs why, where no compiler or no build
works: callers then keep the pure-torch path, and the result holds for the process (no retry).
``DRAFTWISE_NATIVE=0`` turns the kernels off; ``DRAFTWISE_NATIVE_MARCH=x86-64-v3`` (any ``-march``
value) builds for a lesser ISA than this CPU's (tests run the AVX2 and scalar paths that way on an
AVX512 machine).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import torch
from torch.utils import cpp_extension

from .cpu_info import cpu_signature

CSRC = Path(__file__).parent / "csrc"
SOURCES = tuple(sorted(CSRC.rglob("*.cpp")))
# Sources whose floating-point order is part of their contract: built without -ffast-math (no
# reassociation), multiply-adds still fused.
EXACT_ORDER = ("paged_attention.cpp",)
NATIVE_ENV = "DRAFTWISE_NATIVE"
MARCH_ENV = "DRAFTWISE_NATIVE_MARCH"
logger = logging.getLogger("draftwise")


@cache
def load() -> bool:
    if os.environ.get(NATIVE_ENV, "1") == "0" or not torch.backends.openmp.is_available():
        return False
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        logger.info("draftwise: no C++ compiler, the C++ CPU kernels are off")
        return False
    library = _cache_dir() / f"cpu_kernels-{build_key()}.so"
    if not library.exists() and not _build_once(compiler, library):
        return False
    torch.ops.load_library(str(library))
    torch.library.register_fake("draftwise_cpu::packed_linear")(packed_linear_fake)
    torch.library.register_fake("draftwise_cpu::gguf_linear")(gguf_linear_fake)
    return True


def packed_linear_fake(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The output shape of both packed-linear ops (this library's and ``linear.py``'s fallback)."""
    return x.new_empty(x.shape[0], packed.shape[0])  # [num_rows, out_features]


def gguf_linear_fake(x: torch.Tensor, weight: torch.Tensor, qtype: int, packed: bool,
                     bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])  # [num_rows, out_features]


@cache
def build_key() -> str:
    """What the built library depends on: its source, the torch version, the CPU, the compiler (its
    path and version) and the flags."""
    sources = [*SOURCES, *sorted(CSRC.rglob("*.h"))]  # headers change the build too
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    texts = [(str(source.relative_to(CSRC)), source.read_text()) for source in sources]
    key = json.dumps([texts, torch.__version__, cpu_signature(), compiler,
                      _compiler_version(compiler), _flags(),
                      [_source_flags(s) for s in SOURCES]], sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _compiler_version(compiler: str | None) -> str:
    if compiler is None:
        return ""
    result = subprocess.run([compiler, "--version"], capture_output=True, text=True)
    return result.stdout.splitlines()[0] if result.returncode == 0 and result.stdout else ""


def _flags() -> list[str]:
    """The compile flags (the include paths aside), this CPU's ``-march`` among them."""
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return ["-fPIC", "-std=c++20", "-O3", f"-march={_march()}", "-ffast-math", "-fopenmp",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]


def _source_flags(source: Path) -> list[str]:
    return ["-fno-fast-math", "-ffp-contract=fast"] if source.name in EXACT_ORDER else []


def _march() -> str:
    return os.environ.get(MARCH_ENV, "native")


def _cache_dir() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "draftwise" / "native"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _build_once(compiler: str, library: Path) -> bool:
    """Build under a lock, so processes starting together build once and never load a half-written file."""
    with open(f"{library}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return library.exists() or _build(compiler, library)


def _build(compiler: str, library: Path) -> bool:
    """Compile each source on its own (as many at once as there are CPUs), then link."""
    partial = f"{library}.{os.getpid()}.tmp"
    flags = _flags() + [f"-I{p}" for p in (CSRC, *cpp_extension.include_paths())]
    objects = [f"{partial}.{source.stem}.o" for source in SOURCES]
    compiles = [[compiler, "-c", str(source), "-o", obj, *flags, *_source_flags(source)]
                for source, obj in zip(SOURCES, objects)]
    link = [compiler, *objects, "-o", partial, "-shared", "-fopenmp"]
    link += [f"-L{p}" for p in cpp_extension.library_paths()] + ["-lc10", "-ltorch_cpu"]
    link += [f"-Wl,-rpath,{p}" for p in cpp_extension.library_paths()]
    logger.info("draftwise: building the C++ CPU kernels for this machine (once)...")
    start = time.perf_counter()
    try:
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            results = list(pool.map(lambda cmd: subprocess.run(cmd, capture_output=True, text=True), compiles))
        failed = next((r for r in results if r.returncode != 0), None)
        result = failed or subprocess.run(link, capture_output=True, text=True)
    finally:
        for obj in objects:
            Path(obj).unlink(missing_ok=True)
    if result.returncode != 0:
        logger.warning("draftwise: the C++ CPU kernels did not build, using torch's ops:\n%s",
                       result.stderr[-2000:])
        return False
    os.replace(partial, library)
    logger.info("draftwise: C++ CPU kernels built in %.1f s (%s)", time.perf_counter() - start, library)
    return True
