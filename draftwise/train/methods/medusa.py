"""Training Medusa heads (the ``medusa`` proposer's network), vLLM layout.

Head ``i`` reads the target's final-norm state at ``p`` through ``num_head_layers``
residual blocks ``x + SiLU(W x + b)`` and its own lm_head over the draft
vocabulary, and predicts token ``p + 2 + i``. The blocks start at zero (identity)
and each lm_head at the target's lm_head rows; training moves each head to its own
offset. Export (vLLM ``MedusaModel``): ``blocks.{i}.layers.{j}.{weight,bias}``,
``lm_heads.{i}.weight``, ``token_map`` (draft id -> target id) with
``truncated_vocab_size``.
"""
from __future__ import annotations

import torch
from torch import nn

from ...spec_decode.drafter_networks import medusa_head
from ..dataset import Batch, DraftVocab
from ..trainable import TargetParts, TrainableDrafter, register


@register
class MedusaTrainable(TrainableDrafter):
    method = "medusa"

    def __init__(self, target: TargetParts, vocab: DraftVocab, options: dict):
        super().__init__(target, vocab, options)
        hidden = target.config.hidden_size
        self.num_heads, self.num_layers = options["num_heads"], options["num_head_layers"]
        self.blocks = nn.ModuleList(nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(self.num_layers))
                                    for _ in range(self.num_heads))
        for block in (b for head in self.blocks for b in head):
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)
        self.lm_heads = nn.ModuleList(nn.Linear(hidden, vocab.size, bias=False) for _ in range(self.num_heads))
        for head in self.lm_heads:
            head.weight.data = target.lm_head[vocab.draft_ids].clone()

    def max_steps(self) -> int:
        return self.num_heads

    def unroll(self, batch: Batch, num_steps: int) -> tuple[list[torch.Tensor], torch.Tensor]:
        hidden = self.final_state(batch)
        states = []
        for blocks in self.blocks[:num_steps]:
            states.append(medusa_head(blocks, hidden))
        return states, hidden.new_zeros(())

    def logits(self, step: int, rows: torch.Tensor) -> torch.Tensor:
        return self.lm_heads[step](rows)

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {"token_map": self.vocab.draft_ids}
        for i, (blocks, lm_head) in enumerate(zip(self.blocks, self.lm_heads)):
            for j, block in enumerate(blocks):
                out[f"blocks.{i}.layers.{j}.weight"] = block.weight.detach()
                out[f"blocks.{i}.layers.{j}.bias"] = block.bias.detach()
            out[f"lm_heads.{i}.weight"] = lm_head.weight.detach()
        return out

    def public_config(self) -> dict:
        config = self.target.config
        return {"architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": config.hidden_size,
                "vocab_size": self.vocab.vocab_size, "num_heads": self.num_heads,
                "num_hidden_layers": self.num_layers, "truncated_vocab_size": self.vocab.size,
                "medusa_fc_bias": True, "original_lm_head": False}
