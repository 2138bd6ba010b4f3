"""The complete config of the common decoder architectures, as data: what transformers' config
class of ``llama``, ``mistral``, ``qwen2`` and ``qwen3`` makes of a GGUF file's values, without
importing those classes (their module chain imports most of transformers and costs a second or
more on a first load).

``complete_config(values)`` takes the values ``gguf_config`` read from the file (``model_type``,
sizes, ``rope_theta``, token ids) and returns the full dict the class's ``to_dict()`` would give:
the class's defaults under the file's values, then what its ``__post_init__`` derives (head size,
KV heads, the sliding window and ``layer_types`` of the Qwen classes, ``rope_parameters``). It
returns None for any other architecture or for a value these rules do not cover: the caller then
uses transformers' class. ``tests/test_gguf_config.py`` checks every rule against the installed
transformers.
"""
from __future__ import annotations

_BASE = {
    "hidden_act": "silu", "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True,
    "tie_word_embeddings": False, "attention_dropout": 0.0, "pad_token_id": None,
}
_QWEN = {
    **_BASE, "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 32768,
    "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28, "layer_types": None,
    "bos_token_id": None, "eos_token_id": None,
}
# Each class's fields and defaults, as its dataclass declares them.
CLASS_DEFAULTS: dict[str, dict] = {
    "llama": {
        **_BASE, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": None, "max_position_embeddings": 2048,
        "bos_token_id": 1, "eos_token_id": 2, "pretraining_tp": 1, "attention_bias": False, "mlp_bias": False,
        "head_dim": None,
    },
    "mistral": {
        **_BASE, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "max_position_embeddings": 131072,
        "bos_token_id": 1, "eos_token_id": 2, "sliding_window": 4096,
    },
    "qwen2": _QWEN,
    "qwen3": {**_QWEN, "head_dim": 128, "attention_bias": False},
}
CAUSAL_LM_CLASSES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                     "qwen3": "Qwen3ForCausalLM"}
DEFAULT_THETA = 10000.0
_FROM_FILE_ONLY = {"model_type", "_model_name_or_path", "rope_theta"}  # read here, not fields of the class


def complete_config(values: dict) -> dict | None:
    """The class's full field dict for the file ``values`` (see the module docstring), or None."""
    model_type = values.get("model_type")
    defaults = CLASS_DEFAULTS.get(model_type)
    if defaults is None or not set(values) <= set(defaults) | _FROM_FILE_ONLY:
        return None
    config = {**defaults, **{k: v for k, v in values.items() if k not in _FROM_FILE_ONLY}}
    if "head_dim" in config and config["head_dim"] is None:
        config["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
    if config["num_key_value_heads"] is None:
        config["num_key_value_heads"] = config["num_attention_heads"]
    if "use_sliding_window" in config:
        _qwen_windows(config)
    config["rope_parameters"] = {"rope_theta": values.get("rope_theta", DEFAULT_THETA), "rope_type": "default"}
    config["model_type"] = model_type
    config["architectures"] = [CAUSAL_LM_CLASSES[model_type]]
    return config


def _qwen_windows(config: dict) -> None:
    """Qwen2/Qwen3: a window only with ``use_sliding_window``, and on the layers from
    ``max_window_layers`` on."""
    window = config["sliding_window"] if config["use_sliding_window"] else None
    config["sliding_window"] = window
    if config["layer_types"] is None:
        config["layer_types"] = [
            "sliding_attention" if window is not None and i >= config["max_window_layers"] else "full_attention"
            for i in range(config["num_hidden_layers"])]
