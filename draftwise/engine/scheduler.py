"""Continuous batching: which sequences run this step, and how many tokens each.

Each step has a token budget (``max_num_batched_tokens``) and a sequence
budget (``max_num_seqs``). Decoding sequences go first (a decode token and its
draft tokens to verify); drafts count against the budget and are dropped,
never preempting anyone, when budget or KV blocks run short. Prefill comes
next: the next chunks of unfinished prefills, then waiting sequences admitted
while budget and KV blocks last, their prompts chunked to fit, oldest first.

With ``decode_stall_factor`` set, a long prompt does not stall running
streams: while sequences decode, the prefill joining a step is bounded so that
the step is predicted to take at most that many times the decode-only step
(``StepCostModel``, learned from the engine's own steps; the prediction
scaled by ``prefill_margin``, the 95th percentile of how such mixed steps ran
against it, so the bound holds for their tail and not only at their median), and at least
``MIN_PREFILL_CHUNK`` tokens so prompts always progress. Without decodes,
prefill takes the whole budget. (Off by default: small prefill chunks cost
more per token, so the bound trades throughput for inter-token latency.) When a running
sequence cannot get a block, the most recently admitted running sequence is
preempted: its blocks are freed and it goes back to the front of the queue to
be recomputed (prompt + output so far) later. Outputs do not change because
sampling noise is keyed by (seed, position), not by a stateful generator.
With prefix caching, a sequence admitted from scratch starts past the cached
blocks of its longest cached prefix (``BlockManager.match_prefix``), unless it
scores its prompt (``prompt_logprobs.py``): it computes every prompt position.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from ..paged import BlockManager
from ..sequence import Sequence, SequenceStatus
from .prompt_logprobs import scores_prompt
from .drafting.step_cost import StepCostModel, decode_keys

MIN_PREFILL_CHUNK = 16  # prefill tokens a step may always take
MARGIN_QUANTILE = 0.95  # the prefill bound holds for this share of mixed steps, not only on average
MARGIN_RATE = 0.02  # step of the margin's quantile estimate
MARGIN_RANGE = (0.5, 3.0)


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # tokens of ``seq.all_token_ids`` to run
    spec_token_ids: list[int] = field(default_factory=list)  # drafts run after them, to verify

    @property
    def decodes(self) -> bool:
        """True for a decode: the sequence's last token (and drafts to verify), sampled this step."""
        return self.num_new_tokens == 1 and self.samples

    @property
    def num_scheduled_tokens(self) -> int:
        return self.num_new_tokens + len(self.spec_token_ids)

    @property
    def samples(self) -> bool:
        """True when this step reaches the end of the sequence, so a token is sampled."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        """Rows of the step: every scheduled token, drafts included."""
        return sum(item.num_scheduled_tokens for item in self.scheduled)

    def decode_keys(self, further_key_share: float = 1.0) -> float:
        """Keys the step's decode and verify rows read, in first-row keys (``step_cost.decode_keys``;
        prefill rows left out)."""
        items = [item for item in self.scheduled if item.decodes]
        return decode_keys([item.seq.num_computed_tokens + item.num_scheduled_tokens for item in items],
                           [item.num_scheduled_tokens for item in items], further_key_share)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def mixes_prefill(self) -> bool:
        """True when prefill ran beside decoding sequences (the steps the prefill bound shapes)."""
        decodes = [item.decodes for item in self.scheduled]
        return any(decodes) and not all(decodes)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 step_cost: StepCostModel | None = None, decode_stall_factor: float | None = None):
        self.block_manager = block_manager
        self.step_cost = step_cost
        self.decode_stall_factor = decode_stall_factor
        self.prefill_margin = 1.0  # the MARGIN_QUANTILE of mixed steps' actual / predicted time
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        decoding = [seq for seq in self.running if seq.num_tokens - seq.num_computed_tokens == 1]
        budget = self._schedule_running(decoding, self.max_num_batched_tokens, out)
        prefill = min(budget, self._prefill_budget(out.num_batched_tokens, budget, self._decode_keys(out)))
        prefilling = [seq for seq in self.running if seq.num_tokens - seq.num_computed_tokens > 1]
        prefill = self._schedule_running(prefilling, prefill, out)
        if not out.preempted:
            prefill = self._admit_waiting(out, prefill)
        now = time.time()
        for item in out.scheduled:
            if item.seq.first_scheduled_time is None:
                item.seq.first_scheduled_time = now
        return out

    def _schedule_running(self, seqs: list[Sequence], budget: int, out: SchedulerOutput) -> int:
        """Schedule the next tokens (and drafts) of running ``seqs`` within ``budget``; returns what is left."""
        for seq in seqs:
            if budget == 0:
                break
            if seq.status != SequenceStatus.RUNNING:  # preempted earlier in this step
                continue
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self._reserve(seq, num_new, out):
                continue
            item = ScheduledSeq(seq, num_new, self._drafts(seq, num_new, budget - num_new))
            out.scheduled.append(item)
            budget -= item.num_scheduled_tokens
        return budget

    def _decode_keys(self, out: SchedulerOutput) -> float:
        return out.decode_keys(self.step_cost.further_key_share if self.step_cost is not None else 1.0)

    def _prefill_budget(self, num_decode_rows: int, budget: int, num_decode_keys: float = 0.0) -> int:
        """Prefill tokens that may join a step of ``num_decode_rows`` decode (and draft) rows reading
        ``num_decode_keys`` keys."""
        cost, factor = self.step_cost, self.decode_stall_factor
        if num_decode_rows == 0 or factor is None or cost is None or not cost.ready or cost.free:
            return budget
        bound = factor * cost.seconds(num_decode_rows, num_decode_keys) / self.prefill_margin
        within = cost.max_rows_within(bound, num_decode_rows + budget, num_decode_keys)
        return max(MIN_PREFILL_CHUNK, within - num_decode_rows)

    def observe_mixed_step(self, num_rows: int, seconds: float, num_decode_keys: float = 0.0) -> None:
        """A step that ran prefill beside decodes took ``seconds`` (call before the step-cost model
        learns from it): ``prefill_margin`` follows the MARGIN_QUANTILE of actual / predicted time
        (a stochastic quantile estimate), so the bound holds for that share of such steps. A fixed
        model (its unit is a one-row step, not seconds) keeps the margin at 1."""
        cost = self.step_cost
        if cost is None or cost.frozen or not cost.ready:
            return
        predicted = cost.seconds(num_rows, num_decode_keys)
        if not predicted:
            return
        above = seconds / predicted > self.prefill_margin
        step = MARGIN_RATE * (MARGIN_QUANTILE if above else MARGIN_QUANTILE - 1.0)
        self.prefill_margin = min(MARGIN_RANGE[1], max(MARGIN_RANGE[0], self.prefill_margin * (1.0 + step)))

    def _reserve(self, seq: Sequence, num_new: int, out: SchedulerOutput) -> bool:
        """Find blocks for ``seq``'s next ``num_new`` tokens, preempting later sequences if needed."""
        while not self.block_manager.ensure(seq, seq.num_computed_tokens + num_new):
            victim = self.running[-1]
            self._preempt(victim, out)
            if victim is seq:
                return False
        return True

    def _drafts(self, seq: Sequence, num_new: int, budget: int) -> list[int]:
        """The drafts to verify this step: only when the step samples, within budget and free blocks."""
        if not seq.spec.draft_token_ids or seq.num_computed_tokens + num_new != seq.num_tokens:
            return []
        drafts = seq.spec.draft_token_ids[:budget]
        base = seq.num_computed_tokens + num_new
        while drafts and not self.block_manager.ensure(seq, base + len(drafts)):
            drafts = drafts[:max(0, len(seq.block_ids) * self.block_manager.block_size - base)]
        return drafts

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> int:
        """Admit waiting sequences while budget and blocks last; a sequence starting from scratch
        first takes the cached blocks of its prompt's longest cached prefix (prefix caching), unless it
        scores its prompt."""
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            lookup = seq.num_computed_tokens == 0 and not scores_prompt(seq)
            if lookup:
                hit = self.block_manager.match_prefix(seq)
                seq.num_computed_tokens = hit.num_tokens
                if hit.drafter_num_tokens is not None:
                    seq.spec.admit(hit.drafter_num_tokens, hit.drafter_blocked)
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self.block_manager.ensure(seq, seq.num_computed_tokens + num_new):
                if lookup:  # give the cached blocks back; they are looked up again next time
                    self.block_manager.free(seq)
                    seq.num_computed_tokens = 0
                break
            if lookup:
                self.block_manager.record_lookup(seq, seq.num_computed_tokens)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, num_new))
            budget -= num_new
        return budget

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.spec.reset()
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        out.scheduled = [s for s in out.scheduled if s.seq is not seq]

    def finish(self, seq: Sequence) -> None:
        """Release a finished or aborted sequence, wherever it is."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
