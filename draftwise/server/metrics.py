"""Server metrics: the Prometheus registry behind ``GET /metrics``.

The engine records its metrics itself (``engine.stats``, ``draftwise/metrics/recorder.py``, the
same recorder behind ``LLM.get_metrics()``); ``AsyncEngine`` binds this object to its engine, and
every scrape renders the recorder's snapshot with vLLM's names, types and labels (``vllm:*``;
counters with prometheus' ``_total`` suffix), labelled with the served model name and
``engine="0"``, as vLLM's server exposes them, so its benchmark client, Grafana dashboards and
Helm chart read them. The snapshot is taken under the recorder's lock, so a scrape from the event
loop never sees a half-recorded step. The periodic log lines come from the engine too
(``draftwise/metrics/stat_logger.py``; ``AsyncEngine`` gives them their timer).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from ..metrics.prometheus import SnapshotCollector


class ServerMetrics:
    def __init__(self, model_name: str):
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self._bound = False

    def bind(self, engine) -> None:
        """Serve ``engine``'s metrics (an ``LLMEngine``; once)."""
        if self._bound:
            raise RuntimeError("ServerMetrics is already bound to an engine")
        self.registry.register(SnapshotCollector(lambda: engine.stats.snapshot(self.model_name)))
        self._bound = True

    def render(self) -> bytes:
        return generate_latest(self.registry)
