"""Speculative decoding counters, as vLLM's ``SpecDecodingStats``, and its periodic log line.

Per verified sequence and step: one draft (if it had any draft tokens), its
number of draft tokens, how many were accepted, and which positions were
accepted. Derived: acceptance rate = accepted / drafted, mean acceptance
length = 1 + accepted / drafts (the bonus or recovered token included),
per-position acceptance = accepted at position i / drafts.

``SpecDecodingStats`` accumulates for the engine's lifetime (``as_dict`` is
what ``LLM.get_spec_decode_stats`` returns; ``LLM.get_metrics`` reports the
same counters as vLLM's ``vllm:spec_decode_*`` metrics) and for the current
logging interval: ``SpecDecodingLogger.flush`` logs it as vLLM's line::

    SpecDecoding metrics: Mean acceptance length: 2.10, Accepted throughput: 8.80 tokens/s,
    Drafted throughput: 22.80 tokens/s, Accepted: 88 tokens, Drafted: 228 tokens,
    Per-position acceptance rate: 0.525, 0.350, 0.225, Avg Draft acceptance rate: 38.6%

(one line), then starts the next interval. It is flushed after each
``Engine 000:`` line (``draftwise/metrics/stat_logger.py``) and at the end of
each ``LLM.generate`` call; an interval without drafts logs nothing, and
``enabled = False`` (``disable_log_stats``) silences it.
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

    def log_args(self, elapsed_s: float) -> tuple:
        """The arguments of ``LOG_FORMAT`` for this interval of ``elapsed_s`` seconds."""
        per_pos = ", ".join(f"{r:.3f}" for r in self.per_position_acceptance)
        rate = 100 * self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else float("nan")
        per_s = 1 / elapsed_s if elapsed_s > 0 else 0.0
        return (self.mean_acceptance_length, self.num_accepted_tokens * per_s, self.num_draft_tokens * per_s,
                self.num_accepted_tokens, self.num_draft_tokens, per_pos, rate)


LOG_FORMAT = ("SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f tokens/s, "
              "Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, "
              "Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%")


class SpecDecodingLogger:
    """The acceptance figures since the last flush; ``flush`` logs them (see the module docstring)."""

    def __init__(self, num_spec_tokens: int, enabled: bool = True):
        self.num_spec_tokens = num_spec_tokens
        self.enabled = enabled
        self.interval = SpecDecodingStats(num_spec_tokens)
        self._last = time.monotonic()

    def record(self, step_stats: SpecDecodingStats) -> None:
        self.interval.add(step_stats)

    def flush(self, level: int = logging.INFO, now: float | None = None) -> None:
        """Log the interval at ``level`` if it verified drafts, and start the next one (``now``: the
        ``time.monotonic()`` reading that ends it)."""
        now = time.monotonic() if now is None else now
        if self.enabled and self.interval.num_drafts:
            logger.log(level, LOG_FORMAT, *self.interval.log_args(now - self._last))
        self.interval = SpecDecodingStats(self.num_spec_tokens)
        self._last = now
