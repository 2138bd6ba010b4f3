"""Run 4-bit GGUF weights (Q4_0 / Q4_1) natively with torch's CPU int4 kernel.

A Q4_1 block holds 32 weights of one row as ``w = q * d + m`` (``q`` in
0..15, ``d`` and ``m`` fp16); Q4_0 as ``w = (q - 8) * d``. torch's
``_weight_int4pack_mm_for_cpu`` computes with ``w = (q - 8) * scale + zero``
per group of 32 input columns, so ``scale = d`` and ``zero = m + 8 d``
reproduce the file's weights (exactly with fp32 scales; the kernel's fast
path takes bf16 activations and bf16 scales, which round like bf16 weights).
It streams 4-bit instead of 16-bit weights, with bf16 activations: less exact
than bf16 de-quantized weights (``tests/test_gguf_int4.py`` bounds the first-token
logprob error), so it is opt-in: ``LLM(..., additional_config={"gguf_int4": True})``.

``apply_gguf_int4(model, gguf_path, cache_dir)`` swaps every layer's four
linears of a bf16 CPU model for ``Int4Linear`` when all of them are
Q4_0/Q4_1 in the file (llama.cpp's rotary row permutation of q/k undone);
otherwise it changes nothing and returns False. The unpacked 4-bit tensors
are cached beside the converted model, so only the first load reads the GGUF.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .gguf_file import unpermute_rows

GROUP_SIZE = 32
_Q4_TYPES = ("Q4_0", "Q4_1")


class Int4Linear(nn.Module):
    def __init__(self, q: torch.Tensor,  # [out_features, in_features] int32 in 0..15
                 scale: torch.Tensor,  # [out_features, in_features // 32]
                 zero: torch.Tensor,  # [out_features, in_features // 32]
                 bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
        self.scale_zeros = torch.stack((scale, zero), dim=-1).transpose(0, 1).contiguous().bfloat16()
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_rows, in] bf16 -> [num_rows, out]
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, GROUP_SIZE, self.scale_zeros)
        return out if self.bias is None else out + self.bias


def read_q4(tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [out, in] int32, scale [out, in/32], zero [out, in/32]) of one Q4_0/Q4_1 GGUF tensor."""
    kind = tensor.tensor_type.name
    raw = np.asarray(tensor.data)  # [out, num_blocks * block_bytes] uint8
    out_features = raw.shape[0]
    block_bytes = 20 if kind == "Q4_1" else 18
    blocks = raw.reshape(out_features, -1, block_bytes)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if kind == "Q4_1":
        zero = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) + 8 * d
    else:
        zero = np.zeros_like(d)
    packed = blocks[..., block_bytes - 16:]  # 16 bytes: low nibbles = items 0..15, high = 16..31
    q = np.concatenate((packed & 0x0F, packed >> 4), axis=-1).reshape(out_features, -1)
    return torch.from_numpy(q.astype(np.int32)), torch.from_numpy(d), torch.from_numpy(zero)


def _layer_q4(tensors: dict, i: int, config) -> dict[str, tuple] | None:
    names = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output",
             "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}
    found = {key: tensors.get(f"blk.{i}.{name}.weight") for key, name in names.items()}
    if any(t is None or t.tensor_type.name not in _Q4_TYPES for t in found.values()):
        return None
    parts = {key: read_q4(t) for key, t in found.items()}
    if getattr(config, "model_type", "llama") == "llama":  # llama.cpp permutes llama q/k only
        heads = {"q": config.num_attention_heads, "k": config.num_key_value_heads}
        for key, num_heads in heads.items():
            parts[key] = tuple(unpermute_rows(x, num_heads) for x in parts[key])
    return parts


_FUSED = {"qkv_proj": ("q", "k", "v"), "o_proj": ("o",), "gate_up_proj": ("gate", "up"),
          "down_proj": ("down",)}
_CACHE_FILE = "q4_layers.safetensors"


def _read_fused(gguf_path: Path, config, num_layers: int) -> dict[str, torch.Tensor] | None:
    """``layers.{i}.{module}.{q,scale,zero}`` for every fused linear, or None if a layer is not Q4."""
    import gguf

    tensors = {t.name: t for t in gguf.GGUFReader(str(gguf_path)).tensors}
    out = {}
    for i in range(num_layers):
        parts = _layer_q4(tensors, i, config)
        if parts is None:
            return None
        for module, keys in _FUSED.items():
            for j, field in enumerate(("q", "scale", "zero")):
                out[f"layers.{i}.{module}.{field}"] = torch.cat([parts[k][j] for k in keys])
        for module in _FUSED:
            out[f"layers.{i}.{module}.q"] = out[f"layers.{i}.{module}.q"].to(torch.uint8)
    return out


def _load_fused(cache_dir: Path, gguf_path: Path, config, num_layers: int) -> dict[str, torch.Tensor] | None:
    """The fused Q4 tensors, read from the GGUF once and then from ``cache_dir`` (parsing the
    GGUF's metadata costs ~6 s per load; the cached file loads in a fraction of that)."""
    from safetensors.torch import load_file, save_file

    cache = Path(cache_dir) / _CACHE_FILE
    if cache.is_file():
        return load_file(cache)
    fused = _read_fused(gguf_path, config, num_layers)
    if fused is not None:
        tmp = cache.with_suffix(f".tmp{os.getpid()}")
        save_file(fused, tmp)
        os.replace(tmp, cache)  # atomic: a crash leaves no half file
    return fused


def apply_gguf_int4(model, gguf_path: Path, cache_dir: Path) -> bool:
    fused = _load_fused(cache_dir, gguf_path, model.config, len(model.layers))
    if fused is None:
        return False
    for i, layer in enumerate(model.layers):
        for module in _FUSED:
            q, scale, zero = (fused[f"layers.{i}.{module}.{f}"] for f in ("q", "scale", "zero"))
            setattr(layer, module, Int4Linear(q, scale, zero, getattr(layer, module).bias))
    return True
