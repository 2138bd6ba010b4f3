"""Prompt logprobs (``SamplingParams.prompt_logprobs``): which rows of a step score prompt tokens.

A request that asks gets ``RequestOutput.prompt_logprobs``: ``None`` for the
first prompt token, then one dict per later prompt token holding that token's
``Logprob`` (with its rank) and those of the top-N tokens (``-1``: the whole
vocabulary). Row ``p`` of a forward (the hidden state after the token at
position ``p``) scores prompt token ``p + 1`` under the raw model distribution
(no temperature, penalties or other processing), so chunking and batching
change the figures by float rounding only.

Who scores: a request's first sequence only (its ``n`` sequences share one
prompt), from its admission until it samples its first token. Until then it
takes no prefix-cache hits (vLLM's ``skip_reading_prefix_cache``): a cached
position is never computed, so it would have no logits; its own blocks are
still published for others. A sequence preempted before its first token
recomputes, and so rescores, its prompt from position 0; once it has sampled,
its prompt is never scored again.

``prompt_rows`` plans a step's scoring rows; ``ModelRunner`` computes logits
for those rows only (a plain request's rows are untouched) and brings the
figures to the host in one transfer; ``OutputProcessor.record_prompt_logprobs``
turns a ``PromptLogprobs`` into the request's dicts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..sample import HostLogprobs
from ..sequence import Sequence

if TYPE_CHECKING:
    from .scheduler import ScheduledSeq


def scores_prompt(seq: Sequence) -> bool:
    """Whether ``seq`` still scores its prompt (so every prompt position must be computed)."""
    return seq.params.prompt_logprobs is not None and seq.index == 0 and seq.first_token_time is None


@dataclass
class PromptLogprobs:
    """One sequence's prompt tokens scored in one step, as host lists."""
    request_id: str
    first: int  # the first scored token's prompt position = its index in RequestOutput.prompt_logprobs
    token_ids: list[int]  # the prompt tokens scored: positions first, first + 1, ...
    figures: HostLogprobs  # their logprobs and ranks, and the request's top-N per token


@dataclass
class _Span:
    request_id: str
    first: int
    num_rows: int
    num_top: int  # the request's N (the vocabulary size for -1)


@dataclass
class PromptRows:
    """The rows of one step's forward that score prompt tokens, sequence by sequence."""
    rows: list[int] = field(default_factory=list)  # hidden-state rows of the forward
    targets: list[int] = field(default_factory=list)  # the prompt token each row scores
    spans: list[_Span] = field(default_factory=list)

    @property
    def num_top(self) -> int:
        """The most top logprobs any scored sequence asks for."""
        return max(span.num_top for span in self.spans)

    def split(self, figures: HostLogprobs) -> list[PromptLogprobs]:
        """Cut the step's figures (one entry per row, ``num_top`` wide) per sequence, each to its own N."""
        out, r = [], 0
        for span in self.spans:
            end, k = r + span.num_rows, span.num_top
            mine = HostLogprobs(figures.logprobs[r:end], figures.ranks[r:end],
                                [row[:k] for row in figures.top_logprobs[r:end]],
                                [row[:k] for row in figures.top_ids[r:end]])
            out.append(PromptLogprobs(span.request_id, span.first, self.targets[r:end], mine))
            r = end
        return out


def prompt_rows(scheduled: list[ScheduledSeq], cu: list[int], vocab_size: int) -> PromptRows | None:
    """The rows that score prompt tokens in a step (rows of item ``i`` start at ``cu[i]``, at
    position ``seq.num_computed_tokens``), or None when no scheduled sequence scores its prompt."""
    plan = PromptRows()
    for i, item in enumerate(scheduled):
        seq = item.seq
        start = seq.num_computed_tokens
        end = min(start + item.num_new_tokens, seq.num_prompt_tokens - 1)  # the last prompt row samples
        if end <= start or not scores_prompt(seq):
            continue
        asked = seq.params.prompt_logprobs
        plan.spans.append(_Span(seq.request_id, start + 1, end - start, vocab_size if asked == -1 else asked))
        plan.rows.extend(range(cu[i], cu[i] + end - start))
        plan.targets.extend(seq.prompt_token_ids[start + 1:end + 1])
    return plan if plan.rows else None
