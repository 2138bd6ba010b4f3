"""The decoder layers' linears of a GGUF file as its quantized blocks (``GGUFLinear``).

``apply_gguf_blocks(model, gguf_path, cache_dir)`` swaps each fused linear of every layer
(``qkv_proj``, ``o_proj``, ``gate_up_proj``, ``down_proj``), and the output head (the
embedding table where they are tied), for a ``GGUFLinear`` over the file's bytes where every
tensor it fuses has a type the kernel runs (``QTYPE_IDS``); parts of different types (Q4_K_M's
Q6_K values beside Q4_K queries) run side by side in a ``ConcatLinear``. The others keep their
de-quantized weights. llama.cpp stores llama's q/k rows permuted (pairs interleaved per head):
whole rows of blocks are moved back to Hugging Face's order, so a block's bytes are never
touched. The blocks are cached beside the converted model, so only the first load parses the
GGUF. Returns the number of modules swapped.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..layers.gguf_linear import QTYPE_IDS, ConcatLinear, GGUFLinear
from .gguf_int4 import unpermute_rows

_FUSED = {"qkv_proj": ("attn_q", "attn_k", "attn_v"), "o_proj": ("attn_output",),
          "gate_up_proj": ("ffn_gate", "ffn_up"), "down_proj": ("ffn_down",)}
_CACHE_FILE = "gguf_blocks.safetensors"


def _read(gguf_path: Path, config, num_layers: int) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(``layers.{i}.{module}`` -> fused blocks [out, row_bytes] uint8, the same key -> its type)."""
    import gguf

    tensors = {t.name: t for t in gguf.GGUFReader(str(gguf_path)).tensors}
    permuted = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    if getattr(config, "model_type", "llama") != "llama":  # llama.cpp permutes llama q/k only
        permuted = {}
    blocks, types = {}, {}
    for i in range(num_layers):
        for module, names in _FUSED.items():
            parts = [tensors.get(f"blk.{i}.{name}.weight") for name in names]
            if any(t is None or t.tensor_type.name not in QTYPE_IDS for t in parts):
                continue
            for j, (name, tensor) in enumerate(zip(names, parts)):
                raw = torch.from_numpy(np.array(tensor.data, dtype=np.uint8))  # [out, row_bytes]
                key = f"layers.{i}.{module}.{j}"
                blocks[key] = unpermute_rows(raw, permuted[name]) if name in permuted else raw
                types[key] = tensor.tensor_type.name
    head = tensors.get("output.weight") or tensors.get("token_embd.weight")  # tied: the embedding table
    if head is not None and head.tensor_type.name in QTYPE_IDS:
        blocks["lm_head"] = torch.from_numpy(np.array(head.data, dtype=np.uint8))
        types["lm_head"] = head.tensor_type.name
    return blocks, types


def _load(cache_dir: Path, gguf_path: Path, config, num_layers: int):
    from safetensors import safe_open
    from safetensors.torch import save_file

    cache = Path(cache_dir) / _CACHE_FILE
    if cache.is_file():
        with safe_open(str(cache), "pt") as f:
            types = f.metadata() or {}
            return {key: f.get_tensor(key) for key in f.keys()}, types
    blocks, types = _read(gguf_path, config, num_layers)
    tmp = cache.with_suffix(f".tmp{os.getpid()}")
    save_file(blocks, str(tmp), metadata=types)
    os.replace(tmp, cache)  # atomic: a crash leaves no half file
    return blocks, types


def _fused(parts: list[tuple[torch.Tensor, str]], bias: torch.Tensor | None) -> nn.Module:
    """One module for a fused projection from its parts' (blocks, type): one ``GGUFLinear`` over
    the joined rows where they share a type, side by side otherwise."""
    if len({qtype for _, qtype in parts}) == 1:
        return GGUFLinear(torch.cat([blocks for blocks, _ in parts]), parts[0][1], bias)
    return ConcatLinear([GGUFLinear(blocks, qtype) for blocks, qtype in parts], bias)


def apply_gguf_blocks(model, gguf_path: Path, cache_dir: Path) -> int:
    blocks, types = _load(cache_dir, gguf_path, model.config, len(model.layers))
    if "lm_head" in types:
        model.lm_head = GGUFLinear(blocks["lm_head"], types["lm_head"])
    swapped = int("lm_head" in types)
    for i, layer in enumerate(model.layers):
        for module, names in _FUSED.items():
            keys = [f"layers.{i}.{module}.{j}" for j in range(len(names))]
            if all(key in types for key in keys):
                parts = [(blocks[key], types[key]) for key in keys]
                setattr(layer, module, _fused(parts, getattr(getattr(layer, module), "bias", None)))
                swapped += 1
    return swapped
