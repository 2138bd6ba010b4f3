"""Result objects returned by ``LLM.generate`` and ``LLMEngine.step`` (vLLM-compatible)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_generation_tokens: int = 0
    num_preemptions: int = 0
    # Speculative decoding, this request only (all its sequences): verification steps that had
    # drafts, draft tokens proposed, draft tokens accepted.
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0

    @property
    def spec_acceptance_rate(self) -> float:
        return self.spec_num_accepted_tokens / self.spec_num_draft_tokens if self.spec_num_draft_tokens else 0.0

    @property
    def spec_mean_acceptance_length(self) -> float:
        return 1.0 + self.spec_num_accepted_tokens / self.spec_num_drafts if self.spec_num_drafts else 1.0


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    kv_transfer_params: dict | None = None  # e.g. {"hidden_states_path": ...} (extract_hidden_states)
    num_cached_tokens: int = 0  # prompt tokens read from the prefix cache instead of computed
    error: str | None = None  # set when the engine failed this request (finish_reason "error")
    # With SamplingParams.prompt_logprobs: one entry per prompt token, None for the first, then
    # {token_id: Logprob} holding the prompt token (with its rank) and the top-N tokens. None otherwise.
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
