"""The sampler: the logits of one step's sampling rows in, each sequence's tokens out.

``sample(logits, meta, spec, rule)`` is the only call the model runner makes
into this package. Without drafts (``spec is None``) every sequence has one row
and draws one token as plain decoding does (``logits.py``). With drafts the
rows are laid out as ``SpecDecodeMetadata`` says and the rejection sampler
verifies them (``verify/rejection_sampler.py``, with the ``VerifyRule`` chosen from
``verify/config.py``). Either way the result has a fixed shape,
``[num_seqs, max_spec_len + 1]``, padded with ``PLACEHOLDER_TOKEN_ID``, and
``to_host`` turns it into Python lists with one transfer per tensor.

Logprobs (when a request asks) are the log-softmax of the raw logits, vLLM's
default, at the rows whose token was emitted, laid out like ``token_ids``
(``logprobs.py``, which also scores prompt tokens for ``prompt_logprobs``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .logits import draw, process_logits
from .logprobs import gather_logprobs
from .metadata import SamplingMetadata
from .verify.rejection_sampler import rejection_sample
from .spec_decode_metadata import PLACEHOLDER_TOKEN_ID, SpecDecodeMetadata
from .verify.rules import STANDARD, VerifyRule


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor  # [num_seqs, max_spec_len + 1] int64, PLACEHOLDER past each sequence's tokens
    logprobs: torch.Tensor | None = None  # [num_seqs, max_spec_len + 1] logprob of each emitted token
    ranks: torch.Tensor | None = None  # [num_seqs, max_spec_len + 1] its rank among the vocabulary
    top_ids: torch.Tensor | None = None  # [num_seqs, max_spec_len + 1, max_num_logprobs]
    top_logprobs: torch.Tensor | None = None  # [num_seqs, max_spec_len + 1, max_num_logprobs]
    accepted_path: torch.Tensor | None = None  # tree drafts: [num_seqs, max_spec_len] accepted draft per depth

    def to_host(self) -> "HostSample":
        rows = self.token_ids.tolist()
        counts = [sum(1 for t in row if t != PLACEHOLDER_TOKEN_ID) for row in rows]
        token_ids = [row[:n] for row, n in zip(rows, counts)]
        host = HostSample(token_ids)
        if self.accepted_path is not None:
            host.accepted_path = [row[:n - 1] for row, n in zip(self.accepted_path.tolist(), counts)]
        if self.logprobs is not None:
            host.logprobs = [row[:n] for row, n in zip(self.logprobs.tolist(), counts)]
            host.ranks = [row[:n] for row, n in zip(self.ranks.tolist(), counts)]
        if self.top_ids is not None:
            host.top_ids = [row[:n] for row, n in zip(self.top_ids.tolist(), counts)]
            host.top_logprobs = [row[:n] for row, n in zip(self.top_logprobs.tolist(), counts)]
        return host


@dataclass
class HostSample:
    """``SamplerOutput`` as lists, per sequence and emitted token (placeholders dropped)."""
    token_ids: list[list[int]]
    logprobs: list[list[float]] | None = None
    ranks: list[list[int]] | None = None
    top_ids: list[list[list[int]]] | None = None
    top_logprobs: list[list[list[float]]] | None = None
    accepted_path: list[list[int]] | None = None  # tree drafts: per sequence, the accepted drafts' indices


def sample(logits: torch.Tensor,  # [num_rows, vocab] raw model logits, fp32
           meta: SamplingMetadata,  # per row
           spec: SpecDecodeMetadata | None = None,  # None: one row per sequence, no drafts
           rule: VerifyRule = STANDARD) -> SamplerOutput:
    if spec is None:
        row_token_ids, _ = draw(process_logits(logits, meta), meta)  # [num_rows]
        row_index = torch.arange(logits.shape[0], device=logits.device)[:, None]  # [num_seqs, 1]
        out = SamplerOutput(row_token_ids[:, None])
    else:
        verified = rejection_sample(logits, meta, spec, rule)
        row_token_ids, row_index = verified.row_token_ids, verified.row_index
        out = SamplerOutput(verified.token_ids, accepted_path=verified.path)
    if meta.max_num_logprobs is not None:
        _add_logprobs(out, logits, row_token_ids, row_index, meta.max_num_logprobs)
    return out


def _add_logprobs(out: SamplerOutput, logits: torch.Tensor,  # [num_rows, vocab] raw
                  row_token_ids: torch.Tensor,  # [num_rows] emitted token per row, PLACEHOLDER where none
                  row_index: torch.Tensor,  # [num_seqs, max_spec_len + 1] logits row of each output slot
                  num_top: int) -> None:
    figures = gather_logprobs(logits, row_token_ids.clamp(min=0), num_top)
    out.logprobs, out.ranks = figures.logprobs[row_index], figures.ranks[row_index]
    if num_top > 0:
        out.top_logprobs, out.top_ids = figures.top_logprobs[row_index], figures.top_ids[row_index]
