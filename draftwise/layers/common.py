"""Building blocks shared by every decoder: RMSNorm, rotary embeddings, activations.

All of them act on flat token batches: tensors are ``[num_tokens, ...]``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ..kernels import native


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 with an fp32 weight; returns fp32 whatever the input dtype.

    ``offset=1`` gives Gemma's ``x * (1 + w)`` form (the +1 is folded into the
    weight at load). Callers cast the result to the compute dtype where a
    linear layer follows; the residual stream itself stays in fp32.
    """

    def __init__(self, dim: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim] -> fp32 [..., dim]
        if _native_norm(x, self.weight):  # one C++ call instead of torch's five ops (kernels/native.py)
            return torch.ops.draftwise_cpu.rms_norm(x.float(), self.weight, self.eps)
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight, self.eps)


def _native_norm(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Inference on CPU, outside a compiled graph, with the native kernels built."""
    return (x.device.type == "cpu" and not (x.requires_grad or weight.requires_grad)
            and not torch.compiler.is_compiling() and native.load())


def activation(name: str):
    """Map a Hugging Face ``hidden_act`` name to a function."""
    if name in ("silu", "swish"):
        return F.silu
    if name in ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu
    raise ValueError(f"hidden_act={name!r} is not supported; allowed: silu, gelu, gelu_pytorch_tanh")


def rope_tables(config, head_dim: int, layer_type: str | None,
                max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``[max_positions, head_dim]`` for one layer type.

    Frequencies come from transformers' own rope functions (default, linear,
    llama3, yarn, ...), so every rope scaling a config names is honoured.
    """
    with torch.device("cpu"):  # tables are built on the host even under a meta-device init
        return _rope_tables(config, head_dim, layer_type, max_positions)


def _rope_tables(config, head_dim, layer_type, max_positions):
    params = config.rope_parameters
    if layer_type is not None and isinstance(params, dict) and layer_type in params:
        params = params[layer_type]
    else:
        layer_type = None
    rope_type = (params or {}).get("rope_type", "default")
    if rope_type == "default":
        base = params["rope_theta"]
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        scaling = 1.0
    else:
        kwargs = {"layer_type": layer_type} if layer_type is not None else {}
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", **kwargs)
        inv_freq = inv_freq.double()
    positions = torch.arange(max_positions, dtype=torch.float64)
    freqs = torch.outer(positions, inv_freq).float()
    cos = torch.cat((freqs, freqs), dim=-1).cos() * scaling
    sin = freqs.sin() * scaling
    return cos, torch.cat((-sin, sin), dim=-1)  # sign of rotate_half folded into sin


def apply_rope(x: torch.Tensor,  # [..., num_tokens, num_heads, head_dim]
               cos: torch.Tensor,  # [num_tokens, 1, head_dim]
               signed_sin: torch.Tensor) -> torch.Tensor:  # [num_tokens, 1, head_dim]
    """Neox-style rotary embedding: x * cos + rotate_half(x) * sin, with the sign in ``signed_sin``."""
    swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)  # the two halves of head_dim exchanged
    return x * cos + swapped * signed_sin
