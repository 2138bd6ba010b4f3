"""``GGUFLinear``: a linear layer whose weight stays in the GGUF file's quantized blocks.

The weight is ``[out_features, row_bytes]`` uint8, each row the blocks of one output feature
exactly as the file stores them (types in ``QTYPE_IDS``: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the
k-quants Q4_K, Q5_K, Q6_K that llama.cpp's common presets write). The C++ op
``draftwise_cpu::gguf_linear`` (``csrc/gguf_linear.cpp``) quantizes each activation row to
8 bits per 32 values and takes integer dot products with the blocks (every type but Q5_1 is first
repacked, once, into the same bytes laid out for wide SIMD loads),
so a step streams the file's bytes instead of a de-quantized copy 3-8x their size. Results are batch invariant:
a row's output does not depend on the other rows of the call. Inputs of any float dtype;
the output has the input's dtype (fp32 and bf16 are read and written as they are).
"""
from __future__ import annotations

import torch
from torch import nn

from ..kernels import huge_pages, native

QTYPE_IDS = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}  # ggml's
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34,  # bytes per block
               "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
BLOCK_SIZES = {name: 256 if name.endswith("_K") else 32 for name in QTYPE_IDS}  # weights per block
# types whose rows are repacked at load (same bytes; the k-quants only where the CPU runs them
# interleaved, 16 rows side by side, and as stored elsewhere)
REPACKED = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
INTERLEAVED_ROWS = 16  # output rows the interleaved layout packs side by side (csrc kBlockCols)


def available() -> bool:
    """The C++ kernels built on this machine (``native.load``)."""
    return native.load()


class GGUFLinear(nn.Module):
    """``blocks``: one ``[out_features, row_bytes]`` uint8 tensor, or the parts of a fused projection
    (tensors of one type and row length, their rows one after the other). They may be read-only
    views of the file: a weight whose kernel layout is the file's is used in place, any other is
    written once into its layout in a buffer of the same size."""

    def __init__(self, blocks: torch.Tensor | list[torch.Tensor],  # [out, in / BLOCK_SIZES * BLOCK_BYTES] uint8
                 qtype: str, bias: torch.Tensor | None = None):
        super().__init__()
        if not available():
            raise RuntimeError("GGUFLinear needs draftwise's C++ CPU kernels, which did not build here")
        if qtype not in QTYPE_IDS:
            raise ValueError(f"GGUF type {qtype!r} has no kernel; supported: {sorted(QTYPE_IDS)}")
        parts = [blocks] if isinstance(blocks, torch.Tensor) else list(blocks)
        for part in parts:
            if (part.dtype != torch.uint8 or part.dim() != 2 or part.shape[1] % BLOCK_BYTES[qtype]
                    or part.shape[1] != parts[0].shape[1]):
                raise ValueError(f"{qtype} blocks must be [out, k * {BLOCK_BYTES[qtype]}] uint8 tensors of one "
                                 f"row length, got {tuple(part.shape)} {part.dtype}")
        self.qtype, self.qtype_id = qtype, QTYPE_IDS[qtype]
        self.out_features = sum(part.shape[0] for part in parts)
        self.in_features = parts[0].shape[1] // BLOCK_BYTES[qtype] * BLOCK_SIZES[qtype]
        self.packed = qtype in REPACKED  # rows rewritten once for SIMD loads (csrc/gguf_blocks.h)
        self.register_buffer("blocks", self._layout(parts), persistent=False)
        self.bias = bias

    def _layout(self, parts: list[torch.Tensor]) -> torch.Tensor:  # [out_features, row_bytes] uint8
        """The rows in the kernel's layout: repacked part by part into one buffer (on huge pages where
        granted: ``huge_pages.py``) where each part keeps whole 16-row blocks (the interleaved
        layout's unit), else as one tensor."""
        if not self.packed:
            return parts[0].contiguous() if len(parts) == 1 else torch.cat(parts)
        if len(parts) > 1 and any(part.shape[0] % INTERLEAVED_ROWS for part in parts):
            parts = [torch.cat(parts)]
        out = huge_pages.empty((self.out_features, parts[0].shape[1]), torch.uint8)  # streamed every step
        start = 0
        for part in parts:
            torch.ops.draftwise_cpu.gguf_repack(part, self.qtype_id, out[start:start + part.shape[0]])
            start += part.shape[0]
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if x.dim() == 2:
            return torch.ops.draftwise_cpu.gguf_linear(x, self.blocks, self.qtype_id, self.packed, self.bias)
        rows = x.reshape(-1, self.in_features)
        out = torch.ops.draftwise_cpu.gguf_linear(rows, self.blocks, self.qtype_id, self.packed, self.bias)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, qtype={self.qtype}"


class ConcatLinear(nn.Module):
    """Linears side by side: one fused projection whose parts are stored in different types."""

    def __init__(self, parts: list[GGUFLinear], bias: torch.Tensor | None = None):
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., sum of the parts' out]
        out = torch.cat([part(x) for part in self.parts], dim=-1)
        return out if self.bias is None else out + self.bias
