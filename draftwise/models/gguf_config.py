"""A GGUF file's transformers config, from its header, with transformers' own GGUF tables.

``gguf_config(header)`` reads the metadata ``gguf_header.read_header`` parsed (no tensor, no
long array is decoded) through ``GGUF_TO_TRANSFORMERS_MAPPING`` and the per-architecture
defaults, as transformers' ``load_gguf_checkpoint`` does, and builds the config with
``arch_config.complete_config`` where the architecture's class is held as data, else with
``AutoConfig.for_model``. It is what transformers would make of the file, in milliseconds
instead of the seconds its ``GGUFReader`` spends on a large vocabulary, except that a head size and
a sliding window the file states (``attention.key_length``, ``attention.sliding_window``) are always
taken, where transformers' tables leave some architectures (Qwen3; Phi-3) at their default.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .arch_config import complete_config
from .gguf_header import ArrayRef, GGUFHeader


def _model_type(header: GGUFHeader) -> str:
    arch = header.get("general.architecture")
    if "llama" in arch and header.get("general.name") == "mistral":
        return "mistral"
    return {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe"}.get(arch, arch)


def _config_dict(header: GGUFHeader) -> dict:
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING
    from transformers.modeling_gguf_pytorch_utils import GGUF_TO_TRANSFORMERS_MAPPING

    arch, model_type = header.get("general.architecture"), _model_type(header)
    if "rope_factors_long.weight" in header.tensors:
        raise ValueError(f"this {arch} GGUF carries long-context rope factors (rope_factors_long): "
                         "not supported yet; a model without them (e.g. a 4k-context variant) loads")
    renames = GGUF_TO_TRANSFORMERS_MAPPING["config"]
    config = {}
    for key, value in header.fields.items():
        prefix, _, name = key.replace(arch, model_type, 1).partition(".")
        target = renames.get(prefix, {}).get(name)
        if target in (None, -1) or isinstance(value, ArrayRef):
            continue
        config[target] = value[0] if isinstance(value, list) and len(value) == 1 else value
    config["model_type"] = model_type
    config["tie_word_embeddings"] = "output.weight" not in header.tensors
    key_length = header.get(f"{arch}.attention.key_length")
    if key_length is not None and "head_dim" not in config:  # transformers' tables skip it for some archs
        config["head_dim"] = key_length
    window = header.get(f"{arch}.attention.sliding_window")
    if window is not None and "sliding_window" not in config:  # Phi-3's, which transformers' tables drop
        config["sliding_window"] = window
    for key, value in GGUF_CONFIG_DEFAULTS_MAPPING.get(model_type, {}).items():
        config.setdefault(key, value)
    if "vocab_size" not in config and "tokenizer.ggml.tokens" in header.fields:
        tokens = header.fields["tokenizer.ggml.tokens"]
        config["vocab_size"] = tokens.count if isinstance(tokens, ArrayRef) else len(tokens)
    if model_type == "gemma3":
        config["model_type"] = "gemma3_text"
    return config


def gguf_config(header: GGUFHeader, arch_class: bool = False):
    """The transformers config of the GGUF ``header`` describes (fp32, its causal-LM class named): for
    the architectures ``arch_config`` holds as data, in transformers' base class, as a later start
    reads it back (``config_from_values``); else, or with ``arch_class``, in the architecture's own
    class (what transformers' model classes need)."""
    config_dict = _config_dict(header)
    config_dict.pop("_model_name_or_path", None)
    complete = None if arch_class else complete_config(config_dict)
    if complete is not None:
        return config_from_values({**complete, "dtype": "float32"})
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = config_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **config_dict)
    config.dtype = torch.float32
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
    return config


def config_from_values(values: dict):
    """A complete config's values (a written ``config.json``) in transformers' base class, with the
    fields the base class would drop (``model_type``, ``use_cache``) kept."""
    from transformers import PretrainedConfig

    config = PretrainedConfig.from_dict(values)
    config.model_type = values["model_type"]
    if "use_cache" in values:
        config.use_cache = values["use_cache"]
    return config


def save_config(config, out: Path) -> None:
    """``out/config.json``: every field of ``config`` (``config_from_values`` reads it back)."""
    values = config.to_dict()
    values["model_type"] = config.model_type
    (out / "config.json").write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")
