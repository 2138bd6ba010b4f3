"""OpenAI API request/response models (pydantic) and OpenAI's error format.

Requests validate ranges where OpenAI's API defines them (temperature in
[0, 2], penalties in [-2, 2], top_p in (0, 1], ...); a violation becomes a
400 with ``{"error": {"message", "type", "param", "code"}}``. Fields OpenAI
has that draftwise does not implement are accepted only at their neutral
value (``unsupported_fields`` names the others, answered with 400); fields
unknown to both are ignored, as OpenAI's client may send new ones. Extra
vLLM sampling fields (``top_k``, ``min_p``, ``repetition_penalty``,
``min_tokens``, ``ignore_eos``, ``stop_token_ids``, ...) are accepted too,
through the client's ``extra_body``.
"""
from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    n: int = Field(1, ge=1)  # capped by the engine's max_n
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=-2**63, le=2**63 - 1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    def unsupported_fields(self) -> list[str]:
        return ["logit_bias"] if self.logit_bias else []

    def cross_field_error(self) -> tuple[str, str] | None:
        """``(param, message)`` for the first rule across fields that this request breaks (as OpenAI and
        vLLM apply them), else None."""
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options can only be set when stream is true"
        return None


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0)  # capped by the engine's max_logprobs
    best_of: int | None = Field(None, ge=1)
    suffix: str | None = None

    def unsupported_fields(self) -> list[str]:
        bad = super().unsupported_fields()
        if self.suffix:
            bad.append("suffix")
        if self.best_of is not None and self.best_of != self.n:
            bad.append("best_of")
        if self.echo and self.logprobs is not None:
            bad.append("echo")  # echo with logprobs needs prompt logprobs
        return bad


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str = "text"


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)  # capped by the engine's max_logprobs
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None  # vLLM's field; refused unless the server trusts request templates

    def cross_field_error(self) -> tuple[str, str] | None:
        if self.top_logprobs is not None and not self.logprobs:
            return "top_logprobs", "when top_logprobs is set, logprobs must be true"
        return super().cross_field_error()

    def unsupported_fields(self) -> list[str]:
        bad = super().unsupported_fields()
        if self.response_format is not None and self.response_format.type != "text":
            bad.append("response_format")
        if self.tools:
            bad.append("tools")
        if self.tool_choice not in (None, "none", "auto"):
            bad.append("tool_choice")
        return bad


# ---------------------------------------------------------------------- responses
class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None


class SpecDecodeInfo(BaseModel):
    """This request's own speculative decoding figures (an extra field clients ignore)."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    acceptance_rate: float
    mean_acceptance_length: float


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort"] | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    spec_decode: SpecDecodeInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort"] | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    spec_decode: SpecDecodeInfo | None = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort"] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None
    spec_decode: SpecDecodeInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "draftwise"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
