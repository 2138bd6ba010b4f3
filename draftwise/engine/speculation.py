"""The engine's side of speculative decoding: verification bookkeeping, rollback, drafting.

``Speculator`` wraps the configured proposer. After each target step:

1. (the engine has already rolled the cache back: ``BlockManager.rollback``
   kept the accepted drafts' K/V, in the target's and the drafter's tensors)
2. ``on_verified``: counters, the interval log line and the draft length
   policy's acceptance estimates are updated.
3. (the engine appends the emitted tokens and releases finished sequences)
4. ``propose``: the proposer drafts for every sequence still running, each
   clipped to ``num_speculative_tokens``, ``max_model_len``, ``max_tokens``,
   the length worth verifying (``draft_length.py``) and the KV blocks it can get.
"""
from __future__ import annotations

import os

from ..paged import BlockManager, KVPool, PagedModel
from ..sequence import Sequence
from ..spec_decode.config import SpeculativeConfig
from ..spec_decode.interface import ProposeBatch, ProposerNeeds, TargetInfo
from ..spec_decode.metrics import SpecDecodingLogger, SpecDecodingStats
from .draft_length import DraftLengthPolicy, linear_step_costs, measure_step_costs
from .model_runner import StepResult

DRAFTER_KV = "drafter"  # the proposer's member of the KV pool

ROW_COST_ENV = "DRAFTWISE_VERIFY_ROW_COST"


class Speculator:
    def __init__(self, config: SpeculativeConfig, target: TargetInfo):
        self.config = config
        self.proposer = config.proposer_cls(config, target)
        self.num_spec_tokens = config.num_speculative_tokens
        self.max_model_len = target.max_model_len
        self.stats = SpecDecodingStats(self.num_spec_tokens)
        self.logger = SpecDecodingLogger(self.num_spec_tokens)
        self.block_manager: BlockManager | None = None
        self.policy = DraftLengthPolicy([1.0] * (self.num_spec_tokens + 1))

    @property
    def needs(self) -> ProposerNeeds:
        return self.proposer.needs

    def add_kv(self, pool: KVPool) -> None:
        """Declare the proposer's own KV cache, if it has one, as a member of the pool."""
        spec = self.proposer.kv_cache_spec()
        if spec is not None:
            pool.add(DRAFTER_KV, spec)

    def bind(self, pool: KVPool) -> None:
        self.block_manager = pool.block_manager
        if DRAFTER_KV in pool.tensors:
            self.proposer.bind_kv_cache(pool.tensor(DRAFTER_KV))

    def calibrate(self, target: PagedModel) -> None:
        """Measure what verifying drafts costs, which sets how long drafts are worth making.

        ``DRAFTWISE_VERIFY_ROW_COST`` (a number >= 0: each verify row costs that share of a
        one-row step) skips the measurement; 0 never cuts drafts.
        """
        fixed = os.environ.get(ROW_COST_ENV)
        if fixed is not None:
            costs = linear_step_costs(_row_cost_from_env(fixed), self.num_spec_tokens)
        else:
            context_len = min(128, self.max_model_len - self.num_spec_tokens - 1)
            costs = measure_step_costs(target, self.block_manager, self.num_spec_tokens, context_len)
        self.policy = DraftLengthPolicy(costs)

    def on_verified(self, result: StepResult) -> None:
        step = SpecDecodingStats(self.num_spec_tokens)
        for seq, num_accepted, num_drafts in zip(result.seqs, result.num_accepted, result.num_draft_tokens):
            seq.spec_token_ids, seq.spec_probs = [], None
            if num_drafts == 0:
                continue
            seq.num_drafts += 1
            seq.num_draft_tokens += num_drafts
            seq.num_accepted_tokens += num_accepted
            self.policy.observe(seq, num_drafts, num_accepted)
            step.observe(num_drafts, num_accepted)
        if step.num_drafts:
            self.stats.add(step)
            self.logger.record(step)

    def propose(self, result: StepResult) -> None:
        seqs = [seq for seq in result.seqs if not seq.is_finished]
        if not seqs and result.target_hidden is None:
            return  # (a proposer reading hidden states still sees the rows of prefill chunks)
        limits = [self._max_num_drafts(seq) for seq in seqs]
        drafts = self.proposer.propose(ProposeBatch(seqs, limits, result.target_hidden))
        if not seqs:
            return
        token_rows = drafts.token_ids.tolist()
        for i, seq in enumerate(seqs):
            num = min(drafts.num_draft_tokens[i], limits[i])
            if drafts.confidence is not None:
                num = self.policy.cut(num, drafts.confidence[i])
            seq.spec_token_ids = token_rows[i][:num]
            seq.spec_probs = drafts.probs[i, :num] if drafts.probs is not None and num else None

    def _max_num_drafts(self, seq: Sequence) -> int:
        limit = min(self.num_spec_tokens, self.max_model_len - seq.num_tokens - 1)
        if seq.params.max_tokens is not None:
            limit = min(limit, seq.params.max_tokens - seq.num_output_tokens - 1)
        limit = self.policy.limit(seq, limit)
        if limit > 0 and self.needs.kv_cache and not self.block_manager.ensure(seq, seq.num_tokens + limit):
            capacity = len(seq.block_ids) * self.block_manager.block_size
            limit = min(limit, capacity - seq.num_tokens)
        return max(0, limit)

    def on_finished(self, seq: Sequence) -> None:
        self.proposer.on_finished(seq)

    def flush_log(self) -> None:
        self.logger.flush()


def _row_cost_from_env(value: str) -> float:
    try:
        cost = float(value)
    except ValueError:
        cost = -1.0
    if not cost >= 0.0:
        raise ValueError(f"{ROW_COST_ENV}={value!r} is invalid: must be a number >= 0 (0 never cuts drafts)")
    return cost
