"""Request fields draftwise does not implement: accepted only where they ask for nothing.

The server ignores no request field silently. A field that the request
models do not declare (pydantic's ``model_extra``) is checked here:

- a field with no effect on what is generated (``user``, ``metadata``,
  ``service_tier``, the prompt-cache hints, ...) is accepted with any value;
- a field of OpenAI's or vLLM's API that draftwise does not implement is
  accepted only at its neutral value (the value that asks for nothing: its
  API's default, ``null``, ``false``), else refused naming the field, why,
  and the values accepted: ``use_beam_search is not supported yet (...)``;
- any other field is refused as unknown: ``unknown field 'foo'``.

Declared fields with an unimplemented value (``logit_bias``, ``suffix``, ...)
are refused with the same message (``refusal``). ``extra_field_error`` returns
``(param, message)`` for a 400.

Implemented, so declared by the request models and not listed here:
``response_format`` and ``structured_outputs`` (both endpoints,
``server/constraints.py``), chat's ``tools``, ``tool_choice`` (``"none"``,
``"required"``, a named function; ``"auto"`` is refused there, naming
``tool_choice``), ``parallel_tool_calls`` (``server/tools.py``) and vLLM's ``vllm_xargs`` (with a top-level
``num_speculative_tokens``: ``SamplingParams.extra_args``). Still refused:
vLLM's ``guided_*`` fields (vLLM 0.32 removed them), OpenAI's deprecated
``functions`` / ``function_call``, and ``tools`` / ``tool_choice`` on
``/v1/completions``.
"""
from __future__ import annotations

import json
from typing import Any

# Fields whose value changes nothing draftwise produces (identifiers, billing, cache and transport hints).
HARMLESS = frozenset({
    "user", "safety_identifier", "metadata", "service_tier", "prompt_cache_key", "prompt_cache_retention",
    "prompt_cache_options", "parallel_tool_calls", "mm_payload", "return_mm_kwargs", "include_obfuscation"})

_GUIDED = "vLLM removed the guided_* fields: send structured_outputs or response_format"
_TOOLS = "tool calling is served by /v1/chat/completions"
_FUNCTIONS = "OpenAI's deprecated functions API: send tools and tool_choice"
_REASONING = "draftwise has no reasoning parser"
_MODALITIES = "draftwise serves text only"
_SAMPLING = "draftwise's sampler does not implement it"
_OUTPUT = "draftwise does not return it"
_ROUTING = "draftwise's scheduler does not implement it"
_CACHE = "draftwise has no per-request cache isolation or KV transfer"
_TEMPLATE = "draftwise renders the chat template with add_generation_prompt only"
_OPENAI = "draftwise does not implement this OpenAI feature"

# name: (neutral values, in JSON terms; why a non-neutral value is refused)
UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    **{name: ((None,), _GUIDED) for name in (
        "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
        "guided_whitespace_pattern")},
    "tools": ((None, []), _TOOLS),  # chat declares its own (tools.py)
    "tool_choice": ((None, "none", "auto"), _TOOLS),
    "functions": ((None, []), _FUNCTIONS),
    "function_call": ((None, "none", "auto"), _FUNCTIONS),
    "reasoning_effort": ((None,), _REASONING),
    "thinking_token_budget": ((None,), _REASONING),
    "include_reasoning": ((None, True), _REASONING),
    "audio": ((None,), _MODALITIES),
    "modalities": ((None, ["text"]), _MODALITIES),
    "prompt_embeds": ((None,), _MODALITIES),
    "media_io_kwargs": ((None, {}), _MODALITIES),
    "mm_processor_kwargs": ((None, {}), _MODALITIES),
    "logit_bias": ((None, {}), _SAMPLING),
    "use_beam_search": ((None, False), _SAMPLING),
    "length_penalty": ((None, 1.0), _SAMPLING),
    "allowed_token_ids": ((None,), _SAMPLING),
    "bad_words": ((None, []), _SAMPLING),
    "watermarking": ((None,), _SAMPLING),
    "repetition_detection": ((None,), _SAMPLING),
    "spaces_between_special_tokens": ((None, True), _SAMPLING),
    "suffix": ((None, ""), _SAMPLING),
    "truncate_prompt_tokens": ((None,), _SAMPLING),
    "truncation_side": ((None,), _SAMPLING),
    "prompt_logprobs": ((None,), _OUTPUT),
    "logprob_token_ids": ((None,), _OUTPUT),
    "return_tokens_as_token_ids": ((None, False), _OUTPUT),
    "return_token_ids": ((None, False), _OUTPUT),
    "return_token_offsets": ((None, False), _OUTPUT),
    "return_prompt_text": ((None, False), _OUTPUT),
    "routed_experts_prompt_start": ((None, 0), _OUTPUT),
    "echo": ((None, False), _OUTPUT),  # chat's echo (completions implement theirs)
    "stream_interval": ((None, 1), _OUTPUT),
    "continuous_usage_stats": ((None, False), _OUTPUT),
    "priority": ((None, 0), _ROUTING),
    "request_id": ((None,), _ROUTING),
    "session_id": ((None,), _ROUTING),
    "cache_salt": ((None,), _CACHE),
    "kv_transfer_params": ((None,), _CACHE),
    "ec_transfer_params": ((None,), _CACHE),
    "continue_final_message": ((None, False), _TEMPLATE),
    "documents": ((None,), _TEMPLATE),
    "store": ((None, False), _OPENAI),
    "prediction": ((None,), _OPENAI),
    "moderation": ((None,), _OPENAI),
    "verbosity": ((None,), _OPENAI),
    "web_search_options": ((None,), _OPENAI),
}


def is_neutral(name: str, value: Any) -> bool:
    """``value`` asks nothing of ``name`` that draftwise lacks (True for a harmless field)."""
    if name in HARMLESS:
        return True
    neutral, _ = UNSUPPORTED[name]
    return any(_same(value, n) for n in neutral)


def refusal(name: str, param: str | None = None) -> tuple[str, str]:
    """``(param, message)`` refusing a non-neutral value of the known field ``name``."""
    neutral, why = UNSUPPORTED[name]
    allowed = " or ".join(json.dumps(n) for n in neutral)
    return param or name, f"{name} is not supported yet ({why}); send it as {allowed} or leave it out"


def unknown_field(param: str) -> str:
    return f"unknown field {param!r}: draftwise ignores no request field, and does not know this one"


def extra_field_error(extra: dict[str, Any] | None, prefix: str = "") -> tuple[str, str] | None:
    """``(param, message)`` for the first field of ``extra`` (a request's undeclared fields) that is
    unknown or set to a value draftwise does not implement; None if every one is harmless or neutral."""
    for name, value in (extra or {}).items():
        if name not in HARMLESS and name not in UNSUPPORTED:
            return prefix + name, unknown_field(prefix + name)
        if not is_neutral(name, value):
            return refusal(name, prefix + name)
    return None


def _same(value: Any, neutral: Any) -> bool:
    """JSON equality that keeps booleans apart from numbers (``0`` is not ``false``)."""
    if isinstance(value, bool) or isinstance(neutral, bool) or value is None or neutral is None:
        return value is neutral
    return value == neutral
