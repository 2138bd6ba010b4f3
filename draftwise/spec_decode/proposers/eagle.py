"""``eagle`` (EAGLE-1): a one-layer decoder over [embedding ; hidden] drafts from the target's features.

Checkpoint (``speculative_config["model"]``, SafeAILab/EAGLE layout): config.json
of a one-layer Llama decoder; ``fc.weight`` [H, 2H] (``fc.bias`` if present),
``layers.0.self_attn.{q,k,v,o}_proj``, ``layers.0.mlp.{gate,up,down}_proj``,
``layers.0.post_attention_layernorm`` (layer 0 has no input norm), and
optionally ``embed_tokens.weight``. No lm_head and no final norm: the target's
embeddings (unless the checkpoint has its own) and lm_head are used.

Position ``p``: ``g_p = layer(fc(concat(embed(token p+1), h_p)))`` where ``h_p``
is the target's final-norm hidden state (ingestion) or the drafter's own
previous output (chain steps); the target's lm_head on ``g_p`` predicts token
``p + 2``. The engine side (ingestion, KV, chaining) is ``ChainProposer``.
"""
from __future__ import annotations

import torch
from torch import nn

from ..chain_drafter import ChainModel, ChainProposer, IngestBatch
from ..drafter_checkpoint import DrafterCheckpoint, load_drafter, require_model
from ..drafter_modules import RopeCache, check_width, decoder_layer, linear, own_embedding, place
from ..drafter_networks import eagle_step
from ..interface import ProposerNeeds, register


class Eagle1Model(ChainModel):
    def __init__(self, ckpt: DrafterCheckpoint, target):
        super().__init__()
        config = ckpt.layer_config()
        hidden = config.hidden_size
        check_width(ckpt, "hidden_size", hidden, target.hf_config.hidden_size)
        check_width(ckpt, "vocab_size", config.vocab_size, target.vocab_size)
        self.fc = linear(ckpt, "fc.weight", hidden, 2 * hidden, bias="fc.bias")
        layer = decoder_layer(ckpt, config, "layers.0.", skip=("input_norm",))
        layer.input_norm = nn.Identity()  # EAGLE's layer 0 reads fc's output directly
        self.layers = nn.ModuleList([layer])
        self.embed_tokens = own_embedding(ckpt, "embed_tokens.weight", target)
        self._target = [target.model]  # shared embedding / lm_head, outside this module tree
        self.rope = RopeCache(config, layer.head_dim, target.max_model_len, target.device, target.dtype)
        place(self, target)

    def _forward(self, token_ids, positions, hidden, kv_cache, meta) -> torch.Tensor:
        layer = self.layers[0]
        cos, sin = self.rope(positions)
        return eagle_step(self.fc, layer, self.embed(token_ids), hidden,
                          lambda x: layer.attend(x, cos, sin, kv_cache[0], meta))

    def ingest(self, batch: IngestBatch, kv_cache: torch.Tensor) -> torch.Tensor:
        return self._forward(batch.token_ids, batch.positions, batch.target_features, kv_cache, batch.meta)

    def step(self, step, token_ids, positions, hidden, kv_cache, meta) -> torch.Tensor:
        return self._forward(token_ids, positions, hidden, kv_cache, meta)

    def draft_ids(self, step: int, hidden: torch.Tensor) -> torch.Tensor:
        return self._target[0].compute_logits(hidden).argmax(dim=-1)

    def draft_topk(self, step: int, hidden: torch.Tensor, k: int) -> torch.Tensor:
        return self._target[0].compute_logits(hidden).topk(k, dim=-1).indices


@register
class EagleProposer(ChainProposer):
    method = "eagle"
    drafts_trees = True
    needs = ProposerNeeds(hidden_states=True, kv_cache=True, kv_reads_next_token=True)

    @classmethod
    def check_config(cls, config) -> None:
        require_model(config.model, cls.method)

    def __init__(self, config, target):
        super().__init__(config, target)
        self.model = Eagle1Model(load_drafter(config.model, self.method), target)
