"""ModelRunner: turns a scheduled batch into one forward pass and emitted tokens.

It owns a model and its paged KV cache tensor
``[num_layers, 2, num_blocks * block_size, num_kv_heads, head_dim]``.
``forward`` runs any ragged batch of (token ids, start position, block ids)
in one pass; target runners and model-based drafters both use it.

``execute`` is one engine step of the target: flatten the scheduled tokens
(each sequence's new tokens, then its drafts), build the attention metadata
once, run the model, compute logits only for the rows that sample (the
last row of a sequence, plus one row per draft), then either sample (no
drafts in the batch) or verify with the rejection sampler, and sync with
the host once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..layers.attention import AttentionMetadata, build_metadata
from ..layers.sampler import sample
from ..spec.interface import ProposerNeeds, TargetHidden
from ..spec.rejection_sampler import VerifyInput, rejection_sample
from ..spec.verify_config import RejectionSamplerConfig
from .sampling_inputs import build_sampling_metadata
from .scheduler import ScheduledSeq
from .sequence import Sequence


@dataclass
class StepResult:
    seqs: list[Sequence]  # the sequences that emitted tokens this step
    token_ids: list[list[int]]  # per sequence: accepted drafts, then one sampled token
    num_draft_tokens: list[int]  # per sequence: drafts verified this step
    logprobs: list[list[float]] | None = None  # per sequence, per emitted token
    ranks: list[list[int]] | None = None
    top_ids: list[list[list[int]]] | None = None
    top_logprobs: list[list[list[float]]] | None = None
    target_hidden: TargetHidden | None = None  # rows of every scheduled sequence, when a proposer needs them


@dataclass
class ForwardInput:
    token_ids: list[int]
    start: int  # position of token_ids[0]
    block_ids: list[int]


class ModelRunner:
    def __init__(self, model, device: torch.device, dtype: torch.dtype, num_blocks: int,
                 block_size: int, eos_token_ids: set[int], verify_config: RejectionSamplerConfig | None = None):
        self.model = model
        self.verify_config = verify_config  # block / entropy verify of sampled drafts; None: standard
        self.device, self.dtype = device, dtype
        self.block_size = block_size
        self.eos_token_ids = sorted(eos_token_ids)
        layer = model.layers[0]
        shape = (len(model.layers), 2, num_blocks * block_size, layer.num_kv_heads, layer.head_dim)
        self.kv_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.vocab_size = model.config.vocab_size
        self.sliding_window = model.sliding_window if model.uses_sliding_window else None

    @staticmethod
    def kv_bytes_per_token(model, dtype: torch.dtype) -> int:
        layer = model.layers[0]
        return len(model.layers) * 2 * layer.num_kv_heads * layer.head_dim * dtype.itemsize

    @torch.inference_mode()
    def forward(self, batch: list[ForwardInput], aux_layer_ids: tuple[int, ...] = ()
                ) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
        """Run a ragged batch; returns (hidden [num_tokens, H] fp32, aux hidden list, cu_num_tokens)."""
        ids, pos, meta, cu = prepare_batch(batch, self.block_size, self.sliding_window, self.device)
        hidden, aux = self.model(ids, pos, self.kv_cache, meta, aux_layer_ids)
        return hidden, aux, cu

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledSeq], needs: ProposerNeeds | None = None) -> StepResult:
        batch = [ForwardInput(s.seq.all_token_ids[s.seq.num_computed_tokens:][:s.num_new_tokens]
                              + s.spec_token_ids, s.seq.num_computed_tokens, s.seq.block_ids)
                 for s in scheduled]
        aux_ids = needs.aux_layer_ids if needs else ()
        hidden, aux, cu = self.forward(batch, aux_ids)
        target_hidden = None
        if needs and (needs.hidden_states or aux_ids):
            target_hidden = TargetHidden(hidden, aux, cu, [s.seq for s in scheduled],
                                         [s.seq.num_computed_tokens for s in scheduled])
        sampling = [(i, s) for i, s in enumerate(scheduled) if s.samples]
        if not sampling:
            return StepResult([], [], [], target_hidden=target_hidden)
        seqs = [s.seq for _, s in sampling]
        drafts = [s.spec_token_ids for _, s in sampling]
        rows = [r for i, s in sampling for r in range(cu[i + 1] - len(s.spec_token_ids) - 1, cu[i + 1])]
        logits = self.model.compute_logits(hidden[torch.tensor(rows, device=self.device)])  # [num_rows, V]
        meta = build_sampling_metadata(seqs, drafts, self.vocab_size, self.eos_token_ids, self.device)
        if not any(drafts):
            out = sample(logits, meta)
            token_rows, token_ids = out.token_ids, [[t] for t in out.token_ids.tolist()]
        else:
            verified = rejection_sample(logits, meta, _verify_input(seqs, drafts, self.device), self.verify_config)
            token_rows = verified.row_token_ids
            token_ids = [row[:n + 1] for row, n in zip(verified.token_ids.tolist(),
                                                       verified.num_accepted.tolist())]
        result = StepResult(seqs, token_ids, [len(d) for d in drafts], target_hidden=target_hidden)
        if meta.max_num_logprobs is not None:
            _add_logprobs(result, logits, token_rows, meta.max_num_logprobs, drafts)
        return result


def prepare_batch(batch: list[ForwardInput], block_size: int, sliding_window: int | None,
                  device: torch.device, causal: bool = True
                  ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
    """Flatten a ragged batch: (input ids [num_tokens], positions [num_tokens], metadata, cu_num_tokens)."""
    input_ids, positions, cu = [], [], [0]
    for item in batch:
        input_ids.extend(item.token_ids)
        positions.extend(range(item.start, item.start + len(item.token_ids)))
        cu.append(len(input_ids))
    width = max(len(item.block_ids) for item in batch)
    table = torch.full((len(batch), width), -1, dtype=torch.int64)
    for i, item in enumerate(batch):
        table[i, :len(item.block_ids)] = torch.tensor(item.block_ids, dtype=torch.int64)
    meta = build_metadata(table, [len(b.token_ids) for b in batch], [b.start + len(b.token_ids) for b in batch],
                          block_size, sliding_window, device, causal)
    ids = torch.tensor(input_ids, dtype=torch.int64, device=device)
    pos = torch.tensor(positions, dtype=torch.int64, device=device)
    return ids, pos, meta, cu


def _verify_input(seqs: list[Sequence], drafts: list[list[int]], device: torch.device) -> VerifyInput:
    k = max(len(d) for d in drafts)
    num = torch.tensor([len(d) for d in drafts])
    starts = torch.cumsum(num + 1, 0) - (num + 1)
    row_index = starts[:, None] + torch.arange(k + 1)[None, :]
    row_index = torch.where(torch.arange(k + 1)[None, :] <= num[:, None], row_index, 0)
    draft_ids = torch.full((len(drafts), k), -1, dtype=torch.int64)
    for i, d in enumerate(drafts):
        draft_ids[i, :len(d)] = torch.tensor(d, dtype=torch.int64)
    inp = VerifyInput(draft_ids.to(device), num.to(device), row_index.to(device))
    if any(s.spec_probs is not None for s in seqs):
        vocab = next(s.spec_probs for s in seqs if s.spec_probs is not None).shape[-1]
        probs = torch.zeros(len(seqs), k, vocab, device=device)
        for i, seq in enumerate(seqs):
            if seq.spec_probs is not None and drafts[i]:
                probs[i, :len(drafts[i])] = seq.spec_probs[:len(drafts[i])]
        inp.draft_probs = probs
        inp.has_probs = torch.tensor([s.spec_probs is not None for s in seqs], device=device)
    return inp


def _add_logprobs(result: StepResult, logits: torch.Tensor,  # [num_rows, V] raw
                  token_rows: torch.Tensor,  # [num_rows] emitted token per row, -1 where none
                  num_top: int, drafts: list[list[int]]) -> None:
    """Logprobs (of the raw logits, vLLM's default) of every emitted token, one host sync."""
    logprobs = logits.log_softmax(dim=-1)
    chosen = logprobs.gather(1, token_rows.clamp(min=0)[:, None])
    ranks = (logprobs > chosen).sum(dim=-1) + 1
    flat_lp, flat_rank = chosen.squeeze(1).tolist(), ranks.tolist()
    top_lp = top_ids = None
    if num_top > 0:
        top_lp, top_ids = (t.tolist() for t in logprobs.topk(num_top, dim=-1))
    result.logprobs, result.ranks = [], []
    result.top_ids, result.top_logprobs = ([], []) if num_top > 0 else (None, None)
    row = 0
    for tokens, draft in zip(result.token_ids, drafts):
        span = range(row, row + len(tokens))
        result.logprobs.append([flat_lp[r] for r in span])
        result.ranks.append([flat_rank[r] for r in span])
        if num_top > 0:
            result.top_ids.append([top_ids[r] for r in span])
            result.top_logprobs.append([top_lp[r] for r in span])
        row += len(draft) + 1
