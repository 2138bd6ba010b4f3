"""Training an EAGLE-3 drafter (the ``eagle3`` proposer's network, trained with training-time test).

Network ``spec_decode/drafter_networks.eagle3_step``, as the proposer runs it: ``fc`` [H, 3H]
over the target's aux states (inputs of layers (2, L // 2, L - 3)), one decoder layer whose
q/k/v read [input_layernorm(embed(token)) ; hidden_norm(h)], ``norm``, ``lm_head`` over the
reduced draft vocabulary. Starts from the target: ``lm_head`` = the target's lm_head rows of the
draft vocabulary, ``norm`` = its final norm; embeddings stay the target's (frozen, not saved).
Export: EAGLE-3 / vLLM layout (``midlayer.*``, ``fc``, ``norm``, ``lm_head``, ``d2t``, ``t2d``;
``LlamaForCausalLMEagle3`` config with ``draft_vocab_size`` and
``eagle_config.eagle_aux_hidden_state_layer_ids``)."""
from __future__ import annotations

import torch
from torch import nn

from ...layers.common import RMSNorm
from ...models.decoder import ArchSpec, DecoderLayer
from ...spec_decode.drafter_networks import eagle3_layer_ids, eagle3_step
from ..dataset import Batch, DraftVocab
from ..trainable import ChainTrainable, TargetParts, frozen, layer_tensors, register
from ..ttt import ttt_attend


@register
class Eagle3Trainable(ChainTrainable):
    method = "eagle3"

    @classmethod
    def needed_layers(cls, target: TargetParts, options: dict) -> list[int]:
        return list(options.get("aux_layer_ids") or eagle3_layer_ids(target.num_layers))

    def __init__(self, target: TargetParts, vocab: DraftVocab, options: dict):
        super().__init__(target, vocab, options)
        config, hidden = target.config, target.config.hidden_size
        eps = config.rms_norm_eps
        self.aux_index: list[int] = options["layer_index"]  # where the aux layers sit in the data
        self.fc = nn.Linear(len(self.aux_index) * hidden, hidden, bias=False)
        self.layer = DecoderLayer(config, ArchSpec(), "full_attention", qkv_in_features=2 * hidden)
        self.hidden_norm = RMSNorm(hidden, eps)
        self.norm = RMSNorm(hidden, eps)
        self.norm.weight.data = target.norm_weight.clone()
        self.lm_head = nn.Linear(hidden, vocab.size, bias=False)
        self.lm_head.weight.data = target.lm_head[vocab.draft_ids].clone()
        self.register_buffer("embed", frozen(target.embed), persistent=False)
        self.rope = self.rope_cache(self.layer.head_dim)
        self.requires_grad_(True)

    def first_hidden(self, batch: Batch) -> torch.Tensor:
        aux = batch.hidden_states[:, :, self.aux_index]  # [B, T, 3, H]
        return self.fc(aux.flatten(2).float())

    def step(self, step, token_ids, hidden, cache) -> torch.Tensor:
        return eagle3_step(self.hidden_norm, self.layer, self.embed[token_ids], hidden,
                           lambda h: ttt_attend(self.layer, h, self.rope, step, cache))

    def logits(self, step: int, rows: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(rows))

    def tensors(self) -> dict[str, torch.Tensor]:
        out = layer_tensors(self.layer, "midlayer.")
        out.update({"midlayer.hidden_norm.weight": self.hidden_norm.weight.detach(),
                    "fc.weight": self.fc.weight.detach(), "norm.weight": self.norm.weight.detach(),
                    "lm_head.weight": self.lm_head.weight.detach(), "d2t": self.vocab.d2t, "t2d": self.vocab.t2d})
        return out

    def public_config(self) -> dict:
        config = self.target.config_dict()
        config.update({"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
                       "draft_vocab_size": self.vocab.size, "vocab_size": self.vocab.vocab_size,
                       "target_hidden_size": self.target.config.hidden_size, "tie_word_embeddings": False,
                       "norm_before_residual": False,
                       "eagle_config": {"eagle_aux_hidden_state_layer_ids": self.options["layer_ids"],
                                        "use_aux_hidden_state": True}})
        return config
