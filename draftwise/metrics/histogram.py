"""A histogram with fixed buckets, and the bucket bounds vLLM gives each of its histograms.

``observe`` adds a value (optionally several times); ``buckets()`` gives the cumulative
count at or below each upper bound, keyed as prometheus writes the ``le`` label
("0.5", "1.0", "+Inf"), which is how ``reader.Histogram`` and ``/metrics`` show it.
"""
from __future__ import annotations

from bisect import bisect_left

from prometheus_client.utils import floatToGoString

# The bounds of vLLM's histogram families (vllm/v1/metrics/buckets.py), so dashboards' quantiles agree.
TIME_TO_FIRST_TOKEN = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                       10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_LATENCY = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                       20.0, 40.0, 80.0)
REQUEST_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
REQUEST_PARAMS_N = (1, 2, 5, 10, 20)
REQUEST_NUM_PREEMPTIONS = (1, 2, 3, 4, 5, 10, 20)


def request_tokens(max_model_len: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_model_len`` (token counts of a request)."""
    bounds, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return tuple(bounds)
            bounds.append(mantissa * scale)
        scale *= 10


class Histogram:
    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = tuple(bounds)
        self._counts = [0] * (len(self.bounds) + 1)  # per bucket, the last one above every bound
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        self._counts[bisect_left(self.bounds, value)] += times
        self.count += times
        self.sum += value * times

    def buckets(self) -> dict[str, int]:
        out, total = {}, 0
        for bound, count in zip((*self.bounds, float("inf")), self._counts):
            total += count
            out[floatToGoString(bound)] = total
        return out
