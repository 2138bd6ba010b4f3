"""Server metrics: the Prometheus text behind ``GET /metrics``.

The engine records its metrics itself (``engine.stats``, ``draftwise/metrics/recorder.py``, the
same recorder behind ``LLM.get_metrics()``); every scrape renders a snapshot of it with vLLM's
names, types and labels (``vllm:*``; counters with prometheus' ``_total`` suffix), labelled with
the served model name and ``engine``, as vLLM's server exposes them, so its benchmark client,
Grafana dashboards and Helm chart read them.

Where the snapshot comes from is bound once:

* ``bind(engine)`` (``AsyncEngine``, one ``LLMEngine`` in this process): its recorder's snapshot,
  taken under the recorder's lock, so a scrape from the event loop never sees a half-recorded
  step; the series carry ``engine="0"``;
* ``bind_source(fetch)`` (``DataParallelEngine``): ``await fetch()`` gives the metrics of every
  replica, each series labelled with its replica's index (``engine="0"``, ``engine="1"``, ...).
  As vLLM 0.32's data-parallel server (``PrometheusStatLogger`` with ``engine_indexes``), every
  metric, gauges included, is one series per replica and nothing else: a dashboard sums (or
  averages) over ``engine`` itself.

The periodic log lines come from each engine too (``draftwise/metrics/stat_logger.py``), one
``Engine 00i`` line per replica.
"""
from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry, generate_latest

from ..metrics.prometheus import SnapshotCollector
from ..metrics.reader import Metric


class ServerMetrics:
    def __init__(self, model_name: str):
        self.model_name = model_name
        self._fetch: Callable[[], list[Metric] | Awaitable[list[Metric]]] | None = None

    def bind(self, engine) -> None:
        """Serve ``engine``'s metrics (an ``LLMEngine`` in this process; once)."""
        self.bind_source(lambda: engine.stats.snapshot(self.model_name))

    def bind_source(self, fetch: Callable[[], list[Metric] | Awaitable[list[Metric]]]) -> None:
        """Serve what ``fetch()`` returns (the metrics, or an awaitable of them; once)."""
        if self._fetch is not None:
            raise RuntimeError("ServerMetrics is already bound to an engine")
        self._fetch = fetch

    async def render(self) -> bytes:
        metrics = self._fetch() if self._fetch is not None else []
        if inspect.isawaitable(metrics):
            metrics = await metrics
        registry = CollectorRegistry()
        registry.register(SnapshotCollector(lambda: metrics))
        return generate_latest(registry)
