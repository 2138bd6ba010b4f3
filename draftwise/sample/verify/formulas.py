"""Acceptance rules for the sampled rows of a verify step: standard, block and entropy verify.

Pure tensor functions for ``rejection_sampler.py``: no loops over tokens,
positions or vocabulary, no host sync. Per sequence, drafts ``x_1..x_n``
(``n <= K``), target ``p_i`` and draft ``q_i`` at draft position ``i``,
ratio ``r_i = p_i(x_i) / q_i(x_i)`` (0 where ``q_i(x_i) = 0``), uniforms
``u_i`` and entropy thresholds ``tau_i`` (1 when entropy verify is off).
A rule returns how many drafts are accepted, ``t``, and the unnormalised
residuals: the token after the accepted drafts is drawn from
``norm(residual[t])`` when ``t < n``, else it is the bonus token.

* standard (Leviathan et al. 2023): accept while ``tau_i * u_i * q_i(x_i) <= p_i(x_i)``;
  ``residual[i] = max(0, p_i - q_i)``.
* block, lossless (Sun et al. 2024, arXiv 2403.10444, Algorithm 2):
  ``pi_0 = 1``, ``pi_i = min(1, pi_{i-1} * r_i / tau_i)``,
  ``residual[i] = max(0, pi_{i-1} * p_i - q_i)`` with mass ``Z_i``,
  ``h_i = Z_{i+1} / (Z_{i+1} + 1 - pi_i)`` for ``i < n`` and ``h_n = pi_n``;
  ``t = max{i : u_i <= h_i}`` (0 if none). A later position can rescue an
  earlier one, and the output still follows the target when ``tau = 1``.
* block, cumulative (vLLM-Ascend): the same ``pi`` without ``tau``;
  ``t = max{i : q_i(x_i) > 0 and pi_i >= tau_i * prod_{j<=i} u_j}``. It
  accepts more than Algorithm 2 and is not lossless.
* entropy: ``tau_i = min(exp(-alpha * H(p_i)), threshold)`` with
  ``H(p) = -sum p log(p + 1e-10)`` of the distribution the row samples from
  (after temperature, top-k, top-p). Lossy by design.

Worked example (the paper's): ``p = [1/3, 2/3]`` and ``q = [2/3, 1/3]`` at
both positions, drafts ``(a, b)``: ``r = (1/2, 2)``. Standard accepts ``a``
with probability 1/2, then ``b`` surely: both with probability 1/2. Block:
``pi = (1/2, 1)``, ``h_2 = pi_2 = 1``: both are always accepted. Over all
drafts the expected accepted length rises from 10/9 to 11/9.

One-hot drafts (ngram, suffix, greedy drafters: ``q_i(x_i) = 1``): block
verify cannot beat token verification there (any lossless rule accepts
``x_1..x_i`` with probability at most ``prod p_j(x_j)``, which token
verification reaches), so lossless block verify leaves them to the standard
rule. ``one_hot_entropy_accept`` relaxes them without giving up plain
decoding's noise; the cumulative rule treats them as ``q = one-hot``.
"""
from __future__ import annotations

import torch

ENTROPY_EPS = 1e-10


def entropy_thresholds(probs: torch.Tensor,  # [num_rows, vocab] target probs
                       alpha: float, threshold: float) -> torch.Tensor:  # [num_rows]
    entropy = -(probs * torch.log(probs + ENTROPY_EPS)).sum(dim=-1)
    return torch.exp(-alpha * entropy).clamp(max=threshold)


def one_hot_entropy_accept(p_x: torch.Tensor,  # [num_seqs, K] target prob of each one-hot draft
                           tau: torch.Tensor,  # [num_seqs, K]
                           u: torch.Tensor  # [num_seqs, K] uniforms independent of the target draw
                           ) -> torch.Tensor:  # [num_seqs, K] bool
    """Extra acceptance of one-hot drafts whose target token differs from them.

    The entropy rule accepts ``x`` with probability ``min(1, p(x) / tau)``. The
    target token equals ``x`` with probability ``p(x)``; otherwise accept with
    probability ``(min(1, p(x) / tau) - p(x)) / (1 - p(x))``. A rejected row
    emits its target token, which given that it is not ``x`` follows
    ``norm(max(0, p - onehot(x)))``, the rule's recovered distribution.
    """
    want = (p_x / tau).clamp(max=1.0)
    return u * (1.0 - p_x) < want - p_x


def residuals(p: torch.Tensor,  # [num_seqs, K, vocab] target probs at the draft positions
              q: torch.Tensor | None,  # [num_seqs, K, vocab] draft probs, None: all one-hot
              one_hot: torch.Tensor | None,  # [num_seqs] bool: q is one-hot at the drafts; None: no such row
              safe_drafts: torch.Tensor,  # [num_seqs, K, 1] draft ids, 0 where padded
              pi_prev: torch.Tensor | None  # [num_seqs, K] pi_{i-1}, None: all 1
              ) -> torch.Tensor:  # [num_seqs, K, vocab] max(0, pi_{i-1} p_i - q_i)
    scaled = p if pi_prev is None else p * pi_prev[..., None]
    res = scaled if q is None else (scaled - q).clamp(min=0)
    if one_hot is None:
        return res
    # max(0, pi p(x) - 1) = 0 at a one-hot draft (rows with probs keep their value).
    keep = res.gather(2, safe_drafts)
    return res.scatter(2, safe_drafts, torch.where(one_hot[:, None, None], 0.0, keep))


def running_pi(log_ratio: torch.Tensor  # [num_seqs, K] float64 log r_i (-inf where r_i = 0)
               ) -> torch.Tensor:  # [num_seqs, K + 1] float64 log pi_0..log pi_K
    """``pi_i = min(1, pi_{i-1} r_i)`` without a loop: with ``S_i = sum_{j<=i} log r_j``
    (``S_0 = 0``), ``log pi_i = S_i - max_{j<=i} S_j``."""
    s = torch.cat([log_ratio.new_zeros(log_ratio.shape[0], 1), log_ratio.cumsum(dim=1)], dim=1)
    return s - s.cummax(dim=1).values


def lossless_num_accepted(log_pi: torch.Tensor,  # [num_seqs, K + 1] float64
                          mass: torch.Tensor,  # [num_seqs, K] residual mass Z_i at draft position i
                          u: torch.Tensor,  # [num_seqs, K]
                          draft_valid: torch.Tensor,  # [num_seqs, K] bool
                          num_drafts: torch.Tensor  # [num_seqs] int64
                          ) -> torch.Tensor:  # [num_seqs] int64
    k = u.shape[1]
    pi = log_pi[:, 1:].exp()  # pi_i, i = 1..K
    z_next = torch.cat([mass[:, 1:], mass.new_zeros(mass.shape[0], 1)], dim=1).double()  # Z_{i+1}
    denom = z_next + 1.0 - pi
    h = torch.where(denom > 0, z_next / denom.clamp(min=1e-300), 1.0)  # pi_i = 1 and Z_{i+1} = 0: h_i = 1
    index = torch.arange(1, k + 1, device=u.device)
    h = torch.where(index[None, :] == num_drafts[:, None], pi, h)  # h_n = pi_n
    hit = (u.double() <= h) & draft_valid
    return (hit * index[None, :]).amax(dim=1)


def cumulative_num_accepted(log_pi: torch.Tensor,  # [num_seqs, K + 1] float64
                            u: torch.Tensor,  # [num_seqs, K]
                            log_tau: torch.Tensor | None,  # [num_seqs, K] float64, None: tau = 1
                            legal: torch.Tensor  # [num_seqs, K] bool: valid draft with q(x) > 0
                            ) -> torch.Tensor:  # [num_seqs] int64
    bar = u.double().log().cumsum(dim=1)  # log prod_{j<=i} u_j
    if log_tau is not None:
        bar = bar + log_tau
    hit = legal & (log_pi[:, 1:] >= bar)
    index = torch.arange(1, u.shape[1] + 1, device=u.device)
    return (hit * index[None, :]).amax(dim=1)


def block_verify(p: torch.Tensor,  # [num_seqs, K, vocab]
                 q: torch.Tensor | None,  # [num_seqs, K, vocab] or None (all one-hot)
                 one_hot: torch.Tensor | None,  # [num_seqs] bool, None: no one-hot row
                 safe_drafts: torch.Tensor,  # [num_seqs, K, 1]
                 ratio: torch.Tensor,  # [num_seqs, K] float64 r_i, 0 where q_i(x_i) = 0 or padded
                 u: torch.Tensor,  # [num_seqs, K]
                 tau: torch.Tensor | None,  # [num_seqs, K] or None (entropy verify off)
                 draft_valid: torch.Tensor,  # [num_seqs, K] bool
                 num_drafts: torch.Tensor,  # [num_seqs] int64
                 mode: str) -> tuple[torch.Tensor, torch.Tensor]:  # ([num_seqs], [num_seqs, K, vocab])
    """(num_accepted, residuals) of block verify in ``mode`` ("lossless" or "cumulative")."""
    log_tau = tau.double().log() if tau is not None else None
    log_ratio = ratio.log()
    if mode == "lossless" and log_tau is not None:
        log_ratio = log_ratio - log_tau
    log_pi = running_pi(torch.where(draft_valid, log_ratio, 0.0))
    res = residuals(p, q, one_hot, safe_drafts, log_pi[:, :-1].exp().to(p.dtype))
    if mode == "lossless":
        return lossless_num_accepted(log_pi, res.sum(dim=-1), u, draft_valid, num_drafts), res
    return cumulative_num_accepted(log_pi, u, log_tau, draft_valid & (ratio > 0)), res
