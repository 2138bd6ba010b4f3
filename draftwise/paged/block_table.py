"""``BlockTable``: every sequence's block ids as one persistent tensor, updated as they change.

Each sequence holding blocks owns a row of ``table`` ``[num_rows, width]``
(int64, pad -1) for as long as it holds them (``seq.block_table_row``). The
``BlockManager`` calls ``sync(seq)`` whenever a sequence's block list grows or
shrinks at its tail, which writes only the entries that changed, and
``release(seq)`` when it frees them. A step then gathers its sequences' rows
with one ``index_select`` (``rows``) instead of rebuilding a table from Python
lists. Rows and columns grow on demand (doubling), so no size is fixed up front.
"""
from __future__ import annotations

import torch

from ..sequence import Sequence


class BlockTable:
    def __init__(self, num_rows: int = 64, width: int = 64):
        self.table = torch.full((num_rows, width), -1, dtype=torch.int64)  # [num_rows, width]
        self._lens = [0] * num_rows  # valid entries per row
        self._free_rows = list(range(num_rows - 1, -1, -1))

    def sync(self, seq: Sequence) -> None:
        """Make ``seq``'s row equal its ``block_ids`` (changed only at the tail since the last sync)."""
        if seq.block_table_row is None:
            if not seq.block_ids:
                return
            seq.block_table_row = self._take_row()
        row, old, new = seq.block_table_row, self._lens[seq.block_table_row], len(seq.block_ids)
        if new > self.table.shape[1]:
            self._widen(new)
        if new > old:
            self.table[row, old:new] = torch.tensor(seq.block_ids[old:], dtype=torch.int64)
        elif new < old:
            self.table[row, new:old] = -1
        self._lens[row] = new

    def release(self, seq: Sequence) -> None:
        row = seq.block_table_row
        if row is not None:
            self.table[row, :self._lens[row]] = -1
            self._lens[row] = 0
            self._free_rows.append(row)
            seq.block_table_row = None

    def rows(self, rows: list[int], width: int) -> torch.Tensor:  # -> [len(rows), width]
        return self.table[:, :width].index_select(0, torch.tensor(rows, dtype=torch.int64))

    @torch.inference_mode(False)  # grown inside a timed forward's inference mode, it is written outside it
    def _take_row(self) -> int:
        if not self._free_rows:
            num_rows = self.table.shape[0]
            self.table = torch.cat((self.table, torch.full_like(self.table, -1)))
            self._lens += [0] * num_rows
            self._free_rows = list(range(2 * num_rows - 1, num_rows - 1, -1))
        return self._free_rows.pop()

    @torch.inference_mode(False)
    def _widen(self, width: int) -> None:
        extra = max(width, 2 * self.table.shape[1]) - self.table.shape[1]
        self.table = torch.cat((self.table, self.table.new_full((self.table.shape[0], extra), -1)), dim=1)
