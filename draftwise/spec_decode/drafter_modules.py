"""Building blocks the hidden-state drafters share: layers from checkpoints, rope, device placement.

``decoder_layer`` makes a ``DecoderLayer`` for a drafter config and fills it
from Hugging Face-named tensors under a prefix; ``norm``, ``linear`` and
``own_embedding`` read single tensors with their shapes checked; ``place``
moves a drafter to the target's device and dtype with norms kept in fp32, and where the
target's own linears run on GGUF blocks (a GGUF file, or ``quantization``), turns the drafter's
linears into Q8_0 blocks on the same kernels (a drafter's step then costs a fraction of the
target's instead of running bf16 matrix products one row at a time);
``RopeCache`` looks up cos/sin for a batch's positions; ``check_width``
compares a drafter dimension with the target's and names both.
"""
from __future__ import annotations

import torch
from torch import nn

from ..layers.common import RMSNorm, rope_tables
from ..models.decoder import ArchSpec, DecoderLayer, move_keeping_fp32_norms
from ..models.quantize import quantized
from ..models.registry import load_layer
from .drafter_checkpoint import DrafterCheckpoint


def decoder_layer(ckpt: DrafterCheckpoint, config, prefix: str, qkv_in_features: int | None = None,
                  qk_norm: bool = False, skip: tuple[str, ...] = ()) -> DecoderLayer:
    layer = DecoderLayer(config, ArchSpec(qk_norm=qk_norm), "full_attention", qkv_in_features)
    load_layer(layer, ckpt.tensors, prefix, ckpt.what, skip=skip)
    return layer


def norm(ckpt: DrafterCheckpoint, name: str, dim: int, eps: float) -> RMSNorm:
    module = RMSNorm(dim, eps)
    module.weight.data = ckpt.get(name, (dim,)).float()
    return module


def linear(ckpt: DrafterCheckpoint, name: str, out_features: int, in_features: int,
           bias: str | None = None) -> nn.Linear:
    """``nn.Linear`` from ``{name}`` [out, in] (and an optional bias tensor, if the checkpoint has it)."""
    has_bias = bias is not None and bias in ckpt.tensors
    module = nn.Linear(in_features, out_features, bias=has_bias)
    module.weight.data = ckpt.get(name, (out_features, in_features)).float()
    if has_bias:
        module.bias.data = ckpt.get(bias, (out_features,)).float()
    return module


def own_embedding(ckpt: DrafterCheckpoint, name: str, target) -> nn.Embedding | None:
    """The drafter's own embedding table if the checkpoint has one (else it shares the target's);
    ``target``: the ``TargetInfo`` (the table is [vocab_size, hidden_size] of the whole vocabulary)."""
    if name not in ckpt.tensors:
        return None
    shape = (target.vocab_size, target.hf_config.hidden_size)
    own = nn.Embedding(*shape)
    own.weight.data = ckpt.get(name, shape).float()
    return own


def place(module: nn.Module, target) -> nn.Module:
    """Move ``module`` to the ``target``'s (``TargetInfo``) device/dtype, RMSNorm weights kept in fp32,
    linears on the target's kernels. Drafters hold the target modules they share (embedding,
    lm_head) outside their module tree, so those stay."""
    move_keeping_fp32_norms(module, target.device, target.dtype)
    module.requires_grad_(False)
    if getattr(target.model, "num_gguf_linears", 0) and target.device.type == "cpu":
        quantize_drafter(module)
    return module.eval()


def input_dtype(module: nn.Module) -> torch.dtype:
    """The dtype to feed ``module``: a float linear's weight dtype; fp32 for one on GGUF blocks (it
    takes any float input and returns that dtype)."""
    weight = getattr(module, "weight", None)
    return weight.dtype if weight is not None else torch.float32


def quantize_drafter(module: nn.Module, qtype: str = "Q8_0") -> int:
    """Replace every ``nn.Linear`` in ``module``'s tree whose input width takes whole blocks by a
    ``GGUFLinear`` over ``qtype`` blocks of its weight; returns how many."""
    count = 0
    for name, child in list(module.named_children()):
        if not isinstance(child, nn.Linear):
            count += quantize_drafter(child, qtype)
            continue
        new = quantized(child, qtype)
        if new is not None:
            setattr(module, name, new)
            count += 1
    return count


class RopeCache:
    def __init__(self, config, head_dim: int, max_positions: int, device: torch.device, dtype: torch.dtype):
        cos, sin = rope_tables(config, head_dim, "full_attention", max_positions)
        self.cos, self.sin = cos.to(device, dtype), sin.to(device, dtype)

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)  # [num_rows, 1, head_dim]


def check_width(ckpt: DrafterCheckpoint, what: str, value: int, target_value: int) -> None:
    if value != target_value:
        raise ValueError(f"{ckpt.what}: {what} is {value} but the target's is {target_value}; this drafter "
                         "was made for another model")
