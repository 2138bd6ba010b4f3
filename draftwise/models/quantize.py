"""Weight-only quantization at load (``EngineConfig.quantization``: ``q8_0``, ``q4_0``, ``q4_1``).

``quantize_linears(model, quantization)`` turns each layer linear (``qkv_proj``, ``o_proj``,
``gate_up_proj``, ``down_proj``) and the output head of a CPU model into a ``GGUFLinear`` over
blocks ``gguf``'s quantizer writes from the loaded float weights: the same blocks, and so the
same kernels and results, as a GGUF file of that type. A linear whose input width is not a
multiple of 32 keeps its float weight. Returns the number of modules quantized.
"""
from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

from ..layers.gguf_linear import BLOCK_SIZES, GGUFLinear

WEIGHT_ONLY = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1"}  # EngineConfig.quantization -> GGUF type
_LAYER_LINEARS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def float_weight(module) -> torch.Tensor | None:
    """``module``'s weight as [out, in] fp32 (nn.Linear, PackedLinear, the tied head), or None."""
    weight = getattr(module, "weight", None)
    if weight is None and hasattr(module, "embed"):  # _TiedHead
        weight = module.embed[0].weight
    return None if weight is None else weight.detach().float().contiguous()


def quantized(module, qtype: str) -> GGUFLinear | None:
    weight = float_weight(module)
    if weight is None or weight.shape[1] % BLOCK_SIZES[qtype]:
        return None
    blocks = quants.quantize(weight.numpy(), GGMLQuantizationType[qtype])  # [out, row_bytes] uint8
    return GGUFLinear(torch.from_numpy(np.ascontiguousarray(blocks)), qtype, getattr(module, "bias", None))


def quantize_linears(model, quantization: str) -> int:
    qtype = WEIGHT_ONLY[quantization]
    count = 0
    for layer in model.layers:
        for name in _LAYER_LINEARS:
            new = quantized(getattr(layer, name), qtype)
            if new is not None:
                setattr(layer, name, new)
                count += 1
    head = quantized(model.lm_head, qtype)
    if head is not None:
        model.lm_head = head
        count += 1
    return count
