"""Speculative decoding counters, as vLLM's ``SpecDecodingStats``.

Per verified sequence and step: one draft (if it had any draft tokens), its
number of draft tokens, how many were accepted, and which positions were
accepted. Derived: acceptance rate = accepted / drafted, mean acceptance
length = 1 + accepted / drafts (the bonus or recovered token included),
per-position acceptance = accepted at position i / drafts.

``SpecDecodingStats`` accumulates for the engine's lifetime (``as_dict`` is
what ``LLM.get_metrics`` returns) and for the current logging interval
(``SpecDecodingLogger`` prints one line per interval).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

logger = logging.getLogger("draftwise")


@dataclass
class SpecDecodingStats:
    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.num_spec_tokens

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        for pos in range(num_accepted):
            self.num_accepted_tokens_per_pos[pos] += 1

    def add(self, other: "SpecDecodingStats") -> None:
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        for pos, count in enumerate(other.num_accepted_tokens_per_pos):
            self.num_accepted_tokens_per_pos[pos] += count

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [c / self.num_drafts if self.num_drafts else 0.0 for c in self.num_accepted_tokens_per_pos]

    def as_dict(self) -> dict:
        return {
            "spec_decode_num_drafts": self.num_drafts,
            "spec_decode_num_draft_tokens": self.num_draft_tokens,
            "spec_decode_num_accepted_tokens": self.num_accepted_tokens,
            "spec_decode_num_accepted_tokens_per_pos": list(self.num_accepted_tokens_per_pos),
            "spec_decode_acceptance_rate": self.acceptance_rate,
            "spec_decode_mean_acceptance_length": self.mean_acceptance_length,
            "spec_decode_per_position_acceptance": self.per_position_acceptance,
        }

    def summary(self) -> str:
        per_pos = ", ".join(f"{r:.3f}" for r in self.per_position_acceptance)
        return (f"Speculative decoding acceptance rate: {100 * self.acceptance_rate:.1f}%, "
                f"mean acceptance length: {self.mean_acceptance_length:.2f}, per-position: [{per_pos}], "
                f"drafts: {self.num_drafts}, draft tokens: {self.num_draft_tokens}, "
                f"accepted tokens: {self.num_accepted_tokens}")


class SpecDecodingLogger:
    """Logs the acceptance figures of each interval (default every 10 s) while generating."""

    def __init__(self, num_spec_tokens: int, interval_s: float = 10.0):
        self.num_spec_tokens = num_spec_tokens
        self.interval_s = interval_s
        self.interval = SpecDecodingStats(num_spec_tokens)
        self._last = time.monotonic()

    def record(self, step_stats: SpecDecodingStats) -> None:
        self.interval.add(step_stats)
        if time.monotonic() - self._last >= self.interval_s:
            self.flush()

    def flush(self) -> None:
        if self.interval.num_drafts:
            logger.info(self.interval.summary())
        self.interval = SpecDecodingStats(self.num_spec_tokens)
        self._last = time.monotonic()
