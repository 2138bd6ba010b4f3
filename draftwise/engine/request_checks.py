"""What a request must satisfy before it enters the engine, beyond ``SamplingParams``' own checks.

``SamplingParams`` checks what needs no model (ranges, int64 bounds, cross-field
rules); ``check_request`` adds what depends on the model and on the caps that
protect the pool: prompt token ids inside the vocabulary, the context length,
the KV cache's capacity, ``stop_token_ids`` inside the vocabulary, and
``config.RequestLimits`` (``n``, ``logprobs``, ``prompt_logprobs`` where ``-1`` counts as the
whole vocabulary, the number and length of stop strings).
``LLMEngine.add_request`` calls it for every request, so ``LLM.generate`` and
the server share one validator: a violation raises ``ValueError`` naming the
field (``SamplingParams.<field>=...`` where it is a sampling field), before
any engine state changes.
"""
from __future__ import annotations

from ..config import RequestLimits
from ..sampling_params import SamplingParams, is_encodable, short_repr


def check_prompt_text(text: str, field: str = "prompt") -> None:
    if not is_encodable(text):
        raise ValueError(f"{field} is invalid: it must be valid Unicode text (it holds a lone surrogate)")


def check_request(prompt_token_ids: list[int], params: SamplingParams, vocab_size: int, max_model_len: int,
                  kv_capacity: int, limits: RequestLimits, num_speculative_tokens: int = 0) -> None:
    """Raise ``ValueError`` (naming the field) unless the request can run to completion here
    (``num_speculative_tokens``: the engine's, 0 where it does not speculate)."""
    _check_prompt(prompt_token_ids, vocab_size, max_model_len)
    _check_limits(params, limits, vocab_size)
    cap = params.num_speculative_tokens
    if cap is not None and cap > num_speculative_tokens:
        raise ValueError(f"SamplingParams.extra_args={short_repr(params.extra_args)} is invalid: "
                         f"num_speculative_tokens must be in [0, {num_speculative_tokens}], the engine's "
                         f"num_speculative_tokens" + ("" if num_speculative_tokens else " (it does not speculate)"))
    if params.stop_token_ids and not 0 <= max(params.stop_token_ids) < vocab_size:
        raise ValueError(f"SamplingParams.stop_token_ids={short_repr(params.stop_token_ids)} is invalid: "
                         f"token ids must be in [0, {vocab_size})")
    longest = min(max_model_len, len(prompt_token_ids) + (params.max_tokens or max_model_len))
    if longest > kv_capacity:
        raise ValueError(f"this request may need {longest} KV slots but the whole KV cache holds "
                         f"{kv_capacity}: raise kv_cache_memory_bytes or lower max_tokens")


def _check_prompt(token_ids: list[int], vocab_size: int, max_model_len: int) -> None:
    if not token_ids:
        raise ValueError("the prompt is empty: give at least one token")
    if min(token_ids) < 0 or max(token_ids) >= vocab_size:
        raise ValueError(f"prompt_token_ids must be in [0, {vocab_size})")
    if len(token_ids) >= max_model_len:
        raise ValueError(f"the prompt has {len(token_ids)} tokens, more than max_model_len="
                         f"{max_model_len} allows (it must leave room for one output token)")


def _check_limits(params: SamplingParams, limits: RequestLimits, vocab_size: int) -> None:
    def over(name: str, value, cap: int, flag: str) -> None:
        raise ValueError(f"SamplingParams.{name}={short_repr(value)} is invalid: at most {cap} allowed "
                         f"(the engine's {flag})")

    if params.n > limits.max_n:
        over("n", params.n, limits.max_n, "max_n")
    if params.logprobs is not None and params.logprobs > limits.max_logprobs:
        over("logprobs", params.logprobs, limits.max_logprobs, "max_logprobs")
    num_prompt = vocab_size if params.prompt_logprobs == -1 else params.prompt_logprobs
    if num_prompt is not None and num_prompt > limits.max_logprobs:
        flag = "max_logprobs" + (f"; -1 asks for all {vocab_size} tokens" if params.prompt_logprobs == -1 else "")
        over("prompt_logprobs", params.prompt_logprobs, limits.max_logprobs, flag)
    if len(params.stop_strings) > limits.max_stop_strings:
        over("stop", f"<{len(params.stop_strings)} strings>", limits.max_stop_strings, "max_stop_strings")
    longest = max((len(s) for s in params.stop_strings), default=0)
    if longest > limits.max_stop_string_length:
        over("stop", f"<a string of {longest} characters>", limits.max_stop_string_length,
             "max_stop_string_length (characters)")
