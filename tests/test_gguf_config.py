"""``arch_config`` holds transformers' config classes as data: for every architecture it covers, the
config a GGUF's values make equals what the architecture's own class makes of them, field for field,
and a written folder reads back to the same config."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from draftwise.models.arch_config import complete_config
from draftwise.models.gguf_config import config_from_values, save_config
from draftwise.models.loader import _DONE_MARK
from draftwise.models.registry import _written_config

SIZES = dict(num_hidden_layers=6, max_position_embeddings=4096, hidden_size=256, intermediate_size=512,
             num_attention_heads=8, vocab_size=1000, rms_norm_eps=1e-5)
CASES = {
    "llama, every value the file states": ("llama", dict(SIZES, num_key_value_heads=2, head_dim=32,
                                                         rope_theta=500000.0, bos_token_id=1, eos_token_id=2,
                                                         pad_token_id=2, tie_word_embeddings=True)),
    "llama, no head size, KV heads or rope base": ("llama", dict(SIZES, tie_word_embeddings=False)),
    "mistral": ("mistral", dict(SIZES, num_key_value_heads=2, rope_theta=1e6, tie_word_embeddings=False)),
    "qwen2": ("qwen2", dict(SIZES, num_key_value_heads=2, rope_theta=1e6, eos_token_id=5, tie_word_embeddings=True)),
    "qwen2, a window the file states": ("qwen2", dict(SIZES, sliding_window=128, tie_word_embeddings=True)),
    "qwen3": ("qwen3", dict(SIZES, num_key_value_heads=4, head_dim=64, rope_theta=1e6, bos_token_id=3,
                            tie_word_embeddings=False)),
    "qwen3, its default head size": ("qwen3", dict(SIZES, tie_word_embeddings=True)),
}


def _theirs(model_type: str, values: dict) -> dict:
    config = AutoConfig.for_model(model_type, **values)
    config.dtype = torch.float32
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
    return config.to_dict()


def _ours(config) -> dict:
    values = config.to_dict()
    values["model_type"] = config.model_type
    return values


@pytest.mark.parametrize("case", CASES)
def test_complete_config_equals_the_class(case):
    model_type, values = CASES[case]
    complete = complete_config({"model_type": model_type, **values})
    assert complete is not None
    assert _ours(config_from_values({**complete, "dtype": "float32"})) == _theirs(model_type, values)


def test_a_written_folder_reads_back_the_same_config(tmp_path):
    model_type, values = CASES["qwen3"]
    config = config_from_values({**complete_config({"model_type": model_type, **values}), "dtype": "float32"})
    save_config(config, tmp_path)
    (tmp_path / "model.gguf").touch()  # the folder of a GGUF file, as the loader marks it
    (tmp_path / _DONE_MARK).write_text(json.dumps({"source": str(tmp_path / "model.gguf")}))
    assert _ours(_written_config(tmp_path)) == _ours(config)


@pytest.mark.parametrize("values", [
    {"model_type": "gemma3_text", **SIZES},  # an architecture held only as transformers' class
    {"model_type": "llama", **SIZES, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},  # a value no rule covers
])
def test_other_values_go_to_the_class(values):
    assert complete_config(values) is None
