"""SamplingParams: how one request is sampled and when it stops (vLLM-compatible).

Validation happens at construction: every invalid value raises ``ValueError``
naming the field and the allowed range. ``temperature == 0`` means greedy.
``top_k`` of 0 or -1 disables top-k.
"""
from __future__ import annotations

from dataclasses import dataclass, field

_GREEDY_EPS = 1e-5


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
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # Derived, filled by __post_init__.
    stop_strings: list[str] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        _check(isinstance(self.n, int) and self.n >= 1, "n", self.n, "an int >= 1")
        _check(_is_num(self.temperature) and self.temperature >= 0, "temperature",
               self.temperature, "a number >= 0 (0 = greedy)")
        _check(_is_num(self.top_p) and 0 < self.top_p <= 1, "top_p", self.top_p, "in (0, 1]")
        _check(isinstance(self.top_k, int) and self.top_k >= -1, "top_k", self.top_k,
               "an int >= 1, or 0/-1 to disable")
        _check(_is_num(self.min_p) and 0 <= self.min_p <= 1, "min_p", self.min_p, "in [0, 1]")
        _check(self.seed is None or isinstance(self.seed, int), "seed", self.seed, "an int or None")
        if self.max_tokens is not None:
            _check(isinstance(self.max_tokens, int) and self.max_tokens >= 1, "max_tokens",
                   self.max_tokens, "an int >= 1")
        _check(isinstance(self.min_tokens, int) and self.min_tokens >= 0, "min_tokens",
               self.min_tokens, "an int >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens={self.min_tokens} must be <= max_tokens={self.max_tokens}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(_is_num(value) and -2 <= value <= 2, name, value, "in [-2, 2]")
        _check(_is_num(self.repetition_penalty) and self.repetition_penalty > 0,
               "repetition_penalty", self.repetition_penalty, "a number > 0")
        if self.logprobs is not None:
            _check(isinstance(self.logprobs, int) and self.logprobs >= 0, "logprobs",
                   self.logprobs, "an int >= 0 or None")
        self.stop_strings = _normalize_stop(self.stop)
        ids = self.stop_token_ids or []
        _check(all(isinstance(t, int) and t >= 0 for t in ids), "stop_token_ids",
               self.stop_token_ids, "a list of non-negative ints")
        self.stop_token_ids = list(ids)
        if self.temperature < _GREEDY_EPS:
            self.temperature = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1.0)


def _is_num(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check(ok: bool, name: str, value, allowed: str) -> None:
    if not ok:
        raise ValueError(f"SamplingParams.{name}={value!r} is invalid: must be {allowed}")


def _normalize_stop(stop) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise ValueError(f"SamplingParams.stop={stop!r} is invalid: must be a non-empty string "
                         "or a list of non-empty strings")
    return list(stop)
