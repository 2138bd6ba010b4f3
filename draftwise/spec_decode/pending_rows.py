"""Target rows a hidden-state drafter has not ingested yet: ingestion waits until a sequence drafts.

A chain drafter (EAGLE, EAGLE-3, MTP, DFlash) must run over every position of
a sequence before it can draft from the last one: its K/V holds them all, and
each position reads the target's features there. Ingesting each step's rows as
they come costs one drafter forward per step even when the draft-length policy
gives no sequence a draft (a batch large enough that rows are not free, a weak
drafter), so rows wait here until their sequence drafts.

``PendingRows`` keeps, per sequence, the target features of the positions from
``seq.spec.drafter_num_computed_tokens`` on that the target computed but the drafter
has not ingested; the proposer ingests them, with the step's new rows, in a
step where the sequence drafts, or once ``max_rows`` have piled up (bounding
the memory held: ``max_rows`` rows of ``feature_size`` values per sequence).
The prefix cache does not wait for them: it publishes a block once the
target computed it and marks it drafter-ready once the drafter did
(``paged/block_manager.py``). The drafts are the same either way: a
position's K/V depends only on its token and the target's features there.

Entries are keyed by sequence id and remember the position they start at; one
whose start no longer matches the sequence's drafter position is stale and
dropped (the proposer then finds the hole and raises, as it would without).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class _Entry:
    start: int  # the first waiting position
    pieces: list[torch.Tensor] = field(default_factory=list)  # [num_rows_i, feature_size] each, in order
    num_rows: int = 0  # their rows, kept as they come (a sequence gains a piece per step)


class PendingRows:
    def __init__(self, max_rows: int):
        self.max_rows = max_rows  # a sequence is ingested once this many rows would wait
        self._rows: dict[int, _Entry] = {}  # seq id -> its waiting rows

    def count(self, seq_id: int, start: int) -> int:
        """Rows waiting for ``seq_id`` from position ``start`` on (0 when none, or stale)."""
        entry = self._rows.get(seq_id)
        if entry is None:
            return 0
        if entry.start != start:
            del self._rows[seq_id]
            return 0
        return entry.num_rows

    def add(self, seq_id: int, start: int, features: torch.Tensor  # [num_rows, feature_size]
            ) -> None:
        """Keep ``features`` of the positions following the waiting ones (``start``: the first
        waiting position, which a new entry begins at)."""
        entry = self._rows.setdefault(seq_id, _Entry(start))
        entry.pieces.append(features)
        entry.num_rows += len(features)

    def take(self, seq_id: int) -> list[torch.Tensor]:
        """The waiting pieces of ``seq_id``, oldest first, forgotten here (checked by ``count``)."""
        entry = self._rows.pop(seq_id, None)
        return entry.pieces if entry is not None else []

    def drop(self, seq_id: int) -> None:
        self._rows.pop(seq_id, None)

    def seq_ids(self) -> set[int]:
        return set(self._rows)
