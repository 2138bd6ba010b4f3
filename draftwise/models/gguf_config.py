"""A GGUF file's transformers config, from its header, with transformers' own GGUF tables.

``gguf_config(header)`` reads the metadata ``gguf_header.read_header`` parsed (no tensor, no
long array is decoded) through ``GGUF_TO_TRANSFORMERS_MAPPING`` and the per-architecture
defaults, as transformers' ``load_gguf_checkpoint`` does, and builds the config with
``AutoConfig.for_model``. It is what transformers would make of the file, in milliseconds
instead of the seconds its ``GGUFReader`` spends on a large vocabulary, except that a head size and
a sliding window the file states (``attention.key_length``, ``attention.sliding_window``) are always
taken, where transformers' tables leave some architectures (Qwen3; Phi-3) at their default.
"""
from __future__ import annotations

import torch

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


def gguf_config(header: GGUFHeader):
    """The transformers config of the GGUF ``header`` describes (fp32, its causal-LM class named)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config_dict = _config_dict(header)
    config_dict.pop("_model_name_or_path", None)
    model_type = config_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **config_dict)
    config.dtype = torch.float32
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
    return config
