"""The periodic log lines, in vLLM's words, so log greps written for vLLM work.

Every ``interval_s`` seconds (``VLLM_LOG_STATS_INTERVAL``, default 10, as vLLM) the ``draftwise``
logger gets::

    Engine 000: Avg prompt throughput: 41.3 tokens/s, Avg generation throughput: 12.0 tokens/s,
    Running: 2 reqs, Waiting: 0 reqs, CPU KV cache usage: 3.1%, Prefix cache hit rate: 25.0%

("Preemptions: N" before the KV cache part when the interval had any; "GPU KV cache usage" on
CUDA; the hit rate, since start-up, only with prefix caching and after a lookup), followed by the
speculative line (``spec_decode/metrics.py``) when the interval verified drafts. The prompt
throughput counts the prompt tokens computed, not those read from the prefix cache. The prefix
is the recorder's ``engine_index`` (each replica of a data-parallel server logs its own lines,
"Engine 000", "Engine 001", ..., as vLLM does).

``maybe_log`` is called on the engine's thread after each step and, in the server, on every
wake-up of its idle engine loop, so the lines keep their pace while requests run and the interval
that ends a burst is logged too. As in vLLM, an interval whose throughputs and the previous
interval's are all zero logs at DEBUG, so an idle server stays quiet. ``clock`` is
``time.monotonic``; tests pass their own.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

logger = logging.getLogger("draftwise")

INTERVAL_ENV = "VLLM_LOG_STATS_INTERVAL"


def default_interval_s() -> float:
    """``VLLM_LOG_STATS_INTERVAL`` seconds if set (vLLM's variable; a value <= 0 means 10), else 10."""
    raw = os.environ.get(INTERVAL_ENV)
    if raw is None:
        return 10.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{INTERVAL_ENV} must be a number of seconds, got {raw!r}") from None
    return value if value > 0 else 10.0


class StatLogger:
    def __init__(self, recorder, kv_device: str, spec_logger=None, interval_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.recorder = recorder  # a StatsRecorder: its totals are read on the engine's thread
        self.kv_device = kv_device  # "GPU" on CUDA, else the device type ("CPU"), as vLLM writes it
        self.spec_logger = spec_logger  # the Speculator's SpecDecodingLogger, or None
        self.interval_s = default_interval_s() if interval_s is None else interval_s
        self.clock = clock
        self._last_time = clock()
        self._seen = self._totals()
        self._last_throughputs = (0.0, 0.0)

    def _totals(self) -> tuple[int, int, int]:
        r = self.recorder
        return r.prompt_tokens_computed, r.counters["vllm:generation_tokens"], r.counters["vllm:num_preemptions"]

    def maybe_log(self) -> None:
        now = self.clock()
        if now - self._last_time >= self.interval_s:
            self.log(now)

    def log(self, now: float | None = None) -> None:
        """Log the interval since the last line and start the next one."""
        now = self.clock() if now is None else now
        elapsed = now - self._last_time
        totals = self._totals()
        prompt, generation, preemptions = (new - old for new, old in zip(totals, self._seen))
        throughputs = (prompt / elapsed, generation / elapsed) if elapsed > 0 else (0.0, 0.0)
        level = logging.INFO if any(throughputs + self._last_throughputs) else logging.DEBUG
        self._last_time, self._seen, self._last_throughputs = now, totals, throughputs
        gauges = self.recorder.gauges
        parts = ["Avg prompt throughput: %.1f tokens/s", "Avg generation throughput: %.1f tokens/s",
                 "Running: %d reqs", "Waiting: %d reqs"]
        args: list = [*throughputs, gauges["vllm:num_requests_running"], gauges["vllm:num_requests_waiting"]]
        if preemptions:
            parts.append("Preemptions: %d")
            args.append(preemptions)
        parts.append("%s KV cache usage: %.1f%%")
        args += [self.kv_device, 100 * gauges["vllm:kv_cache_usage_perc"]]
        queries = self.recorder.counters["vllm:prefix_cache_queries"]
        if queries:
            parts.append("Prefix cache hit rate: %.1f%%")
            args.append(100 * self.recorder.counters["vllm:prefix_cache_hits"] / queries)
        logger.log(level, "Engine %03d: " + ", ".join(parts), self.recorder.engine_index, *args)
        if self.spec_logger is not None:
            self.spec_logger.flush(level, now)
