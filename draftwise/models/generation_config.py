"""A model's own sampling defaults (``generation_config.json``), as vLLM reads them.

``sampling_defaults(source, model_path, overrides)`` returns ``SamplingParams`` keyword arguments:
``source`` is ``"auto"`` (the model directory's ``generation_config.json``), ``"vllm"`` (none: vLLM's
own defaults) or a directory holding one; ``overrides`` (vLLM's ``override_generation_config``)
win over the file. Only the keys vLLM reads are used: ``temperature``, ``top_p``, ``top_k``,
``min_p``, ``repetition_penalty`` and ``max_new_tokens`` (as ``max_tokens``). A missing file means
no defaults; an override key outside these is a ``ValueError`` naming it.
"""
from __future__ import annotations

import json
from pathlib import Path

SAMPLING_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                 "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


def sampling_defaults(source: str, model_path: Path, overrides: dict | None = None) -> dict:
    unknown = sorted(set(overrides or {}) - set(SAMPLING_KEYS))
    if unknown:
        raise ValueError(f"override_generation_config keys {unknown} are not sampling defaults; allowed: "
                         f"{sorted(SAMPLING_KEYS)}")
    raw = {} if source == "vllm" else _read(model_path if source == "auto" else Path(source).expanduser(),
                                            required=source != "auto")
    raw.update(overrides or {})
    return {ours: raw[key] for key, ours in SAMPLING_KEYS.items() if raw.get(key) is not None}


def _read(directory: Path, required: bool) -> dict:
    path = (directory if directory.is_dir() else directory.parent) / "generation_config.json"
    if not path.is_file():
        if required:
            raise ValueError(f"generation_config={str(directory)!r} holds no generation_config.json")
        return {}
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} cannot be read as JSON: {exc}") from None
    return raw if isinstance(raw, dict) else {}
