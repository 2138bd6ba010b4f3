"""Drafters shipped inside the package, usable by name as ``speculative_config["model"]``.

``resolve_drafter(name)`` maps a bundled name (``draftwise/SmolLM2-135M-Instruct-eagle3``)
to its directory here; any other value is returned unchanged (a local path). Each
directory is a drafter in its method's public layout (config.json + model.safetensors)
plus ``TRAINING.md``, the commands that made it.
"""
from __future__ import annotations

from pathlib import Path

BUNDLED = {"draftwise/SmolLM2-135M-Instruct-eagle3": "SmolLM2-135M-Instruct-eagle3"}


def resolve_drafter(model: str) -> str:
    name = BUNDLED.get(model)
    return str(Path(__file__).parent / name) if name is not None else model
