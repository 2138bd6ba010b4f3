"""Measure which linear kernel is fastest at each row count, on this machine, once.

``choose_kernels(model, cache_dir)`` times every candidate kernel of
``linear.CANDIDATES`` for the model's ``PackedLinear`` modules at the row
counts of ``ROW_BUCKETS`` and gives each module the fastest per bucket. Modules
are timed as groups the way a step runs them, so weights stream from memory
as in a real forward rather than sitting in cache: ``layers`` (every linear of
the decoder layers, in order) and ``head`` (the output projection, whose
shape differs). A group's time is the best of ``REPEATS`` passes after a
warm-up.

The result is cached as JSON under ``cache_dir``, keyed by the CPU (model
name and ISA flags), torch version, thread count, dtype and the groups'
shapes, so a second start reads it instead of measuring. It is logged at
start-up and kept on the model (``model.kernel_plans``).
``DRAFTWISE_KERNEL_CHOICE=default`` skips the measurement (``linear.DEFAULT_PLANS``).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from pathlib import Path

import torch

from .linear import CANDIDATES, DEFAULT_PLANS, PackedLinear

ROW_BUCKETS = (1, 2, 4, 8, 16, 64)
REPEATS = 3
CHOICE_ENV = "DRAFTWISE_KERNEL_CHOICE"
_ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8")
logger = logging.getLogger("draftwise")


def cpu_signature() -> dict:
    """The CPU model and the ISA flags that decide kernel speed (from /proc/cpuinfo)."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return {"cpu": name, "flags": sorted(f for f in _ISA_FLAGS if f in flags)}


def choose_kernels(groups: dict[str, list[PackedLinear]], cache_dir: Path | None) -> dict[str, dict[int, str]]:
    """Give every module of ``groups`` its measured (or cached) plan; returns ``{group: plan}``."""
    groups = {name: mods for name, mods in groups.items() if mods}
    if not groups:
        return {}
    dtype = next(iter(groups.values()))[0].dtype
    if os.environ.get(CHOICE_ENV, "measure") == "default":
        plans = {name: dict(DEFAULT_PLANS[dtype]) for name in groups}
    else:
        key = _cache_key(groups, dtype)
        plans = _read_cache(cache_dir, key)
        if plans is None:
            start = time.perf_counter()
            plans, times = measure(groups, dtype)
            logger.info("draftwise: measured linear kernels in %.1f s", time.perf_counter() - start)
            _write_cache(cache_dir, key, plans, times, dtype)
    for name, modules in groups.items():
        for module in modules:
            module.set_plan(plans[name])
    logger.info("draftwise: linear kernels (%s, %s): %s", str(dtype).removeprefix("torch."),
                cpu_signature()["cpu"], describe(plans))
    return plans


@torch.inference_mode()
def measure(groups: dict[str, list[PackedLinear]], dtype: torch.dtype
            ) -> tuple[dict[str, dict[int, str]], dict[str, dict[int, dict[str, float]]]]:
    """({group: {bucket: fastest kernel}}, {group: {bucket: {kernel: ms}}})."""
    plans, times = {}, {}
    for name, modules in groups.items():
        plans[name], times[name] = {}, {}
        for rows in ROW_BUCKETS:
            inputs = {m.in_features: torch.randn(rows, m.in_features, dtype=dtype) for m in modules}
            kernels = [k for k in CANDIDATES[dtype] if k != "mv" or rows == 1]
            measured = {k: _time_group(modules, k, inputs) for k in kernels}
            times[name][rows] = {k: round(1000 * t, 3) for k, t in measured.items()}
            plans[name][rows] = min(measured, key=measured.get)
    return plans, times


def _time_group(modules: list[PackedLinear], kernel: str, inputs: dict[int, torch.Tensor]) -> float:
    samples = []
    for _ in range(REPEATS + 1):
        start = time.perf_counter()
        for module in modules:
            module.run(kernel, inputs[module.in_features])
        samples.append(time.perf_counter() - start)
    return min(samples[1:])


def describe(plans: dict[str, dict[int, str]]) -> str:
    """``layers: 1 row mv, 2-64+ rows packed; head: ...``: consecutive buckets merged."""
    parts = []
    for name, plan in plans.items():
        runs, low = [], 1
        buckets = sorted(plan)
        for i, bucket in enumerate(buckets):
            last = i + 1 == len(buckets)
            if last or plan[buckets[i + 1]] != plan[bucket]:
                runs.append(f"{_span(low, bucket, last)} {plan[bucket]}")
                low = bucket + 1
        parts.append(f"{name}: " + ", ".join(runs))
    return "; ".join(parts)


def _span(low: int, high: int, last: bool) -> str:
    text = (f"{low}" if low == high else f"{low}-{high}") + ("+" if last else "")
    return text + (" row" if text == "1" else " rows")


def _cache_key(groups: dict[str, list[PackedLinear]], dtype: torch.dtype) -> str:
    shapes = {name: [(m.out_features, m.in_features) for m in mods] for name, mods in groups.items()}
    what = {**cpu_signature(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "dtype": str(dtype), "buckets": ROW_BUCKETS, "shapes": shapes}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def _read_cache(cache_dir: Path | None, key: str) -> dict[str, dict[int, str]] | None:
    if cache_dir is None:
        return None
    try:
        raw = json.loads((cache_dir / f"{key}.json").read_text())["plans"]
        return {name: {int(b): k for b, k in plan.items()} for name, plan in raw.items()}
    except (OSError, ValueError, KeyError, AttributeError):
        return None


def _write_cache(cache_dir: Path | None, key: str, plans: dict, times: dict, dtype: torch.dtype) -> None:
    if cache_dir is None:
        return
    record = {**cpu_signature(), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "dtype": str(dtype), "plans": plans, "times_ms": times}
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cache_dir / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(record, indent=1))
        tmp.replace(cache_dir / f"{key}.json")
    except OSError as exc:
        logger.warning("draftwise: could not cache the kernel choice in %s: %s", cache_dir, exc)
