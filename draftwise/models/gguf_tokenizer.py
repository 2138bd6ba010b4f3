"""A GGUF file's tokenizer: transformers' GGUF converter fed from ``gguf_header``.

transformers makes a tokenizer from a GGUF's metadata in two halves: ``get_gguf_tokenizer`` reads
the vocabulary, merges and special ids (its reader decodes each string through a numpy view, most
of a second for a 50K-token vocabulary) and ``convert_gguf_tokenizer`` builds the tokenizers
backend. ``gguf_tokenizer(header, tokenizer_class)`` gives the second half the same dictionaries,
read by ``gguf_header`` under transformers' own key table (``GGUF_TOKENIZER_MAPPING``), so the
tokenizer is the one transformers makes from the file (``tests/test_gguf_tokenizer.py`` compares
the two field by field and on text).
"""
from __future__ import annotations

from .gguf_header import STRING_TYPE, ArrayRef, GGUFHeader

# transformers' names for the special tokens, and the metadata keys of their ids
_SPECIAL_TOKEN_IDS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
                      "unk_token": "unknown_token_id", "pad_token": "padding_token_id"}
_STRING_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")  # the only string arrays transformers decodes


def tokenizer_parts(header: GGUFHeader) -> tuple[str, dict, dict]:
    """``(architecture, tokenizer_dict, tokenizer_config)`` as transformers' ``get_gguf_tokenizer``
    returns them for the file ``header`` describes."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING

    groups = {group: {name: _value(header, f"tokenizer.{key}") for key, name in renames.items()
                      if f"tokenizer.{key}" in header.fields}
              for group, renames in GGUF_TOKENIZER_MAPPING.items()}
    tokenizer, tokenizer_config = groups["tokenizer"], groups["tokenizer_config"]
    tokenizer_type = tokenizer.get("tokenizer_type")
    if tokenizer_type == "llama":  # sentencepiece files without the flag add BOS, as llama.cpp does
        tokenizer_config.setdefault("add_bos_token", True)
    elif tokenizer_type == "gemma4":  # its chat template writes <bos> itself
        tokenizer_config["add_bos_token"] = False
    for name, key in _SPECIAL_TOKEN_IDS.items():
        token_id = header.fields.get(f"tokenizer.ggml.{key}")
        tokenizer_config[name] = tokenizer["tokens"][token_id] if token_id is not None else None
    return header.get("general.architecture"), tokenizer, tokenizer_config


def _value(header: GGUFHeader, key: str):
    """A metadata value as transformers' reader gives it: string arrays other than the vocabulary and
    merges as their length, every other array decoded."""
    value = header.fields[key]
    if key not in _STRING_ARRAYS:
        if isinstance(value, ArrayRef) and value.item_type == STRING_TYPE:
            return value.count
        if isinstance(value, list) and value and isinstance(value[0], str):
            return len(value)
    return header.get(key)


def gguf_tokenizer(header: GGUFHeader, tokenizer_class):
    """The ``tokenizer_class`` tokenizer (a transformers fast-tokenizer class) the file describes."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    architecture, tokenizer_dict, tokenizer_config = tokenizer_parts(header)
    backend, extra = convert_gguf_tokenizer(architecture, tokenizer_dict)
    return tokenizer_class(tokenizer_object=backend, **tokenizer_config, **extra)
