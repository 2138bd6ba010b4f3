"""The per-position computation of each trainable drafter, defined once.

A proposer runs these with its attention over its own paged KV cache; ``train-draft`` runs them
with training-time-test attention over whole padded samples (``train/ttt.py``). Both pass
``attend``: a function from the layer's attention input [rows, in_features] to the attention
output [rows, hidden] (already through ``o_proj``), so the network a drafter is trained as is the
network the engine runs. Inputs and outputs are fp32 pre-norm states [rows, hidden]; ``embeds``
are the token embeddings [rows, hidden] the drafter reads.

* ``eagle_step`` (EAGLE-1): ``x = fc([embed ; h])``, a decoder layer without input norm.
* ``eagle3_step`` (EAGLE-3): a decoder layer whose q/k/v read ``[input_norm(embed) ;
  hidden_norm(h)]``; the residual is ``h`` (or ``hidden_norm(h)`` with ``norm_before_residual``).
* ``mtp_step`` (DeepSeek MTP): ``x = eh_proj([enorm(embed) ; hnorm(h)])``, a full decoder layer.
* ``medusa_head``: residual SiLU blocks over the target's state.
* ``eagle3_layer_ids``: EAGLE-3's default auxiliary target layers.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .drafter_modules import input_dtype

Attend = Callable[[torch.Tensor], torch.Tensor]  # [rows, in_features] -> [rows, hidden]


def eagle3_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's auxiliary layers (2, L // 2, L - 3), kept inside [0, L] for very shallow models."""
    return [min(2, num_layers), num_layers // 2, max(0, num_layers - 3)]


def eagle_step(fc: nn.Module, layer: nn.Module, embeds: torch.Tensor, hidden: torch.Tensor,
               attend: Attend) -> torch.Tensor:
    x = fc(torch.cat((embeds, hidden.float()), dim=-1).to(input_dtype(fc))).float()
    return layer.feed_forward(x + attend(x))


def eagle3_step(hidden_norm: nn.Module, layer: nn.Module, embeds: torch.Tensor, hidden: torch.Tensor,
                attend: Attend, norm_before_residual: bool = False) -> torch.Tensor:
    normed = hidden_norm(hidden)
    residual = normed if norm_before_residual else hidden.float()
    return layer.feed_forward(residual + attend(torch.cat((layer.input_norm(embeds), normed), dim=-1)))


def mtp_step(enorm: nn.Module, hnorm: nn.Module, eh_proj: nn.Module, layer: nn.Module, embeds: torch.Tensor,
             hidden: torch.Tensor, attend: Attend) -> torch.Tensor:
    x = eh_proj(torch.cat((enorm(embeds), hnorm(hidden)), dim=-1).to(input_dtype(eh_proj))).float()
    return layer.feed_forward(x + attend(layer.input_norm(x)))


def medusa_head(blocks: nn.ModuleList, hidden: torch.Tensor) -> torch.Tensor:  # [rows, hidden]
    x = hidden
    for block in blocks:
        x = x + F.silu(block(x))
    return x
