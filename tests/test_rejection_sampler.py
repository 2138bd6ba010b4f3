"""The rejection sampler is lossless: greedy rules, and sampled outputs follow the target.

The statistical tests draw many seeded rows at once on a small vocabulary and
compare the emitted tokens' frequencies with the exact target distribution
with a chi-square test (p-value threshold 1e-3; the seeds are fixed, so the
test is deterministic).
"""
from __future__ import annotations

import torch

from draftwise.sample import SamplingMetadata, SpecDecodeMetadata
from draftwise.sample.verify.rejection_sampler import rejection_sample

VOCAB = 6


def _meta(num_seqs: int, k: int, greedy: bool, temperature: float = 1.0) -> SamplingMetadata:
    rows = num_seqs * (k + 1)
    return SamplingMetadata(
        all_greedy=greedy, greedy=torch.full((rows,), greedy),
        temperature=torch.full((rows,), temperature), top_k=None, top_p=None, min_p=None,
        seeds=torch.arange(num_seqs).repeat_interleave(k + 1) * 7919 + 13,
        positions=torch.arange(k + 1).repeat(num_seqs) + 100)


def _inputs(drafts: torch.Tensor,  # [num_seqs, K], -1 past each sequence's drafts
            draft_probs: torch.Tensor | None = None  # [num_seqs, K, vocab]
            ) -> SpecDecodeMetadata:
    """Metadata for logits laid out with K + 1 rows per sequence, padded or not."""
    num_seqs, k = drafts.shape
    valid = drafts >= 0
    num = valid.sum(dim=1)
    rows = torch.arange(num_seqs)[:, None] * (k + 1) + torch.arange(k)[None, :]  # [num_seqs, K]
    probs = has_probs = None
    if draft_probs is not None:
        probs, has_probs = draft_probs[valid], torch.ones(num_seqs, dtype=torch.bool)
    return SpecDecodeMetadata(drafts[valid], num.tolist(), num.cumsum(0), rows[valid],
                              torch.arange(num_seqs) * (k + 1) + num, probs, has_probs)


def _chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    stat = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    df = torch.tensor(float(keep.sum() - 1))
    return float(1 - torch.special.gammainc(df / 2, stat / 2))


def test_greedy_accepts_matching_prefix_then_target_token():
    logits = torch.full((2 * 4, VOCAB), -5.0)
    target = [[1, 2, 3, 4], [1, 2, 3, 4]]
    for s in range(2):
        for j in range(4):
            logits[s * 4 + j, target[s][j]] = 5.0
    drafts = torch.tensor([[1, 2, 5], [1, 2, 3]])  # seq 0 mismatches at position 2; seq 1 all match
    out = rejection_sample(logits, _meta(2, 3, greedy=True), _inputs(drafts))
    assert out.num_accepted.tolist() == [2, 3]
    assert out.token_ids.tolist() == [[1, 2, 3, -1], [1, 2, 3, 4]]


def test_padded_drafts_never_match():
    logits = torch.zeros(2 * 3, VOCAB)
    logits[:, 0] = 1.0  # target argmax is always 0
    drafts = torch.tensor([[0, -1], [-1, -1]])
    out = rejection_sample(logits, _meta(2, 2, greedy=True), _inputs(drafts))
    assert out.num_accepted.tolist() == [1, 0]
    # [num_seqs, max_spec_len + 1]: the widest sequence here has one draft
    assert out.token_ids.tolist() == [[0, 0], [0, -1]]
    assert out.row_token_ids.tolist() == [0, 0, -1, 0, -1, -1]


def _distributions(seed: int):
    gen = torch.Generator().manual_seed(seed)
    p_logits = torch.randn(2, VOCAB, generator=gen) * 1.5  # target at positions 0 and 1
    q = torch.softmax(torch.randn(2, VOCAB, generator=gen) * 1.5, dim=-1)  # draft distributions
    return p_logits, q, gen


def _run_sampled(num_seqs: int, with_probs: bool):
    p_logits, q, gen = _distributions(0)
    drafts = torch.stack([torch.multinomial(q[j], num_seqs, replacement=True, generator=gen) for j in range(2)], 1)
    logits = torch.cat([p_logits, p_logits[:1]]).repeat(num_seqs, 1)  # rows: pos0, pos1, bonus
    probs = q[None].expand(num_seqs, 2, VOCAB).contiguous() if with_probs else None
    out = rejection_sample(logits, _meta(num_seqs, 2, greedy=False), _inputs(drafts, probs))
    return out, torch.softmax(p_logits, dim=-1), drafts


def test_sampled_with_draft_probs_follows_target():
    out, p, drafts = _run_sampled(40000, with_probs=True)
    first = torch.bincount(out.token_ids[:, 0], minlength=VOCAB).float()
    assert _chi2_pvalue(first, p[0]) > 1e-3
    # Given the first draft was accepted, the second emitted token follows the position-1 target.
    accepted = out.num_accepted >= 1
    second = torch.bincount(out.token_ids[accepted, 1], minlength=VOCAB).float()
    assert accepted.sum() > 5000
    assert _chi2_pvalue(second, p[1]) > 1e-3
    # A biased sampler fails the same test: the draft distribution itself is far from p.
    biased = torch.bincount(drafts[:, 0], minlength=VOCAB).float()
    assert _chi2_pvalue(biased, p[0]) < 1e-6


def test_sampled_one_hot_drafts_follow_target():
    out, p, _ = _run_sampled(40000, with_probs=False)
    first = torch.bincount(out.token_ids[:, 0], minlength=VOCAB).float()
    assert _chi2_pvalue(first, p[0]) > 1e-3
    accepted = out.num_accepted >= 1
    second = torch.bincount(out.token_ids[accepted, 1], minlength=VOCAB).float()
    assert _chi2_pvalue(second, p[1]) > 1e-3


def test_acceptance_rate_matches_theory():
    """With draft probs q, a draft is accepted with probability sum_x min(p(x), q(x))."""
    out, p, _ = _run_sampled(40000, with_probs=True)
    _, q, _ = _distributions(0)
    expected = torch.minimum(p[0], q[0]).sum().item()
    observed = (out.num_accepted >= 1).float().mean().item()
    assert abs(observed - expected) < 0.01


def test_same_seed_same_output():
    a, _, _ = _run_sampled(500, with_probs=True)
    b, _, _ = _run_sampled(500, with_probs=True)
    assert torch.equal(a.token_ids, b.token_ids)
