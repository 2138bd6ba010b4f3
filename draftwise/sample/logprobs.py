"""Logprobs of the raw model distribution: a token's logprob and rank, and the top-k, for rows of logits.

``gather_logprobs(logits, token_ids, num_top)`` takes one row of raw logits
per token whose figures are wanted (sampled tokens, prompt tokens) and returns
``log_softmax`` of the row (vLLM's default ``logprobs_mode``, ``raw_logprobs``:
before temperature, penalties and any other processing) gathered at the token,
the token's rank (1 + the number of tokens with a strictly larger logprob, so
the best token has rank 1), and the ``num_top`` best tokens with their
logprobs, best first. Everything stays on the device.

``pack_logprobs`` / ``unpack_logprobs`` carry those figures to the host in one
transfer: one float64 tensor ``[num_rows, 2 + 2 * num_top]`` laid out as
``[logprob, rank, top logprobs..., top ids...]`` (ids and ranks are exact in
float64).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TokenLogprobs:
    logprobs: torch.Tensor  # [num_rows] float32, the token's logprob
    ranks: torch.Tensor  # [num_rows] int64, its rank in the vocabulary (1-based)
    top_logprobs: torch.Tensor | None = None  # [num_rows, num_top] float32, best first; None if num_top == 0
    top_ids: torch.Tensor | None = None  # [num_rows, num_top] int64


@dataclass
class HostLogprobs:
    """``TokenLogprobs`` as Python lists, one entry per row."""
    logprobs: list[float]
    ranks: list[int]
    top_logprobs: list[list[float]]  # [] per row when num_top == 0
    top_ids: list[list[int]]


def gather_logprobs(logits: torch.Tensor,  # [num_rows, vocab] raw model logits, fp32
                    token_ids: torch.Tensor,  # [num_rows] int64, a valid token id per row
                    num_top: int) -> TokenLogprobs:
    logprobs = logits.log_softmax(dim=-1)
    chosen = logprobs.gather(1, token_ids[:, None])  # [num_rows, 1]
    out = TokenLogprobs(chosen.squeeze(1), (logprobs > chosen).sum(dim=-1) + 1)
    if num_top > 0:
        out.top_logprobs, out.top_ids = logprobs.topk(num_top, dim=-1)
    return out


def pack_logprobs(figures: TokenLogprobs) -> torch.Tensor:
    """One float64 tensor ``[num_rows, 2 + 2 * num_top]``: logprob, rank, top logprobs, top ids."""
    columns = [figures.logprobs[:, None], figures.ranks[:, None]]
    if figures.top_ids is not None:
        columns += [figures.top_logprobs, figures.top_ids]
    return torch.cat([c.to(torch.float64) for c in columns], dim=1)


def unpack_logprobs(packed: torch.Tensor, num_top: int) -> HostLogprobs:
    """Read ``pack_logprobs``' layout back on the host, with a single device-to-host copy."""
    host = packed.cpu()
    return HostLogprobs(host[:, 0].tolist(), host[:, 1].long().tolist(), host[:, 2:2 + num_top].tolist(),
                        host[:, 2 + num_top:].long().tolist())
