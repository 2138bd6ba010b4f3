"""Shorter and older ways vLLM users ask for speculative decoding, folded into ``speculative_config``.

* vLLM's current shorthands ``spec_method``, ``spec_model``, ``spec_tokens`` (``--spec-method`` ...):
  each sets one key of ``speculative_config``; setting a key both ways is an error, as in vLLM.
* the first vLLM guide's keywords (vLLM V0): ``speculative_model="[ngram]"`` (or a drafter's path),
  ``num_speculative_tokens``, ``ngram_prompt_lookup_max/min``, ``speculative_draft_tensor_parallel_size``,
  ``speculative_max_model_len``, ``speculative_disable_by_batch_size``, with ``use_v2_block_manager``
  and other V0 engine keywords accepted as no-ops. One deprecation line shows the modern config.

``fold_speculative_shorthands(kwargs)`` returns the keyword arguments with these names removed
and ``speculative_config`` set; every other name passes through untouched.
"""
from __future__ import annotations

import logging

from ...drafters import resolve_drafter
from ...spec_decode.config import as_config_dict
from ...spec_decode.drafter_checkpoint import infer_method

logger = logging.getLogger("draftwise")

CURRENT = {"spec_method": "method", "spec_model": "model", "spec_tokens": "num_speculative_tokens"}
LEGACY = {"speculative_model": "model", "num_speculative_tokens": "num_speculative_tokens",
          "ngram_prompt_lookup_max": "prompt_lookup_max", "ngram_prompt_lookup_min": "prompt_lookup_min",
          "speculative_draft_tensor_parallel_size": "draft_tensor_parallel_size",
          "speculative_max_model_len": "max_model_len",
          "speculative_disable_by_batch_size": "disable_by_batch_size"}
# V0 engine keywords with no effect in vLLM V1 either: accepted, named in the deprecation line
LEGACY_NOOPS = ("use_v2_block_manager", "swap_space", "max_seq_len_to_capture", "disable_log_requests",
                "num_lookahead_slots", "preemption_mode", "disable_logprobs_during_spec_decoding")
_NGRAM_MODEL = "[ngram]"


def fold_speculative_shorthands(kwargs: dict) -> dict:
    out = dict(kwargs)
    current = {CURRENT[name]: out.pop(name) for name in CURRENT if out.get(name) is not None}
    for name in CURRENT:
        out.pop(name, None)
    legacy = {name: out.pop(name) for name in list(LEGACY) + list(LEGACY_NOOPS) if name in out}
    if not current and not any(legacy.get(name) is not None for name in LEGACY):
        if legacy:
            logger.warning("draftwise: %s: vLLM V0 arguments with no effect since vLLM V1; drop them",
                           ", ".join(sorted(legacy)))
        return out
    raw = out.get("speculative_config")
    spec = {} if raw is None else as_config_dict(raw)
    for key, value in current.items():
        _set(spec, key, value, f"spec_{'tokens' if key == 'num_speculative_tokens' else key}")
    if any(legacy.get(name) is not None for name in LEGACY):
        _fold_legacy(spec, legacy)
    out["speculative_config"] = spec
    return out


def _fold_legacy(spec: dict, legacy: dict) -> None:
    model = legacy.get("speculative_model")
    if model is None and not spec:
        raise ValueError(f"{sorted(n for n in LEGACY if legacy.get(n) is not None)} need speculative_model "
                         "(vLLM's older form); use speculative_config={'method': ..., ...} instead")
    for name, key in LEGACY.items():
        value = legacy.get(name)
        if value is None or name == "speculative_model":
            continue
        _set(spec, key, value, name)
    if model == _NGRAM_MODEL:
        _set(spec, "method", "ngram", "speculative_model")
    elif model is not None:
        _set(spec, "model", model, "speculative_model")
        _set(spec, "method", infer_method(resolve_drafter(model)) or "draft_model", "speculative_model")
    logger.warning("draftwise: %s are vLLM's older speculative arguments; the same engine is "
                   "speculative_config=%r", ", ".join(sorted(legacy)), spec)


def _set(spec: dict, key: str, value, name: str) -> None:
    if key in spec and spec[key] != value:
        raise ValueError(f"{name}={value!r} and speculative_config[{key!r}]={spec[key]!r} disagree; give one")
    spec[key] = value
