"""Paged KV-cache bookkeeping: fixed-size blocks, per-sequence block lists.

The tensors live in the ``KVPool`` (one per member: target, drafter); this
class only hands out block ids, which address every member's tensor alike.
``ensure(seq, num_slots)`` grows a sequence's block list so that slots
``[0, num_slots)`` exist; ``trim(seq, num_slots)`` gives back blocks past
``num_slots``. Together they let a step append several tokens (prefill
chunks, drafts to verify).

``rollback(seq, num_accepted)`` is the one place a verify step's outcome
reaches the cache: it alone advances ``num_computed_tokens`` over accepted
drafts, gives back blocks past the new end, and clips what a drafter's own
cache holds (``drafter_num_computed_tokens``) to the accepted positions. The
K/V of rejected positions stays in its slots and is overwritten later.

``scratch(name, num_tokens, num_slots)`` lends a throwaway sequence for
start-up work (timing a step, compiling the forward) and frees its blocks.
"""
from __future__ import annotations

from collections import deque
from contextlib import contextmanager
from typing import Iterator

from ..sampling_params import SamplingParams
from ..sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1:
            raise ValueError(f"the KV cache holds no block of {block_size} tokens: raise kv_cache_memory_bytes")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_block_ids: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, seq: Sequence, num_slots: int) -> int:
        return max(0, -(-num_slots // self.block_size) - len(seq.block_ids))

    def ensure(self, seq: Sequence, num_slots: int) -> bool:
        """Give ``seq`` enough blocks for ``num_slots`` slots; False (and no change) if out of blocks."""
        needed = self.blocks_needed(seq, num_slots)
        if needed > self.num_free_blocks:
            return False
        seq.block_ids.extend(self.free_block_ids.popleft() for _ in range(needed))
        return True

    def trim(self, seq: Sequence, num_slots: int) -> None:
        keep = -(-num_slots // self.block_size)
        while len(seq.block_ids) > keep:
            self.free_block_ids.append(seq.block_ids.pop())

    def free(self, seq: Sequence) -> None:
        self.free_block_ids.extend(reversed(seq.block_ids))
        seq.block_ids = []

    @contextmanager
    def scratch(self, name: str, num_tokens: int, num_slots: int) -> Iterator[Sequence | None]:
        """A throwaway greedy sequence of ``num_tokens`` zero tokens with blocks for ``num_slots``
        slots, or None when the cache cannot hold them; its blocks are freed on exit."""
        seq = Sequence(name, 0, [0] * num_tokens, SamplingParams(temperature=0.0), 0, 0.0)
        if not self.ensure(seq, num_slots):
            yield None
            return
        try:
            yield seq
        finally:
            self.free(seq)

    def rollback(self, seq: Sequence, num_accepted: int) -> None:
        """After a step that sampled for ``seq`` (its ``num_computed_tokens`` already covers the
        scheduled tokens): keep the K/V of its ``num_accepted`` accepted drafts, drop the rest.

        The next token to compute is then the one just sampled, at position
        ``num_computed_tokens``; blocks past it go back and drafter positions past it are forgotten.
        """
        seq.num_computed_tokens += num_accepted
        self.trim(seq, seq.num_computed_tokens + 1)
        seq.drafter_num_computed_tokens = min(seq.drafter_num_computed_tokens, seq.num_computed_tokens)
