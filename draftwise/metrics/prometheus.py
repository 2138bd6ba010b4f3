"""The recorder's snapshot as prometheus metric families (the server's ``GET /metrics``).

``SnapshotCollector(snapshot)`` is a prometheus-client collector: register it on a
``CollectorRegistry`` and ``generate_latest`` renders, at each scrape, what ``snapshot()``
returns (``reader`` objects), with the types vLLM's server exposes: counters (prometheus adds
``_total`` to their samples), gauges, histograms (``_bucket{le}``, ``_sum``, ``_count``), and the
per-position ``Vector`` as the counter ``vllm:spec_decode_num_accepted_tokens_per_pos`` with a
``position`` label.
"""
from __future__ import annotations

from collections.abc import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from .reader import Counter, Gauge, Histogram, Metric, Vector

HELP = {
    "vllm:num_requests_running": "Requests in the running batch.",
    "vllm:num_requests_waiting": "Requests waiting to be scheduled.",
    "vllm:kv_cache_usage_perc": "Share of the KV cache blocks in use (1 = all).",
    "vllm:prompt_tokens": "Prompt tokens of requests that produced their first token.",
    "vllm:prompt_tokens_cached": "Of those, prompt tokens read from the prefix cache.",
    "vllm:generation_tokens": "Output tokens produced.",
    "vllm:num_preemptions": "Sequences preempted to free KV cache blocks.",
    "vllm:prefix_cache_queries": "Prompt tokens looked up in the prefix cache.",
    "vllm:prefix_cache_hits": "Prompt tokens found in the prefix cache.",
    "vllm:request_success": "Finished requests, by finish reason.",
    "vllm:spec_decode_num_drafts": "Verified drafts (one per sequence and step with draft tokens).",
    "vllm:spec_decode_num_draft_tokens": "Draft tokens verified.",
    "vllm:spec_decode_num_accepted_tokens": "Draft tokens accepted.",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "Draft tokens accepted, by position in the draft.",
    "draftwise:spec_decode_draft_limits": "Sequences and steps, by what limited their drafts (full: nothing did).",
    "vllm:time_to_first_token_seconds": "Seconds from a request's arrival to its first output token.",
    "vllm:inter_token_latency_seconds": "Seconds per output token after a request's first.",
    "vllm:e2e_request_latency_seconds": "Seconds from a request's arrival to its end.",
    "vllm:request_queue_time_seconds": "Seconds from a request's arrival to its first scheduling.",
    "vllm:request_prefill_time_seconds": "Seconds from a request's first scheduling to its first token.",
    "vllm:request_decode_time_seconds": "Seconds from a request's first token to its end.",
    "vllm:request_inference_time_seconds": "Seconds from a request's first scheduling to its end.",
    "vllm:request_time_per_output_token_seconds": "A request's decode seconds per output token after the first.",
    "vllm:request_prompt_tokens": "Prompt tokens per finished request.",
    "vllm:request_generation_tokens": "Output tokens per finished request.",
    "vllm:request_params_n": "The n parameter of finished requests.",
    "vllm:request_num_preemptions": "Preemptions per finished request.",
}


class SnapshotCollector:
    def __init__(self, snapshot: Callable[[], list[Metric]]):
        self.snapshot = snapshot

    def collect(self):
        families: dict[str, object] = {}
        for metric in self.snapshot():
            keys = list(metric.labels)
            family = families.get(metric.name)
            if family is None:
                family = families[metric.name] = _family(metric, keys)
            values = [metric.labels[k] for k in keys]
            if isinstance(metric, Vector):
                for pos, value in enumerate(metric.values):
                    family.add_metric(values + [str(pos)], value)
            elif isinstance(metric, Histogram):
                family.add_metric(values, list(metric.buckets.items()), metric.sum)
            else:
                family.add_metric(values, metric.value)
        yield from families.values()


def _family(metric: Metric, keys: list[str]):
    doc = HELP.get(metric.name, metric.name)
    if isinstance(metric, Vector):
        return CounterMetricFamily(metric.name, doc, labels=keys + ["position"])
    if isinstance(metric, Counter):
        return CounterMetricFamily(metric.name, doc, labels=keys)
    if isinstance(metric, Gauge):
        return GaugeMetricFamily(metric.name, doc, labels=keys)
    return HistogramMetricFamily(metric.name, doc, labels=keys)
