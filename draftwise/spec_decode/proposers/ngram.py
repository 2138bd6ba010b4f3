"""``ngram``: prompt-lookup drafting (vLLM's ``ngram`` method).

For each sequence, find the longest ``n`` in ``[prompt_lookup_min,
prompt_lookup_max]`` such that the last ``n`` tokens of prompt+output occur
earlier in it, and propose the (up to ``k``) tokens that followed that
occurrence. Equal-length matches go to the earliest occurrence, as vLLM's
KMP search does; no match means no draft this step.

The search is vectorised with numpy: one comparison per suffix offset over
the whole context (``O(len * max_n)``), no Python loop over tokens. The
context is mirrored in a growing int32 buffer per sequence so each step only
copies the tokens appended since the last one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
        self._contexts: dict[int, _Context] = {}

    def propose(self, batch: ProposeBatch) -> DraftBatch:
        lo, hi = self.options.prompt_lookup_min, self.options.prompt_lookup_max
        drafts = []
        for seq, limit in zip(batch.seqs, batch.max_num_drafts):
            if limit <= 0:
                drafts.append([])
                continue
            context = self._contexts.setdefault(seq.seq_id, _Context())
            tokens = context.sync(seq.all_token_ids)
            drafts.append(find_ngram_draft(tokens, lo, hi, limit))
        return DraftBatch.from_lists(drafts)

    def on_finished(self, seq) -> None:
        self._contexts.pop(seq.seq_id, None)

    def tracked_seq_ids(self) -> set[int]:
        return set(self._contexts)


class _Context:
    """A numpy mirror of one sequence's token list, grown by appending (amortised O(1))."""

    def __init__(self):
        self.buffer = np.empty(256, dtype=np.int32)
        self.length = 0

    def sync(self, token_ids: list[int]) -> np.ndarray:
        num = len(token_ids)
        if num < self.length:  # the sequence was reset (preemption): start over
            self.length = 0
        if num > self.buffer.size:
            grown = np.empty(max(num, 2 * self.buffer.size), dtype=np.int32)
            grown[:self.length] = self.buffer[:self.length]
            self.buffer = grown
        self.buffer[self.length:num] = token_ids[self.length:num]
        self.length = num
        return self.buffer[:num]


def find_ngram_draft(tokens: np.ndarray,  # [num_tokens] int, prompt + output
                     min_n: int, max_n: int, k: int) -> list[int]:
    """The tokens that followed the earliest occurrence of the longest matching suffix n-gram."""
    num = tokens.shape[0]
    if num < min_n + 1 or k <= 0:
        return []
    # match[j] = length (capped at max_n) of the common suffix of tokens[:j+1] and tokens[:num],
    # for every earlier end position j < num - 1.
    ends = num - 1
    match = np.zeros(ends, dtype=np.int32)
    alive = np.ones(ends, dtype=bool)
    for t in range(min(max_n, ends)):
        # position j - t must exist (j >= t) and equal tokens[num - 1 - t]
        eq = np.zeros(ends, dtype=bool)
        eq[t:] = tokens[:ends - t] == tokens[num - 1 - t]
        alive &= eq
        if not alive.any():
            break
        match += alive
    best = int(match.max())
    if best < min_n:
        return []
    start = int(np.argmax(match == best)) + 1  # earliest occurrence; drafts follow it
    return tokens[start:start + k].tolist()
