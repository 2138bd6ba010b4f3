"""The KV pool's free blocks, handed out so that resident memory follows the work.

On a CPU the pool's tensors are zero pages the OS maps when first written (``kv_pool.py``): a block
costs resident memory from the first time it is handed out until the process ends. ``FreeBlocks``
hands out, in this order:

1. a touched block that holds nothing a later sequence can find (never published to the prefix
   cache: a sequence's partial last block, a verify step's trimmed draft block, a scratch
   sequence's blocks, every block when prefix caching is off), the most recently freed first:
   its pages are resident and likely still in the CPU's caches;
2. a block never handed out (ids from ``num_touched`` on), in id order;
3. a touched block the prefix cache holds, the least recently freed first (LRU eviction).

So resident KV grows with the tokens a server holds at once plus what its prefix cache keeps
(bounded by the pool's size), never with the tokens it has served. Whether a freed block is
cached is decided when it is freed (``push``); a cached free block leaves the list when a prefix
hit claims it (``take``) or when it is handed out again, and moves to the first kind when the
prefix cache takes another block in its place (``forget``).
"""
from __future__ import annotations

from collections import OrderedDict


class FreeBlocks:
    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.num_touched = 0  # blocks [0, num_touched) have been handed out at least once
        self._reusable: list[int] = []  # touched, nothing cached: the most recently freed last
        self._cached: OrderedDict[int, None] = OrderedDict()  # touched and cached: least recently freed first

    def __len__(self) -> int:
        return len(self._reusable) + len(self._cached) + self.num_blocks - self.num_touched

    def pop(self) -> int:
        """A free block id, in the order of the module docstring (the caller checks ``len`` first)."""
        if self._reusable:
            return self._reusable.pop()
        if self.num_touched < self.num_blocks:
            self.num_touched += 1
            return self.num_touched - 1
        block_id, _ = self._cached.popitem(last=False)
        return block_id

    def push(self, block_id: int, cached: bool) -> None:
        """``block_id`` is free again; ``cached``: the prefix cache can still find what it holds."""
        if cached:
            self._cached[block_id] = None
        else:
            self._reusable.append(block_id)

    def forget(self, block_id: int) -> None:
        """The free cached block ``block_id`` is no longer findable (the prefix cache took another
        block for its prefix): it is reused first, like any block holding nothing findable."""
        del self._cached[block_id]
        self._reusable.append(block_id)

    def take(self, block_id: int) -> None:
        """A prefix hit claims the free cached block ``block_id``."""
        del self._cached[block_id]
