"""Server metrics: the Prometheus registry behind ``GET /metrics`` and the periodic log line.

All ``record_*`` methods run on the engine thread (see ``async_engine``);
prometheus-client's metrics are thread-safe, so ``/metrics`` renders them
from the event loop at any time. Names follow vLLM's with the ``draftwise:``
prefix; counters are exposed with prometheus' ``_total`` suffix.

Latencies: time to first token is arrival to the first output token; inter-
token latency is the gap between two steps that emitted tokens for a
request, divided by the tokens that step emitted (speculation emits several
per step) and observed once per token, so its mean is the per-token latency
a streaming client sees.
"""
from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

logger = logging.getLogger("draftwise")

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
                    2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
_SPEC_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
_PREFIX_COUNTERS = ("queries", "hits")  # BlockManager.prefix_cache_queries / prefix_cache_hits


class ServerMetrics:
    def __init__(self, model_name: str, log_interval_s: float = 10.0):
        self.registry = CollectorRegistry()
        labels, self._label = ["model_name"], {"model_name": model_name}
        reg = {"registry": self.registry}
        self.success = Counter("draftwise:request_success", "Finished requests by finish reason",
                               labels + ["finished_reason"], **reg)
        self.aborted = Counter("draftwise:request_abort", "Requests aborted (client gone)", labels, **reg)
        self.prompt_tokens = Counter("draftwise:prompt_tokens", "Prompt tokens of finished requests", labels,
                                     **reg)
        self.generation_tokens = Counter("draftwise:generation_tokens", "Generated tokens", labels, **reg)
        self.ttft = Histogram("draftwise:time_to_first_token_seconds", "Time to first token", labels,
                              buckets=_LATENCY_BUCKETS, **reg)
        self.itl = Histogram("draftwise:inter_token_latency_seconds", "Inter-token latency", labels,
                             buckets=_LATENCY_BUCKETS, **reg)
        self.e2e = Histogram("draftwise:e2e_request_latency_seconds", "Arrival to finish", labels,
                             buckets=_LATENCY_BUCKETS, **reg)
        self.running = Gauge("draftwise:num_requests_running", "Requests running", labels, **reg)
        self.waiting = Gauge("draftwise:num_requests_waiting", "Requests waiting", labels, **reg)
        self.kv_usage = Gauge("draftwise:kv_cache_usage_perc", "KV cache usage (0..1)", labels, **reg)
        self.spec = {name: Counter(f"draftwise:spec_decode_{name}", f"Speculative decoding {name}", labels,
                                   **reg) for name in _SPEC_COUNTERS}
        self.spec_per_pos = Counter("draftwise:spec_decode_num_accepted_tokens_per_pos",
                                    "Accepted draft tokens by draft position", labels + ["position"], **reg)
        self.prefix_cache = {name: Counter(f"draftwise:prefix_cache_{name}", f"Prefix cache {name}, in tokens",
                                           labels, **reg) for name in _PREFIX_COUNTERS}
        self._prefix_seen = {name: 0 for name in _PREFIX_COUNTERS}
        self._spec_seen = {name: 0 for name in _SPEC_COUNTERS}
        self._per_pos_seen: list[int] = []
        self._requests: dict[str, list] = {}  # request_id -> [arrival, last token time, tokens seen]
        self._log = _ThroughputLog(log_interval_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ------------------------------------------------------------------ engine thread
    def record_arrival(self, request_id: str, now: float) -> None:
        self._requests[request_id] = [now, now, 0]

    def record_abort(self, request_id: str) -> None:
        if self._requests.pop(request_id, None) is not None:
            self.aborted.labels(**self._label).inc()

    def record_step(self, engine, outputs, now: float) -> None:
        for out in outputs:
            state = self._requests.get(out.request_id)
            if state is None:
                continue
            num_tokens = sum(len(c.token_ids) for c in out.outputs)
            self._observe_tokens(state, num_tokens, now)
            if out.finished:
                del self._requests[out.request_id]
                self.e2e.labels(**self._label).observe(now - state[0])
                reason = out.outputs[0].finish_reason or "unknown"
                self.success.labels(finished_reason=reason, **self._label).inc()
                self.prompt_tokens.labels(**self._label).inc(len(out.prompt_token_ids))
                self._log.prompt_tokens += len(out.prompt_token_ids)
        self._record_engine_state(engine)

    def record_idle(self, engine) -> None:
        self._record_engine_state(engine)

    def _observe_tokens(self, state: list, num_tokens: int, now: float) -> None:
        num_new = num_tokens - state[2]
        if num_new <= 0:
            return
        if state[2] == 0:
            self.ttft.labels(**self._label).observe(now - state[0])
        else:
            per_token = (now - state[1]) / num_new
            itl = self.itl.labels(**self._label)
            for _ in range(num_new):
                itl.observe(per_token)
        state[1], state[2] = now, num_tokens
        self.generation_tokens.labels(**self._label).inc(num_new)
        self._log.generation_tokens += num_new

    def _record_engine_state(self, engine) -> None:
        scheduler = engine.scheduler
        num_running = len({s.request_id for s in scheduler.running})
        num_waiting = len({s.request_id for s in scheduler.waiting})
        self.running.labels(**self._label).set(num_running)
        self.waiting.labels(**self._label).set(num_waiting)
        self.kv_usage.labels(**self._label).set(engine.block_manager.usage)
        for name in _PREFIX_COUNTERS:
            self._raise_to(self.prefix_cache[name], self._prefix_seen, name,
                           getattr(engine.block_manager, f"prefix_cache_{name}"))
        self._record_spec(engine.get_metrics())
        self._log.maybe_log(num_running, num_waiting, engine)

    def _record_spec(self, stats: dict) -> None:
        if not stats:
            return
        for name in _SPEC_COUNTERS:
            self._raise_to(self.spec[name], self._spec_seen, name, stats[f"spec_decode_{name}"])
        per_pos = stats["spec_decode_num_accepted_tokens_per_pos"]
        self._per_pos_seen += [0] * (len(per_pos) - len(self._per_pos_seen))
        for pos, value in enumerate(per_pos):
            self._raise_to(self.spec_per_pos, self._per_pos_seen, pos, value, position=str(pos))

    def _raise_to(self, counter: Counter, seen, key, total: int, **labels) -> None:
        """Bring ``counter`` up to the engine's running ``total``; ``seen[key]`` is what it counted so far."""
        if total > seen[key]:
            counter.labels(**labels, **self._label).inc(total - seen[key])
            seen[key] = total


class _ThroughputLog:
    """One log line per interval with traffic: throughput, queue, KV usage (as vLLM's)."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self._last = time.monotonic()

    def maybe_log(self, num_running: int, num_waiting: int, engine) -> None:
        now = time.monotonic()
        elapsed = now - self._last
        if elapsed < self.interval_s:
            return
        if self.prompt_tokens or self.generation_tokens or num_running or num_waiting:
            blocks = engine.block_manager
            hit_rate = 100 * blocks.prefix_cache_hits / max(1, blocks.prefix_cache_queries)
            logger.info("draftwise: avg prompt throughput %.1f tokens/s, avg generation throughput %.1f "
                        "tokens/s, running %d reqs, waiting %d reqs, KV cache usage %.1f%%, prefix cache hit "
                        "rate %.1f%%", self.prompt_tokens / elapsed, self.generation_tokens / elapsed, num_running,
                        num_waiting, 100 * blocks.usage, hit_rate)
            if engine.speculator:
                engine.speculator.flush_log()  # the acceptance figures of the same interval
        self.prompt_tokens = self.generation_tokens = 0
        self._last = now
