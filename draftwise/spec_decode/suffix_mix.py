"""Model drafts mixed with suffix drafts, per sequence and step (``"enable_suffix_decoding": true``).

A model drafter (EAGLE, EAGLE-3, MTP, Medusa, a draft model, DFlash) guesses well on open text;
suffix decoding wins outright where the output copies earlier text (code edits, repeated
structure, agent loops) and costs nothing to run. ``SuffixMix`` wraps the configured proposer
and a ``SuffixProposer`` (same ``suffix_decoding_*`` keys) and, for each sequence, keeps the
draft with the larger expected number of accepted tokens:

* the suffix draft's: the sum of its path probabilities (``DraftBatch.confidence``), and
* the model's: the mean number of tokens its drafts got accepted so far in this engine
  (``observe``), ``MODEL_PRIOR`` until ``MIN_OBSERVED`` drafts were verified.

The model drafter is asked for drafts only for the sequences the suffix draft did not win (the
rest get a limit of 0; it still ingests every target row, so its cache stays whole). The
combined batch carries every draft's confidence (1.0 per model draft without its own), and
one-hot probabilities for suffix drafts where the model's drafts carry probabilities, so
sampled verification stays lossless. Counters per source (``source_stats``) report how many
drafts and draft tokens each source made and how many were accepted.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .interface import DraftBatch, ProposeBatch, Proposer, ProposerNeeds

MODEL_PRIOR = 1.0  # expected accepted tokens per model draft before any was verified
MIN_OBSERVED = 16
SUFFIX, MODEL = "suffix", "model"


@dataclass
class SourceCounts:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


class SuffixMix(Proposer):
    method = "suffix_mix"

    def __init__(self, model: Proposer, suffix: Proposer):
        super().__init__(model.config, model.target)
        self.model, self.suffix = model, suffix
        self.counts = {SUFFIX: SourceCounts(), MODEL: SourceCounts()}
        self._source: dict[int, str] = {}  # seq_id -> source of its drafts being verified

    @property
    def needs(self) -> ProposerNeeds:
        return self.model.needs

    @property
    def shards_drafter(self) -> bool:
        return self.model.shards_drafter

    def kv_cache_spec(self):
        return self.model.kv_cache_spec()

    def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        self.model.bind_kv_cache(kv_cache)

    def drafting_seconds(self, depth: int) -> float:
        return self.model.drafting_seconds(depth)

    def warm_up(self, block_manager) -> None:
        self.model.warm_up(block_manager)

    def catch_up_seconds(self, seqs) -> list[float]:
        return self.model.catch_up_seconds(seqs)

    def model_expectation(self) -> float:
        counts = self.counts[MODEL]
        if counts.num_drafts < MIN_OBSERVED:
            return MODEL_PRIOR
        return counts.num_accepted_tokens / counts.num_drafts

    def propose(self, batch: ProposeBatch) -> DraftBatch:
        suffix = self.suffix.propose(batch)
        expected = self.model_expectation()
        wins = [n > 0 and sum(conf[:n]) > expected for n, conf in zip(suffix.num_draft_tokens, suffix.confidence)]
        limits = [0 if win else limit for win, limit in zip(wins, batch.max_num_drafts)]
        model = self.model.propose(ProposeBatch(batch.seqs, limits, batch.target_hidden))
        drafts, confidence = [], []
        for i, win in enumerate(wins):
            source = suffix if win else model
            num = source.num_draft_tokens[i]
            drafts.append(source.token_ids[i, :num].tolist())
            confidence.append(source.confidence[i][:num] if source.confidence is not None else [1.0] * num)
            if num:
                self._source[batch.seqs[i].seq_id] = SUFFIX if win else MODEL
        return DraftBatch.from_lists(drafts, self._probs(model.probs, drafts, wins), confidence)

    @staticmethod
    def _probs(model_probs: torch.Tensor | None,  # [num_seqs, width, vocab] or None
               drafts: list[list[int]], wins: list[bool]) -> torch.Tensor | None:
        if model_probs is None:
            return None
        width = max((len(d) for d in drafts), default=0)
        probs = model_probs.new_zeros(len(drafts), width, model_probs.shape[-1])
        for i, (draft, win) in enumerate(zip(drafts, wins)):
            if win:
                probs[i, torch.arange(len(draft)), torch.tensor(draft, dtype=torch.int64)] = 1.0
            else:
                num = min(len(draft), model_probs.shape[1])
                probs[i, :num] = model_probs[i, :num]
        return probs

    def observe(self, seq, num_drafts: int, num_accepted: int) -> None:
        counts = self.counts[self._source.pop(seq.seq_id, MODEL)]
        counts.num_drafts += 1
        counts.num_draft_tokens += num_drafts
        counts.num_accepted_tokens += num_accepted

    def source_stats(self) -> dict:
        return {f"spec_decode_{source}_{key}": value for source, counts in self.counts.items()
                for key, value in vars(counts).items()}

    def on_finished(self, seq) -> None:
        self._source.pop(seq.seq_id, None)
        self.model.on_finished(seq)
        self.suffix.on_finished(seq)

    def tracked_seq_ids(self) -> set[int]:
        return self.model.tracked_seq_ids() | self.suffix.tracked_seq_ids() | set(self._source)
