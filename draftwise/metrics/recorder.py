"""The engine's metrics, recorded once and read three ways: ``LLM.get_metrics()``, the server's
``GET /metrics`` and the periodic log lines.

``LLMEngine`` owns one ``StatsRecorder`` (``engine.stats``) and calls, on the thread that steps
it, ``record_step`` after every step, ``record_abort`` when requests are aborted and (the
server's engine loop, while idle) ``record_idle``; each of them also gives the ``StatLogger``
its turn. ``snapshot()`` may run on any thread (a lock guards the state) and returns
``reader`` objects with vLLM's names, types and labels (``model_name``, ``engine``: the
``engine_index``, 0 but in a data-parallel server's replicas, as in vLLM):

* counters: ``vllm:prompt_tokens`` (a request's prompt, counted when its first token comes
  out), ``vllm:prompt_tokens_cached`` (the part of it read from the prefix cache),
  ``vllm:generation_tokens``, ``vllm:request_success{finished_reason}`` (stop, length, abort,
  error, repetition; an aborted request counts as ``abort``), ``vllm:num_preemptions``,
  ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` (prompt tokens looked up and
  found; 0 without prefix caching); with a speculative config only,
  ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``, ``..._num_accepted_tokens`` and
  the ``Vector`` ``vllm:spec_decode_num_accepted_tokens_per_pos``, and draftwise's own
  ``draftwise:spec_decode_draft_limits{reason}`` (per sequence and step, what limited its
  drafts: ``engine/drafting/plan.py``);
* gauges: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` (0..1);
* histograms, per request: ``vllm:time_to_first_token_seconds`` (arrival to first token),
  ``vllm:e2e_request_latency_seconds`` (arrival to finish), ``vllm:request_queue_time_seconds``
  (arrival to first scheduled), ``vllm:request_prefill_time_seconds`` (first scheduled to first
  token), ``vllm:request_decode_time_seconds`` (first token to finish),
  ``vllm:request_inference_time_seconds`` (first scheduled to finish),
  ``vllm:request_time_per_output_token_seconds`` (decode time / (tokens - 1)),
  ``vllm:request_prompt_tokens``, ``vllm:request_generation_tokens``, ``vllm:request_params_n``,
  ``vllm:request_num_preemptions``; and per output token after a request's first,
  ``vllm:inter_token_latency_seconds``: the gap between two steps that gave the request tokens,
  divided by the tokens the later one gave (speculation gives several), observed once per token,
  so its mean is the per-token latency a streaming client sees.

Requests are counted per request (all ``n`` sequences together), finished ones when their
finished output leaves ``step()``.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from . import histogram as buckets
from .histogram import Histogram as _Histogram
from .reader import Counter, Gauge, Histogram, Metric, Vector
from .stat_logger import StatLogger

FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")  # vLLM's FinishReason labels
COUNTERS = ("vllm:prompt_tokens", "vllm:prompt_tokens_cached", "vllm:generation_tokens", "vllm:num_preemptions",
            "vllm:prefix_cache_queries", "vllm:prefix_cache_hits")
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
DRAFT_LIMITS = "draftwise:spec_decode_draft_limits"
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


def _histograms(max_model_len: int) -> dict[str, _Histogram]:
    tokens = buckets.request_tokens(max_model_len)
    latency = {name: buckets.REQUEST_LATENCY for name in (
        "e2e_request_latency", "request_queue_time", "request_prefill_time", "request_decode_time",
        "request_inference_time")}
    bounds = {"vllm:time_to_first_token_seconds": buckets.TIME_TO_FIRST_TOKEN,
              "vllm:inter_token_latency_seconds": buckets.INTER_TOKEN_LATENCY,
              **{f"vllm:{name}_seconds": b for name, b in latency.items()},
              "vllm:request_time_per_output_token_seconds": buckets.INTER_TOKEN_LATENCY,
              "vllm:request_prompt_tokens": tokens, "vllm:request_generation_tokens": tokens,
              "vllm:request_params_n": buckets.REQUEST_PARAMS_N,
              "vllm:request_num_preemptions": buckets.REQUEST_NUM_PREEMPTIONS}
    return {name: _Histogram(b) for name, b in bounds.items()}


@dataclass
class _Progress:
    """A request in flight: output tokens seen so far and when the last ones came."""
    num_tokens: int = 0
    last_time: float = 0.0


class StatsRecorder:
    def __init__(self, model_name: str, max_model_len: int, num_spec_tokens: int | None = None,
                 prefix_caching: bool = True):
        self.model_name = model_name
        self.num_spec_tokens = num_spec_tokens
        self.prefix_caching = prefix_caching
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.prompt_tokens_computed = 0  # prompt tokens not read from the cache (the log's prompt throughput)
        self.finished = dict.fromkeys(FINISHED_REASONS, 0)
        self.gauges = dict.fromkeys(GAUGES, 0.0)
        self.spec = dict.fromkeys(SPEC_COUNTERS, 0) if num_spec_tokens is not None else {}
        self.per_pos = [0] * (num_spec_tokens or 0)
        self.draft_limits: dict[str, int] = {}  # reason -> sequences-and-steps (engine/drafting/plan.py)
        self.histograms = _histograms(max_model_len)
        self.logger: StatLogger | None = None  # the periodic log lines; None with disable_log_stats
        self.engine_index = 0  # vLLM's engine label and log prefix ("Engine 001"): a data-parallel replica's index
        self._requests: dict[str, _Progress] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_engine(cls, engine, default_model_name: str) -> "StatsRecorder":
        """The recorder of an ``LLMEngine`` (labels: the ``model`` argument, or ``default_model_name``),
        with its ``StatLogger`` unless ``disable_log_stats`` (which also silences the acceptance line)."""
        config, spec = engine.config, engine.speculator
        recorder = cls(str(config.model or default_model_name), engine.max_model_len,
                       spec.num_spec_tokens if spec else None, engine.prefix_caching)
        if config.disable_log_stats:
            if spec:
                spec.logger.enabled = False
        else:
            kv_device = "GPU" if engine.device.type == "cuda" else engine.device.type.upper()  # vLLM's wording
            recorder.logger = StatLogger(recorder, kv_device, spec.logger if spec else None)
        recorder.record_idle(engine)
        return recorder

    # ------------------------------------------------------------------ the engine's thread
    def record_step(self, engine, outputs, now: float | None = None) -> None:
        """Count a step's outputs (``RequestOutput``s, cumulative) and the engine's state after it."""
        now = time.time() if now is None else now
        with self._lock:
            for out in outputs:
                self._record_output(out, now)
            self._record_state(engine)
        if self.logger:
            self.logger.maybe_log()

    def record_abort(self, engine, request_ids: list[str]) -> None:
        """Count requests aborted before they finished (``finished_reason="abort"``) and the engine's
        state once the abort has freed their blocks."""
        with self._lock:
            for request_id in request_ids:
                self._requests.pop(request_id, None)
                self.finished["abort"] += 1
            self._record_state(engine)

    def record_idle(self, engine) -> None:
        """Refresh the engine's state (an abort changed it between steps) and give the logger its turn."""
        with self._lock:
            self._record_state(engine)
        if self.logger:
            self.logger.maybe_log()

    def _record_output(self, out, now: float) -> None:
        progress = self._requests.setdefault(out.request_id, _Progress())
        num_tokens = sum(len(c.token_ids) for c in out.outputs)
        num_new = num_tokens - progress.num_tokens
        if num_new > 0:
            if progress.num_tokens == 0:
                metrics = out.metrics
                self.histograms["vllm:time_to_first_token_seconds"].observe(
                    (metrics.first_token_time or now) - metrics.arrival_time)
                num_prompt = len(out.prompt_token_ids)
                num_cached = min(out.num_cached_tokens, num_prompt)
                self.counters["vllm:prompt_tokens"] += num_prompt
                self.counters["vllm:prompt_tokens_cached"] += num_cached
                self.prompt_tokens_computed += num_prompt - num_cached
            else:
                self.histograms["vllm:inter_token_latency_seconds"].observe((now - progress.last_time) / num_new,
                                                                            times=num_new)
            progress.num_tokens, progress.last_time = num_tokens, now
            self.counters["vllm:generation_tokens"] += num_new
        if out.finished:
            del self._requests[out.request_id]
            self._record_finished(out, now)

    def _record_finished(self, out, now: float) -> None:
        m, h = out.metrics, self.histograms
        reason = next((c.finish_reason for c in out.outputs if c.finish_reason), "abort")
        self.finished[reason] = self.finished.get(reason, 0) + 1
        finished = m.finished_time or now
        scheduled = m.first_scheduled_time or m.arrival_time
        first_token = m.first_token_time or finished
        h["vllm:e2e_request_latency_seconds"].observe(finished - m.arrival_time)
        h["vllm:request_queue_time_seconds"].observe(scheduled - m.arrival_time)
        h["vllm:request_prefill_time_seconds"].observe(first_token - scheduled)
        h["vllm:request_decode_time_seconds"].observe(finished - first_token)
        h["vllm:request_inference_time_seconds"].observe(finished - scheduled)
        per_token = (finished - first_token) / (m.num_generation_tokens - 1) if m.num_generation_tokens > 1 else 0.0
        h["vllm:request_time_per_output_token_seconds"].observe(per_token)
        h["vllm:request_prompt_tokens"].observe(len(out.prompt_token_ids))
        h["vllm:request_generation_tokens"].observe(m.num_generation_tokens)
        h["vllm:request_params_n"].observe(len(out.outputs))
        h["vllm:request_num_preemptions"].observe(m.num_preemptions)

    def _record_state(self, engine) -> None:
        scheduler, blocks = engine.scheduler, engine.block_manager
        self.gauges["vllm:num_requests_running"] = float(len({s.request_id for s in scheduler.running}))
        self.gauges["vllm:num_requests_waiting"] = float(len({s.request_id for s in scheduler.waiting}))
        self.gauges["vllm:kv_cache_usage_perc"] = blocks.usage
        self.counters["vllm:num_preemptions"] = scheduler.num_preemptions
        if self.prefix_caching:
            self.counters["vllm:prefix_cache_queries"] = blocks.prefix_cache_queries
            self.counters["vllm:prefix_cache_hits"] = blocks.prefix_cache_hits
        if self.spec:
            stats = engine.speculator.stats
            self.spec.update(zip(SPEC_COUNTERS, (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens)))
            self.per_pos = list(stats.num_accepted_tokens_per_pos)
            self.draft_limits = dict(engine.speculator.draft_limits.counts)

    # ------------------------------------------------------------------ any thread
    def snapshot(self, model_name: str | None = None) -> list[Metric]:
        """Every metric now, labelled ``model_name`` (default: the engine's) and ``engine`` (its index)."""
        labels = {"model_name": model_name or self.model_name, "engine": str(self.engine_index)}
        with self._lock:
            out: list[Metric] = [Gauge(name, dict(labels), value) for name, value in self.gauges.items()]
            out += [Counter(name, dict(labels), value) for name, value in self.counters.items()]
            out += [Counter("vllm:request_success", {**labels, "finished_reason": reason}, count)
                    for reason, count in self.finished.items()]
            out += [Counter(name, dict(labels), value) for name, value in self.spec.items()]
            if self.spec:
                out.append(Vector(PER_POS, dict(labels), list(self.per_pos)))
            out += [Counter(DRAFT_LIMITS, {**labels, "reason": reason}, count)
                    for reason, count in self.draft_limits.items()]
            out += [Histogram(name, dict(labels), h.count, h.sum, h.buckets()) for name, h in self.histograms.items()]
        return out
