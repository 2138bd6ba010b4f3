"""Lossless verification of draft tokens (the rejection sampler).

Input: the target's raw logits for every verified row, ``n_i + 1`` rows per
sequence (its ``n_i`` drafts and the bonus position), the drafts, and per-row
sampling settings. Output: per sequence, the accepted drafts followed by one
target token (the recovered token at the first rejection, or the bonus token
when every draft was accepted), padded with -1 to ``[num_seqs, K + 1]``.

Rules (Leviathan et al. 2023, as vLLM):

* The target distribution of each row is built exactly as in plain decoding
  (penalties and min-tokens suppression on raw logits, then temperature,
  min-p, top-k, top-p), and the target token of each row is drawn with the
  same counter-based noise plain decoding uses at that position.
* Greedy rows, and sampled rows whose drafts carry no probabilities (ngram,
  suffix, greedy drafters: ``q`` is one-hot): a draft is accepted while it
  equals the target token of its row. For a one-hot ``q`` this is standard
  speculative sampling (accept with probability ``p(x)``; on rejection the
  target token is a draw from ``p`` without ``x``), and since the draw uses
  plain decoding's noise, a seeded request emits the very tokens it would
  emit without speculation.
* Sampled rows with draft probabilities ``q``: accept ``x`` iff
  ``u * q(x) <= p(x)``; at the first rejection emit a draw from
  ``norm(max(0, p - q))``; if all are accepted emit the bonus token from ``p``.
  ``u`` and the residual draw use their own noise streams.

Everything is batched over sequences and positions; there is no loop over
tokens or vocabulary, and no host sync (the caller syncs once).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..layers.sampler import (
    SamplingMetadata,
    process_logits,
    target_probs,
    uniform_noise,
)

ACCEPT_STREAM = 1  # noise stream of the acceptance uniforms u
RESIDUAL_STREAM = 2  # noise stream of the recovered-token draw


@dataclass
class VerifyInput:
    draft_token_ids: torch.Tensor  # [num_seqs, K] int64, -1 past each sequence's drafts
    num_draft_tokens: torch.Tensor  # [num_seqs] int64
    row_index: torch.Tensor  # [num_seqs, K + 1] int64 row of (seq, position) in the logits; 0 where padded
    draft_probs: torch.Tensor | None = None  # [num_seqs, K, vocab] or None (all one-hot)
    has_probs: torch.Tensor | None = None  # [num_seqs] bool: this sequence's drafts carry probs


@dataclass
class VerifyOutput:
    token_ids: torch.Tensor  # [num_seqs, K + 1] int64, -1 padded
    num_accepted: torch.Tensor  # [num_seqs] int64 accepted drafts (emitted = num_accepted + 1)
    row_token_ids: torch.Tensor  # [num_rows] int64 the token emitted at each row (-1 if none)


def draw(processed: torch.Tensor,  # [num_rows, vocab] penalised logits
         meta: SamplingMetadata) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each row's target token, as plain decoding draws it, and the target probs (None if all greedy)."""
    token_ids = processed.argmax(dim=-1)
    if meta.all_greedy:
        return token_ids, None
    probs = target_probs(processed, meta)
    exp_noise = -torch.log(uniform_noise(meta.seeds, meta.positions, probs.shape[-1]))
    sampled = (probs / exp_noise).argmax(dim=-1)
    return torch.where(meta.greedy, token_ids, sampled), probs


def rejection_sample(logits: torch.Tensor,  # [num_rows, vocab] raw target logits, fp32
                     meta: SamplingMetadata,  # per row
                     inp: VerifyInput) -> VerifyOutput:
    processed = process_logits(logits, meta)
    target_ids, probs = draw(processed, meta)
    num_seqs, width = inp.row_index.shape
    k = width - 1
    positions = torch.arange(width, device=logits.device)
    valid = positions[None, :] <= inp.num_draft_tokens[:, None]  # [num_seqs, K + 1]
    target = torch.where(valid, target_ids[inp.row_index], -1)  # [num_seqs, K + 1]
    drafts = inp.draft_token_ids
    draft_valid = positions[None, :k] < inp.num_draft_tokens[:, None]  # [num_seqs, K]
    accept = (drafts == target[:, :k]) & draft_valid  # [num_seqs, K]
    final = target.clone()
    if inp.draft_probs is not None and probs is not None:
        prob_rows = inp.has_probs & ~meta.greedy[inp.row_index[:, 0]]
        prob_accept, recovered = _probabilistic(probs, meta, inp, draft_valid)
        accept = torch.where(prob_rows[:, None], prob_accept, accept)
        final[:, :k] = torch.where(prob_rows[:, None] & draft_valid, recovered, final[:, :k])
    num_accepted = accept.int().cumprod(dim=1).sum(dim=1).long()  # [num_seqs]
    token_ids = torch.where(positions[None, :k] < num_accepted[:, None], drafts, -1)
    token_ids = torch.cat([token_ids, torch.full_like(token_ids[:, :1], -1)], dim=1)
    token_ids.scatter_(1, num_accepted[:, None], final.gather(1, num_accepted[:, None]))
    row_token_ids = torch.full_like(target_ids, -1)
    emitted = positions[None, :] <= num_accepted[:, None]
    row_token_ids[inp.row_index[emitted]] = token_ids[emitted]
    return VerifyOutput(token_ids, num_accepted, row_token_ids)


def _probabilistic(probs: torch.Tensor,  # [num_rows, vocab] target probs
                   meta: SamplingMetadata, inp: VerifyInput,
                   draft_valid: torch.Tensor  # [num_seqs, K]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard speculative sampling for drafts with probabilities: (accept [S, K], recovered [S, K])."""
    k = draft_valid.shape[1]
    rows = inp.row_index[:, :k]  # [num_seqs, K]
    p = probs[rows]  # [num_seqs, K, vocab]
    q = inp.draft_probs
    safe_drafts = inp.draft_token_ids.clamp(min=0)[..., None]
    p_x, q_x = p.gather(2, safe_drafts)[..., 0], q.gather(2, safe_drafts)[..., 0]
    u = uniform_noise(meta.seeds[rows].flatten(), meta.positions[rows].flatten(), 1, ACCEPT_STREAM)
    accept = (q_x > 0) & (u.view_as(p_x) * q_x <= p_x) & draft_valid
    residual = (p - q).clamp(min=0)
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p)
    noise = uniform_noise(meta.seeds[rows].flatten(), meta.positions[rows].flatten(), p.shape[-1],
                          RESIDUAL_STREAM)
    recovered = (residual / -torch.log(noise).view_as(p)).argmax(dim=-1)
    return accept, recovered
