"""``mtp``: the multi-token-prediction layers a model ships in its own checkpoint (DeepSeek-V3 style).

``deepseek_mtp``, ``qwen3_next_mtp`` etc. are aliases. ``model`` defaults to
the target's directory; its config gives ``num_nextn_predict_layers`` (n) and
MTP layer ``i`` is stored after the target's L layers, as
``model.layers.{L+i}.{enorm, hnorm, eh_proj, self_attn.*, mlp.*,
input_layernorm, post_attention_layernorm, shared_head.norm, shared_head.head}``
(``embed_tokens`` and ``shared_head.head`` are optional: the target's are
shared). Dense MLPs only (a MoE MTP layer is rejected with the missing tensor).

Position ``p``, layer ``j``: ``x = eh_proj(concat(enorm(embed(token p+1)),
hnorm(h)))`` (embedding zeroed at position 0), one decoder layer, and
``shared_head.head(shared_head.norm(x))`` predicts token ``p + 2``. Draft step
``s`` uses layer ``s mod n``. ``h`` is the target's final-norm hidden state
for layer 0; layer ``j > 0`` reads layer ``j - 1``'s output at ``p - 1``, both
while ingesting the context and while drafting, so every layer's K/V covers
the whole sequence. ``num_speculative_tokens`` defaults to n; a larger value
must be a multiple of n (vLLM's rule for reusing layers).
"""
from __future__ import annotations

import torch
from torch import nn

from ...validate import PREFIX
from ..chain_drafter import ChainModel, ChainProposer, IngestBatch
from ..drafter_checkpoint import DrafterCheckpoint, declared_config, load_drafter
from ..drafter_modules import RopeCache, decoder_layer, input_dtype, linear, norm, own_embedding, place
from ..drafter_networks import mtp_step
from ..interface import ProposerNeeds, register


class MtpLayer(nn.Module):
    def __init__(self, ckpt: DrafterCheckpoint, config, prefix: str, qk_norm: bool, target):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.enorm = norm(ckpt, prefix + "enorm.weight", hidden, eps)
        self.hnorm = norm(ckpt, prefix + "hnorm.weight", hidden, eps)
        self.eh_proj = linear(ckpt, prefix + "eh_proj.weight", hidden, 2 * hidden)
        self.layer = decoder_layer(ckpt, config, prefix, qk_norm=qk_norm)
        self.head_norm = norm(ckpt, prefix + "shared_head.norm.weight", hidden, eps)
        head = prefix + "shared_head.head.weight"
        self.head = linear(ckpt, head, target.vocab_size, hidden) if head in ckpt.tensors else None


class MtpModel(ChainModel):
    def __init__(self, ckpt: DrafterCheckpoint, target, num_layers: int):
        super().__init__()
        config, first = target.hf_config, target.hf_config.num_hidden_layers
        qk_norm = target.model.spec.qk_norm
        self.mtp = nn.ModuleList(MtpLayer(ckpt, config, f"model.layers.{first + i}.", qk_norm, target)
                                 for i in range(num_layers))
        self.layers = nn.ModuleList(m.layer for m in self.mtp)  # one KV cache each
        self.embed_tokens = own_embedding(ckpt, f"model.layers.{first}.embed_tokens.weight", target)
        self._target = [target.model]
        self.rope = RopeCache(config, self.layers[0].head_dim, target.max_model_len, target.device, target.dtype)
        self._carry: dict[int, torch.Tensor] = {}  # seq_id -> [n - 1, H]: layer j's output at the last position
        place(self, target)

    def _forward(self, j: int, token_ids, positions, hidden, kv_cache, meta) -> torch.Tensor:
        mtp = self.mtp[j]
        embeds = self.embed(token_ids) * (positions != 0)[:, None]  # position 0 reads no embedding
        cos, sin = self.rope(positions)
        return mtp_step(mtp.enorm, mtp.hnorm, mtp.eh_proj, mtp.layer, embeds, hidden,
                        lambda h: mtp.layer.attend(h, cos, sin, kv_cache[j], meta))

    def ingest(self, batch: IngestBatch, kv_cache: torch.Tensor) -> torch.Tensor:
        cu = batch.cu_num_rows
        out = first = self._forward(0, batch.token_ids, batch.positions, batch.target_features, kv_cache, batch.meta)
        for j in range(1, len(self.mtp)):
            shifted = torch.zeros_like(out)  # layer j at p reads layer j - 1 at p - 1
            for n, seq_id in enumerate(batch.seq_ids):
                a, b = cu[n], cu[n + 1]
                shifted[a + 1:b] = out[a:b - 1]
                if int(batch.positions[a]) > 0 and seq_id in self._carry:
                    shifted[a] = self._carry[seq_id][j - 1]
            last_rows = torch.tensor(cu[1:]) - 1
            previous = out[last_rows]
            out = self._forward(j, batch.token_ids, batch.positions, shifted, kv_cache, batch.meta)
            for n, seq_id in enumerate(batch.seq_ids):
                carry = self._carry.setdefault(seq_id, torch.zeros(len(self.mtp) - 1, out.shape[-1],
                                                                    device=out.device))
                carry[j - 1] = previous[n]
        return first

    def step(self, step, token_ids, positions, hidden, kv_cache, meta) -> torch.Tensor:
        return self._forward(self.cache_index(step), token_ids, positions, hidden, kv_cache, meta)

    def cache_index(self, step: int) -> int:
        return step % len(self.mtp)

    def draft_ids(self, step: int, hidden: torch.Tensor) -> torch.Tensor:
        return self._logits(step, hidden).argmax(dim=-1)

    def draft_topk(self, step: int, hidden: torch.Tensor, k: int) -> torch.Tensor:
        return self._logits(step, hidden).topk(k, dim=-1).indices

    def _logits(self, step: int, hidden: torch.Tensor) -> torch.Tensor:  # [num_rows, vocab]
        mtp = self.mtp[step % len(self.mtp)]
        normed = mtp.head_norm(hidden)
        if mtp.head is None:
            return self._target[0].compute_logits(normed)
        return mtp.head(normed.to(input_dtype(mtp.head)))

    def release(self, seq_id: int) -> None:
        self._carry.pop(seq_id, None)

    def tracked(self) -> set[int]:
        return set(self._carry)


@register
class MtpProposer(ChainProposer):
    method = "mtp"
    drafter_in_target = True  # ``model`` defaults to the target's own checkpoint
    drafts_trees = True  # with one MTP layer (every level runs it, as a chain reuses it)

    @classmethod
    def default_num_speculative_tokens(cls, options, model) -> int | None:
        return _num_layers(model)

    @classmethod
    def check_config(cls, config) -> None:
        _check_num_tokens(config.num_speculative_tokens, _num_layers(config.model), config.token_tree is not None)

    def __init__(self, config, target):
        super().__init__(config, target)
        model = config.model or str(target.model_path)
        num = _num_layers(model)
        if not num:
            raise ValueError(f"{PREFIX}: method 'mtp' needs a model whose config.json has "
                             f"num_nextn_predict_layers >= 1; {model!r} has none")
        _check_num_tokens(config.num_speculative_tokens, num, config.token_tree is not None)  # (model defaulted)
        first = target.hf_config.num_hidden_layers
        ckpt = load_drafter(model, self.method, prefix=tuple(f"model.layers.{first + i}." for i in range(num)))
        self.model = MtpModel(ckpt, target, num)
        # With several layers, layer j > 0 reads layer j - 1's output at the previous position, kept
        # outside the KV blocks (``_carry``): a cached prefix could not restore it.
        self.needs = ProposerNeeds(hidden_states=True, kv_cache=True, kv_reads_next_token=True,
                                   prefix_cacheable=num == 1)


def _num_layers(model: str) -> int | None:
    value = declared_config(model).get("num_nextn_predict_layers")
    return value if isinstance(value, int) else None


def _check_num_tokens(num_tokens: int, num_layers: int | None, tree: bool = False) -> None:
    """vLLM's rule: at most one token per MTP layer, or a multiple of the layer count (reuse); a
    token tree needs a single layer (its levels reuse it)."""
    if tree:
        if num_layers and num_layers > 1:
            raise ValueError(f"{PREFIX}['speculative_token_tree'] needs a model with one MTP layer (each tree "
                             f"level reuses it); this one has {num_layers}")
        return
    if num_layers and num_tokens > num_layers and num_tokens % num_layers:
        raise ValueError(f"{PREFIX}['num_speculative_tokens']={num_tokens} is invalid: the model has {num_layers} "
                         f"MTP layers; use at most {num_layers} or a multiple of {num_layers}")
