"""What a drafter's forward costs, measured as it runs: the price of drafting deeper.

The draft-length policy (``engine/draft_length.py``) weighs each draft's expected
gain against the rows it adds to the target's step; a model-based drafter also
spends its own forwards to produce it (EAGLE's chain runs one per draft after
the first, a draft model one per draft). ``ForwardTimer`` keeps a moving average
of those forwards' wall time, which the proposer turns into
``Proposer.drafting_seconds(depth)``. Until one forward was timed it reads 0, so
drafts are tried (and measured) before they are priced.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

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
