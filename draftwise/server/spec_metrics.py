"""vLLM's per-request speculative decoding figures: ``metrics.speculative_decoding`` in a response.

With ``--per-request-spec-decode-metrics summary`` (or ``detailed``) and a
speculative config, a response for one sequence (``n == 1``, one prompt)
carries vLLM's ``SpeculativeDecodingMetrics``: mean acceptance length, draft
acceptance rate, the histogram of draft tokens accepted per verify step, and
the step, draft-token and accepted-token counts (``detailed`` adds the
accepted and proposed counts of every step, in order). The counts are the
request's own ``RequestOutput.metrics`` (``spec_num_drafts``,
``spec_num_draft_tokens``, ``spec_num_accepted_tokens``); the per-step
figures come from ``SpecTrace``, which the engine thread feeds every output
of the request: each output of a one-sequence request follows at most one
verify step (``LLMEngine.step`` verifies a sequence once per step), so the
growth of the counters between two outputs is that step's figures. A
streamed response carries them on its final usage chunk only (as vLLM), so
only with ``stream_options.include_usage``.
"""
from __future__ import annotations

import logging

from ..outputs import RequestMetrics, RequestOutput
from .protocol import PerRequestMetrics, SpeculativeDecodingMetrics

logger = logging.getLogger("draftwise")


class SpecTrace:
    """One request's verify steps, read off its successive outputs (on the engine thread)."""

    def __init__(self, num_spec_tokens: int, detailed: bool):
        self.num_spec_tokens = num_spec_tokens
        self.histogram: list[int] | None = [0] * (num_spec_tokens + 1)  # None: the steps could not be told apart
        self.per_step_accepted: list[int] | None = [] if detailed else None
        self.per_step_drafted: list[int] | None = [] if detailed else None
        self._seen = (0, 0, 0)  # drafts, draft tokens, accepted tokens as of the last output

    def observe(self, metrics: RequestMetrics | None) -> None:
        if metrics is None or self.histogram is None:
            return
        now = (metrics.spec_num_drafts, metrics.spec_num_draft_tokens, metrics.spec_num_accepted_tokens)
        steps, drafted, accepted = (a - b for a, b in zip(now, self._seen))
        self._seen = now
        if steps == 0:
            return
        if steps > 1:  # not expected (one verify per output); the histogram would be a guess, so drop it
            logger.warning("draftwise: an output followed %d verify steps; per-request spec metrics dropped", steps)
            self.histogram = None
            return
        if accepted >= len(self.histogram):
            self.histogram.extend([0] * (accepted + 1 - len(self.histogram)))
        self.histogram[accepted] += 1
        if self.per_step_accepted is not None:
            self.per_step_accepted.append(accepted)
            self.per_step_drafted.append(drafted)


def per_request_metrics(trace: SpecTrace | None, final: RequestOutput | None) -> PerRequestMetrics | None:
    """vLLM's response ``metrics`` for a finished one-sequence request; None without a usable trace."""
    if trace is None or trace.histogram is None or final is None or final.metrics is None:
        return None
    m = final.metrics
    steps, drafted, accepted = m.spec_num_drafts, m.spec_num_draft_tokens, m.spec_num_accepted_tokens
    spec = SpeculativeDecodingMetrics(
        mean_acceptance_length=m.spec_mean_acceptance_length, draft_acceptance_rate=m.spec_acceptance_rate,
        acceptance_histogram=list(trace.histogram), num_spec_steps=steps, num_accepted_draft_tokens=accepted,
        num_draft_tokens=drafted, num_spec_tokens=trace.num_spec_tokens,
        per_step_accepted=trace.per_step_accepted or None, per_step_drafted=trace.per_step_drafted or None)
    return PerRequestMetrics(speculative_decoding=spec)
