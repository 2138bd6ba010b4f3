"""``ngram``: prompt-lookup drafting (vLLM's ``ngram`` method).

For each sequence, find the longest ``n`` in ``[prompt_lookup_min,
prompt_lookup_max]`` such that the last ``n`` tokens of prompt+output occur
earlier in it, and propose the (up to ``k``) tokens that followed that
occurrence. Equal-length matches go to the earliest occurrence, as vLLM's
KMP search does; no match means no draft this step.

Each sequence keeps an index (``NgramIndex``): for every ``n`` in the range,
each n-gram of its tokens mapped to the position its earliest occurrence ends
at. A token is indexed once, when it first appears (the prompt in one pass on
first sight, then the tokens appended since the last step), so a step's
lookup costs one dictionary probe per ``n`` whatever the context length: the
per-step cost stays flat as the context grows, where a scan of the context
would grow with it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...validate import check_int
from ..interface import DraftBatch, ProposeBatch, Proposer, register


@register
class NgramProposer(Proposer):
    method = "ngram"

    @dataclass
    class Options:
        prompt_lookup_min: int | None = None
        prompt_lookup_max: int | None = None

        def __post_init__(self) -> None:
            lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
            for key, value in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
                if value is not None:
                    check_int(key, value, 1)
            lo, hi = (5, 5) if lo is None and hi is None else (lo if lo is not None else hi,
                                                                 hi if hi is not None else lo)
            if lo > hi:
                raise ValueError(f"speculative_config: 'prompt_lookup_min'={lo} must be <= "
                                 f"'prompt_lookup_max'={hi}")
            self.prompt_lookup_min, self.prompt_lookup_max = lo, hi

    def __init__(self, config, target):
        super().__init__(config, target)
        self._indexes: dict[int, NgramIndex] = {}

    def propose(self, batch: ProposeBatch) -> DraftBatch:
        lo, hi = self.options.prompt_lookup_min, self.options.prompt_lookup_max
        drafts = []
        for seq, limit in zip(batch.seqs, batch.max_num_drafts):
            if limit <= 0:
                drafts.append([])
                continue
            index = self._indexes.get(seq.seq_id)
            if index is None:
                index = self._indexes[seq.seq_id] = NgramIndex(lo, hi)
            drafts.append(index.draft(seq.all_token_ids, limit))
        return DraftBatch.from_lists(drafts)

    def on_finished(self, seq) -> None:
        self._indexes.pop(seq.seq_id, None)

    def tracked_seq_ids(self) -> set[int]:
        return set(self._indexes)


class NgramIndex:
    """One sequence's n-grams of ``min_n..max_n`` tokens, each mapped to the end position of its
    earliest occurrence. Invariant: ``first_end[n]`` holds every n-gram of ``tokens[:num_indexed]``."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.first_end: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_n, max_n + 1)}
        self.num_indexed = 0

    def sync(self, token_ids: list[int]) -> None:
        """Index the n-grams ending at the tokens appended since the last call (a shorter list than
        indexed, after a reset, is indexed again from the start)."""
        num = len(token_ids)
        if num < self.num_indexed:
            for table in self.first_end.values():
                table.clear()
            self.num_indexed = 0
        start = self.num_indexed
        for n, table in self.first_end.items():
            first = max(start, n - 1)  # the first new end position with n tokens before it
            if first >= num:
                continue
            grams = zip(*(token_ids[first - n + 1 + i:num - n + 1 + i] for i in range(n)))
            for end, gram in enumerate(grams, start=first):
                table.setdefault(gram, end)
        self.num_indexed = num

    def draft(self, token_ids: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the earliest earlier occurrence of the longest suffix
        n-gram of ``token_ids`` (prompt + output); none without a match."""
        self.sync(token_ids)
        num = len(token_ids)
        if k <= 0:
            return []
        for n in range(min(self.max_n, num - 1), self.min_n - 1, -1):
            end = self.first_end[n].get(tuple(token_ids[num - n:]))
            if end is not None and end < num - 1:  # the suffix itself ends at num - 1
                return token_ids[end + 1:end + 1 + k]
        return []
