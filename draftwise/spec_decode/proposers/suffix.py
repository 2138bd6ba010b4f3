"""``suffix``: suffix decoding (SuffixDecoding, Oliaro et al. 2024; vLLM's ``suffix`` method).

Two frequency suffix trees (``draftwise.spec_decode.suffix_tree``):

* a local tree per running sequence over its prompt + output, and
* one global tree over the outputs of running sequences and of the last
  ``suffix_decoding_max_cached_requests`` finished ones (FIFO eviction; 0
  turns the global tree off).

Each step, the last ``suffix_decoding_max_tree_depth`` tokens of a sequence
are matched in both trees; each gives its best-scored greedy path (length at
most ``floor(match_len * suffix_decoding_max_spec_factor)``, cut where the
path probability drops below ``suffix_decoding_min_token_prob``). The higher
score wins, local on ties. Trees are updated lazily with the tokens appended
since the sequence's last draft. Finished and aborted sequences release their
local tree and move their output to the global cache; a preempted one drops
both and is re-added from its tokens when it runs again. Each draft carries
its path probabilities (``DraftBatch.confidence``).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from ...validate import check_float, check_int
from ..interface import DraftBatch, ProposeBatch, Proposer, register
from ..suffix_tree import EMPTY_DRAFT, SuffixDraft, SuffixTree


@register
class SuffixProposer(Proposer):
    method = "suffix"

    @dataclass
    class Options:
        suffix_decoding_max_tree_depth: int = 24
        suffix_decoding_max_cached_requests: int = 10000
        suffix_decoding_max_spec_factor: float = 1.0
        suffix_decoding_min_token_prob: float = 0.1

        def __post_init__(self) -> None:
            check_int("suffix_decoding_max_tree_depth", self.suffix_decoding_max_tree_depth, 1)
            check_int("suffix_decoding_max_cached_requests", self.suffix_decoding_max_cached_requests, 0)
            check_float("suffix_decoding_max_spec_factor", self.suffix_decoding_max_spec_factor, 0.0,
                        lo_open=True)
            check_float("suffix_decoding_min_token_prob", self.suffix_decoding_min_token_prob, 0.0, 1.0)

    @classmethod
    def default_num_speculative_tokens(cls, options, model) -> int:
        return options.suffix_decoding_max_tree_depth

    def __init__(self, config, target):
        super().__init__(config, target)
        depth = self.options.suffix_decoding_max_tree_depth
        self.max_cached = self.options.suffix_decoding_max_cached_requests
        self._local: dict[int, SuffixTree] = {}  # seq_id -> tree over prompt + output
        self._global = SuffixTree(depth) if self.max_cached > 0 else None  # outputs, keyed by seq_id
        self._cached: OrderedDict[int, None] = OrderedDict()  # finished seq_ids still in the global tree

    def propose(self, batch: ProposeBatch) -> DraftBatch:
        depth = self.options.suffix_decoding_max_tree_depth
        drafts, confidence = [], []
        for seq, limit in zip(batch.seqs, batch.max_num_drafts):
            draft = EMPTY_DRAFT
            if limit > 0:
                draft = self._best(self._sync(seq), seq.all_token_ids[-depth:], limit)
            drafts.append(draft.token_ids[:limit])
            confidence.append(list(draft.probs[:limit]))
        return DraftBatch.from_lists(drafts, confidence=confidence)

    def _best(self, local: SuffixTree, context: list[int], limit: int) -> SuffixDraft:
        opts = self.options
        args = (limit, opts.suffix_decoding_max_spec_factor, opts.suffix_decoding_min_token_prob)
        draft = local.speculate(context, *args)
        if self._global is not None:
            other = self._global.speculate(context, *args)
            if other.score > draft.score:
                draft = other
        return draft

    def _sync(self, seq) -> SuffixTree:
        """Add the tokens appended since the last step to the sequence's trees."""
        local = self._local.get(seq.seq_id)
        if local is None:
            local = self._local[seq.seq_id] = SuffixTree(self.options.suffix_decoding_max_tree_depth)
        tokens = seq.all_token_ids
        local.extend(seq.seq_id, tokens[local.num_tokens(seq.seq_id):])
        if self._global is not None:
            self._sync_global(seq)
        return local

    def on_finished(self, seq) -> None:
        self._local.pop(seq.seq_id, None)
        if self._global is None or seq.seq_id in self._cached:
            return
        if not seq.is_finished:  # preempted: rebuilt from its tokens when it runs again
            self._global.remove(seq.seq_id)
            return
        self._sync_global(seq)
        self._cached[seq.seq_id] = None
        while len(self._cached) > self.max_cached:
            oldest, _ = self._cached.popitem(last=False)
            self._global.remove(oldest)

    def _sync_global(self, seq) -> None:
        done = seq.num_prompt_tokens + self._global.num_tokens(seq.seq_id)
        self._global.extend(seq.seq_id, seq.all_token_ids[done:])

    def tracked_seq_ids(self) -> set[int]:
        """Running sequences (finished outputs live on only in the bounded global cache)."""
        active = set(self._global.keys()) - set(self._cached) if self._global is not None else set()
        return set(self._local) | active
