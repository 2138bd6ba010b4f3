"""``kv_transfer_config``: where a producer instance hands its per-request results to others.

draftwise implements vLLM's ``ExampleHiddenStatesConnector`` in the producer
role, used with the ``extract_hidden_states`` speculative method: every
request is prefilled, produces one output token (a producer only prefills, as
in disaggregated prefill), and its prompt's hidden states are written under
``kv_connector_extra_config["shared_storage_path"]``; the output's
``kv_transfer_params["hidden_states_path"]`` names the file.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CONNECTORS = ("ExampleHiddenStatesConnector",)
ROLES = ("kv_producer",)
_KEYS = ("kv_connector", "kv_role", "kv_connector_extra_config")


@dataclass(frozen=True)
class KVTransferConfig:
    kv_connector: str
    kv_role: str
    shared_storage_path: Path

    @classmethod
    def from_value(cls, raw) -> "KVTransferConfig":
        if not isinstance(raw, dict):
            raise ValueError(f"kv_transfer_config must be a dict, got {type(raw).__name__}")
        unknown = sorted(set(raw) - set(_KEYS))
        if unknown:
            raise ValueError(f"kv_transfer_config: unknown key(s) {unknown}; allowed: {list(_KEYS)}")
        connector, role = raw.get("kv_connector"), raw.get("kv_role")
        if connector not in CONNECTORS:
            raise ValueError(f"kv_transfer_config['kv_connector']={connector!r} is invalid; "
                             f"allowed: {list(CONNECTORS)}")
        if role not in ROLES:
            raise ValueError(f"kv_transfer_config['kv_role']={role!r} is invalid; allowed: {list(ROLES)}")
        extra = raw.get("kv_connector_extra_config") or {}
        path = extra.get("shared_storage_path") if isinstance(extra, dict) else None
        if not isinstance(path, str) or not path:
            raise ValueError("kv_transfer_config['kv_connector_extra_config']['shared_storage_path'] must be a "
                             "directory path (str)")
        return cls(connector, role, Path(path).expanduser())

    @property
    def prefill_only(self) -> bool:
        """A producer prefills and emits one token per request."""
        return self.kv_role == "kv_producer"
