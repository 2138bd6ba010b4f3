"""Which requests make a step fail: bisection over the step's requests.

A step batches many requests into one forward; if one request carries
values that break it (an input no check foresaw, a kernel fault tied to its
shape), the whole step raises. ``find_failing`` re-runs subsets of the
step's requests (all sequences of a request together) and halves every
subset that still raises, until each failing request stands alone. A subset
that raises while both of its halves succeed fails as a whole: the fault
comes from the combination, and no smaller set is known to be safe.

Re-running is safe: a forward writes each position's K/V from the same
inputs, and sampling noise is a pure function of (seed, position), so the
survivors' final step computes exactly what it would have computed in a
batch without the failing requests. Cost: about 2 log2(number of requests)
extra forwards per failing request, only on the step that failed.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def find_failing(groups: Sequence[list[T]], run: Callable[[list[T]], object],
                 error: Exception | None = None) -> dict[int, Exception]:
    """Indices of the ``groups`` whose items make ``run`` raise, with the exception each raised.
    ``error``: what running every group together raised, if already known (saves that run)."""
    failing: dict[int, Exception] = {}

    def search(indices: list[int], error: Exception) -> None:
        if len(indices) == 1:
            failing[indices[0]] = error
            return
        mid = len(indices) // 2
        halves_failed = False
        for half in (indices[:mid], indices[mid:]):
            half_error = _raised(run, [item for i in half for item in groups[i]])
            if half_error is not None:
                halves_failed = True
                search(half, half_error)
        if not halves_failed:
            failing.update({i: error for i in indices})

    if error is None:
        error = _raised(run, [item for group in groups for item in group])
    if error is not None:
        search(list(range(len(groups))), error)
    return failing


def _raised(run: Callable[[list[T]], object], items: list[T]) -> Exception | None:
    try:
        run(items)
    except Exception as exc:  # the point: a fault is data here
        return exc
    return None
