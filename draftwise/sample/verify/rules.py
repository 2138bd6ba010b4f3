"""Verification rules as objects: how the drafts of *sampled* sequences are accepted.

A rule is chosen once, when the engine is configured (``RejectionSamplerConfig.rule()``), and
the rejection sampler calls its ``verify``; greedy rows never depend on it (their drafts are
accepted while they equal the target's argmax, whatever the rule). Every rule sees the same
``SampledRows`` (the target's probabilities at the draft rows, the drafts' ``q`` where they
carry one, the acceptance uniforms) and returns, per sequence, how many drafts it accepts; it
writes the token after them (the recovered token) into ``final`` for the sequences it judged.

* ``StandardRule`` (the default, lossless; Leviathan et al. 2023): one-hot drafts (ngram,
  suffix, greedy drafters) are accepted while they equal the token plain decoding draws at
  their row, which *is* standard speculative sampling for ``q = one-hot``; drafts with ``q``
  are accepted while ``u * q(x) <= p(x)`` and the first rejection emits a draw from
  ``norm(max(0, p - q))``.
* ``LosslessBlockRule`` (Sun et al. 2024, Algorithm 2): the draft block judged jointly for
  drafts with ``q``; one-hot drafts as the standard rule (no lossless rule beats it there).
* ``CumulativeBlockRule`` (vLLM-Ascend's cumulative product; lossy): every sampled draft,
  one-hot ones as ``q = one-hot``.
* ``entropy`` (lossy), on the standard or a block rule: thresholds
  ``tau = min(exp(-alpha H(p)), threshold)`` lower the acceptance bar; on the standard and the
  lossless block rule they also relax one-hot drafts (``one_hot_entropy_accept``).

The formulas live in ``formulas.py``; this module decides which apply to which rows.
Batched over sequences and positions, no host sync.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import torch

from ..logits import uniform_noise
from ..metadata import SamplingMetadata
from .formulas import block_verify, entropy_thresholds, one_hot_entropy_accept, residuals

ACCEPT_STREAM = 1  # noise stream of the acceptance uniforms u
RESIDUAL_STREAM = 2  # noise stream of the recovered-token draw


@dataclass(frozen=True)
class Entropy:
    alpha: float
    threshold: float


@dataclass
class SampledRows:
    """What a rule reads about one verify step's draft rows (``K`` = the widest draft count)."""
    probs: torch.Tensor  # [num_rows, vocab] target probabilities (after temperature, top-k, top-p, ...)
    meta: SamplingMetadata  # per row
    rows: torch.Tensor  # [num_seqs, K] logits row of each draft position
    draft_token_ids: torch.Tensor  # [num_seqs, K] int64, negative past each sequence's drafts
    draft_valid: torch.Tensor  # [num_seqs, K] bool
    num_draft_tokens: torch.Tensor  # [num_seqs] int64
    q: torch.Tensor | None  # [num_seqs, K, vocab] draft probabilities, None: every draft one-hot
    has_probs: torch.Tensor  # [num_seqs] bool: this sequence's drafts carry q
    sampled: torch.Tensor  # [num_seqs] bool: this sequence samples (not greedy)

    @cached_property
    def u(self) -> torch.Tensor:  # [num_seqs, K] acceptance uniforms
        flat = uniform_noise(self.meta.seeds[self.rows].flatten(), self.meta.positions[self.rows].flatten(), 1,
                             ACCEPT_STREAM)
        return flat.view_as(self.rows)

    @cached_property
    def p(self) -> torch.Tensor:  # [num_seqs, K, vocab] target probabilities at the draft rows
        return self.probs[self.rows]

    @cached_property
    def safe_drafts(self) -> torch.Tensor:  # [num_seqs, K, 1] draft ids, 0 where padded
        return self.draft_token_ids.clamp(min=0)[..., None]

    @cached_property
    def p_x(self) -> torch.Tensor:  # [num_seqs, K] target probability of each draft
        return self.p.gather(2, self.safe_drafts)[..., 0]

    @cached_property
    def q_x(self) -> torch.Tensor:  # [num_seqs, K] draft probability of each draft (1 where one-hot)
        return torch.ones_like(self.p_x) if self.q is None else self.q.gather(2, self.safe_drafts)[..., 0]

    def recovered(self, residual: torch.Tensor) -> torch.Tensor:  # [S, K, vocab] unnormalised -> [S, K]
        """A draw from ``norm(residual)`` per draft position (from ``p`` where the residual is empty)."""
        residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, self.p)
        noise = uniform_noise(self.meta.seeds[self.rows].flatten(), self.meta.positions[self.rows].flatten(),
                              self.p.shape[-1], RESIDUAL_STREAM)
        return (residual / -torch.log(noise).view_as(self.p)).argmax(dim=-1)


def num_leading(accept: torch.Tensor) -> torch.Tensor:  # [num_seqs, K] bool -> [num_seqs] int64
    return accept.int().cumprod(dim=1).sum(dim=1).long()


@dataclass(frozen=True)
class StandardRule:
    entropy: Entropy | None = None

    name = "standard"

    @property
    def lossless(self) -> bool:
        return self.entropy is None

    def tau(self, rows: SampledRows) -> torch.Tensor | None:  # [num_seqs, K] entropy thresholds
        if self.entropy is None:
            return None
        return entropy_thresholds(rows.probs, self.entropy.alpha, self.entropy.threshold)[rows.rows]

    def verify(self, rows: SampledRows,
               accept: torch.Tensor,  # [num_seqs, K] the draft equals the target's draw at its row
               final: torch.Tensor  # [num_seqs, K + 1] token after t accepted drafts; updated in place
               ) -> torch.Tensor:  # [num_seqs] num_accepted
        tau = self.tau(rows)
        if tau is not None:  # entropy verify also relaxes sampled one-hot drafts
            one_hot = (rows.sampled & ~rows.has_probs)[:, None] & rows.draft_valid
            accept = accept | (one_hot_entropy_accept(rows.p_x, tau, rows.u) & one_hot)
        num_accepted = num_leading(accept)
        if rows.q is None:
            return num_accepted
        judged_accepted, residual = self.judge(rows, tau)
        return _settle(rows, rows.sampled & rows.has_probs, judged_accepted, rows.recovered(residual),
                       num_accepted, final)

    def judge(self, rows: SampledRows, tau: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Drafts with ``q``: accept while ``u * q(x) <= p(x)`` (``u * q(x) * tau`` with entropy);
        (num_accepted [S], residual [S, K, vocab] = max(0, p - q))."""
        bar = rows.u * rows.q_x if tau is None else rows.u * rows.q_x * tau
        take = (rows.q_x > 0) & (rows.p_x > 0) & (bar <= rows.p_x) & rows.draft_valid
        return num_leading(take), residuals(rows.p, rows.q, None, rows.safe_drafts, None)


@dataclass(frozen=True)
class LosslessBlockRule(StandardRule):
    name = "block-lossless"

    def judge(self, rows: SampledRows, tau: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        return block_verify(rows.p, rows.q, None, rows.safe_drafts, _ratio(rows, rows.q_x), rows.u, tau,
                            rows.draft_valid, rows.num_draft_tokens, "lossless")


@dataclass(frozen=True)
class CumulativeBlockRule(StandardRule):
    name = "block-cumulative"

    @property
    def lossless(self) -> bool:
        return False

    def verify(self, rows: SampledRows, accept: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
        """Every sampled sequence is judged, one-hot drafts as ``q = one-hot``."""
        one_hot = ~rows.has_probs  # [num_seqs]
        q_x = torch.where(one_hot[:, None], 1.0, rows.q_x)
        judged_accepted, residual = block_verify(rows.p, rows.q, one_hot, rows.safe_drafts, _ratio(rows, q_x),
                                                 rows.u, self.tau(rows), rows.draft_valid, rows.num_draft_tokens,
                                                 "cumulative")
        return _settle(rows, rows.sampled, judged_accepted, rows.recovered(residual), num_leading(accept), final)


def _ratio(rows: SampledRows, q_x: torch.Tensor) -> torch.Tensor:  # [num_seqs, K] float64 p(x) / q(x), 0 if q(x) = 0
    ok = (q_x > 0) & rows.draft_valid
    return torch.where(ok, rows.p_x.double() / torch.where(ok, q_x, 1.0).double(), 0.0)


def _settle(rows: SampledRows,
            judged: torch.Tensor,  # [num_seqs] bool: sequences the rule judged
            judged_accepted: torch.Tensor,  # [num_seqs]
            recovered: torch.Tensor,  # [num_seqs, K]
            num_accepted: torch.Tensor,  # [num_seqs] the others' count
            final: torch.Tensor) -> torch.Tensor:  # [num_seqs, K + 1] updated in place
    k = rows.draft_valid.shape[1]
    final[:, :k] = torch.where(judged[:, None] & rows.draft_valid, recovered, final[:, :k])
    return torch.where(judged, judged_accepted, num_accepted)


class VerifyRule(Protocol):
    """What the rejection sampler asks of a rule."""
    name: str

    @property
    def lossless(self) -> bool: ...

    def verify(self, rows: SampledRows, accept: torch.Tensor, final: torch.Tensor) -> torch.Tensor: ...


STANDARD = StandardRule()
