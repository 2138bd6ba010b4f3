"""ModelRunner: turns a scheduled batch into one forward pass and sampled tokens.

It owns the target model and the paged KV cache tensor
``[num_layers, 2, num_blocks * block_size, num_kv_heads, head_dim]``. One
``execute`` call: flatten the scheduled tokens (varlen), build the attention
metadata once, run the model, compute logits only for the rows that sample,
sample them, and sync with the host once (``tolist``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..layers.attention import build_metadata
from ..layers.sampler import Penalties, SamplerOutput, SamplingMetadata, sample
from .scheduler import ScheduledSeq
from .sequence import Sequence


@dataclass
class StepResult:
    seqs: list[Sequence]  # the sequences that sampled a token this step
    token_ids: list[int]
    logprobs: list[float] | None = None
    ranks: list[int] | None = None
    top_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None


class ModelRunner:
    def __init__(self, model, device: torch.device, dtype: torch.dtype, num_blocks: int,
                 block_size: int, eos_token_ids: set[int]):
        self.model = model
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
    def execute(self, scheduled: list[ScheduledSeq]) -> StepResult:
        input_ids, positions, sample_rows, sampling_seqs = [], [], [], []
        for item in scheduled:
            seq, start = item.seq, item.seq.num_computed_tokens
            input_ids.extend(seq.all_token_ids[start:start + item.num_new_tokens])
            positions.extend(range(start, start + item.num_new_tokens))
            if item.samples:
                sample_rows.append(len(input_ids) - 1)
                sampling_seqs.append(seq)
        meta = build_metadata(self._block_tables(scheduled), [s.num_new_tokens for s in scheduled],
                              [s.seq.num_computed_tokens + s.num_new_tokens for s in scheduled],
                              self.block_size, self.sliding_window, self.device)
        ids = torch.tensor(input_ids, dtype=torch.int64, device=self.device)
        pos = torch.tensor(positions, dtype=torch.int64, device=self.device)
        hidden, _ = self.model(ids, pos, self.kv_cache, meta)
        if not sampling_seqs:
            return StepResult([], [])
        rows = torch.tensor(sample_rows, dtype=torch.int64, device=self.device)
        logits = self.model.compute_logits(hidden[rows])  # [num_sampling, vocab]
        out = sample(logits, self._sampling_metadata(sampling_seqs))
        return self._to_host(sampling_seqs, out)

    def _block_tables(self, scheduled: list[ScheduledSeq]) -> torch.Tensor:
        width = max(len(s.seq.block_ids) for s in scheduled)
        table = torch.full((len(scheduled), width), -1, dtype=torch.int64)
        for i, item in enumerate(scheduled):
            ids = item.seq.block_ids
            table[i, :len(ids)] = torch.tensor(ids, dtype=torch.int64)
        return table

    def _sampling_metadata(self, seqs: list[Sequence]) -> SamplingMetadata:
        params = [s.params for s in seqs]
        dev = self.device
        greedy = [p.greedy for p in params]
        top_k = [p.top_k if p.top_k > 0 else self.vocab_size for p in params]
        top_p = [p.top_p for p in params]
        min_p = [p.min_p for p in params]
        logprobs = [p.logprobs for p in params if p.logprobs is not None]
        meta = SamplingMetadata(
            all_greedy=all(greedy),
            greedy=torch.tensor(greedy, device=dev),
            temperature=torch.tensor([p.temperature or 1.0 for p in params], device=dev),
            top_k=torch.tensor(top_k, device=dev) if any(k < self.vocab_size for k in top_k) else None,
            top_p=torch.tensor(top_p, device=dev) if any(p < 1.0 for p in top_p) else None,
            min_p=torch.tensor(min_p, device=dev) if any(m > 0 for m in min_p) else None,
            seeds=torch.tensor([s.seed for s in seqs], dtype=torch.int64, device=dev),
            positions=torch.tensor([s.num_tokens for s in seqs], dtype=torch.int64, device=dev),
            max_num_logprobs=max(logprobs) if logprobs else None,
        )
        if any(p.has_penalties for p in params):
            meta.penalties = self._penalties(seqs)
        self._suppress(seqs, meta)
        return meta

    def _penalties(self, seqs: list[Sequence]) -> Penalties:
        num_rows, dev = len(seqs), self.device
        outputs = _padded([s.output_token_ids for s in seqs], self.vocab_size)
        prompts = _padded([s.prompt_token_ids for s in seqs], self.vocab_size)
        counts = torch.zeros(num_rows, self.vocab_size + 1)
        counts.scatter_add_(1, outputs, torch.ones_like(outputs, dtype=torch.float32))
        seen = torch.zeros(num_rows, self.vocab_size + 1, dtype=torch.bool)
        seen.scatter_(1, prompts, True)
        counts, seen = counts[:, :-1], seen[:, :-1] | (counts[:, :-1] > 0)
        p = [s.params for s in seqs]
        return Penalties(
            presence=torch.tensor([x.presence_penalty for x in p], device=dev),
            frequency=torch.tensor([x.frequency_penalty for x in p], device=dev),
            repetition=torch.tensor([x.repetition_penalty for x in p], device=dev),
            output_counts=counts.to(dev), seen=seen.to(dev))

    def _suppress(self, seqs: list[Sequence], meta: SamplingMetadata) -> None:
        """Ban EOS and stop ids on rows that have not reached min_tokens yet."""
        rows, ids = [], []
        for i, seq in enumerate(seqs):
            if seq.num_output_tokens < seq.params.min_tokens:
                banned = list(seq.params.stop_token_ids)
                if not seq.params.ignore_eos:
                    banned += self.eos_token_ids
                rows += [i] * len(banned)
                ids += banned
        if rows:
            meta.suppress_rows = torch.tensor(rows, dtype=torch.int64, device=self.device)
            meta.suppress_ids = torch.tensor(ids, dtype=torch.int64, device=self.device)

    @staticmethod
    def _to_host(seqs: list[Sequence], out: SamplerOutput) -> StepResult:
        result = StepResult(seqs, out.token_ids.tolist())
        if out.logprobs is not None:
            result.logprobs, result.ranks = out.logprobs.tolist(), out.ranks.tolist()
        if out.top_ids is not None:
            result.top_ids, result.top_logprobs = out.top_ids.tolist(), out.top_logprobs.tolist()
        return result


def _padded(rows: list[list[int]], pad: int) -> torch.Tensor:  # [num_rows, max_len] int64
    width = max(1, max(len(r) for r in rows))
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.int64)
