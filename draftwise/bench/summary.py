"""When a measurement has enough passes, and what one measurement reports.

A measurement is one configuration (or transformers mode) on one workload at one concurrency.

Stability rule: a candidate's passes over the same prompts repeat (interleaved with the other
candidates', see ``run``) until at least ``min_repeats`` are done and the relative standard
error of their mean output tokens/s, ``stdev / sqrt(n) / mean``, is at most ``max_rel_error``;
at ``max_repeats`` passes it stops anyway, marked ``stable: false``. Example (defaults 2, 5,
0.03): passes at 12.0 and 13.0 tokens/s -> error 1.0/25 = 4%, so a third pass; at 12.6 ->
stdev 0.50, error 0.29/12.5 = 2.3% -> done. Unlike max - min, the error shrinks as passes
are added, so one slow pass does not force every later repeat.

Reported: tokens/s = median over the passes, with their spread ``(max - min) / median``;
acceptance counters summed over all passes; TTFT, ITL and TPOT = medians over every request
of every pass; output token ids of the first pass (for the ``match`` column, set by
``compare_outputs``).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from ..spec_decode.metrics import SpecDecodingStats
from .measure import PassResult

MS = 1000.0


def is_settled(tokens_per_s: list[float], min_repeats: int, max_repeats: int, max_rel_error: float) -> bool:
    """Whether a candidate with these passes needs no more (the stability rule above)."""
    if len(tokens_per_s) >= max_repeats:
        return True
    return len(tokens_per_s) >= min_repeats and relative_error(tokens_per_s) <= max_rel_error


def relative_error(values: list[float]) -> float:
    """Standard error of the mean over the mean (0 for one value: nothing to compare)."""
    mean = statistics.fmean(values)
    if len(values) < 2 or mean <= 0:
        return 0.0
    return statistics.stdev(values) / math.sqrt(len(values)) / mean


def relative_spread(values: list[float]) -> float:
    median = statistics.median(values)
    return (max(values) - min(values)) / median if median > 0 else 0.0


@dataclass
class Measurement:
    workload: str
    label: str  # "none", "ngram K=3", "transformers generate", ...
    backend: str  # "draftwise" or "transformers"
    method: str  # "none" or a speculative method ("ngram" for transformers' prompt lookup)
    num_speculative_tokens: int | None
    concurrency: int
    passes_tokens_per_s: list[float]
    stable: bool
    num_output_tokens: int  # of the first pass
    spec: SpecDecodingStats | None
    passes_acceptance_rate: list[float]
    ttft_s: float | None
    itl_s: float | None
    tpot_s: float | None
    outputs: list[list[int]] = field(repr=False)  # first pass, in prompt order
    grammar: tuple[int, int, float] | None = None  # grammar drafts, accepted, share of the passes' time
    speedup: float | None = None  # over draftwise "none" at the same concurrency
    num_matched: int | None = None  # first-pass outputs equal to "none"'s (None: nothing to compare)
    total_output_tokens: int = 0  # of every pass

    @property
    def rows_per_token(self) -> float:
        """Target rows verified per output token: each step runs one row per sequence plus its drafts,
        and yields one token plus the accepted drafts (1.0 without speculation)."""
        spec, total = self.spec, self.total_output_tokens
        if spec is None or total <= 0:
            return 1.0
        return (total - spec.num_accepted_tokens + spec.num_draft_tokens) / total

    @property
    def tokens_per_s(self) -> float:
        return statistics.median(self.passes_tokens_per_s)

    @property
    def spread(self) -> float:
        return relative_spread(self.passes_tokens_per_s)

    def to_dict(self) -> dict:
        spec = self.spec
        return {
            "workload": self.workload, "configuration": self.label, "backend": self.backend,
            "method": self.method, "num_speculative_tokens": self.num_speculative_tokens,
            "concurrency": self.concurrency, "tokens_per_s": self.tokens_per_s, "spread": self.spread,
            "rel_error": relative_error(self.passes_tokens_per_s),
            "passes_tokens_per_s": self.passes_tokens_per_s, "repeats": len(self.passes_tokens_per_s),
            "stable": self.stable, "speedup": self.speedup, "num_output_tokens": self.num_output_tokens,
            "acceptance_rate": spec.acceptance_rate if spec else None,
            "mean_acceptance_length": spec.mean_acceptance_length if spec else None,
            "rows_per_token": self.rows_per_token,
            "per_position_acceptance": spec.per_position_acceptance if spec else None,
            "num_drafts": spec.num_drafts if spec else None,
            "num_draft_tokens": spec.num_draft_tokens if spec else None,
            "num_accepted_tokens": spec.num_accepted_tokens if spec else None,
            "passes_acceptance_rate": self.passes_acceptance_rate if spec else None,
            "ttft_ms": _ms(self.ttft_s), "itl_ms": _ms(self.itl_s), "tpot_ms": _ms(self.tpot_s),
            "outputs_match_none": self.num_matched, "num_prompts": len(self.outputs),
            "grammar_num_draft_tokens": self.grammar and self.grammar[0],
            "grammar_num_accepted_tokens": self.grammar and self.grammar[1],
            "grammar_time_share": self.grammar and self.grammar[2],
        }


def summarize(passes: list[PassResult], max_rel_error: float, **labels) -> Measurement:
    """``labels``: workload, label, backend, method, num_speculative_tokens, concurrency."""
    samples = [s for p in passes for s in p.samples]
    spec = None
    if passes[0].spec is not None:
        spec = SpecDecodingStats(passes[0].spec.num_spec_tokens)
        for p in passes:
            spec.add(p.spec)
    tokens_per_s = [p.tokens_per_s for p in passes]
    return Measurement(
        **labels, passes_tokens_per_s=tokens_per_s, stable=relative_error(tokens_per_s) <= max_rel_error,
        num_output_tokens=passes[0].num_tokens, total_output_tokens=sum(p.num_tokens for p in passes), spec=spec,
        passes_acceptance_rate=[p.spec.acceptance_rate for p in passes if p.spec is not None],
        ttft_s=_median([s.ttft for s in samples if s.ttft is not None]),
        itl_s=_median([g for s in samples for g in s.gaps]),
        tpot_s=_median([s.tpot for s in samples if s.tpot is not None]),
        outputs=[s.token_ids for s in passes[0].samples],
        grammar=_grammar(passes))


def _grammar(passes: list[PassResult]) -> tuple[int, int, float] | None:
    """Grammar drafts and accepted ones summed over ``passes``, and the grammar's share of their time."""
    if passes[0].grammar is None:
        return None
    drafted, accepted, seconds = map(sum, zip(*(p.grammar for p in passes)))
    return drafted, accepted, seconds / sum(p.seconds for p in passes)


def compare_outputs(measurements: list[Measurement]) -> None:
    """Set ``speedup`` and ``num_matched`` against draftwise ``none`` of the same workload and concurrency
    (with structured outputs, ``none`` without grammar drafts: plain constrained decoding)."""
    base = {}  # draftwise "none", without grammar drafts where both ran
    for m in measurements:
        if m.backend == "draftwise" and m.method == "none" and (m.label == "none" or (m.workload, m.concurrency)
                                                                 not in base):
            base[(m.workload, m.concurrency)] = m
    for m in measurements:
        ref = base.get((m.workload, m.concurrency))
        if ref is None:
            continue
        m.speedup = m.tokens_per_s / ref.tokens_per_s if ref.tokens_per_s > 0 else None
        if m is not ref:
            m.num_matched = sum(a == b for a, b in zip(m.outputs, ref.outputs))


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * MS
