"""Automatic prefix caching: which KV blocks hold which token prefix.

A block is cached once it is full and every position in it is computed (and,
with speculation, accepted): its key is the hash of (the previous block's key,
its token ids), so a key names the whole prefix up to the block's end and the
same tokens at another offset never match. Only the token ids change a
block's K/V here (one model, no adapters, no multimodal inputs), with one
exception: a drafter whose K/V at position ``p`` reads token ``p + 1`` (the
EAGLE family) makes a block's last slot depend on the next block's first
token, so its keys take ``lookahead=1`` extra token.

``PrefixCache`` only maps keys to block ids; the ``BlockManager`` owns
reference counts, the free list and the hit counters. A cached block stays
findable after its last user frees it, until the block manager hands it out
again (LRU eviction among cached blocks: ``free_blocks.py``). Cached blocks are
never written: a sequence only writes positions at or past its
``num_computed_tokens``, which lie past its full computed blocks, and a
lookup never covers a sequence's last token (it must be computed to sample).
"""
from __future__ import annotations

from collections.abc import Sequence as SequenceABC


def block_keys(token_ids: SequenceABC[int], block_size: int, parent: int | None = None,
               start_block: int = 0, lookahead: int = 0) -> list[int]:
    """Keys of the full blocks of ``token_ids`` from block ``start_block`` on, chained from ``parent``
    (the key of block ``start_block - 1``, None for the first block). With ``lookahead`` a block's
    key also covers that many following tokens, and a block without them gets no key."""
    keys = []
    span = block_size + lookahead
    for start in range(start_block * block_size, len(token_ids) - span + 1, block_size):
        parent = hash((parent, tuple(token_ids[start:start + span])))
        keys.append(parent)
    return keys


class PrefixCache:
    def __init__(self):
        self._block_of: dict[int, int] = {}  # key -> block id
        self._key_of: dict[int, int] = {}  # block id -> key, for the blocks in the cache

    def lookup(self, keys: list[int]) -> list[int]:
        """Block ids of the longest cached run of ``keys`` from the first."""
        blocks = []
        for key in keys:
            block = self._block_of.get(key)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def block_of(self, key: int) -> int | None:
        return self._block_of.get(key)

    def insert(self, key: int, block_id: int, replace: bool = False) -> int | None:
        """Cache ``block_id`` under ``key`` unless another block already holds that prefix (with
        ``replace``: in its place; the other block is then no longer found, and its id is returned)."""
        if block_id in self._key_of:
            return None
        old = self._block_of.get(key)
        if old is not None:
            if not replace:
                return None
            del self._key_of[old]
        self._block_of[key] = block_id
        self._key_of[block_id] = key
        return old

    def evict(self, block_id: int) -> None:
        """``block_id`` is about to hold other tokens: forget what it held."""
        key = self._key_of.pop(block_id, None)
        if key is not None:
            del self._block_of[key]

    def holds(self, block_id: int) -> bool:
        """Whether a lookup can find ``block_id``."""
        return block_id in self._key_of

    def __len__(self) -> int:
        return len(self._block_of)
