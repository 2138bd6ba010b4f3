"""The persistent ``BlockTable`` always equals the sequences' block lists: through growth, rollback
trims, frees, prefix-cache matches, preemption and the tensor growing its rows and columns."""
from __future__ import annotations

import random

import torch

from draftwise import SamplingParams
from draftwise.paged import BlockManager
from draftwise.paged.batch import ForwardInput, prepare_batch
from draftwise.sequence import Sequence


def _row(bm: BlockManager, seq: Sequence) -> list[int]:
    if seq.block_table_row is None:
        return []
    return [b for b in bm.block_table.table[seq.block_table_row].tolist() if b >= 0]


def test_rows_follow_every_change_of_the_block_lists():
    rng = random.Random(0)
    bm = BlockManager(400, 16, enable_prefix_caching=True)
    seqs = [Sequence(f"r{i}", 0, [rng.randrange(9) for _ in range(rng.randrange(1, 90))], SamplingParams(), 0, 0.0)
            for i in range(80)]  # more sequences than the table's first 64 rows
    for _ in range(2000):
        seq = rng.choice(seqs)
        action = rng.random()
        if action < 0.45:
            bm.ensure(seq, len(seq.block_ids) * 16 + rng.randrange(1, 1200))  # wider than 64 blocks too
        elif action < 0.75:
            bm.trim(seq, rng.randrange(0, 16 * len(seq.block_ids) + 1))
        elif action < 0.9:
            bm.free(seq)
        elif not seq.block_ids:
            seq.num_computed_tokens = bm.match_prefix(seq).num_tokens
        for s in seqs:
            assert _row(bm, s) == s.block_ids
    rows = [s.block_table_row for s in seqs if s.block_ids]
    assert len(set(rows)) == len(rows)  # no two sequences share a row


def test_prepare_batch_gathers_the_same_table_as_from_lists():
    bm = BlockManager(64, 16)
    seqs = [Sequence(f"r{i}", 0, list(range(n)), SamplingParams(), 0, 0.0) for i, n in enumerate((5, 40, 17))]
    for seq in seqs:
        bm.ensure(seq, seq.num_tokens)
    batch = [ForwardInput([1], s.num_tokens - 1, s.block_ids, s.block_table_row) for s in seqs]
    plain = [ForwardInput(b.token_ids, b.start, b.block_ids) for b in batch]
    with_table = prepare_batch(batch, 16, None, torch.device("cpu"), block_table=bm.block_table)[2]
    from_lists = prepare_batch(plain, 16, None, torch.device("cpu"))[2]
    assert torch.equal(with_table.block_table, from_lists.block_table)
    assert torch.equal(with_table.slot_mapping, from_lists.slot_mapping)


def test_table_grown_inside_inference_mode_is_written_outside_it():
    """A timed forward allocates throw-away sequences under ``torch.inference_mode``; the rows and
    columns it grows must stay writable when they are freed after (and in every later step)."""
    bm = BlockManager(500, 16)
    seqs = [Sequence(f"s{i}", 0, [0] * 4, SamplingParams(), 0, 0.0) for i in range(70)]
    with torch.inference_mode():
        assert all(bm.ensure(seq, 16 * 5) for seq in seqs[:69])  # past the first 64 rows
        assert bm.ensure(seqs[69], 16 * 80)  # past the first 64 columns
    for seq in seqs:
        bm.free(seq)
    assert bm.num_free_blocks == bm.num_blocks and (bm.block_table.table == -1).all()
