"""Linear layers for CPU bf16 and fp32: oneDNN-packed weights plus a matvec path.

oneDNN reorders each weight once at load; calls with several rows (prefill,
batched decode, verification) then run on the packed AMX kernel. A call with
a single row (batch-1 decode) uses ``torch.mv`` instead, the fastest bf16
matrix-vector kernel measured here. SmolLM2 decode, one process, A/B
alternating on the 2-core dev machine: mv-for-one-row 17.1/16.1/16.4
tokens/s vs packed-only 13.7/14.0/14.6 vs plain ``F.linear`` about 4% below
packed-only. ``pack_linears`` swaps every ``nn.Linear`` of a model for a
``PackedLinear`` when it applies (CPU, bf16, oneDNN with bf16 support);
elsewhere the model is left as is.

fp32 is packed too: MKL's fp32 GEMM is very slow for a few rows on CPUs it
does not tune for (AMD EPYC, AVX2: a [11, 576] x [576, 1536] product took
10x the time of one row). Verifying drafts runs exactly such products; on
SmolLM2 fp32 a forward over 11 rows went from 458 ms to 268 ms with packed
weights. For one or two rows fp32 keeps the weight transposed (``[in, out]``)
and multiplies ``x @ weight_t``: 30 SmolLM2 layers' linears, weights
streamed from memory, AMD EPYC: one row 29 ms vs 38 ms with ``torch.mv`` and
32 ms packed; two rows 49 ms vs 55 ms packed.
"""
from __future__ import annotations

import torch
from torch import nn


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    return (device.type == "cpu" and dtype in (torch.bfloat16, torch.float32)
            and torch.backends.mkldnn.is_available()
            and (dtype == torch.float32 or torch.ops.mkldnn._is_mkldnn_bf16_supported()))


class PackedLinear(nn.Module):
    """bf16 linear: oneDNN-packed weights for several rows, ``torch.mv`` for a single row.

    At one row (batch-1 decode) the bf16 matrix-vector kernel behind ``torch.mv``
    beats both oneDNN paths (30 layers of SmolLM2: mv 26.4 ms, F.linear 34.4 ms);
    from two rows on, the packed AMX kernel wins.
    """

    def __init__(self, weight: torch.Tensor,  # [out_features, in_features]
                 bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 1)
        self.bias = bias
        self.weight_t = None  # fp32: [in_features, out_features] for one or two rows
        if weight.dtype == torch.float32:
            self.weight_t = weight.t().contiguous()
            self.weight = self.weight_t.t()  # a view: no second copy
        else:
            self.weight = weight.contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_rows, in] -> [num_rows, out]
        if self.weight_t is not None and x.shape[0] <= 2:
            out = x @ self.weight_t
        elif x.shape[0] == 1:
            out = torch.mv(self.weight, x[0]).unsqueeze(0)
        else:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return out if self.bias is None else out + self.bias


def pack_linears(model: nn.Module) -> None:
    """Replace each nn.Linear child (recursively) by a PackedLinear, in place."""
    for name, child in model.named_children():
        if isinstance(child, nn.Linear):
            setattr(model, name, PackedLinear(child.weight.data, None if child.bias is None else child.bias.data))
        else:
            pack_linears(child)
