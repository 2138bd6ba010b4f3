"""Reading drafter checkpoints (EAGLE, EAGLE-3, Medusa, DFlash) in their public layouts.

``load_drafter(model, method)`` reads ``config.json`` and every weight file of
a local directory (``weight_files``: ``*.safetensors``, or else the ``*.pt`` /
``*.bin`` files of original Medusa heads, read with ``weights_only``), or the
``files`` a method names (Medusa heads beside a target), into a
``DrafterCheckpoint``. ``tensor_names(file)`` lists a file's tensors without
reading them.
A config in the ``speculators`` format (``speculators_model_type``,
``transformer_layer_config``, ``speculators_config``) is flattened to the
plain layout: the layer config's keys, then the drafter's own keys on top.

``infer_method(model)`` is what a config says the drafter is, for a
``speculative_config`` that names a ``model`` but no ``method``.
Every failure is a ``ValueError`` naming the checkpoint and what is wrong.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from ..validate import PREFIX


@dataclass
class DrafterCheckpoint:
    path: Path
    method: str
    config: dict  # config.json, flattened (speculators format)
    tensors: dict[str, torch.Tensor]

    @property
    def what(self) -> str:
        return f"{PREFIX}['model']={str(self.path)!r} ({self.method} checkpoint)"

    def require(self, *names: str) -> None:
        for name in names:
            if name not in self.tensors:
                raise ValueError(f"{self.what} is missing tensor {name!r}; it has "
                                 f"{sorted(self.tensors)[:8]}{' ...' if len(self.tensors) > 8 else ''}")

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        self.require(name)
        tensor = self.tensors[name]
        if shape is not None and tuple(tensor.shape) != shape:
            raise ValueError(f"{self.what}: tensor {name!r} has shape {tuple(tensor.shape)}, expected {shape}")
        return tensor

    def layer_config(self, default_type: str = "llama"):
        """The transformers config of the drafter's decoder layer(s)."""
        keys = {k: v for k, v in self.config.items() if k not in ("architectures", "auto_map")}
        model_type = keys.pop("model_type", default_type) or default_type
        from transformers import AutoConfig  # on use: its import chain takes about a second

        try:
            return AutoConfig.for_model(model_type, **keys)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{self.what}: config.json is not a valid {model_type} config ({exc})") from None


def require_model(model: str | None, method: str) -> None:
    if not model:
        raise ValueError(f"{PREFIX}: method {method!r} needs 'model' (the drafter checkpoint directory)")


def load_drafter(model: str | None, method: str, prefix: str | tuple[str, ...] = "",
                 files: list[Path] | None = None) -> DrafterCheckpoint:
    """``prefix``: read only the tensors whose names start with it (MTP layers inside a target);
    ``files``: read these weight files instead of the directory's ``weight_files``."""
    require_model(model, method)
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ValueError(f"{PREFIX}['model']={model!r}: not a directory (a {method} checkpoint is a local "
                         "directory with config.json and weights)")
    tensors = _read_tensors(path, method, prefix, weight_files(path) if files is None else files)
    return DrafterCheckpoint(path, method, read_config(path), tensors)


def weight_files(path: Path) -> list[Path]:
    """A drafter directory's weight files: its ``*.safetensors``, or else its ``*.pt`` and ``*.bin``."""
    return sorted(path.glob("*.safetensors")) or sorted(path.glob("*.pt")) + sorted(path.glob("*.bin"))


def tensor_names(file: Path) -> list[str]:
    """The tensor names of one weight file, without reading the tensors (a safetensors header; a
    torch file memory-mapped where its format allows)."""
    if file.suffix == ".safetensors":
        with safe_open(str(file), framework="pt") as f:
            return list(f.keys())
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # the legacy (non-zip) format cannot be mapped
        state = torch.load(file, map_location="cpu", weights_only=True)
    return [k for k, v in state.items() if isinstance(v, torch.Tensor)]


def read_config(path: Path) -> dict:
    file = path / "config.json"
    if not file.is_file():
        raise ValueError(f"{PREFIX}['model']={str(path)!r} has no config.json")
    try:
        config = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file}: invalid JSON ({exc})") from None
    if "speculators_model_type" in config:  # vllm-project/speculators: nest the layer config
        flat = dict(config.get("transformer_layer_config") or {})
        flat.update({k: v for k, v in config.items() if k not in ("transformer_layer_config", "model_type")})
        return flat
    return config


def declared_config(model: str | None) -> dict:
    """``model``'s config.json (flattened), or {} when there is no such file: what a config
    declares (method, head or layer counts) before the checkpoint is loaded."""
    if not model or not (Path(model).expanduser() / "config.json").is_file():
        return {}
    return read_config(Path(model).expanduser())


def infer_method(model: str) -> str | None:
    """The method a drafter's config declares (speculators type, EAGLE-3 or Medusa markers), or None."""
    config = declared_config(model)
    if not config:
        return None
    path = Path(model).expanduser()
    declared = config.get("speculators_model_type")
    if declared in ("eagle", "eagle3", "dflash", "mtp"):
        return declared
    architectures = " ".join(config.get("architectures") or [])
    if "Eagle3" in architectures or "draft_vocab_size" in config:
        return "eagle3"
    if "DFlash" in architectures or "dflash_config" in config:
        return "dflash"
    if config.get("model_type") == "medusa" or "medusa_num_heads" in config:
        return "medusa"
    if "eagle" in path.name.lower():
        return "eagle"
    return None


def speculators_num_tokens(model: str | None) -> int | None:
    """``speculators_config.proposal_methods[0].speculative_tokens`` of a speculators config."""
    spec = declared_config(model).get("speculators_config") or {}
    methods = spec.get("proposal_methods") or [{}]
    value = methods[0].get("speculative_tokens")
    return value if isinstance(value, int) else None


def _read_tensors(path: Path, method: str, prefix: str | tuple[str, ...], files: list[Path]) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        if file.suffix == ".safetensors":
            with safe_open(str(file), framework="pt") as f:
                tensors.update({k: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)})
        else:
            state = torch.load(file, map_location="cpu", weights_only=True)
            tensors.update({k: v for k, v in state.items() if isinstance(v, torch.Tensor) and k.startswith(prefix)})
    if not tensors:
        raise ValueError(f"{PREFIX}['model']={str(path)!r}: no weights{f' named {prefix}*' if prefix else ''} "
                         f"(*.safetensors, *.pt or *.bin) for the {method} drafter")
    return tensors
