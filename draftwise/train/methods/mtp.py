"""Training a multi-token-prediction layer (the ``mtp`` proposer's network, DeepSeek-V3 style).

Network ``spec_decode/drafter_networks.mtp_step`` (as the proposer runs it) with one MTP layer:
``x = eh_proj([enorm(embed(token)) ; hnorm(h)])`` (embedding zeroed at position 0), a full
decoder layer, ``shared_head.norm`` and the target's lm_head (frozen, shared, not saved). ``h``
is the target's final-norm state at step 0 and the layer's own output after that (K > 1 reuses
the layer, as vLLM does), so training unrolls it with training-time test. Export: the target's
config with ``num_nextn_predict_layers: 1`` and the layer as ``model.layers.{L}.*``, which the
``mtp`` proposer reads from ``speculative_config["model"]``."""
from __future__ import annotations

import torch
from torch import nn

from ...layers.common import RMSNorm
from ...models.decoder import ArchSpec, DecoderLayer
from ...spec_decode.drafter_networks import mtp_step
from ..dataset import Batch, DraftVocab
from ..trainable import ChainTrainable, TargetParts, frozen, layer_tensors, register
from ..ttt import ttt_attend


@register
class MtpTrainable(ChainTrainable):
    method = "mtp"

    def __init__(self, target: TargetParts, vocab: DraftVocab, options: dict):
        super().__init__(target, vocab, options)
        config, hidden, eps = target.config, target.config.hidden_size, target.config.rms_norm_eps
        self.enorm, self.hnorm = RMSNorm(hidden, eps), RMSNorm(hidden, eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.layer = DecoderLayer(config, ArchSpec(), "full_attention")
        self.head_norm = RMSNorm(hidden, eps)
        self.head_norm.weight.data = target.norm_weight.clone()
        self.register_buffer("embed", frozen(target.embed), persistent=False)
        self.register_buffer("head", frozen(target.lm_head[vocab.draft_ids]), persistent=False)
        self.rope = self.rope_cache(self.layer.head_dim)
        self.requires_grad_(True)

    def first_hidden(self, batch: Batch) -> torch.Tensor:
        return self.final_state(batch)

    def step(self, step, token_ids, hidden, cache) -> torch.Tensor:
        e = self.embed[token_ids]
        if step == 0:
            e = e.clone()
            e[:, 0] = 0  # position 0 reads no embedding (as DeepSeek's MTP)
        return mtp_step(self.enorm, self.hnorm, self.eh_proj, self.layer, e, hidden,
                        lambda h: ttt_attend(self.layer, h, self.rope, step, cache))

    def logits(self, step: int, rows: torch.Tensor) -> torch.Tensor:
        return self.head_norm(rows) @ self.head.T

    def tensors(self) -> dict[str, torch.Tensor]:
        prefix = f"model.layers.{self.target.num_layers}."
        out = layer_tensors(self.layer, prefix)
        out.update({prefix + "enorm.weight": self.enorm.weight.detach(), prefix + "hnorm.weight":
                    self.hnorm.weight.detach(), prefix + "eh_proj.weight": self.eh_proj.weight.detach(),
                    prefix + "shared_head.norm.weight": self.head_norm.weight.detach()})
        return out

    def public_config(self) -> dict:
        config = self.target.config_dict()
        config.update({"architectures": list(getattr(self.target.config, "architectures", None) or []),
                       "num_nextn_predict_layers": 1})
        return config
