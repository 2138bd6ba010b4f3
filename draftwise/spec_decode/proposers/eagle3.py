"""``eagle3`` (EAGLE-3): drafts from three intermediate hidden states of the target, in a reduced vocabulary.

Checkpoint (EAGLE-3 / vLLM layout; also the ``speculators`` config format):
``midlayer.*`` or ``layers.0.*`` (a Llama decoder layer whose q/k/v read
2H = [input_layernorm(embedding) ; hidden_norm(hidden)], plus
``hidden_norm.weight``), ``fc.weight`` [H, 3 * H_target] over the target's
auxiliary hidden states, ``norm.weight``, ``lm_head.weight`` [draft_vocab, H],
``d2t`` (draft id -> target id offset; absent only when the vocabularies are
equal), ``t2d`` (unused), optionally ``embed_tokens.weight``.

The auxiliary states are the inputs of target layers
``eagle_aux_hidden_state_layer_ids`` (config.json, top level or in
``eagle_config``; default (2, L // 2, L - 3) as in EAGLE-3 and vLLM). The network is
``drafter_networks.eagle3_step``, the one ``train-draft`` trains.
Position ``p``: ingestion feeds ``fc(concat(aux states of p))``, chain steps
the previous pre-norm output; the residual is that input (or its
``hidden_norm`` with ``norm_before_residual``). Drafts are
``argmax(lm_head(norm(out))) + d2t``.
"""
from __future__ import annotations

import torch
from torch import nn

from ..chain_drafter import ChainModel, ChainProposer, IngestBatch
from ..drafter_checkpoint import DrafterCheckpoint, load_drafter, require_model
from ..drafter_modules import RopeCache, check_width, decoder_layer, input_dtype, linear, norm, own_embedding, place
from ..drafter_networks import eagle3_layer_ids, eagle3_step
from ..interface import ProposerNeeds, register


def aux_layer_ids(config: dict, num_target_layers: int, what: str) -> tuple[int, ...]:
    ids = config.get("eagle_aux_hidden_state_layer_ids") or \
        (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        ids = eagle3_layer_ids(num_target_layers)
    ids = tuple(ids)
    if not ids or not all(isinstance(i, int) and 0 <= i <= num_target_layers for i in ids):
        raise ValueError(f"{what}: eagle_aux_hidden_state_layer_ids={list(ids)} must be layer ids in "
                         f"[0, {num_target_layers}] of the target ({num_target_layers} layers)")
    return ids


class Eagle3Model(ChainModel):
    def __init__(self, ckpt: DrafterCheckpoint, target, num_aux: int):
        super().__init__()
        config = ckpt.layer_config()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        target_hidden = ckpt.config.get("target_hidden_size") or target.hf_config.hidden_size
        check_width(ckpt, "target_hidden_size", target_hidden, target.hf_config.hidden_size)
        check_width(ckpt, "hidden_size", hidden, target.hf_config.hidden_size)
        prefix = "midlayer." if any(k.startswith("midlayer.") for k in ckpt.tensors) else "layers.0."
        self.fc = linear(ckpt, "fc.weight", hidden, num_aux * target_hidden, bias="fc.bias")
        self.layers = nn.ModuleList([decoder_layer(ckpt, config, prefix, qkv_in_features=2 * hidden)])
        self.hidden_norm = norm(ckpt, prefix + "hidden_norm.weight", hidden, eps)
        self.norm = norm(ckpt, "norm.weight", hidden, eps)
        draft_vocab = ckpt.config.get("draft_vocab_size") or config.vocab_size
        self.lm_head = linear(ckpt, "lm_head.weight", draft_vocab, hidden)
        self.d2t = self._draft_to_target(ckpt, draft_vocab, target.vocab_size)
        self.norm_before_residual = bool(ckpt.config.get("norm_before_residual", False))
        self.embed_tokens = own_embedding(ckpt, "embed_tokens.weight", target)
        self._target = [target.model]
        self.rope = RopeCache(config, self.layers[0].head_dim, target.max_model_len, target.device, target.dtype)
        place(self, target)
        self.d2t = self.d2t.to(target.device)

    @staticmethod
    def _draft_to_target(ckpt: DrafterCheckpoint, draft_vocab: int, vocab: int) -> torch.Tensor:
        if "d2t" not in ckpt.tensors:
            if draft_vocab != vocab:
                ckpt.require("d2t")  # a reduced vocabulary needs its map
            return torch.zeros(draft_vocab, dtype=torch.int64)
        d2t = ckpt.get("d2t", (draft_vocab,)).to(torch.int64)
        ids = torch.arange(draft_vocab) + d2t
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ValueError(f"{ckpt.what}: d2t maps draft ids outside the target vocabulary [0, {vocab})")
        return d2t

    def _forward(self, token_ids, positions, hidden, kv_cache, meta) -> torch.Tensor:
        layer = self.layers[0]
        cos, sin = self.rope(positions)
        return eagle3_step(self.hidden_norm, layer, self.embed(token_ids), hidden,
                           lambda h: layer.attend(h, cos, sin, kv_cache[0], meta), self.norm_before_residual)

    def ingest(self, batch: IngestBatch, kv_cache: torch.Tensor) -> torch.Tensor:
        hidden = self.fc(batch.target_features.to(input_dtype(self.fc))).float()
        return self._forward(batch.token_ids, batch.positions, hidden, kv_cache, batch.meta)

    def step(self, step, token_ids, positions, hidden, kv_cache, meta) -> torch.Tensor:
        return self._forward(token_ids, positions, hidden, kv_cache, meta)

    def draft_ids(self, step: int, hidden: torch.Tensor) -> torch.Tensor:
        draft = self._draft_logits(hidden).argmax(dim=-1)
        return draft + self.d2t[draft]

    def draft_topk(self, step: int, hidden: torch.Tensor, k: int) -> torch.Tensor:
        draft = self._draft_logits(hidden).topk(k, dim=-1).indices  # [num_rows, k]
        return draft + self.d2t[draft]

    def _draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [num_rows, draft_vocab]
        return self.lm_head(self.norm(hidden).to(input_dtype(self.lm_head)))


@register
class Eagle3Proposer(ChainProposer):
    method = "eagle3"
    drafts_trees = True

    @classmethod
    def check_config(cls, config) -> None:
        require_model(config.model, cls.method)

    def __init__(self, config, target):
        super().__init__(config, target)
        ckpt = load_drafter(config.model, self.method)
        ids = aux_layer_ids(ckpt.config, target.hf_config.num_hidden_layers, ckpt.what)
        self.needs = ProposerNeeds(aux_layer_ids=ids, kv_cache=True, kv_reads_next_token=True)
        self.model = Eagle3Model(ckpt, target, len(ids))
