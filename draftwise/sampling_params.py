"""SamplingParams: how one request is sampled and when it stops (vLLM-compatible).

Validation happens at construction: every invalid value raises ``ValueError``
naming the field (``SamplingParams.<field>=...``) and the allowed range. Every
integer must fit the engine's int64 tensors, seeds included: sequence ``i`` of
a request samples with ``seed + i``, so ``seed + n - 1`` must fit too. Stop
strings must be encodable text (no lone surrogates). What depends on the model
(token ids inside the vocabulary, the context length) and the server's caps is
checked by ``engine/request_checks.py`` when the request is added.
``temperature == 0`` means greedy. ``top_k`` of 0 or -1 disables top-k.
``logprobs`` / ``prompt_logprobs`` ask for the top-N logprobs of each output /
prompt token besides the token's own (``prompt_logprobs=-1``: the whole vocabulary).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .structured.params import StructuredOutputsParams

_GREEDY_EPS = 1e-5
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsParams | None = None  # what the output must match (structured/)
    # vLLM's per-request extension dict; draftwise reads EXTRA_ARGS: {"num_speculative_tokens": k} caps this
    # request's drafts per step at k (0: no drafting for it; at most the engine's num_speculative_tokens)
    extra_args: dict | None = None
    # Derived, filled by __post_init__.
    stop_strings: list[str] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        _check(_is_int(self.n, 1), "n", self.n, "an int >= 1")
        _check(_is_num(self.temperature) and self.temperature >= 0, "temperature",
               self.temperature, "a number >= 0 (0 = greedy)")
        _check(_is_num(self.top_p) and 0 < self.top_p <= 1, "top_p", self.top_p, "in (0, 1]")
        _check(_is_int(self.top_k, -1), "top_k", self.top_k, "an int >= 1, or 0/-1 to disable")
        _check(_is_num(self.min_p) and 0 <= self.min_p <= 1, "min_p", self.min_p, "in [0, 1]")
        if self.seed is not None:
            _check(_is_int(self.seed, INT64_MIN, INT64_MAX - self.n + 1), "seed", self.seed,
                   f"an int in [{INT64_MIN}, {INT64_MAX} - n + 1] (sequence i samples with seed + i)")
        if self.max_tokens is not None:
            _check(_is_int(self.max_tokens, 1), "max_tokens", self.max_tokens, "an int >= 1")
        _check(_is_int(self.min_tokens, 0), "min_tokens", self.min_tokens, "an int >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            _check(False, "min_tokens", self.min_tokens, f"<= max_tokens={self.max_tokens}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(_is_num(value) and -2 <= value <= 2, name, value, "in [-2, 2]")
        _check(_is_num(self.repetition_penalty) and self.repetition_penalty > 0,
               "repetition_penalty", self.repetition_penalty, "a number > 0")
        if self.logprobs is not None:
            _check(_is_int(self.logprobs, 0), "logprobs", self.logprobs, "an int >= 0 or None")
        if self.prompt_logprobs is not None:
            _check(_is_int(self.prompt_logprobs, -1), "prompt_logprobs", self.prompt_logprobs,
                   "an int >= 0, -1 (the whole vocabulary) or None")
        self.stop_strings = _normalize_stop(self.stop)
        ids = self.stop_token_ids or []
        _check(isinstance(ids, (list, tuple)) and all(_is_int(t, 0) for t in ids), "stop_token_ids",
               self.stop_token_ids, "a list of non-negative ints")
        self.stop_token_ids = list(ids)
        _check(self.structured_outputs is None or isinstance(self.structured_outputs, StructuredOutputsParams),
               "structured_outputs", self.structured_outputs, "a StructuredOutputsParams or None")
        _check_extra_args(self.extra_args)
        if self.temperature < _GREEDY_EPS:
            self.temperature = 0.0

    @property
    def num_speculative_tokens(self) -> int | None:
        """The request's cap on drafts per step (``extra_args``), or None: the engine's."""
        return (self.extra_args or {}).get("num_speculative_tokens")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1.0)


EXTRA_ARGS = ("num_speculative_tokens",)  # the extra_args keys draftwise reads


def _check_extra_args(extra_args) -> None:
    _check(extra_args is None or isinstance(extra_args, dict), "extra_args", extra_args, "a dict or None")
    unknown = sorted(set(extra_args or {}) - set(EXTRA_ARGS), key=str)
    _check(not unknown, "extra_args", extra_args, f"a dict of the keys {list(EXTRA_ARGS)} (unknown: {unknown})")
    cap = (extra_args or {}).get("num_speculative_tokens")
    _check(cap is None or _is_int(cap, 0, INT64_MAX), "extra_args", extra_args,
           "{'num_speculative_tokens': an int >= 0} (0 turns drafting off for this request)")


def _is_num(value) -> bool:
    """A finite int or float (not a bool, NaN, an infinity, or an int too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) < 1e300 if isinstance(value, int) else math.isfinite(value)


def _is_int(value, lo: int, hi: int = INT64_MAX) -> bool:
    """An int (not a bool) in [lo, hi]; ``hi`` defaults to what an int64 tensor holds."""
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def _check(ok: bool, name: str, value, allowed: str) -> None:
    if not ok:
        raise ValueError(f"SamplingParams.{name}={short_repr(value)} is invalid: must be {allowed}")


def short_repr(value, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: error messages never echo a huge input."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _normalize_stop(stop) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise ValueError(f"SamplingParams.stop={short_repr(stop)} is invalid: must be a non-empty string "
                         "or a list of non-empty strings")
    for text in stop:
        if not is_encodable(text):
            raise ValueError(f"SamplingParams.stop={short_repr(text)} is invalid: must be valid Unicode text "
                             "(it holds a lone surrogate)")
    return list(stop)


def is_encodable(text: str) -> bool:
    """Whether ``text`` is valid Unicode (UTF-8 encodable: no lone surrogates such as ``\\ud800``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
