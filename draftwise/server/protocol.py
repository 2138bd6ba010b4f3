"""OpenAI API request/response models (pydantic) and OpenAI's error format.

Requests validate ranges where OpenAI's API defines them (temperature in
[0, 2], penalties in [-2, 2], top_p in (0, 1], ...); a violation becomes a
400 with ``{"error": {"message", "type", "param", "code"}}``. vLLM's extra
sampling fields (``top_k``, ``min_p``, ``repetition_penalty``,
``min_tokens``, ``ignore_eos``, ``stop_token_ids``, ``add_special_tokens``,
...) are accepted too, through the client's ``extra_body``. No field is
ignored: ``unsupported_field`` names the first field that is unknown or set
to a value draftwise does not implement (``compat.vllm.request_fields``), answered with
400; harmless fields (``user``, ``metadata``, ...) and neutral values pass.
OpenAI's ``response_format`` and vLLM's ``structured_outputs`` (both
endpoints) and chat's ``tools`` / ``tool_choice`` / ``parallel_tool_calls``
are declared here and resolved in ``constraints`` and ``tools``.

Responses follow OpenAI's shapes (tool calls: ``tool_protocol``), plus vLLM's: ``/tokenize`` and
``/detokenize``, the model card's fields, and ``metrics.speculative_decoding``
(vLLM's per-request speculative decoding figures) beside draftwise's own
``spec_decode``.
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..compat.vllm.request_fields import extra_field_error, is_neutral, refusal
from .tool_protocol import ChatTool, DeltaToolCall, ToolCall


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")  # checked by ``extra_field_error``

    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: OpenAI's ``{"name", "description", "schema", "strict"}``."""
    model_config = ConfigDict(extra="allow")  # checked by ``extra_field_error``

    name: str
    description: str | None = None
    json_schema: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format`` (and vLLM's ``structural_tag`` form, whose own fields are its extras)."""
    model_config = ConfigDict(extra="allow")  # checked by ``unsupported_field`` (a structural tag's are its own)

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None

    def unsupported_field(self) -> tuple[str, str] | None:
        if self.type != "structural_tag":
            broken = extra_field_error(self.model_extra, "response_format.")
            if broken:
                return broken
        if self.json_schema is not None:
            return extra_field_error(self.json_schema.model_extra, "response_format.json_schema.")
        return None


class _SamplingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # checked by ``extra_field_error``

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
    response_format: ResponseFormat | None = None  # OpenAI's; vLLM reads it on completions too
    structured_outputs: dict[str, Any] | None = None  # vLLM's: StructuredOutputsParams' fields (constraints.py)
    # vLLM's per-request extension dict (SamplingParams.extra_args); draftwise reads num_speculative_tokens,
    # also accepted at the top level of the request (an OpenAI client's extra_body)
    vllm_xargs: dict[str, Any] | None = None
    num_speculative_tokens: Any = None

    def extra_args(self) -> dict | None:
        """``SamplingParams.extra_args``: ``vllm_xargs`` with a top-level ``num_speculative_tokens``."""
        if self.num_speculative_tokens is None:
            return self.vllm_xargs
        merged = dict(self.vllm_xargs or {})
        if merged.get("num_speculative_tokens", self.num_speculative_tokens) != self.num_speculative_tokens:
            raise ValueError("SamplingParams.extra_args=vllm_xargs is invalid: num_speculative_tokens is given twice, "
                             "at the top level and in vllm_xargs, with different values")
        merged["num_speculative_tokens"] = self.num_speculative_tokens
        return merged

    def unsupported_field(self) -> tuple[str, str] | None:
        """``(param, message)`` for the first field that is unknown or asks for what draftwise does not
        implement, else None."""
        if not is_neutral("logit_bias", self.logit_bias):
            return refusal("logit_bias")
        if self.stream_options is not None:
            broken = extra_field_error(self.stream_options.model_extra, "stream_options.")
            if broken:
                return broken
        if self.response_format is not None:
            broken = self.response_format.unsupported_field()
            if broken:
                return broken
        return extra_field_error(self.model_extra)

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
    add_special_tokens: bool = True  # vLLM's: tokenize a string prompt with the tokenizer's special tokens

    def unsupported_field(self) -> tuple[str, str] | None:
        if not is_neutral("suffix", self.suffix):
            return refusal("suffix")
        if self.best_of is not None and self.best_of != self.n:
            return "best_of", (f"best_of={self.best_of} is not supported yet: draftwise returns the n={self.n} "
                               "choices it samples (best_of must be n or left out)")
        if self.echo and self.logprobs is not None:
            return "echo", "echo with logprobs is not supported yet (it needs prompt logprobs)"
        return super().unsupported_field()


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)  # capped by the engine's max_logprobs
    tools: list[ChatTool] | None = None
    tool_choice: Any = None  # "none", "auto", "required" or a named function: checked in ``tools``
    parallel_tool_calls: bool | None = None  # false: at most one call (tool_choice "required")
    add_generation_prompt: bool = True
    add_special_tokens: bool = False  # vLLM's: special tokens on top of what the chat template adds
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None  # vLLM's field; refused unless the server trusts request templates

    def cross_field_error(self) -> tuple[str, str] | None:
        if self.top_logprobs is not None and not self.logprobs:
            return "top_logprobs", "when top_logprobs is set, logprobs must be true"
        return super().cross_field_error()



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


class SpeculativeDecodingMetrics(BaseModel):
    """vLLM's per-request speculative decoding figures (``--per-request-spec-decode-metrics``)."""

    mean_acceptance_length: float  # 1 + accepted / verify steps: the bonus token included
    draft_acceptance_rate: float  # accepted / proposed draft tokens
    acceptance_histogram: list[int]  # [j]: verify steps that accepted exactly j draft tokens
    num_spec_steps: int
    num_accepted_draft_tokens: int
    num_draft_tokens: int
    num_spec_tokens: int
    per_step_accepted: list[int] | None = None  # "detailed" only: one entry per verify step
    per_step_drafted: list[int] | None = None


class PerRequestMetrics(BaseModel):
    """vLLM's response ``metrics`` object (draftwise fills its speculative decoding part)."""

    speculative_decoding: SpeculativeDecodingMetrics | None = None


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
    metrics: PerRequestMetrics | None = None


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
    tool_calls: list[ToolCall] = Field(default_factory=list)  # as vLLM: [] when no tool was called


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort", "tool_calls"] | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    spec_decode: SpecDecodeInfo | None = None
    metrics: PerRequestMetrics | None = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort", "tool_calls"] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None
    spec_decode: SpecDecodeInfo | None = None
    metrics: PerRequestMetrics | None = None


class ModelPermission(BaseModel):
    id: str = Field(default_factory=lambda: f"modelperm-{uuid.uuid4().hex}")
    object: Literal["model_permission"] = "model_permission"
    created: int = Field(default_factory=lambda: int(time.time()))
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "draftwise"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[ModelPermission] = Field(default_factory=lambda: [ModelPermission()])


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# ---------------------------------------------------------------------- /tokenize, /detokenize (vLLM's)
class TokenizeCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # checked by ``extra_field_error``

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # checked by ``extra_field_error``

    model: str | None = None
    messages: list[ChatMessage]
    add_generation_prompt: bool = True
    add_special_tokens: bool = False
    return_token_strs: bool | None = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None  # rendered by the chat template, as the chat endpoint renders them


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # checked by ``extra_field_error``

    model: str | None = None
    tokens: list[int]  # range-checked against the vocabulary by the handler


class DetokenizeResponse(BaseModel):
    prompt: str


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
