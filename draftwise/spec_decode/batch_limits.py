"""How many drafts a step may carry, by how many requests run: vLLM's ``disable_by_batch_size``
and ``num_speculative_tokens_per_batch_size``.

* ``disable_by_batch_size`` (N, from vLLM V0): while N or more requests run, no sequence gets
  drafts; drafting resumes once fewer run. Requests are counted as V0's running queue counted
  them (``running_queue_size >= disable_by_batch_size``): one per request, however many
  sequences its ``n`` made.
* ``num_speculative_tokens_per_batch_size`` (vLLM V1's dynamic speculative decoding):
  ``[[first, last, k], ...]``, inclusive batch-size ranges that do not overlap, the first
  starting at 1; a batch size between two ranges takes the range before it, one past the last
  range takes the last. V1 runs each of a request's ``n`` sequences as a request of its own, so
  here every sequence counts.

Both only lower the draft length (to ``min(k, num_speculative_tokens)``): outputs do not change.
``parse_schedule`` raises ``ValueError`` naming the key for a malformed schedule.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..validate import PREFIX

SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"
Schedule = tuple[tuple[int, int, int], ...]


def parse_schedule(value) -> Schedule | None:
    """The schedule as sorted ``(first, last, k)`` triples, or None when ``value`` is None."""
    if value is None:
        return None
    where = f"{PREFIX}[{SCHEDULE_KEY!r}]={value!r} is invalid"
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{where}: must be a non-empty list of [first_batch_size, last_batch_size, "
                         "num_speculative_tokens]")
    entries = []
    for entry in value:
        ok = isinstance(entry, (list, tuple)) and len(entry) == 3
        if not ok or any(isinstance(v, bool) or not isinstance(v, int) for v in entry):
            raise ValueError(f"{where}: each entry must be 3 ints [first, last, k], got {entry!r}")
        first, last, k = entry
        if not 1 <= first <= last or k < 0:
            raise ValueError(f"{where}: in {list(entry)}, need 1 <= first <= last and k >= 0")
        entries.append((first, last, k))
    entries.sort()
    if entries[0][0] != 1:
        raise ValueError(f"{where}: the first range must start at batch size 1")
    for (_, last, _), (first, _, _) in zip(entries, entries[1:]):
        if first <= last:
            raise ValueError(f"{where}: the ranges overlap")
    return tuple(entries)


@dataclass(frozen=True)
class BatchSizeLimits:
    disable_by_batch_size: int | None = None
    schedule: Schedule | None = None

    def num_spec_tokens(self, num_requests: int, num_seqs: int, k: int) -> int:
        """The most drafts a sequence may get in a step of ``num_requests`` running requests
        (``num_seqs`` sequences), ``k`` being ``num_speculative_tokens``."""
        if self.disable_by_batch_size is not None and num_requests >= self.disable_by_batch_size:
            return 0
        if not self.schedule or num_seqs < 1:
            return k
        chosen = self.schedule[0][2]
        for first, _, num in self.schedule:
            if first > num_seqs:
                break
            chosen = num
        return min(k, chosen)
