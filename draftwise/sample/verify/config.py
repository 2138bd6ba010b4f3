"""``additional_config["rejection_sampler_config"]``: which rules verify sampled drafts.

The keys are vLLM-Ascend's (``RejectionSamplerConfig`` in its ``ascend_config.py``)
plus ``block_verify_mode``; every one is optional and all are off by default:

* ``enable_block_verify`` (False): verify the draft block jointly (``formulas.py``).
  Acts only when ``num_speculative_tokens >= 3``, as in vLLM-Ascend
  (``for_num_speculative_tokens``).
* ``block_verify_mode`` ("lossless"): ``"lossless"`` is Sun et al. 2024
  (arXiv 2403.10444) Algorithm 2, which keeps the target distribution;
  ``"cumulative"`` is the cumulative-product rule vLLM-Ascend ships, which
  does not (it accepts more).
* ``enable_entropy_verify`` (False): lower the acceptance bar by
  ``tau = min(exp(-posterior_alpha * H(p)), posterior_threshold)``. Lossy.
* ``posterior_threshold`` (0.95): a number in (0, 1].
* ``posterior_alpha`` (0.4): a finite number >= 0.

``RejectionSamplerConfig.from_value(raw)`` takes the dict (``None``: all off).
Unknown keys, non-bool switches and out-of-range numbers raise ``ValueError``
naming the key, the value and what is allowed. Greedy requests never use any
of these rules.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ...validate import check_bool, check_choice, check_float
from .rules import CumulativeBlockRule, Entropy, LosslessBlockRule, StandardRule, VerifyRule

PREFIX = "additional_config['rejection_sampler_config']"
BLOCK_VERIFY_MODES = ("lossless", "cumulative")
MIN_BLOCK_VERIFY_TOKENS = 3  # vLLM-Ascend: block verify needs max_spec_len >= 3


@dataclass(slots=True, frozen=True)
class RejectionSamplerConfig:
    enable_block_verify: bool = False
    enable_entropy_verify: bool = False
    posterior_threshold: float = 0.95
    posterior_alpha: float = 0.4
    block_verify_mode: str = "lossless"

    def __post_init__(self) -> None:
        check_bool("enable_block_verify", self.enable_block_verify, prefix=PREFIX)
        check_bool("enable_entropy_verify", self.enable_entropy_verify, prefix=PREFIX)
        check_float("posterior_threshold", self.posterior_threshold, 0.0, 1.0, lo_open=True, prefix=PREFIX)
        check_float("posterior_alpha", self.posterior_alpha, 0.0, prefix=PREFIX)
        if not math.isfinite(self.posterior_alpha):
            raise ValueError(f"{PREFIX}['posterior_alpha']={self.posterior_alpha!r} is invalid: must be finite")
        check_choice("block_verify_mode", self.block_verify_mode, BLOCK_VERIFY_MODES, prefix=PREFIX)

    @classmethod
    def from_value(cls, raw) -> "RejectionSamplerConfig":
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise ValueError(f"{PREFIX} must be a dict, got {type(raw).__name__}")
        allowed = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(raw) - set(allowed))
        if unknown:
            raise ValueError(f"{PREFIX}: unknown key(s) {unknown}; allowed: {allowed}")
        return cls(**raw)

    def for_num_speculative_tokens(self, num_speculative_tokens: int) -> "RejectionSamplerConfig":
        """The rules that act at this draft length: block verify needs at least 3 drafts."""
        if self.enable_block_verify and num_speculative_tokens < MIN_BLOCK_VERIFY_TOKENS:
            return dataclasses.replace(self, enable_block_verify=False)
        return self

    @property
    def block_mode(self) -> str | None:
        """"lossless", "cumulative", or None when block verify is off."""
        return self.block_verify_mode if self.enable_block_verify else None

    @property
    def is_lossless(self) -> bool:
        return self.rule().lossless

    def rule(self) -> VerifyRule:
        """The rule this configuration selects for sampled drafts (``rules.py``)."""
        entropy = Entropy(self.posterior_alpha, self.posterior_threshold) if self.enable_entropy_verify else None
        if self.block_mode == "lossless":
            return LosslessBlockRule(entropy)
        if self.block_mode == "cumulative":
            return CumulativeBlockRule(entropy)
        return StandardRule(entropy)
