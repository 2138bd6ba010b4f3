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
* ``config`` (``additional_config["rejection_sampler_config"]``, see
  ``verify_config.py``) changes the rule for sampled rows only: block verify
  (lossless: Sun et al. Algorithm 2; or vLLM-Ascend's cumulative rule) and
  entropy verify (lossy), as ``verify_rules.py`` defines them. Lossless block
  verify leaves one-hot drafts to the rule above (it cannot do better there);
  entropy verify relaxes them while keeping plain decoding's noise; the
  cumulative rule verifies them as ``q = one-hot``. Greedy rows never change.
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

from .logits import draw, process_logits, uniform_noise
from .metadata import SamplingMetadata
from .spec_decode_metadata import PLACEHOLDER_TOKEN_ID, SpecDecodeMetadata
from .verify_config import RejectionSamplerConfig
from .verify_rules import block_verify, entropy_thresholds, one_hot_entropy_accept, residuals

ACCEPT_STREAM = 1  # noise stream of the acceptance uniforms u
RESIDUAL_STREAM = 2  # noise stream of the recovered-token draw
_STANDARD = RejectionSamplerConfig()


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
    row_index: torch.Tensor  # [num_seqs, K + 1] logits row of (seq, position), as SpecDecodeMetadata.row_index


def rejection_sample(logits: torch.Tensor,  # [num_rows, vocab] raw target logits, fp32
                     meta: SamplingMetadata,  # per row
                     spec: SpecDecodeMetadata,
                     config: RejectionSamplerConfig | None = None) -> VerifyOutput:
    inp = VerifyInput.of(spec)
    processed = process_logits(logits, meta)
    target_ids, probs = draw(processed, meta)
    num_seqs, width = inp.row_index.shape
    k = width - 1
    positions = torch.arange(width, device=logits.device)
    valid = positions[None, :] <= inp.num_draft_tokens[:, None]  # [num_seqs, K + 1]
    target = torch.where(valid, target_ids[inp.row_index], PLACEHOLDER_TOKEN_ID)  # [num_seqs, K + 1]
    drafts = inp.draft_token_ids
    draft_valid = spec.draft_valid  # [num_seqs, K]
    accept = (drafts == target[:, :k]) & draft_valid  # [num_seqs, K]
    final = target.clone()
    if probs is None:
        num_accepted = _num_leading(accept)
    else:
        num_accepted = _verify_sampled(probs, meta, inp, accept, draft_valid, final, config or _STANDARD)
        if spec.residual_probs is not None:
            _recover_cut_draft(probs, meta, spec, num_accepted, final)
    token_ids = torch.where(positions[None, :k] < num_accepted[:, None], drafts, PLACEHOLDER_TOKEN_ID)
    token_ids = torch.cat([token_ids, token_ids.new_full((num_seqs, 1), PLACEHOLDER_TOKEN_ID)], dim=1)
    token_ids.scatter_(1, num_accepted[:, None], final.gather(1, num_accepted[:, None]))
    row_token_ids = torch.full_like(target_ids, PLACEHOLDER_TOKEN_ID)
    emitted = positions[None, :] <= num_accepted[:, None]
    row_token_ids[inp.row_index[emitted]] = token_ids[emitted]
    return VerifyOutput(token_ids, num_accepted, row_token_ids, inp.row_index)


def _num_leading(accept: torch.Tensor) -> torch.Tensor:  # [num_seqs, K] bool -> [num_seqs] int64
    return accept.int().cumprod(dim=1).sum(dim=1).long()


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


def _verify_sampled(probs: torch.Tensor,  # [num_rows, vocab] target probs
                    meta: SamplingMetadata, inp: VerifyInput,
                    accept: torch.Tensor,  # [num_seqs, K] draft equals the row's target token
                    draft_valid: torch.Tensor,  # [num_seqs, K]
                    final: torch.Tensor,  # [num_seqs, K + 1] token after t accepted drafts; updated in place
                    config: RejectionSamplerConfig) -> torch.Tensor:  # [num_seqs] num_accepted
    """Greedy rows and one-hot drafts keep ``accept`` (entropy verify may add to the latter);
    drafts with probs, and all sampled drafts under the cumulative block rule, use ``verify_rules``."""
    rows = inp.row_index[:, :draft_valid.shape[1]]  # [num_seqs, K]
    sampled = ~meta.greedy[inp.row_index[:, 0]]  # [num_seqs]
    mode = config.block_mode
    use_rules = inp.draft_probs is not None or mode == "cumulative"
    tau = u = None
    if config.enable_entropy_verify:
        tau = entropy_thresholds(probs, config.posterior_alpha, config.posterior_threshold)[rows]
    if tau is not None or use_rules:
        u = uniform_noise(meta.seeds[rows].flatten(), meta.positions[rows].flatten(), 1, ACCEPT_STREAM)
        u = u.view_as(rows)
    has_probs = inp.has_probs if inp.draft_probs is not None else torch.zeros_like(sampled)
    if tau is not None and mode != "cumulative":
        p_x = probs[rows, inp.draft_token_ids.clamp(min=0)]  # [num_seqs, K]
        relaxed = one_hot_entropy_accept(p_x, tau, u) & (sampled & ~has_probs)[:, None] & draft_valid
        accept = accept | relaxed
    num_accepted = _num_leading(accept)
    if not use_rules:
        return num_accepted
    ruled = sampled & (has_probs | (mode == "cumulative"))  # [num_seqs]
    ruled_accepted, recovered = _rules(probs, meta, inp, draft_valid, u, tau, mode)
    k = draft_valid.shape[1]
    final[:, :k] = torch.where(ruled[:, None] & draft_valid, recovered, final[:, :k])
    return torch.where(ruled, ruled_accepted, num_accepted)


def _rules(probs: torch.Tensor,  # [num_rows, vocab] target probs
           meta: SamplingMetadata, inp: VerifyInput,
           draft_valid: torch.Tensor,  # [num_seqs, K]
           u: torch.Tensor,  # [num_seqs, K] acceptance uniforms
           tau: torch.Tensor | None,  # [num_seqs, K] entropy thresholds
           mode: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard or block verification against q: (num_accepted [S], recovered [S, K])."""
    rows = inp.row_index[:, :draft_valid.shape[1]]  # [num_seqs, K]
    p = probs[rows]  # [num_seqs, K, vocab]
    q = inp.draft_probs
    one_hot = None  # only the cumulative rule sees one-hot drafts here
    if mode == "cumulative":
        one_hot = ~inp.has_probs if q is not None else torch.ones_like(inp.num_draft_tokens, dtype=torch.bool)
    safe_drafts = inp.draft_token_ids.clamp(min=0)[..., None]
    p_x = p.gather(2, safe_drafts)[..., 0]
    q_x = torch.ones_like(p_x) if q is None else q.gather(2, safe_drafts)[..., 0]
    if one_hot is not None:
        q_x = torch.where(one_hot[:, None], 1.0, q_x)
    if mode is None:
        bar = u * q_x if tau is None else u * q_x * tau
        num_accepted = _num_leading((q_x > 0) & (p_x > 0) & (bar <= p_x) & draft_valid)
        residual = residuals(p, q, one_hot, safe_drafts, None)
    else:
        ok = (q_x > 0) & draft_valid
        ratio = torch.where(ok, p_x.double() / torch.where(ok, q_x, 1.0).double(), 0.0)
        num_accepted, residual = block_verify(p, q, one_hot, safe_drafts, ratio, u, tau, draft_valid,
                                              inp.num_draft_tokens, mode)
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p)
    noise = uniform_noise(meta.seeds[rows].flatten(), meta.positions[rows].flatten(), p.shape[-1],
                          RESIDUAL_STREAM)
    return num_accepted, (residual / -torch.log(noise).view_as(p)).argmax(dim=-1)
