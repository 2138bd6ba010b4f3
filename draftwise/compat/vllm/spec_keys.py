"""The keys of vLLM's ``speculative_config`` that select nothing in draftwise, and what each does here.

``strip_vllm_keys(raw)`` is the edge between a user's ``speculative_config`` and the core
``SpeculativeConfig``, which knows none of these keys: it refuses unknown keys as the core does
(naming these among the allowed), checks these keys, and returns the config without them.
``EngineConfig`` calls it on every ``speculative_config`` it is given (``LLM``, ``serve``,
``generate`` and a directly built ``EngineConfig`` alike).

A config pasted from vLLM (or from an older vLLM's docs) may carry keys that tune vLLM's own
machinery (kernels, compilation, Hub revisions, V0's scorer) or that switch on features
draftwise does not have. ``KEYS`` lists each with the values that need no word (vLLM's
default first):

* no-op keys: ignoring them cannot change a token of the output. The value is
  type-checked; any other value than the quiet ones is logged once, as
  ``draftwise: speculative_config['revision']='main' is ignored: <why>``.
* refused keys: ignoring them would change what the user asked for (another
  verification rule, a quantized drafter, tree or parallel drafting); any other value
  raises ``ValueError`` naming the key, why, and the value allowed.

Keys draftwise gives a meaning (``max_model_len``, ``disable_by_batch_size``,
``tensor_parallel_size``, ...) are read by ``spec_decode/config.py``; a method's own keys (the
fields of its proposer's ``Options``, e.g. ``draft_model``'s ``draft_sample_method``) take
precedence over this table: they are left in the config for the method's options to read.
"""
from __future__ import annotations

import logging
from typing import Any, NamedTuple

from ...spec_decode.config import as_config_dict, check_known_keys, method_option_keys
from ...validate import PREFIX, as_bool

logger = logging.getLogger("draftwise")


class VllmKey(NamedTuple):
    kind: str  # "bool", "str", "number" (value type-checked) or "any"
    quiet: tuple[Any, ...]  # values taken without a word; vLLM's default first
    refused: bool  # True: any other value raises; False: it is logged and ignored
    why: str


_REVISION = "models are loaded from local paths here, so a revision has nothing to select"
_KERNELS = "draftwise chooses the drafter's kernels itself"
_TYPICAL = ("vLLM read it only with acceptance_method='typical_acceptance_sampler'; draftwise's relaxed "
            "verification is additional_config['rejection_sampler_config'] (enable_entropy_verify, "
            "posterior_threshold, posterior_alpha)")
_SYNTHETIC = "synthetic acceptance (rejection_sample_method='synthetic') is not built"
_DSPARK = "it is for method 'dspark', which is not built"

KEYS: dict[str, VllmKey] = {
    # no-ops
    "enforce_eager": VllmKey("bool", (None, False), False,
                             "draftwise's drafters never compile their forward: they run eagerly already"),
    "revision": VllmKey("str", (None,), False, _REVISION),
    "code_revision": VllmKey("str", (None,), False, _REVISION),
    "index_share_for_mtp_iteration": VllmKey("bool", (None,), False, "it concerns MTP layers with sparse "
                                             "(indexer) attention, which draftwise does not load"),
    "disable_eagle_block_drop": VllmKey("bool", (False,), False, "draftwise decides which cached blocks a "
                                        "hidden-state drafter reuses; the outputs are the same either way"),
    "use_local_argmax_reduction": VllmKey("bool", (False,), False, "drafts are argmaxed on one device: there "
                                          "is no vocab-parallel reduction to replace"),
    "moe_backend": VllmKey("str", (None,), False, _KERNELS),
    "attention_backend": VllmKey("str", (None, "auto"), False, _KERNELS),
    "kv_cache_dtype": VllmKey("str", (None, "auto"), False, "the drafter's KV cache has the target's dtype, "
                              "in the same paged pool"),
    "disable_log_stats": VllmKey("bool", (None, False), False, "speculative decoding's periodic log lines "
                                 "follow the engine's disable_log_stats (LLM(disable_log_stats=True), "
                                 "--disable-log-stats)"),
    "disable_logprobs": VllmKey("bool", (False,), False, "logprobs are always the target's, computed in the "
                                "verifying forward"),
    "disable_mqa_scorer": VllmKey("bool", (False,), False, "a choice of vLLM V0's scoring kernel; draftwise "
                                  "scores all drafts in its one batched forward"),
    "posterior_threshold": VllmKey("number", (None,), False, _TYPICAL),
    "posterior_alpha": VllmKey("number", (None,), False, _TYPICAL),
    # refused
    "quantization": VllmKey("any", (None,), True, "draftwise does not quantize drafters: the drafter's "
                            "weights are used as stored, in the target's dtype"),
    "parallel_drafting": VllmKey("bool", (False,), True, "parallel drafting (P-EAGLE, PARD) is not built: "
                                 "drafts are made one position after another"),
    "use_heterogeneous_vocab": VllmKey("bool", (False,), True, "a drafter needs the target's vocabulary here "
                                       "(no token-intersection drafting)"),
    "draft_load_config": VllmKey("any", (None,), True, "the drafter loads from its local directory with "
                                 "draftwise's own loader, which takes no load options"),
    "rejection_sample_method": VllmKey("any", ("standard",), True, "'block' is additional_config="
                                       "{'rejection_sampler_config': {'enable_block_verify': True}} here; "
                                       "'synthetic' is not built"),
    "synthetic_acceptance_rates": VllmKey("any", (None,), True, _SYNTHETIC),
    "synthetic_acceptance_length": VllmKey("any", (None,), True, _SYNTHETIC),
    "acceptance_method": VllmKey("any", ("rejection_sampler",), True, "typical acceptance changes the output "
                                 "distribution; draftwise's relaxed verification is additional_config"
                                 "['rejection_sampler_config'] with enable_entropy_verify"),
    "enable_adaptive_verification": VllmKey("bool", (False,), True, _DSPARK),
    "dspark_draft_topk": VllmKey("any", (None,), True, _DSPARK),
    "draft_sample_method": VllmKey("any", ("greedy",), True, "only method 'draft_model' draws probabilistic "
                                   "drafts here; this method drafts its argmax"),
}


def strip_vllm_keys(raw) -> dict:
    """``raw`` (a speculative config dict or its JSON text) as a dict without the ``KEYS`` its method's
    options do not own, those checked by ``check_vllm_keys``. ``ValueError``, in ``SpeculativeConfig``'s
    order: an invalid method, model or suffix mix, then unknown keys, then a refused or mistyped key."""
    raw = as_config_dict(raw)
    method, option_keys = method_option_keys(raw)
    check_known_keys(raw, method, option_keys, also_allowed=KEYS)
    vllm_only = {k: v for k, v in raw.items() if k in KEYS and k not in option_keys}
    check_vllm_keys(vllm_only)
    return {k: v for k, v in raw.items() if k not in vllm_only}


def check_vllm_keys(values: dict) -> None:
    """Type-check the ``KEYS`` in ``values``; log the ignored ones set away from their quiet
    values, raise ``ValueError`` for a refused one."""
    for name, value in values.items():
        key = KEYS[name]
        value = _typed(name, key, value)
        if any(value is quiet or (value == quiet and type(value) is type(quiet)) for quiet in key.quiet):
            continue
        if key.refused:
            allowed = " or ".join(repr(v) for v in key.quiet)
            raise ValueError(f"{PREFIX}[{name!r}]={value!r} is not supported: {key.why}; allowed: {allowed}")
        logger.info("draftwise: %s[%r]=%r is ignored: %s", PREFIX, name, value, key.why)


def _typed(name: str, key: VllmKey, value):
    if key.kind == "any" or (value is None and None in key.quiet):
        return value
    if key.kind == "bool":
        return as_bool(name, value)
    if key.kind == "str" and not isinstance(value, str):
        raise ValueError(f"{PREFIX}[{name!r}]={value!r} is invalid: must be a string")
    if key.kind == "number" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"{PREFIX}[{name!r}]={value!r} is invalid: must be a number")
    return value
