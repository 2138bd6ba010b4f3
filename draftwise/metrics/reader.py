"""The objects ``LLM.get_metrics()`` returns: vLLM's ``vllm.v1.metrics.reader`` shapes.

Each metric has a ``name`` (``vllm:...``, without prometheus' ``_total`` suffix) and
``labels`` (``model_name``, ``engine``, plus ``finished_reason`` on
``vllm:request_success``). A name may appear more than once with different labels.

* ``Counter.value``: an int that only grows.
* ``Gauge.value``: a float that goes up and down.
* ``Vector.values``: ints, one per speculative draft position; only
  ``vllm:spec_decode_num_accepted_tokens_per_pos`` has this type (prometheus has no
  vector: ``/metrics`` shows it as a counter with a ``position`` label).
* ``Histogram``: ``count`` observations summing to ``sum``; ``buckets`` maps each
  bucket's upper bound, written as prometheus writes the ``le`` label ("0.5", "1.0",
  "+Inf"), to the number of observations at or below it (cumulative, so the "+Inf"
  entry equals ``count``).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Metric:
    name: str
    labels: dict[str, str]


@dataclass
class Counter(Metric):
    value: int


@dataclass
class Vector(Metric):
    values: list[int]


@dataclass
class Gauge(Metric):
    value: float


@dataclass
class Histogram(Metric):
    count: int
    sum: float
    buckets: dict[str, int]
