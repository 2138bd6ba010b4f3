"""``dflash``: a block-diffusion drafter; one forward drafts a whole block.

Checkpoint (z-lab DFlash layout): a Qwen3-style config plus ``block_size`` and
``dflash_config: {target_layer_ids, mask_token_id}``; tensors ``layers.{i}.*``
(attention with ``q_norm``/``k_norm``, MLP, input/post-attention norms),
``fc.weight`` [H, n * H_target], ``hidden_norm.weight``, ``norm.weight``; no
embeddings or lm_head of its own (the target's are used).

Context: for every position ``p`` the target has computed,
``ctx_p = hidden_norm(fc(concat(outputs of target layers target_layer_ids at p)))``;
each drafter layer projects it to K/V (its k/v projections, k norm, rope at
``p``), kept in the drafter's paged cache and extended by the new rows of each
step (rejected rows never enter). Block: queries are the target embeddings of
[last token, mask, ..., mask] at positions ``num_tokens - 1 ...``; each layer
attends non-causally to the whole context and the whole block; the target's
lm_head on ``norm`` of block positions 1.. gives the drafts (argmax).

``num_speculative_tokens`` defaults to ``block_size - 1`` and may not exceed
it; a sequence allowed fewer drafts this step runs a shorter block (its
block K/V must fit in the KV blocks the engine reserved for it).
"""
from __future__ import annotations

import torch
from torch import nn

from ...layers.common import apply_rope
from ...paged import ForwardInput, prepare_batch
from ...validate import PREFIX
from ..chain_drafter import ChainModel, ChainProposer
from ..drafter_checkpoint import DrafterCheckpoint, declared_config, load_drafter, require_model
from ..drafter_modules import RopeCache, check_width, decoder_layer, input_dtype, linear, norm, place
from ..forward_timer import ForwardTimer
from ..interface import DraftBatch, ProposeBatch, ProposerNeeds, TargetHidden, register


def target_layer_ids(config: dict, num_target_layers: int, num_draft_layers: int, what: str) -> list[int]:
    ids = (config.get("dflash_config") or {}).get("target_layer_ids")
    if ids is None:  # z-lab's default: the middle layer, or spread over [1, L - 3]
        if num_draft_layers == 1:
            ids = [num_target_layers // 2]
        else:
            span = num_target_layers - 4
            ids = [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]
    if not ids or not all(isinstance(i, int) and 0 <= i < num_target_layers for i in ids):
        raise ValueError(f"{what}: dflash_config.target_layer_ids={ids} must be layer ids in "
                         f"[0, {num_target_layers - 1}] of the target")
    return list(ids)


class DFlashModel(ChainModel):
    def __init__(self, ckpt: DrafterCheckpoint, target, num_features: int):
        super().__init__()
        config = ckpt.layer_config(default_type="qwen3")
        hidden, eps = config.hidden_size, config.rms_norm_eps
        check_width(ckpt, "hidden_size", hidden, target.hf_config.hidden_size)
        self.fc = linear(ckpt, "fc.weight", hidden, num_features * target.hf_config.hidden_size)
        self.hidden_norm = norm(ckpt, "hidden_norm.weight", hidden, eps)
        self.norm = norm(ckpt, "norm.weight", hidden, eps)
        self.layers = nn.ModuleList(decoder_layer(ckpt, config, f"layers.{i}.", qk_norm=True)
                                    for i in range(config.num_hidden_layers))
        self._target = [target.model]
        self.rope = RopeCache(config, self.layers[0].head_dim, target.max_model_len, target.device, target.dtype)
        place(self, target)

    def write_context(self, features: torch.Tensor,  # [num_rows, n * H_target]
                      positions: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor) -> None:
        """K/V of the context rows, for every layer, into the drafter cache at ``slots``."""
        ctx = self.hidden_norm(self.fc(features.to(input_dtype(self.fc))).float())  # [num_rows, H]
        cos, sin = self.rope(positions)
        for i, layer in enumerate(self.layers):
            q_size, kv_size, _ = layer.split
            kv = layer.qkv_proj(ctx.to(layer.compute_dtype))[:, q_size:]
            k = layer.k_norm(kv[:, :kv_size].view(-1, layer.num_kv_heads, layer.head_dim)).to(cos.dtype)
            k = apply_rope(k, cos, sin)
            v = kv[:, kv_size:].view(-1, layer.num_kv_heads, layer.head_dim)
            kv_cache[i][:, slots] = torch.stack((k, v)).to(kv_cache.dtype)

    def draft_block(self, token_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                    meta) -> torch.Tensor:  # [num_rows] argmax token of every block row
        x = self._target[0].embed_tokens(token_ids).float()
        cos, sin = self.rope(positions)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, kv_cache[i], meta)
        return self._target[0].compute_logits(self.norm(x)).argmax(dim=-1)


@register
class DFlashProposer(ChainProposer):
    """Shares the chain drafters' KV pool and row selection; drafts a block instead of a chain."""
    method = "dflash"

    @classmethod
    def check_config(cls, config) -> None:
        require_model(config.model, cls.method)
        block = _block_size(config.model)
        if block is not None and config.num_speculative_tokens > block - 1:
            raise ValueError(f"{PREFIX}['num_speculative_tokens']={config.num_speculative_tokens} is invalid: "
                             f"the DFlash block size is {block}, so at most {block - 1} drafts")

    @classmethod
    def default_num_speculative_tokens(cls, options, model) -> int | None:
        block = _block_size(model)
        return block - 1 if block else None

    def __init__(self, config, target):
        super().__init__(config, target)
        ckpt = load_drafter(config.model, self.method)
        num_draft_layers = ckpt.config.get("num_hidden_layers", 1)
        ids = target_layer_ids(ckpt.config, target.hf_config.num_hidden_layers, num_draft_layers, ckpt.what)
        # The output of target layer i is the input of layer i + 1 (id num_layers: before the final norm).
        self.needs = ProposerNeeds(aux_layer_ids=tuple(i + 1 for i in ids), kv_cache=True)
        self.mask_token_id = (ckpt.config.get("dflash_config") or {}).get("mask_token_id")
        if not isinstance(self.mask_token_id, int) or not 0 <= self.mask_token_id < target.vocab_size:
            raise ValueError(f"{ckpt.what}: dflash_config.mask_token_id={self.mask_token_id!r} must be a token id "
                             f"of the target's vocabulary [0, {target.vocab_size})")
        self.model = DFlashModel(ckpt, target, len(ids))
        self.block_timer = ForwardTimer()

    def drafting_seconds(self, depth: int) -> float:
        """One forward drafts the whole block, whatever its depth (after the context is written)."""
        return self.ingest_timer.seconds(self.num_seqs) + self.block_timer.seconds if depth > 0 else 0.0

    @torch.inference_mode()
    def propose(self, batch: ProposeBatch) -> DraftBatch:
        drafting = self.drafting(batch)
        if batch.target_hidden is not None:
            self._ingest(batch.target_hidden, drafting)
        rows = [i for i, (seq, limit) in enumerate(zip(batch.seqs, batch.max_num_drafts))
                if limit > 0 and seq.spec.drafter_num_computed_tokens == seq.num_tokens - 1]
        drafts: list[list[int]] = [[] for _ in batch.seqs]
        if rows:
            inputs = [ForwardInput([batch.seqs[i].all_token_ids[-1]] + [self.mask_token_id] * batch.max_num_drafts[i],
                                   batch.seqs[i].num_tokens - 1, batch.seqs[i].block_ids) for i in rows]
            ids, pos, meta, cu = prepare_batch(inputs, self.target.block_size, None, self.target.device,
                                               causal=False)
            with self.block_timer.timing():
                tokens = self.model.draft_block(ids, pos, self.kv_cache, meta).tolist()
            for n, i in enumerate(rows):
                drafts[i] = tokens[cu[n] + 1:cu[n + 1]]
        return DraftBatch.from_lists(drafts)

    def _ingest(self, target: TargetHidden, drafting: set[int]) -> None:
        """Context K/V for the positions the target computed (up to ``num_tokens - 2``) of the sequences
        in ``drafting``; the other sequences' rows wait (``ChainProposer.ingest_batch``)."""
        prepared = self.ingest_batch(target, drafting)
        if prepared is not None:
            batch, _ = prepared
            with self.ingest_timer.timing(len(batch.token_ids)):
                self.model.write_context(batch.target_features, batch.positions, self.kv_cache,
                                         batch.meta.slot_mapping)


def _block_size(model: str) -> int | None:
    value = declared_config(model).get("block_size")
    return value if isinstance(value, int) and value >= 2 else None
