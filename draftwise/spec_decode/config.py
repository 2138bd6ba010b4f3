"""``speculative_config``: the keys draftwise reads, validated, with each method's own options.

``SpeculativeConfig.from_value(raw, target_tensor_parallel_size)`` accepts a
dict or its JSON text (what ``--speculative-config`` / ``-sc`` carries).
Common keys are checked here; the keys of one method are the fields of its
proposer's ``Options`` dataclass, which validates them. Switches read vLLM's
spellings ("False", "true", 1, ...: ``validate.read_bools``). Every violation
raises ``ValueError`` naming the key, the value and what is allowed; any other
key is unknown, an error. The registry of proposers (``interface.py``) is the
only list of methods: a method is valid when a proposer registered it.

This module knows no other engine's keys. vLLM's keys that select nothing here
are checked and removed before ``from_value`` by the edge
(``draftwise.compat.vllm.spec_keys``, called by ``EngineConfig``), which asks
``method_option_keys`` which keys a method owns and ``check_known_keys`` to
refuse the unknown ones with its own keys named among the allowed.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..drafters import resolve_drafter
from ..validate import PREFIX, as_bool, check_choice, check_int, parse_json, read_bools
from .batch_limits import SCHEDULE_KEY, BatchSizeLimits, Schedule, parse_schedule
from .drafter_checkpoint import infer_method, speculators_num_tokens
from .interface import Proposer, proposer_class, registered_methods
from .token_tree import KEY as TREE_KEY
from .token_tree import TokenTree

SUFFIX_MIX_KEY = "enable_suffix_decoding"  # Arctic Inference's key: model drafts mixed with suffix drafts
_COMMON_KEYS = ("method", "num_speculative_tokens", "model", "draft_model", "draft_tensor_parallel_size",
                "tensor_parallel_size", "disable_padded_drafter_batch", "max_model_len", "disable_by_batch_size",
                SCHEDULE_KEY, SUFFIX_MIX_KEY, TREE_KEY)
NOT_MIXABLE = ("suffix", "extract_hidden_states")


@dataclass
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    model: str | None = None
    draft_tensor_parallel_size: int = 1
    disable_padded_drafter_batch: bool = False  # only meaningful for drafters with a batched forward
    # The drafter's context limit: a sequence whose length plus num_speculative_tokens would pass it
    # gets no drafts (the engine checks it against the target's max_model_len).
    max_model_len: int | None = None
    disable_by_batch_size: int | None = None  # no drafts while this many requests run (batch_limits.py)
    num_speculative_tokens_per_batch_size: Schedule | None = None  # k by batch size (batch_limits.py)
    options: Any = None  # the method's Options instance
    proposer_cls: type[Proposer] | None = dataclasses.field(default=None, repr=False)
    suffix_config: "SpeculativeConfig | None" = None  # enable_suffix_decoding: the suffix proposer's config
    token_tree: TokenTree | None = None  # speculative_token_tree: drafts as a tree of num_speculative_tokens nodes

    @classmethod
    def from_value(cls, raw, target_tensor_parallel_size: int = 1,
                   target_model: str | None = None) -> "SpeculativeConfig":
        raw = as_config_dict(raw)
        method, proposer, suffix_config, option_keys = _resolve(raw, target_model)
        check_known_keys(raw, method, option_keys)
        own_keys = [f.name for f in dataclasses.fields(proposer.Options)]
        options = proposer.Options(**read_bools(proposer.Options, {k: raw[k] for k in own_keys if k in raw}))
        common = read_bools(cls, {k: raw[k] for k in _COMMON_KEYS if k in raw})
        tree = _token_tree(raw, proposer, suffix_config)
        config = cls(method=method, num_speculative_tokens=_num_tokens(raw, proposer, options, tree),
                     model=_model(raw), options=options, proposer_cls=proposer,
                     draft_tensor_parallel_size=_draft_tp(raw, target_tensor_parallel_size),
                     disable_padded_drafter_batch=common.get("disable_padded_drafter_batch", False),
                     max_model_len=_optional_int(raw, "max_model_len"),
                     disable_by_batch_size=_optional_int(raw, "disable_by_batch_size"),
                     num_speculative_tokens_per_batch_size=parse_schedule(raw.get(SCHEDULE_KEY)),
                     suffix_config=suffix_config, token_tree=None if tree is None or tree.is_chain else tree)
        proposer.check_config(config)
        return config

    @property
    def batch_limits(self) -> BatchSizeLimits:
        return BatchSizeLimits(self.disable_by_batch_size, self.num_speculative_tokens_per_batch_size)

    def to_dict(self) -> dict:
        out = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.model is not None:
            out["model"] = self.model
        for key in ("max_model_len", "disable_by_batch_size", SCHEDULE_KEY):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        out.update(dataclasses.asdict(self.options))
        if self.suffix_config is not None:
            out.update({SUFFIX_MIX_KEY: True, **dataclasses.asdict(self.suffix_config.options)})
        if self.token_tree is not None:
            out[TREE_KEY] = self.token_tree.describe()
        return out


def as_config_dict(raw) -> dict:
    """A copy of ``raw``, a speculative config as a dict or its JSON text; ``ValueError`` otherwise."""
    if isinstance(raw, str):
        raw = parse_json(PREFIX, raw)
    if not isinstance(raw, dict):
        raise ValueError(f"{PREFIX} must be a dict (or its JSON text), got {type(raw).__name__}")
    return dict(raw)


def method_option_keys(raw: dict) -> tuple[str, list[str]]:
    """``(method, option_keys)`` of a speculative config dict: the method it names (or its drafter
    implies) and the keys that method's options own (its proposer's ``Options`` fields, and the suffix
    proposer's given where ``enable_suffix_decoding`` mixes it in). ``raw`` is not changed; the
    ``ValueError`` for an invalid method, model or suffix mix is the one ``from_value`` raises first."""
    method, _, _, option_keys = _resolve(dict(raw), None)
    return method, option_keys


def check_known_keys(raw: dict, method: str, option_keys: list[str], also_allowed=()) -> None:
    """``ValueError`` naming every key of ``raw`` that is neither common, nor in ``option_keys``, nor in
    ``also_allowed`` (keys a caller reads itself), with all of them listed as allowed."""
    allowed = set(_COMMON_KEYS) | set(option_keys) | set(also_allowed)
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ValueError(f"{PREFIX}: unknown key(s) {unknown} for method {method!r}; allowed: {sorted(allowed)}")


def _resolve(raw: dict, target_model: str | None) -> tuple[str, type[Proposer], SpeculativeConfig | None, list[str]]:
    """``(method, proposer, suffix_config, option_keys)`` of ``raw``, in ``from_value``'s order of checks;
    ``raw`` gains the inferred method and, for a drafter inside the target, the target as its model."""
    method = _method(raw)
    proposer = proposer_class(method)
    if proposer.drafter_in_target and _model(raw) is None and target_model:
        raw["model"] = str(target_model)
    option_keys = [f.name for f in dataclasses.fields(proposer.Options)]
    suffix_config = _suffix_config(raw, method)
    if suffix_config is not None:
        option_keys += [k for k in dataclasses.asdict(suffix_config.options) if k in raw]
    return method, proposer, suffix_config, option_keys


def _suffix_config(raw: dict, method: str) -> SpeculativeConfig | None:
    """The suffix proposer's config where ``enable_suffix_decoding`` is on (its ``suffix_decoding_*`` keys)."""
    if not as_bool(SUFFIX_MIX_KEY, raw.get(SUFFIX_MIX_KEY, False)):
        return None
    if method in NOT_MIXABLE:
        raise ValueError(f"{PREFIX}[{SUFFIX_MIX_KEY!r}] mixes suffix drafts into a drafter's; method {method!r} "
                         f"cannot take it (use it with a model drafter, e.g. 'eagle3', 'eagle', 'mtp', 'draft_model')")
    suffix = proposer_class("suffix")
    keys = [f.name for f in dataclasses.fields(suffix.Options)]
    options = suffix.Options(**read_bools(suffix.Options, {k: raw[k] for k in keys if k in raw}))
    return SpeculativeConfig(method="suffix", num_speculative_tokens=1, options=options, proposer_cls=suffix)


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


def _token_tree(raw: dict, proposer: type[Proposer], suffix_config) -> TokenTree | None:
    """The parsed ``speculative_token_tree`` (None: absent). A chain is what no tree means: any method takes it."""
    if raw.get(TREE_KEY) is None:
        return None
    tree = TokenTree.parse(raw[TREE_KEY])
    if tree.is_chain:
        return tree
    if not proposer.drafts_trees:
        allowed = sorted(m for m in registered_methods() if proposer_class(m).drafts_trees)
        raise ValueError(f"{PREFIX}[{TREE_KEY!r}] is invalid for method {proposer.method!r}: only "
                         f"{allowed} draft trees")
    if suffix_config is not None:
        raise ValueError(f"{PREFIX}[{TREE_KEY!r}] and {SUFFIX_MIX_KEY!r} cannot be combined: suffix drafts "
                         "are chains")
    return tree


def _num_tokens(raw: dict, proposer: type[Proposer], options, tree: TokenTree | None = None) -> int:
    value = raw.get("num_speculative_tokens")
    if tree is not None:  # as vLLM: the tree's nodes are the drafts verified each step
        if value is not None and value != len(tree):
            raise ValueError(f"{PREFIX}['num_speculative_tokens']={value!r} is invalid with {TREE_KEY!r}: "
                             f"must be the tree's number of nodes ({len(tree)}) or omitted")
        return len(tree)
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


def _optional_int(raw: dict, key: str) -> int | None:
    value = raw.get(key)
    if value is not None:
        check_int(key, value, 1)
    return value


def _draft_tp(raw: dict, target_tp: int) -> int:
    """``draft_tensor_parallel_size``, or vLLM's older spelling ``tensor_parallel_size``: 1 or the target's."""
    given = {k: raw[k] for k in ("draft_tensor_parallel_size", "tensor_parallel_size") if raw.get(k) is not None}
    if len(set(map(repr, given.values()))) > 1:
        raise ValueError(f"{PREFIX}: 'draft_tensor_parallel_size'={given['draft_tensor_parallel_size']!r} and "
                         f"'tensor_parallel_size'={given['tensor_parallel_size']!r} (the drafter's tensor "
                         "parallel size, twice) disagree")
    for key, value in given.items():
        check_int(key, value, 1)
        if value not in (1, target_tp):
            raise ValueError(f"{PREFIX}[{key!r}]={value} is invalid: must be 1 or the "
                             f"target's tensor_parallel_size ({target_tp})")
        return value
    return 1
