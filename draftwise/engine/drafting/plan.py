"""One step's draft decision: per sequence, the drafts it may get, the drafts it got, and why not more.

``Speculator.propose`` builds a ``DraftPlan`` each step. Every sequence starts at
``num_speculative_tokens`` and each limit, applied in the order below, can only lower it; the
*reason* of a sequence is the last limit that lowered its count (the one that binds), ``"full"``
when it drafts ``num_speculative_tokens``. Limits, in order:

* ``drafter_blocked``: its cached prefix lacks the drafter's K/V (``paged/block_manager.py``);
* ``drafter_max_model_len``: past ``speculative_config["max_model_len"]``;
* ``request``: the request's own ``num_speculative_tokens`` (``SamplingParams.extra_args``);
* ``max_tokens``: the room left before ``max_model_len`` or the request's ``max_tokens``;
* ``batch_size``: ``disable_by_batch_size`` / ``num_speculative_tokens_per_batch_size``;
* ``step_cost``: the drafts worth verifying in this batch (``length.py``);
* ``kv_cache``: the KV blocks the drafter's cache can get;
* ``proposer``: the proposer drafted fewer (no match in the context, a short suffix path, ...);
* ``confidence``: a confidence-based cut of model drafts (``length.py``).

The plan is logged at debug level (one line per step) and its reasons are counted for the
engine's lifetime (``get_spec_decode_stats()["spec_decode_draft_limits"]``, and
``draftwise:spec_decode_draft_limits{reason}`` on ``/metrics``).
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

logger = logging.getLogger("draftwise")

FULL = "full"
REASONS = (FULL, "drafter_blocked", "drafter_max_model_len", "request", "max_tokens", "tree_alignment",
           "batch_size", "step_cost", "kv_cache", "proposer", "confidence")


@dataclass
class DraftPlan:
    seq_ids: list[int]
    num_speculative_tokens: int
    num_drafts: list[int]  # per sequence: the most drafts it may get so far; in the end, the drafts it got
    reasons: list[str]  # per sequence: the limit that set its count (FULL: none did)

    @classmethod
    def start(cls, seq_ids: list[int], num_speculative_tokens: int) -> "DraftPlan":
        return cls(list(seq_ids), num_speculative_tokens, [num_speculative_tokens] * len(seq_ids),
                   [FULL] * len(seq_ids))

    def limit(self, reason: str, caps: list[int]) -> list[int]:
        """Lower each sequence's count to its cap under ``reason``; returns the counts."""
        if reason not in REASONS:
            raise ValueError(f"unknown draft limit {reason!r}; known: {', '.join(REASONS)}")
        for i, cap in enumerate(caps):
            if cap < self.num_drafts[i]:
                self.num_drafts[i], self.reasons[i] = max(0, cap), reason
        return self.num_drafts

    def counts(self) -> Counter:
        return Counter(self.reasons)

    def log(self) -> None:
        if logger.isEnabledFor(logging.DEBUG) and self.seq_ids:
            logger.debug("draftwise: draft plan (seq: drafts/reason): %s",
                         ", ".join(f"{s}: {n}/{r}" for s, n, r in zip(self.seq_ids, self.num_drafts, self.reasons)))


class DraftLimitCounts:
    """The reasons of every plan since start-up, one per sequence and step."""

    def __init__(self) -> None:
        self.counts = Counter(dict.fromkeys(REASONS, 0))

    def add(self, plan: DraftPlan) -> None:
        counts = self.counts
        for reason in plan.reasons:
            counts[reason] += 1

    def as_dict(self) -> dict:
        return {"spec_decode_draft_limits": {reason: self.counts[reason] for reason in REASONS}}
