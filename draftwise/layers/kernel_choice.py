"""Measure which kernel is fastest at each row count, on this machine, once.

``choose_kernels(groups, cache_dir)`` times every candidate kernel of each
group at the row counts of ``ROW_BUCKETS`` and gives the group the fastest
per bucket. A group is what a step runs together:

* ``LinearGroup``: ``PackedLinear`` modules timed in order, so weights stream
  from memory as in a real forward rather than sitting in cache; candidates
  from ``linear.CANDIDATES``. Models have ``layers`` (every linear of the
  decoder layers) and ``head`` (the output projection, whose shape differs).
* ``AttentionGroup``: one layer's attention for ``ATTENTION_SEQS`` sequences of
  up to ``ATTENTION_CONTEXT`` keys, rows being query rows per sequence. Where draftwise's paged
  CPU kernel built (``native.py``) it is the only candidate at every row count, not timed: its
  rows reduce their keys in an order fixed by position whatever the rows beside them, so a
  prefill, decode, verify or tree row of the same position computes alike (scheduling and
  speculation change no output). Otherwise: scaled-dot-product attention in the model's dtype (``native``)
  or in fp32 (``fp32``; bf16 CPU flash attention is several times slower than fp32 for a few
  query rows on some CPUs).

A kernel's time is its best of ``REPEATS`` rounds after a warm-up round, every round running each
candidate once in turn (interleaved), so a burst of load on the machine hits all candidates alike.

The result is cached as JSON under ``cache_dir``, keyed by the CPU (model
name and ISA flags), torch version, thread count, the groups' dtypes and
shapes, ``METHOD_VERSION`` and the paged kernel's build, so a second start
reads it instead of measuring. A cached plan is re-checked at start-up, cheaply: at
``RECHECK_BUCKETS`` its kernel is timed against the other candidates on a sample of the work (one
attention call in ``RECHECK_SAMPLE``, one linear in as many), interleaved, in one round after a
warm-up, and where one of them runs ``RECHECK_RATIO`` times faster there and again at full size
(a plan measured while the machine was busy) the plan is measured again and re-cached. It is logged at start-up and kept on the model (``model.kernel_plans``).
``DRAFTWISE_KERNEL_CHOICE=default`` skips the measurement (``linear.DEFAULT_PLANS``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Callable

import torch

from ..kernels import native
from .attention import build_metadata, paged_attention, with_paged_kernel
from ..kernels.cpu_info import cpu_signature
from .linear import CANDIDATES, DEFAULT_PLANS, PackedLinear

ROW_BUCKETS = (1, 2, 4, 8, 16, 64)
ATTENTION_CONTEXT = 512
ATTENTION_SEQS = 16  # sequences of the timed attention batch: a busy server's, since a small batch
# under-prices the gathered SDPA path against the paged kernel
BLOCK_SIZE = 16
ATTENTION_CALLS = 16  # attention calls per timed sample
METHOD_VERSION = 9  # part of the cache key: raise it when what is timed changes
REPEATS = 3
RECHECK_BUCKETS = (1, 8)
RECHECK_RATIO = 1.5
RECHECK_SAMPLE = 8  # the re-check times 1/RECHECK_SAMPLE of a measurement's work
CHOICE_ENV = "DRAFTWISE_KERNEL_CHOICE"
logger = logging.getLogger("draftwise")


class LinearGroup:
    def __init__(self, modules: list[PackedLinear]):
        self.modules = modules
        self.dtype = modules[0].dtype
        self.default_plan = DEFAULT_PLANS[self.dtype]
        self.shape = [(m.out_features, m.in_features) for m in modules]

    def candidates(self, rows: int) -> list[str]:
        return [k for k in CANDIDATES[self.dtype] if k != "mv" or rows == 1]

    def timer(self, rows: int, sample: int = 1) -> Callable[[str], None]:
        """Runs every ``sample``-th module in order."""
        modules = self.modules[::sample]
        inputs = {m.in_features: torch.randn(rows, m.in_features, dtype=self.dtype) for m in modules}

        def run(kernel: str) -> None:
            for module in modules:
                module.run(kernel, inputs[module.in_features])
        return run

    def apply(self, plan: dict[int, str]) -> None:
        for module in self.modules:
            module.set_plan(plan)


class AttentionGroup:
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 apply: Callable[[dict[int, str]], None]):
        self.heads, self.dtype, self.apply = (num_heads, num_kv_heads, head_dim), dtype, apply
        self.default_plan = {1: "native"}
        self.shape = [num_heads, num_kv_heads, head_dim, ATTENTION_CONTEXT]

    def candidates(self, rows: int) -> list[str]:
        if native.load():
            return ["paged"]
        return ["native"] + (["fp32"] if self.dtype != torch.float32 else [])

    def timer(self, rows: int, sample: int = 1) -> Callable[[str], None]:
        """One layer's ``paged_attention`` as a batch runs it: ``ATTENTION_SEQS`` sequences of
        different context lengths in scattered blocks, ``rows`` query rows each;
        ``ATTENTION_CALLS // sample`` calls."""
        num_heads, num_kv_heads, head_dim = self.heads
        context_lens = [ATTENTION_CONTEXT - 23 * i for i in range(ATTENTION_SEQS)]
        width = -(-ATTENTION_CONTEXT // BLOCK_SIZE)
        table = torch.randperm(width * ATTENTION_SEQS).view(ATTENTION_SEQS, width)
        meta = build_metadata(table, [rows] * ATTENTION_SEQS, context_lens, BLOCK_SIZE, None, torch.device("cpu"))
        metas = {"native": meta, "fp32": dataclasses.replace(meta, compute_dtype=torch.float32),
                 "paged": with_paged_kernel(meta)}
        q, k, v = (torch.randn(rows * ATTENTION_SEQS, h, head_dim, dtype=self.dtype)
                   for h in (num_heads, num_kv_heads, num_kv_heads))
        kv_cache = torch.zeros(2, table.numel() * BLOCK_SIZE, num_kv_heads, head_dim, dtype=self.dtype)

        def run(kernel: str) -> None:
            for _ in range(max(1, ATTENTION_CALLS // sample)):  # one call per layer of a step
                paged_attention(q, k, v, kv_cache, metas[kernel], head_dim ** -0.5, False)
        return run


def choose_kernels(groups: dict[str, LinearGroup | AttentionGroup], cache_dir: Path | None
                   ) -> dict[str, dict[int, str]]:
    """Give every group its measured (or cached) plan; returns ``{group: plan}``."""
    if not groups:
        return {}
    if os.environ.get(CHOICE_ENV, "measure") == "default":
        plans = {name: dict(group.default_plan) for name, group in groups.items()}
    else:
        key = _cache_key(groups)
        plans = _read_cache(cache_dir, key)
        if plans is not None and not plan_holds(groups, plans):
            plans = None
        if plans is None:
            start = time.perf_counter()
            plans, times = measure(groups)
            logger.info("draftwise: measured kernels in %.1f s", time.perf_counter() - start)
            _write_cache(cache_dir, key, plans, times, groups)
    for name, group in groups.items():
        group.apply(plans[name])
    dtype = next(iter(groups.values())).dtype
    logger.info("draftwise: kernels (%s, %s): %s", str(dtype).removeprefix("torch."),
                cpu_signature()["cpu"], describe(plans))
    return plans


@torch.inference_mode()
def measure(groups: dict[str, LinearGroup | AttentionGroup]
            ) -> tuple[dict[str, dict[int, str]], dict[str, dict[int, dict[str, float]]]]:
    """({group: {bucket: fastest kernel}}, {group: {bucket: {kernel: ms}}})."""
    plans, times = {}, {}
    for name, group in groups.items():
        plans[name], times[name] = {}, {}
        for rows in ROW_BUCKETS:
            candidates = group.candidates(rows)
            if len(candidates) == 1:  # nothing to choose: not timed
                plans[name][rows], times[name][rows] = candidates[0], {}
                continue
            measured = _interleaved(group.timer(rows), candidates)
            times[name][rows] = {k: round(1000 * t, 3) for k, t in measured.items()}
            plans[name][rows] = min(measured, key=measured.get)
    return plans, times


@torch.inference_mode()
def plan_holds(groups: dict[str, LinearGroup | AttentionGroup], plans: dict[str, dict[int, str]]) -> bool:
    """False where, at a ``RECHECK_BUCKETS`` row count, another candidate runs ``RECHECK_RATIO``
    times faster than the plan's kernel (timed interleaved, now)."""
    for name, group in groups.items():
        for rows in RECHECK_BUCKETS:
            candidates = group.candidates(rows)
            chosen = plans.get(name, {}).get(rows)
            if len(candidates) < 2 or chosen not in candidates:
                continue
            sample = _interleaved(group.timer(rows, RECHECK_SAMPLE), candidates, rounds=1)
            if not _contradicts(sample, chosen):
                continue
            measured = _interleaved(group.timer(rows), candidates)  # confirmed at full size before re-measuring
            best = min(measured, key=measured.get)
            if _contradicts(measured, chosen):
                logger.info("draftwise: the cached kernel plan's %s at %d rows (%s, %.2f ms) is slower than %s "
                            "(%.2f ms) now: measuring again", name, rows, chosen, 1000 * measured[chosen], best,
                            1000 * measured[best])
                return False
    return True


def _contradicts(measured: dict[str, float], chosen: str) -> bool:
    return measured[chosen] > RECHECK_RATIO * min(measured.values())


def _interleaved(run: Callable[[str], None], kernels: list[str], rounds: int = REPEATS) -> dict[str, float]:
    """Each kernel's best time over ``rounds`` rounds (after a warm-up round) that run every kernel once."""
    best = dict.fromkeys(kernels, float("inf"))
    for round_index in range(rounds + 1):
        for kernel in kernels:
            start = time.perf_counter()
            run(kernel)
            if round_index:
                best[kernel] = min(best[kernel], time.perf_counter() - start)
    return best


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


def _cache_key(groups: dict[str, LinearGroup | AttentionGroup]) -> str:
    shapes = {name: [type(g).__name__, str(g.dtype), g.shape] for name, g in groups.items()}
    what = {**cpu_signature(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "buckets": ROW_BUCKETS, "shapes": shapes, "method": METHOD_VERSION,
            "native": native.build_key() if native.load() else None}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def _read_cache(cache_dir: Path | None, key: str) -> dict[str, dict[int, str]] | None:
    if cache_dir is None:
        return None
    try:
        raw = json.loads((cache_dir / f"{key}.json").read_text())["plans"]
        return {name: {int(b): k for b, k in plan.items()} for name, plan in raw.items()}
    except (OSError, ValueError, KeyError, AttributeError):
        return None


def _write_cache(cache_dir: Path | None, key: str, plans: dict, times: dict, groups: dict) -> None:
    if cache_dir is None:
        return
    record = {**cpu_signature(), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "dtypes": {name: str(g.dtype) for name, g in groups.items()}, "plans": plans, "times_ms": times}
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cache_dir / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(record, indent=1))
        tmp.replace(cache_dir / f"{key}.json")
    except OSError as exc:
        logger.warning("draftwise: could not cache the kernel choice in %s: %s", cache_dir, exc)
