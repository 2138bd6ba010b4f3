"""A ragged batch for a paged forward: each item is (token ids, start position, block ids).

``prepare_batch`` flattens it into the model's inputs: input ids and positions
``[num_tokens]``, the ``AttentionMetadata`` every layer shares, and
``cu_num_tokens`` (rows of item ``i`` are ``cu[i]:cu[i + 1]``). The target,
the draft model and the hidden-state drafters all run their forwards through it.

Token ``j`` of an item goes to cache slot ``start + j``. Its position (RoPE) is ``start + j`` too,
unless the item gives ``positions`` (a draft tree: every node at its depth); ``tree`` then says
which earlier slots each row sees (``TreeRows``, ``AttentionMetadata.tree_mask``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..layers.attention import NO_TREE, AttentionMetadata, build_metadata
from .block_table import BlockTable


@dataclass
class TreeRows:
    """A draft tree's attention: row ``j`` sees the slots before ``start`` and slot ``start + b`` for
    each bit ``b`` of ``bits[j]``; a row with ``bits`` 0 is plain causal."""
    start: int  # cache slot of bit 0
    bits: list[int]  # per row of the item


@dataclass
class ForwardInput:
    token_ids: list[int]
    start: int  # cache slot (and, without ``positions``, position) of token_ids[0]
    block_ids: list[int]
    table_row: int | None = None  # the sequence's row of a BlockTable holding block_ids, if any
    positions: list[int] | None = None  # per token; None: start, start + 1, ...
    tree: TreeRows | None = None  # None: causal


def prepare_batch(batch: list[ForwardInput], block_size: int, sliding_window: int | None,
                  device: torch.device, causal: bool = True, block_table: BlockTable | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
    """Flatten a ragged batch: (input ids [num_tokens], positions [num_tokens], metadata, cu_num_tokens).
    With ``block_table`` (and a row for every item) the block table is gathered from it."""
    input_ids, positions, cu = [], [], [0]
    for item in batch:
        input_ids.extend(item.token_ids)
        positions.extend(item.positions or range(item.start, item.start + len(item.token_ids)))
        cu.append(len(input_ids))
    table = block_rows(batch, max(len(item.block_ids) for item in batch), block_table)  # [num_seqs, width]
    meta = build_metadata(table, [len(b.token_ids) for b in batch], [b.start + len(b.token_ids) for b in batch],
                          block_size, sliding_window, device, causal, _tree_mask(batch))
    ids = torch.tensor(input_ids, dtype=torch.int64, device=device)
    pos = torch.tensor(positions, dtype=torch.int64, device=device)
    return ids, pos, meta, cu


def block_rows(batch: list[ForwardInput], width: int, block_table: BlockTable | None = None
               ) -> torch.Tensor:  # [len(batch), width] int64
    """The items' first ``width`` block ids, -1 past an item's last block: gathered from
    ``block_table`` where every item has a row in it, else from their lists."""
    if block_table is not None and all(item.table_row is not None for item in batch):
        return block_table.rows([item.table_row for item in batch], width)
    return torch.tensor([item.block_ids[:width] + [-1] * (width - len(item.block_ids[:width])) for item in batch],
                        dtype=torch.int64)


def _tree_mask(batch: list[ForwardInput]) -> torch.Tensor | None:  # [num_tokens, 2] int64, or None
    """Per row ``(tree_start, bits)`` where an item carries a tree (``NO_TREE`` for causal rows)."""
    if all(item.tree is None for item in batch):
        return None
    rows = []
    for item in batch:
        bits = item.tree.bits if item.tree is not None else [0] * len(item.token_ids)
        rows.extend((item.tree.start, b) if b else (NO_TREE, 0) for b in bits)
    return torch.tensor(rows, dtype=torch.int64)
