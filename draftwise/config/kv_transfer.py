"""``kv_transfer_config``: where a producer instance hands its per-request results to others.

draftwise implements vLLM's ``ExampleHiddenStatesConnector`` in the producer
role, used with the ``extract_hidden_states`` speculative method: every
request is prefilled, produces one output token (a producer only prefills, as
in disaggregated prefill), and its prompt's hidden states are written under
``kv_connector_extra_config["shared_storage_path"]``; the output's
``kv_transfer_params["hidden_states_path"]`` names the file. draftwise's one extra key,
``kv_connector_extra_config["hidden_states_dtype"]`` (``float32``, the default, ``bfloat16`` or
``float16``), is the dtype the states are written in.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

CONNECTORS = ("ExampleHiddenStatesConnector",)
HIDDEN_STATES_DTYPES = ("float32", "bfloat16", "float16")
ROLES = ("kv_producer",)
_KEYS = ("kv_connector", "kv_role", "kv_connector_extra_config")


@dataclass(frozen=True)
class KVTransferConfig:
    """vLLM's ``KVTransferConfig`` fields; ``LLM(kv_transfer_config=...)`` takes it or a dict of them."""
    kv_connector: str | None = None
    kv_role: str | None = None
    kv_connector_extra_config: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kv_connector not in CONNECTORS:
            raise ValueError(f"kv_transfer_config['kv_connector']={self.kv_connector!r} is invalid; "
                             f"allowed: {list(CONNECTORS)}")
        if self.kv_role not in ROLES:
            raise ValueError(f"kv_transfer_config['kv_role']={self.kv_role!r} is invalid; allowed: {list(ROLES)}")
        extra = self.kv_connector_extra_config
        path = extra.get("shared_storage_path") if isinstance(extra, dict) else None
        if not isinstance(path, str) or not path:
            raise ValueError("kv_transfer_config['kv_connector_extra_config']['shared_storage_path'] must be a "
                             "directory path (str)")
        dtype = extra.get("hidden_states_dtype", "float32")
        if dtype not in HIDDEN_STATES_DTYPES:
            raise ValueError(f"kv_transfer_config['kv_connector_extra_config']['hidden_states_dtype']={dtype!r} "
                             f"is invalid; allowed: {list(HIDDEN_STATES_DTYPES)}")

    @classmethod
    def from_value(cls, raw) -> "KVTransferConfig":
        if isinstance(raw, cls):
            return raw
        if not isinstance(raw, dict):
            raise ValueError(f"kv_transfer_config must be a KVTransferConfig or a dict, got {type(raw).__name__}")
        unknown = sorted(set(raw) - set(_KEYS))
        if unknown:
            raise ValueError(f"kv_transfer_config: unknown key(s) {unknown}; allowed: {list(_KEYS)}")
        return cls(**{key: value for key, value in raw.items() if value is not None})

    @property
    def shared_storage_path(self) -> Path:
        return Path(self.kv_connector_extra_config["shared_storage_path"]).expanduser()

    @property
    def hidden_states_dtype(self) -> str:
        return self.kv_connector_extra_config.get("hidden_states_dtype", "float32")

    @property
    def prefill_only(self) -> bool:
        """A producer prefills and emits one token per request."""
        return self.kv_role == "kv_producer"
