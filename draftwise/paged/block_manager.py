"""Paged KV-cache bookkeeping: fixed-size blocks, per-sequence block lists.

The tensors live in the ``KVPool`` (one per member: target, drafter); this
class only hands out block ids, which address every member's tensor alike.
``ensure(seq, num_slots)`` grows a sequence's block list so that slots
``[0, num_slots)`` exist; ``trim(seq, num_slots)`` gives back blocks past
``num_slots``. Together they let a step append several tokens (prefill
chunks, drafts to verify).

``rollback(seq, num_accepted)`` is the one place a verify step's outcome
reaches the cache: it alone advances ``num_computed_tokens`` over accepted
drafts and gives back blocks past the new end, which it returns: the speculation
side clips what a drafter's own cache holds (``SpecState.roll_back``) to it. The
K/V of rejected positions stays in its slots and is overwritten later.

``scratch(name, num_tokens, num_slots)`` lends a throwaway sequence for
start-up work (timing a step, compiling the forward) and frees its blocks.

With prefix caching (``prefix_cache.py``) blocks are reference-counted:
``match_prefix`` gives a new sequence the cached blocks of its prompt,
``cache_computed`` publishes a sequence's full computed blocks, and a freed
block keeps its cached content until ``ensure`` reuses it. Which free block ``ensure`` takes
is ``free_blocks.py``'s order: blocks that hold nothing findable first, then blocks never used,
then cached blocks least recently freed first, so resident memory follows the work.

A drafter that keeps K/V in the blocks (``drafter_kv``) may compute a
sequence's positions later than the target does (a chain drafter ingests a
sequence's rows only when it drafts: ``spec_decode/pending_rows.py``), so a
block is published as soon as the target computed it and is marked
``drafter_ready`` once the drafter computed it too (the drafter's K/V of a
position depends only on the tokens, as the target's does). A sequence that
finds cached blocks without the drafter's K/V cannot draft from them: the
drafter would need the target's features there, which a hit does not
compute. If that hole is at most ``DRAFTER_RECOMPUTE_TOKENS`` long the match
stops at the drafter-ready blocks and the sequence computes the rest, for
both; a longer hole is taken whole for the target and the sequence is
``drafter_blocked``: it decodes plainly (its drafter would have been
withheld on that traffic anyway: a long hole means the sequence that
computed it drafted nothing for that long).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, NamedTuple

from ..sampling_params import SamplingParams
from ..sequence import Sequence
from .block_table import BlockTable
from .free_blocks import FreeBlocks
from .prefix_cache import PrefixCache, block_keys

class PrefixHit(NamedTuple):
    """What ``match_prefix`` found: cached tokens, and where the pool tracks a drafter's K/V, how many
    of them hold it too and whether the sequence must decode plainly (``SpecState.admit``)."""
    num_tokens: int
    drafter_num_tokens: int | None = None
    drafter_blocked: bool = False


DRAFTER_RECOMPUTE_TOKENS = 64  # a longer hole in the drafter's cached K/V is not recomputed: no drafts


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False,
                 drafter_kv: bool = False, key_lookahead: int = 0):
        if num_blocks < 1:
            raise ValueError(f"the KV cache holds no block of {block_size} tokens: raise kv_cache_memory_bytes")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_blocks = FreeBlocks(num_blocks)
        self.ref_counts = [0] * num_blocks
        self.block_table = BlockTable()  # every sequence's block ids, as one tensor
        self.prefix_cache = PrefixCache() if enable_prefix_caching else None
        self.key_lookahead = key_lookahead  # 1: that drafter's K/V at p reads token p + 1 (prefix_cache.py)
        # per block: the drafter's K/V of every position in it is computed (prefix caching with drafter_kv:
        # a drafter keeps K/V in the same blocks, shared along with the target's)
        self.drafter_ready = bytearray(num_blocks) if drafter_kv and enable_prefix_caching else None
        self.prefix_cache_queries = 0  # tokens of admitted sequences looked up (vLLM's prefix_cache_queries)
        self.prefix_cache_hits = 0  # of those, tokens found in the cache (prefix_cache_hits)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

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
        if needed:
            seq.block_ids.extend(self._allocate() for _ in range(needed))
            self.block_table.sync(seq)
        return True

    def trim(self, seq: Sequence, num_slots: int) -> None:
        keep = -(-num_slots // self.block_size)
        if len(seq.block_ids) <= keep:
            return
        while len(seq.block_ids) > keep:
            self._release(seq.block_ids.pop())
        self.block_table.sync(seq)

    def free(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_ids):  # the tail first: the least likely to be shared
            self._release(block_id)
        seq.block_ids = []
        seq.block_keys = []
        self.block_table.release(seq)

    def match_prefix(self, seq: Sequence) -> PrefixHit:
        """Give a sequence that holds no block yet the cached blocks of its longest cached prefix
        (full blocks of every token but the last, which must be computed); returns what was found."""
        if self.prefix_cache is None or seq.block_ids:
            return PrefixHit(0)
        # Blocks of every token but the last (it must be computed), plus their lookahead tokens.
        keys = block_keys(seq.all_token_ids[:seq.num_tokens - 1 + self.key_lookahead], self.block_size,
                          lookahead=self.key_lookahead)
        blocks = self.prefix_cache.lookup(keys)
        hit = PrefixHit(0)
        if self.drafter_ready is not None:
            blocks, hit = self._drafter_match(blocks)
        for block_id in blocks:
            if self.ref_counts[block_id] == 0:
                self.free_blocks.take(block_id)
            self.ref_counts[block_id] += 1
        seq.block_ids, seq.block_keys = blocks, keys[:len(blocks)]
        self.block_table.sync(seq)
        return hit._replace(num_tokens=len(blocks) * self.block_size)

    def _drafter_match(self, blocks: list[int]) -> tuple[list[int], PrefixHit]:
        """The cached ``blocks`` a sequence takes, given which hold the drafter's K/V too (see the
        module docstring), and its drafter position and ``drafter_blocked``."""
        ready = 0
        while ready < len(blocks) and self.drafter_ready[blocks[ready]]:
            ready += 1
        blocked = (len(blocks) - ready) * self.block_size > DRAFTER_RECOMPUTE_TOKENS
        hit = PrefixHit(0, ready * self.block_size, blocked)  # the drafter's K/V came along
        return (blocks if blocked else blocks[:ready]), hit

    def record_lookup(self, seq: Sequence, num_hit_tokens: int) -> None:
        """Count an admitted sequence's lookup; its first admission sets ``num_cached_tokens``."""
        self.prefix_cache_queries += seq.num_tokens
        self.prefix_cache_hits += num_hit_tokens
        if seq.first_scheduled_time is None:
            seq.num_cached_tokens = min(num_hit_tokens, seq.num_prompt_tokens)

    def cache_computed(self, seq: Sequence) -> None:
        """Publish ``seq``'s full blocks whose positions are all computed and final, and mark those
        the drafter computed too (when it keeps K/V in the blocks)."""
        if self.prefix_cache is None:
            return
        num_full = min(seq.num_computed_tokens, seq.num_tokens) // self.block_size
        if num_full > len(seq.block_keys):
            self._publish(seq, num_full)
        if self.drafter_ready is not None:
            self._mark_drafter_ready(seq, min(num_full, seq.spec.drafter_num_computed_tokens // self.block_size))

    def _mark_drafter_ready(self, seq: Sequence, num_blocks: int) -> None:
        """The drafter's K/V of ``seq``'s first ``num_blocks`` blocks is computed (marked from the
        last back to the first already marked: a sequence's marks only grow)."""
        i = num_blocks - 1
        while i >= 0 and not self.drafter_ready[seq.block_ids[i]]:
            self.drafter_ready[seq.block_ids[i]] = 1
            if i < len(seq.block_keys):
                self._offer(seq.block_keys[i], seq.block_ids[i])
            i -= 1

    def _offer(self, key: int, block_id: int) -> None:
        """Cache ``block_id`` under ``key``, in place of a block cached for the same prefix without the
        drafter's K/V if ``block_id`` has it (a hit on it then lets the sequence draft)."""
        cached = self.prefix_cache.block_of(key)
        replace = (cached is not None and self.drafter_ready is not None
                   and self.drafter_ready[block_id] and not self.drafter_ready[cached])
        replaced = self.prefix_cache.insert(key, block_id, replace)
        if replaced is not None and self.ref_counts[replaced] == 0:
            self.free_blocks.forget(replaced)  # free and no longer findable: reused first

    def _publish(self, seq: Sequence, num_full: int) -> None:
        done = len(seq.block_keys)
        parent = seq.block_keys[-1] if done else None
        keys = block_keys(seq.all_token_ids[:num_full * self.block_size + self.key_lookahead], self.block_size,
                          parent, done, self.key_lookahead)
        for i, key in enumerate(keys, start=done):
            self._offer(key, seq.block_ids[i])
        seq.block_keys.extend(keys)

    def _allocate(self) -> int:
        block_id = self.free_blocks.pop()
        if self.prefix_cache is not None:
            self.prefix_cache.evict(block_id)
        if self.drafter_ready is not None:
            self.drafter_ready[block_id] = 0
        self.ref_counts[block_id] = 1
        return block_id

    def _release(self, block_id: int) -> None:
        self.ref_counts[block_id] -= 1
        if self.ref_counts[block_id] == 0:
            self.free_blocks.push(block_id, self.prefix_cache is not None and self.prefix_cache.holds(block_id))

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

    def rollback(self, seq: Sequence, num_accepted: int) -> int:
        """After a step that sampled for ``seq`` (its ``num_computed_tokens`` already covers the
        scheduled tokens): keep the K/V of its ``num_accepted`` accepted drafts, drop the rest.

        The next token to compute is then the one just sampled, at position
        ``num_computed_tokens``; blocks past it go back. Returns that new end: the speculation side
        forgets the drafter positions past it (``SpecState.roll_back``).
        """
        seq.num_computed_tokens += num_accepted
        self.trim(seq, seq.num_computed_tokens + 1)
        return seq.num_computed_tokens
