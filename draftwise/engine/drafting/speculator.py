"""The engine's side of speculative decoding: verification bookkeeping, rollback, drafting.

``Speculator`` wraps the configured proposer. After each target step:

1. (the engine has already rolled the cache back: ``BlockManager.rollback``
   kept the accepted drafts' K/V, in the target's and the drafter's tensors;
   and cleared each verified sequence's drafts)
2. ``on_verified``: counters, the interval log line and the draft length
   policy's acceptance estimates are updated.
3. (the engine appends the emitted tokens and releases finished sequences)
4. ``propose``: the proposer drafts for every sequence still running, as many
   as the step's ``DraftPlan`` allows (``plan.py``: ``num_speculative_tokens``
   lowered by the drafter's cache and context limit, the request, ``max_model_len``
   and ``max_tokens``, the batch-size limits of ``speculative_config``
   (``spec_decode/batch_limits.py``, counted over the sequences still running), the
   drafts worth verifying in this batch (``length.py``, priced by the engine's
   ``StepCostModel``) and the KV blocks it can get), then the plan records what the
   proposer drafted and any confidence cut, with the reason each sequence got no more.
"""
from __future__ import annotations

import logging

from ...layers.attention import PAGED_CHUNK_KEYS
from ...paged import BlockManager, KVPool
from ...sequence import Sequence
from ...spec_decode.config import SpeculativeConfig
from ...spec_decode.interface import ProposeBatch, ProposerNeeds, TargetInfo
from ...spec_decode.metrics import SpecDecodingLogger, SpecDecodingStats
from ...spec_decode.suffix_mix import SuffixMix
from ...validate import PREFIX
from ..fault_isolation import find_failing
from ..model_runner import StepResult
from .length import DraftLengthPolicy
from .plan import DraftLimitCounts, DraftPlan
from .step_cost import StepCostModel

logger = logging.getLogger("draftwise")
DRAFTER_KV = "drafter"  # the proposer's member of the KV pool


class Speculator:
    def __init__(self, config: SpeculativeConfig, target: TargetInfo):
        if config.max_model_len is not None and config.max_model_len > target.max_model_len:
            raise ValueError(f"{PREFIX}['max_model_len']={config.max_model_len} is invalid: must be <= the "
                             f"target's max_model_len ({target.max_model_len})")
        self.config = config
        self.proposer = config.proposer_cls(config, target)
        if config.suffix_config is not None:  # model drafts mixed with suffix drafts, per sequence
            self.proposer = SuffixMix(self.proposer, config.suffix_config.proposer_cls(config.suffix_config, target))
        if config.draft_tensor_parallel_size > 1 and not self.proposer.shards_drafter:
            logger.info("draftwise: draft_tensor_parallel_size=%d: the %s drafter runs whole on the driver's rank "
                        "(its target states are whole there)", config.draft_tensor_parallel_size, config.method)
        self.num_spec_tokens = config.num_speculative_tokens
        self.max_model_len = target.max_model_len
        self.drafter_max_model_len = config.max_model_len  # None: the target's clipping only
        self.batch_limits = config.batch_limits
        self.stats = SpecDecodingStats(self.num_spec_tokens)
        self.logger = SpecDecodingLogger(self.num_spec_tokens)
        self.block_manager: BlockManager | None = None
        self.tree = config.token_tree
        self.policy = DraftLengthPolicy(StepCostModel.fixed(0.0, self.num_spec_tokens + 1), self.tree)
        self.draft_limits = DraftLimitCounts()  # every step's DraftPlan reasons, counted
        self.last_plan: DraftPlan | None = None

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
        self.proposer.warm_up(self.block_manager)

    def price_with(self, step_cost: StepCostModel) -> None:
        """Price drafts with the engine's step-cost model (until then every draft is kept)."""
        self.policy = DraftLengthPolicy(step_cost, self.tree)

    def on_verified(self, result: StepResult) -> None:
        step = SpecDecodingStats(self.num_spec_tokens)
        for seq, num_accepted, num_drafts in zip(result.seqs, result.num_accepted, result.num_draft_tokens):
            if num_drafts == 0:
                continue
            seq.spec.observe(num_drafts, num_accepted)
            depth = num_drafts
            if self.tree is not None and num_drafts <= len(self.tree):  # a tree's prefix: its last node's depth
                depth = max(self.tree.depths[num_drafts - 1], num_accepted)  # (more accepted: a grammar's chain)
            self.policy.observe(seq, depth, num_accepted)
            self.proposer.observe(seq, num_drafts, num_accepted)
            step.observe(num_drafts, num_accepted)
        if step.num_drafts:
            self.stats.add(step)
            self.logger.record(step)

    def propose(self, result: StepResult) -> list[tuple[Sequence, Exception]]:
        """Draft for the sequences of ``result`` still running (their drafts are priced on top of
        one decode row each). Returns the sequences whose requests make the proposer raise, with
        the exception (the engine fails those requests; see ``_isolate``)."""
        seqs = [seq for seq in result.seqs if not seq.is_finished]
        if not seqs and result.target_hidden is None:
            return []  # (a proposer reading hidden states still sees the rows of prefill chunks)
        num_base_rows = len(seqs)
        plan = DraftPlan.start([seq.seq_id for seq in seqs], self.num_spec_tokens)
        slots = [seq.num_draft_slots(self.max_model_len) for seq in seqs]  # room before max_tokens / max_model_len
        self._limit_per_sequence(plan, seqs, slots)
        batch_limit = self.batch_limits.num_spec_tokens(len({seq.request_id for seq in seqs}), len(seqs),
                                                        self.num_spec_tokens)
        plan.limit("batch_size", [batch_limit] * len(seqs))
        catch_up = list(zip(self.proposer.catch_up_seconds(seqs),
                            [num + 1 for num in slots]))
        plan.limit("step_cost", self.policy.limits(seqs, list(plan.num_drafts), num_base_rows,
                                                   self.proposer.drafting_seconds, catch_up))
        limits = list(plan.limit("kv_cache", [self._fit_kv(seq, n) for seq, n in zip(seqs, plan.num_drafts)]))
        batch = ProposeBatch(seqs, limits, result.target_hidden)
        try:
            drafts = self.proposer.propose(batch)
        except Exception as exc:  # a fault tied to some request: find it, the others draft again next step
            return self._isolate(batch, exc)
        if not seqs:
            return []
        nums = plan.limit("proposer", drafts.num_draft_tokens)
        if drafts.confidence is not None:
            nums = plan.limit("confidence", self.policy.cut(list(nums), drafts.confidence, num_base_rows,
                                                            [seq.num_tokens for seq in seqs]))
        token_rows = drafts.token_ids.tolist()
        for i, (seq, num) in enumerate(zip(seqs, nums)):
            probs = drafts.probs[i, :num] if drafts.probs is not None and num else None
            parents = drafts.parents[:num] if drafts.parents is not None and num else None
            seq.spec.set_drafts(token_rows[i][:num], probs, parents)
        self.draft_limits.add(plan)
        plan.log()
        self.last_plan = plan
        return []

    def _isolate(self, batch: ProposeBatch, error: Exception) -> list[tuple[Sequence, Exception]]:
        """The requests whose sequences make ``propose`` raise, found by bisection (``fault_isolation``:
        each trial proposes for a subset, with its target rows, and its drafts are dropped). No sequence
        gets drafts this step; outputs do not depend on drafts, so the others' tokens stay as in a
        clean run (a trial that raised may leave a drafter's state for its sequences behind, which
        can only cost acceptance)."""
        logger.exception("draftwise: drafting for %d sequences failed; finding the request(s) that cause it",
                         len(batch.seqs))
        groups: dict[str, list[tuple[Sequence, int]]] = {}
        for seq, limit in zip(batch.seqs, batch.max_num_drafts):
            groups.setdefault(seq.request_id, []).append((seq, limit))
        group_list = list(groups.values())

        def trial(items: list[tuple[Sequence, int]]) -> None:
            ids = {seq.seq_id for seq, _ in items}
            hidden = batch.target_hidden.subset(ids) if batch.target_hidden is not None else None
            self.proposer.propose(ProposeBatch([seq for seq, _ in items], [limit for _, limit in items], hidden))

        failing = find_failing(group_list, trial, error)
        return [(seq, exc) for i, exc in failing.items() for seq, _ in group_list[i]]

    def _limit_per_sequence(self, plan: DraftPlan, seqs: list[Sequence], slots: list[int]) -> None:
        """The limits a sequence carries alone: the drafter's cache and context, the request, its length
        (``slots[i]``: the drafts that fit before its ``max_tokens`` and ``max_model_len``)."""
        plan.limit("drafter_blocked", [0 if seq.spec.drafter_blocked else self.num_spec_tokens for seq in seqs])
        drafter_limit = self.drafter_max_model_len  # past it: no drafts (as vLLM skips such sequences)
        if drafter_limit is not None:
            plan.limit("drafter_max_model_len", [0 if seq.num_tokens + self.num_spec_tokens > drafter_limit
                                                 else self.num_spec_tokens for seq in seqs])
        caps = [seq.params.num_speculative_tokens for seq in seqs]  # extra_args, checked <= the engine's
        plan.limit("request", [self.num_spec_tokens if cap is None else cap for cap in caps])
        plan.limit("max_tokens", slots)
        if self.tree is not None:  # the root is the last token; see TokenTree.chunk_aligned
            plan.limit("tree_alignment", [self.tree.chunk_aligned(seq.num_tokens - 1, PAGED_CHUNK_KEYS)
                                          for seq in seqs])

    def _fit_kv(self, seq: Sequence, limit: int) -> int:
        """``limit`` cut to the KV slots ``seq`` can get (proposers with a KV cache of their own)."""
        if limit > 0 and self.needs.kv_cache and not self.block_manager.ensure(seq, seq.num_tokens + limit):
            capacity = len(seq.block_ids) * self.block_manager.block_size
            limit = min(limit, capacity - seq.num_tokens)
        return max(0, limit)

    def on_finished(self, seq: Sequence) -> None:
        self.proposer.on_finished(seq)

    def flush_log(self) -> None:
        self.logger.flush()

