"""Training an EAGLE-1 drafter (the ``eagle`` proposer's network).

Network ``spec_decode/drafter_networks.eagle_step``, as the proposer runs it: ``g =
layer(fc([embed(token) ; h]))`` with a decoder layer that has no input norm; ``h`` is the
target's final-norm hidden state (step 0) or the drafter's previous output; the target's lm_head
(frozen, shared, not saved) turns ``g`` into logits. As in EAGLE-1, ``g`` is also regressed onto
the target's next feature (smooth L1) so that chained steps read something like the target's
states; the classification loss uses the lm_head rows of the draft vocabulary. Export: SafeAILab
EAGLE layout (``fc.weight``, ``layers.0.*`` without ``input_layernorm``; Llama config with one
layer)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...models.decoder import ArchSpec, DecoderLayer
from ...spec_decode.drafter_networks import eagle_step
from ..dataset import Batch, DraftVocab
from ..trainable import ChainTrainable, TargetParts, frozen, layer_tensors, register, shift_left
from ..ttt import ttt_attend

REGRESSION_WEIGHT = 1.0


@register
class EagleTrainable(ChainTrainable):
    method = "eagle"

    def __init__(self, target: TargetParts, vocab: DraftVocab, options: dict):
        super().__init__(target, vocab, options)
        config, hidden = target.config, target.config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.layer = DecoderLayer(config, ArchSpec(), "full_attention")
        self.register_buffer("embed", frozen(target.embed), persistent=False)
        self.register_buffer("head", frozen(target.lm_head[vocab.draft_ids]), persistent=False)
        self.rope = self.rope_cache(self.layer.head_dim)
        self.requires_grad_(True)
        self.layer.input_norm.requires_grad_(False)  # not part of EAGLE's layer 0

    def first_hidden(self, batch: Batch) -> torch.Tensor:
        return self.final_state(batch)

    def step(self, step, token_ids, hidden, cache) -> torch.Tensor:
        return eagle_step(self.fc, self.layer, self.embed[token_ids], hidden,
                          lambda x: ttt_attend(self.layer, x, self.rope, step, cache))

    def logits(self, step: int, rows: torch.Tensor) -> torch.Tensor:
        return rows @ self.head.T

    def extra_loss(self, step: int, out: torch.Tensor, batch: Batch) -> torch.Tensor:
        mask = shift_left(batch.loss_mask, 1 + step)
        if not mask.any():
            return out.new_zeros(())
        goal = shift_left(self.final_state(batch), 1 + step)  # the target's feature at p + 1 + step
        return REGRESSION_WEIGHT * 0.8 ** step * F.smooth_l1_loss(out[mask], goal[mask])

    def tensors(self) -> dict[str, torch.Tensor]:
        out = layer_tensors(self.layer, "layers.0.", input_norm=False)
        out.update({"fc.weight": self.fc.weight.detach(), "fc.bias": self.fc.bias.detach()})
        return out

    def public_config(self) -> dict:
        config = self.target.config_dict()
        config.update({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1,
                       "bias": True})
        return config
