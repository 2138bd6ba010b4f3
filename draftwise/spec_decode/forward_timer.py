"""What a drafter's forward costs, measured as it runs: the price of drafting deeper.

The draft-length policy (``engine/drafting/length.py``) weighs each draft's expected
gain against the rows it adds to the target's step; a model-based drafter also
spends its own forwards to produce it (EAGLE's chain runs one per draft after
the first, a draft model one per draft). ``ForwardTimer`` keeps a moving average
of those forwards' wall time, which the proposer turns into
``Proposer.drafting_seconds(depth)``. Until one forward was timed it reads 0, so
drafts are tried (and measured) before they are priced.

``RowsTimer`` does the same for forwards whose size varies a lot, a chain
drafter's ingestion (one row per drafting sequence in steady state, a
prompt or the rows that waited while a sequence drafted nothing when it
resumes): ``seconds(num_rows)`` is a line fitted by exponentially weighted
least squares to the timed forwards (0 until forwards of two sizes were
timed), so one long ingestion does not price every later small one.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

RATE = 0.2  # weight of the newest forward in the moving average


class ForwardTimer:
    def __init__(self):
        self.seconds = 0.0  # moving average of one forward's wall time, 0 until measured
        self._count = 0

    @contextmanager
    def timing(self) -> Iterator[None]:
        start = time.perf_counter()
        yield
        elapsed = time.perf_counter() - start
        self._count += 1
        self.seconds += max(1.0 / self._count, RATE) * (elapsed - self.seconds)


class RowsTimer:
    """Wall time of a forward as ``intercept + slope * num_rows``, refitted as forwards are timed."""

    def __init__(self, rate: float = 0.05):  # (a line needs more memory than a mean: ~20 forwards)
        self.rate = rate
        self._sums = np.zeros(5)  # weighted sums of 1, x, y, x^2, x*y (x: rows, y: seconds)

    @contextmanager
    def timing(self, num_rows: int) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.observe(num_rows, time.perf_counter() - start)

    def observe(self, num_rows: int, seconds: float) -> None:
        x, y = float(num_rows), seconds
        keep = 1.0 - self.rate if self._sums[0] else 0.0
        self._sums = keep * self._sums + np.array([1.0, x, y, x * x, x * y])

    def seconds(self, num_rows: int) -> float:
        """Predicted wall time of a forward of ``num_rows`` rows; 0 until forwards of two sizes were
        timed (one long forward says nothing of a short one's cost: drafts are tried first)."""
        n, sx, sy, sxx, sxy = self._sums
        mean_x = sx / n if n else 0.0
        var = sxx / n - mean_x * mean_x if n else 0.0
        if var <= 1e-6 * max(1.0, mean_x * mean_x):
            return 0.0
        mean_y = sy / n
        slope = max(0.0, (sxy / n - mean_x * mean_y) / var)
        return max(0.0, mean_y + slope * (num_rows - mean_x))
