"""Lossless verification of draft tokens (the rejection sampler).

Input: the target's raw logits for every verified row, ``n_i + 1`` rows per
sequence (its ``n_i`` drafts and the bonus position), where they are and the
drafts (``SpecDecodeMetadata``), and per-row sampling settings. Output: per
sequence, the accepted drafts followed by one target token (the recovered token
at the first rejection, or the bonus token when every draft was accepted),
padded with ``PLACEHOLDER_TOKEN_ID`` to ``[num_seqs, K + 1]``.

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
* ``rule`` (a ``VerifyRule``, ``rules.py``, chosen once from
  ``additional_config["rejection_sampler_config"]``) decides for sampled rows:
  the standard rule above by default; block verify (lossless: Sun et al.
  Algorithm 2; or vLLM-Ascend's cumulative rule) and entropy verify (lossy)
  where configured. Greedy rows never change.
* Tree drafts (``spec.draft_parents``): one-hot, verified by following the target's own draw down
  the tree (``tree.py``); the result also gives the accepted path's drafts.
* A draft the grammar forbade was cut before verification (structured outputs); if it carried
  ``q``, its rejection was certain (the grammar masks ``p(x)`` to 0), so when every kept draft
  is accepted the token at its position is drawn from ``norm(max(0, p - q))`` with the residual
  noise, exactly what verifying it would emit (``SpecDecodeMetadata.residual_probs``).

Everything is batched over sequences and positions; there is no loop over
tokens or vocabulary, and no host sync (the caller syncs once).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..logits import draw, process_logits, uniform_noise
from ..metadata import SamplingMetadata
from ..spec_decode_metadata import PLACEHOLDER_TOKEN_ID, SpecDecodeMetadata
from .tree import tree_accept
from .rules import ACCEPT_STREAM, RESIDUAL_STREAM, STANDARD, SampledRows, VerifyRule, num_leading

__all__ = ["ACCEPT_STREAM", "RESIDUAL_STREAM", "VerifyInput", "VerifyOutput", "rejection_sample"]


@dataclass
class VerifyInput:
    """The padded view of ``SpecDecodeMetadata`` the rules below work on."""
    draft_token_ids: torch.Tensor  # [num_seqs, K] int64, PLACEHOLDER past each sequence's drafts
    num_draft_tokens: torch.Tensor  # [num_seqs] int64
    row_index: torch.Tensor  # [num_seqs, K + 1] int64 row of (seq, position) in the logits; 0 where padded
    draft_probs: torch.Tensor | None = None  # [num_seqs, K, vocab] or None (all one-hot)
    has_probs: torch.Tensor | None = None  # [num_seqs] bool: this sequence's drafts carry probs

    @classmethod
    def of(cls, spec: SpecDecodeMetadata) -> "VerifyInput":
        return cls(spec.padded_drafts(), spec.draft_counts, spec.row_index(), spec.padded_probs(),
                   spec.has_probs)


@dataclass
class VerifyOutput:
    token_ids: torch.Tensor  # [num_seqs, K + 1] int64, PLACEHOLDER padded
    num_accepted: torch.Tensor  # [num_seqs] int64 accepted drafts (emitted = num_accepted + 1)
    row_token_ids: torch.Tensor  # [num_rows] int64 the token emitted at each row (PLACEHOLDER if none)
    row_index: torch.Tensor  # [num_seqs, K + 1] logits row of each emitted token (of (seq, position) for chains)
    path: torch.Tensor | None = None  # tree drafts: [num_seqs, K] accepted draft at each depth, -1 past it


def rejection_sample(logits: torch.Tensor,  # [num_rows, vocab] raw target logits, fp32
                     meta: SamplingMetadata,  # per row
                     spec: SpecDecodeMetadata,
                     rule: VerifyRule = STANDARD) -> VerifyOutput:
    inp = VerifyInput.of(spec)
    target_ids, probs = draw(process_logits(logits, meta), meta)  # plain decoding's draw at every row
    if spec.draft_parents is not None:
        return _tree_sample(target_ids, inp, spec)
    num_seqs, width = inp.row_index.shape
    k = width - 1
    positions = torch.arange(width, device=logits.device)
    valid = positions[None, :] <= inp.num_draft_tokens[:, None]  # [num_seqs, K + 1]
    target = torch.where(valid, target_ids[inp.row_index], PLACEHOLDER_TOKEN_ID)  # [num_seqs, K + 1]
    drafts = inp.draft_token_ids
    accept = (drafts == target[:, :k]) & spec.draft_valid  # [num_seqs, K] the draft is the target's own draw
    final = target.clone()  # [num_seqs, K + 1] the token emitted after t accepted drafts
    if probs is None:  # every row greedy
        num_accepted = num_leading(accept)
    else:
        num_accepted = rule.verify(_sampled_rows(probs, meta, inp, spec), accept, final)
        if spec.residual_probs is not None:
            _recover_cut_draft(probs, meta, spec, num_accepted, final)
    token_ids = torch.where(positions[None, :k] < num_accepted[:, None], drafts, PLACEHOLDER_TOKEN_ID)
    token_ids = torch.cat([token_ids, token_ids.new_full((num_seqs, 1), PLACEHOLDER_TOKEN_ID)], dim=1)
    token_ids.scatter_(1, num_accepted[:, None], final.gather(1, num_accepted[:, None]))
    row_token_ids = torch.full_like(target_ids, PLACEHOLDER_TOKEN_ID)
    emitted = positions[None, :] <= num_accepted[:, None]
    row_token_ids[inp.row_index[emitted]] = token_ids[emitted]
    return VerifyOutput(token_ids, num_accepted, row_token_ids, inp.row_index)


def _tree_sample(target_ids: torch.Tensor,  # [num_rows] each row's target token
                 inp: VerifyInput, spec: SpecDecodeMetadata) -> VerifyOutput:
    if inp.draft_probs is not None:
        raise ValueError("tree drafts are verified as one-hot drafts: they carry no draft probabilities")
    num_seqs, width = inp.row_index.shape
    positions = torch.arange(width, device=target_ids.device)
    valid = positions[None, :] <= inp.num_draft_tokens[:, None]  # [num_seqs, K + 1]
    target = torch.where(valid, target_ids[inp.row_index], PLACEHOLDER_TOKEN_ID)
    verdict = tree_accept(target, inp.draft_token_ids, spec.draft_parents, spec.draft_valid, spec.draft_depths,
                          int(spec.draft_depths.max()) if spec.draft_depths.numel() else 0)
    num_accepted, path = verdict.num_accepted, verdict.path
    drafts_on_path = inp.draft_token_ids.gather(1, path.clamp(min=0))  # [num_seqs, K]
    token_ids = torch.where(path >= 0, drafts_on_path, PLACEHOLDER_TOKEN_ID)
    token_ids = torch.cat([token_ids, token_ids.new_full((num_seqs, 1), PLACEHOLDER_TOKEN_ID)], dim=1)
    token_ids.scatter_(1, num_accepted[:, None], target.gather(1, verdict.last_row[:, None]))
    # Emitted token j was drawn at the row of the path's draft j - 1 (the root's row for j = 0).
    emitted_row = torch.cat([torch.zeros_like(num_accepted)[:, None], path + 1], dim=1).clamp(min=0)
    row_index = inp.row_index[:, :1] + emitted_row  # [num_seqs, K + 1] (a sequence's rows are consecutive)
    emitted = positions[None, :] <= num_accepted[:, None]
    row_token_ids = torch.full_like(target_ids, PLACEHOLDER_TOKEN_ID)
    row_token_ids[row_index[emitted]] = token_ids[emitted]
    return VerifyOutput(token_ids, num_accepted, row_token_ids, torch.where(emitted, row_index, 0), path)


def _sampled_rows(probs: torch.Tensor,  # [num_rows, vocab] target probs
                  meta: SamplingMetadata, inp: VerifyInput, spec: SpecDecodeMetadata) -> SampledRows:
    k = spec.draft_valid.shape[1]
    sampled = ~meta.greedy[inp.row_index[:, 0]]  # [num_seqs]
    has_probs = inp.has_probs if inp.draft_probs is not None else torch.zeros_like(sampled)
    return SampledRows(probs, meta, inp.row_index[:, :k], inp.draft_token_ids, spec.draft_valid,
                       inp.num_draft_tokens, inp.draft_probs, has_probs, sampled)


def _recover_cut_draft(probs: torch.Tensor,  # [num_rows, vocab] target probs
                       meta: SamplingMetadata, spec: SpecDecodeMetadata,
                       num_accepted: torch.Tensor,  # [num_seqs]
                       final: torch.Tensor) -> None:  # [num_seqs, K + 1], updated in place
    """The bonus token of sampled sequences with a cut draft (``residual_probs``) whose drafts were
    all accepted: the residual draw the cut draft's rejection would have made at that row."""
    rows = spec.bonus_logits_indices  # [num_seqs] the row after the kept drafts: the cut draft's row
    p = probs[rows]  # [num_seqs, vocab]
    residual = (p - spec.residual_probs).clamp(min=0)
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p)
    noise = uniform_noise(meta.seeds[rows], meta.positions[rows], p.shape[-1], RESIDUAL_STREAM)
    recovered = (residual / -torch.log(noise)).argmax(dim=-1)
    use = spec.has_residual & ~meta.greedy[rows] & (num_accepted == spec.draft_counts)
    current = final.gather(1, num_accepted[:, None])[:, 0]
    final.scatter_(1, num_accepted[:, None], torch.where(use, recovered, current)[:, None])
