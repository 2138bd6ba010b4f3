"""``speculative_config``: the vLLM keys, validated, with each method's own options.

``SpeculativeConfig.from_value(raw, target_tensor_parallel_size)`` accepts a
dict or its JSON text (what ``--speculative-config`` / ``-sc`` carries).
Common keys are checked here; the keys of one method are the fields of its
proposer's ``Options`` dataclass, which validates them. Every violation
raises ``ValueError`` naming the key, the value and what is allowed;
unknown keys are an error. The registry of proposers (``interface.py``) is
the only list of methods: a method is valid when a proposer registered it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..drafters import resolve_drafter
from ..validate import PREFIX, check_bool, check_choice, check_int, parse_json
from .drafter_checkpoint import infer_method, speculators_num_tokens
from .interface import Proposer, proposer_class, registered_methods

_COMMON_KEYS = ("method", "num_speculative_tokens", "model", "draft_model", "draft_tensor_parallel_size",
                "disable_padded_drafter_batch")


@dataclass
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    model: str | None = None
    draft_tensor_parallel_size: int = 1
    disable_padded_drafter_batch: bool = False  # only meaningful for drafters with a batched forward
    options: Any = None  # the method's Options instance
    proposer_cls: type[Proposer] | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def from_value(cls, raw, target_tensor_parallel_size: int = 1,
                   target_model: str | None = None) -> "SpeculativeConfig":
        raw = _as_dict(raw)
        method = _method(raw)
        proposer = proposer_class(method)
        if proposer.drafter_in_target and _model(raw) is None and target_model:
            raw["model"] = str(target_model)
        option_keys = [f.name for f in dataclasses.fields(proposer.Options)]
        unknown = sorted(set(raw) - set(_COMMON_KEYS) - set(option_keys))
        if unknown:
            raise ValueError(f"{PREFIX}: unknown key(s) {unknown} for method {method!r}; allowed: "
                             f"{sorted(_COMMON_KEYS + tuple(option_keys))}")
        options = proposer.Options(**{k: raw[k] for k in option_keys if k in raw})
        config = cls(method=method, num_speculative_tokens=_num_tokens(raw, proposer, options),
                     model=_model(raw), options=options, proposer_cls=proposer,
                     draft_tensor_parallel_size=_draft_tp(raw, target_tensor_parallel_size),
                     disable_padded_drafter_batch=raw.get("disable_padded_drafter_batch", False))
        check_bool("disable_padded_drafter_batch", config.disable_padded_drafter_batch)
        proposer.check_config(config)
        return config

    def to_dict(self) -> dict:
        out = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.model is not None:
            out["model"] = self.model
        out.update(dataclasses.asdict(self.options))
        return out


def _as_dict(raw) -> dict:
    if isinstance(raw, str):
        raw = parse_json(PREFIX, raw)
    if not isinstance(raw, dict):
        raise ValueError(f"{PREFIX} must be a dict (or its JSON text), got {type(raw).__name__}")
    return dict(raw)


def _method(raw: dict) -> str:
    if raw.get("method") is None:  # as vLLM: a drafter's config may say what it is
        model = _model(raw)
        method = infer_method(model) if model else None
        if method is None:
            raise ValueError(f"{PREFIX}: 'method' is required (it could not be inferred from 'model'); "
                             f"allowed: {registered_methods()}")
        raw["method"] = method
        return method
    method = raw["method"]
    if isinstance(method, str) and method.endswith("_mtp"):
        return "mtp"  # deepseek_mtp, qwen3_next_mtp, ...: legacy names of the same method
    check_choice("method", method, registered_methods())
    return method


def _num_tokens(raw: dict, proposer: type[Proposer], options) -> int:
    value = raw.get("num_speculative_tokens")
    if value is None:
        value = speculators_num_tokens(_model(raw)) or proposer.default_num_speculative_tokens(options, _model(raw))
        if value is None:
            raise ValueError(f"{PREFIX}: 'num_speculative_tokens' is required for method "
                             f"{proposer.method!r} (an int >= 1)")
    check_int("num_speculative_tokens", value, 1, 128)
    return value


def _model(raw: dict) -> str | None:
    model, alias = raw.get("model"), raw.get("draft_model")
    if model is not None and alias is not None and model != alias:
        raise ValueError(f"{PREFIX}: 'model'={model!r} and its alias 'draft_model'={alias!r} disagree")
    model = model if model is not None else alias
    if model is not None and not isinstance(model, str):
        raise ValueError(f"{PREFIX}['model']={model!r} is invalid: must be a path or model name")
    return resolve_drafter(model) if model is not None else None


def _draft_tp(raw: dict, target_tp: int) -> int:
    value = raw.get("draft_tensor_parallel_size", 1)
    if value is None:
        return 1
    check_int("draft_tensor_parallel_size", value, 1)
    if value not in (1, target_tp):
        raise ValueError(f"{PREFIX}['draft_tensor_parallel_size']={value} is invalid: must be 1 or the "
                         f"target's tensor_parallel_size ({target_tp})")
    return value
