"""Block Verify and Entropy Verify (``additional_config["rejection_sampler_config"]``).

Sampler-level checks on seeded rows (deterministic): lossless block verify keeps the target
distribution of the completed sequence (chi-square, as ``test_rejection_sampler.py``) and
reaches the paper's 11/9 on its toy example; the cumulative rule does not keep it; entropy
verify is monotone in ``posterior_alpha`` and equals a fixed threshold at alpha = 0; greedy
rows never change. Engine-level: the config is validated, gated at 3 drafts and reaches the
sampler, greedy outputs stay those of plain decoding, and sampled outputs of a tiny model
with block verify follow its exact distribution.
"""
from __future__ import annotations

import pytest
import torch
from conftest import PROMPTS, greedy
from test_rejection_sampler import _chi2_pvalue, _inputs, _meta

from draftwise import LLM, SamplingParams
from draftwise.config import EngineConfig
from draftwise.sample.logits import uniform_noise
from draftwise.sample.verify.rejection_sampler import ACCEPT_STREAM, rejection_sample
from draftwise.sample.verify.config import RejectionSamplerConfig
from draftwise.sample.verify.rules import STANDARD, VerifyRule

BLOCK = RejectionSamplerConfig(enable_block_verify=True).rule()
CUMULATIVE = RejectionSamplerConfig(enable_block_verify=True, block_verify_mode="cumulative").rule()
BOTH = RejectionSamplerConfig(enable_block_verify=True, enable_entropy_verify=True, posterior_alpha=1.0).rule()


def _entropy(alpha: float, threshold: float = 0.95) -> VerifyRule:
    return RejectionSamplerConfig(enable_entropy_verify=True, posterior_alpha=alpha,
                                  posterior_threshold=threshold).rule()


def _workload(num_seqs: int, k: int, vocab: int, seed: int = 0):
    """Context-independent target p_j and draft q_j per position j; drafts drawn from q."""
    gen = torch.Generator().manual_seed(seed)
    p_logits = torch.randn(k + 1, vocab, generator=gen) * 1.5  # [K + 1, vocab]; row K is the bonus
    q = torch.softmax(torch.randn(k, vocab, generator=gen) * 1.5, dim=-1)  # [K, vocab]
    drafts = torch.stack([torch.multinomial(q[j], num_seqs, replacement=True, generator=gen)
                          for j in range(k)], dim=1)  # [num_seqs, K]
    logits = p_logits.repeat(num_seqs, 1)  # [num_seqs * (K + 1), vocab]
    return logits, q[None].expand(num_seqs, k, vocab).contiguous(), drafts, torch.softmax(p_logits, dim=-1)


def _completed(out, p: torch.Tensor, seed: int = 1) -> torch.Tensor:  # [num_seqs, K + 1]
    """Emitted tokens, then fresh target draws for the positions this step did not reach."""
    num_seqs, width = out.token_ids.shape
    gen = torch.Generator().manual_seed(seed)
    fresh = torch.stack([torch.multinomial(p[j], num_seqs, replacement=True, generator=gen)
                         for j in range(width)], dim=1)
    return torch.where(out.token_ids >= 0, out.token_ids, fresh)


def _joint_pvalue(tokens: torch.Tensor, p: torch.Tensor) -> float:
    """Chi-square of the joint of all positions against prod_j p_j, rare cells pooled."""
    vocab = p.shape[-1]
    codes = (tokens * vocab ** torch.arange(tokens.shape[1])).sum(dim=1)
    counts = torch.bincount(codes, minlength=vocab ** tokens.shape[1]).float()
    exact = p[0]
    for j in range(1, tokens.shape[1]):
        exact = (p[j][:, None] * exact[None, :]).flatten()  # index = sum_j token_j * vocab^j
    rare = exact * tokens.shape[0] < 5
    return _chi2_pvalue(torch.cat([counts[~rare], counts[rare].sum()[None]]),
                        torch.cat([exact[~rare], exact[rare].sum()[None]]))


# ---- block verify -------------------------------------------------------------------------


def test_lossless_block_verify_keeps_the_target_distribution():
    num_seqs, k, vocab = 60000, 3, 4
    logits, q, drafts, p = _workload(num_seqs, k, vocab)
    meta = _meta(num_seqs, k, greedy=False)
    standard = rejection_sample(logits, meta, _inputs(drafts, q))
    block = rejection_sample(logits, meta, _inputs(drafts, q), BLOCK)
    assert block.num_accepted.float().mean() > standard.num_accepted.float().mean() + 0.02
    assert _joint_pvalue(_completed(block, p), p) > 1e-3
    assert _joint_pvalue(_completed(standard, p), p) > 1e-3
    # The cumulative rule accepts more still, but the test above catches that it is lossy.
    cumulative = rejection_sample(logits, meta, _inputs(drafts, q), CUMULATIVE)
    assert cumulative.num_accepted.float().mean() > block.num_accepted.float().mean()
    assert _joint_pvalue(_completed(cumulative, p), p) < 1e-6


def test_paper_toy_example_accepts_11_9():
    """p = [1/3, 2/3], q = [2/3, 1/3], 2 drafts: E[accepted] is 10/9 standard, 11/9 block."""
    num_seqs = 200000
    p, q = torch.tensor([1 / 3, 2 / 3]), torch.tensor([2 / 3, 1 / 3])
    drafts = torch.multinomial(q, num_seqs * 2, replacement=True,
                               generator=torch.Generator().manual_seed(0)).view(num_seqs, 2)
    logits = p.log().repeat(num_seqs * 3, 1)
    probs = q[None, None].expand(num_seqs, 2, 2).contiguous()
    meta = _meta(num_seqs, 2, greedy=False)
    for config, expected in ((STANDARD, 10 / 9), (BLOCK, 11 / 9)):
        accepted = rejection_sample(logits, meta, _inputs(drafts, probs), config).num_accepted.double()
        bound = 4 * accepted.std().item() / num_seqs ** 0.5  # 4 standard errors, about 0.008
        assert abs(accepted.mean().item() - expected) < bound


def test_block_verify_leaves_one_hot_drafts_to_the_standard_rule():
    logits, _, drafts, _ = _workload(2000, 3, 6)
    meta = _meta(2000, 3, greedy=False)
    assert torch.equal(rejection_sample(logits, meta, _inputs(drafts)).token_ids,
                       rejection_sample(logits, meta, _inputs(drafts), BLOCK).token_ids)


# ---- entropy verify -----------------------------------------------------------------------


@pytest.mark.parametrize("with_probs", [True, False])
def test_entropy_acceptance_rises_with_alpha(with_probs):
    logits, q, drafts, _ = _workload(4000, 3, 6)
    meta = _meta(4000, 3, greedy=False)
    previous = rejection_sample(logits, meta, _inputs(drafts, q if with_probs else None)).num_accepted
    for alpha in (0.0, 0.2, 0.4, 0.8, 1.6, 3.2):
        accepted = rejection_sample(logits, meta, _inputs(drafts, q if with_probs else None),
                                    _entropy(alpha)).num_accepted
        assert (accepted >= previous).all()  # per sequence, for the same noise
        previous = accepted
    assert previous.float().mean() > 1.0


def test_entropy_alpha_zero_is_a_fixed_threshold():
    num_seqs, k, vocab, threshold = 40000, 3, 6, 0.6
    logits, q, drafts, p = _workload(num_seqs, k, vocab)
    meta = _meta(num_seqs, k, greedy=False)
    out = rejection_sample(logits, meta, _inputs(drafts, q), _entropy(0.0, threshold))
    rows = torch.arange(num_seqs)[:, None] * (k + 1) + torch.arange(k)[None, :]
    u = uniform_noise(meta.seeds[rows].flatten(), meta.positions[rows].flatten(), 1, ACCEPT_STREAM).view(rows.shape)
    p_x, q_x = p[:k].gather(1, drafts.T).T, q[0].gather(1, drafts.T).T
    expected = (threshold * u * q_x <= p_x).int().cumprod(dim=1).sum(dim=1)
    assert torch.equal(out.num_accepted, expected)
    # Acceptance probability of a draft: sum_x min(q(x), p(x) / threshold).
    rate = torch.minimum(q[0, 0], p[0] / threshold).sum().item()
    assert abs((out.num_accepted >= 1).float().mean().item() - rate) < 0.01


def test_entropy_on_one_hot_drafts_follows_the_relaxed_rule():
    """One-hot draft x: emit x with probability min(1, p(x) / tau), else a draw from p without x."""
    num_seqs, vocab, threshold = 40000, 6, 0.5
    logits, _, _, p = _workload(num_seqs, 1, vocab)
    x = int(p[0].argsort()[2])  # a mid-probability draft
    out = rejection_sample(logits, _meta(num_seqs, 1, greedy=False),
                           _inputs(torch.full((num_seqs, 1), x)), _entropy(0.0, threshold))
    keep = min(1.0, p[0, x].item() / threshold)
    expected = p[0] * (1 - keep) / (1 - p[0, x])
    expected[x] = keep
    assert _chi2_pvalue(torch.bincount(out.token_ids[:, 0], minlength=vocab).float(), expected) > 1e-3


# ---- greedy rows and batching -------------------------------------------------------------


@pytest.mark.parametrize("config", [BLOCK, CUMULATIVE, BOTH], ids=["block", "cumulative", "both"])
def test_greedy_rows_are_unaffected(config):
    num_seqs, k = 400, 3
    logits, q, drafts, _ = _workload(num_seqs, k, 6)
    drafts[:, 0] = logits[::k + 1].argmax(dim=-1)  # some drafts match the greedy target
    meta = _meta(num_seqs, k, greedy=False)
    meta.greedy[: (k + 1) * num_seqs // 2] = True  # the first half of the sequences is greedy
    for probs in (q, None):
        plain = rejection_sample(logits, meta, _inputs(drafts, probs))
        ruled = rejection_sample(logits, meta, _inputs(drafts, probs), config)
        half = num_seqs // 2
        assert torch.equal(plain.token_ids[:half], ruled.token_ids[:half])
        assert plain.num_accepted[:half].sum() > 0
        meta_all = _meta(num_seqs, k, greedy=True)
        assert torch.equal(rejection_sample(logits, meta_all, _inputs(drafts, probs)).token_ids,
                           rejection_sample(logits, meta_all, _inputs(drafts, probs), config).token_ids)


# ---- configuration ------------------------------------------------------------------------


@pytest.mark.parametrize("raw, words", [
    ({"enable_block_verify": 1}, ["enable_block_verify", "1", "true or false"]),
    ({"enable_entropy_verify": "yes"}, ["enable_entropy_verify", "'yes'", "true or false"]),
    ({"posterior_threshold": 0.0}, ["posterior_threshold", "0.0", "> 0.0 and <= 1.0"]),
    ({"posterior_threshold": 1.5}, ["posterior_threshold", "1.5"]),
    ({"posterior_alpha": -0.1}, ["posterior_alpha", "-0.1", ">= 0.0"]),
    ({"posterior_alpha": float("inf")}, ["posterior_alpha", "inf", "finite"]),
    ({"posterior_alpha": True}, ["posterior_alpha", "True"]),
    ({"block_verify_mode": "fast"}, ["block_verify_mode", "'fast'", "lossless", "cumulative"]),
    ({"enable_typical": True}, ["unknown", "enable_typical", "posterior_alpha"]),
    ("on", ["rejection_sampler_config", "must be a dict"]),
])
def test_config_errors_name_key_value_and_allowed(tiny_model_dir, raw, words):
    with pytest.raises(ValueError) as err:
        LLM(model=str(tiny_model_dir), additional_config={"rejection_sampler_config": raw})
    for word in words:
        assert word in str(err.value)


def test_config_defaults_off_and_block_gated_at_three_drafts(tiny_model_dir):
    default = RejectionSamplerConfig.from_value({})
    assert default == RejectionSamplerConfig() and default.block_mode is None and default.is_lossless
    raw = {"enable_block_verify": True, "enable_entropy_verify": True}
    for k, block in ((2, False), (3, True)):
        config = EngineConfig.from_kwargs(model=str(tiny_model_dir),
                                          additional_config={"rejection_sampler_config": raw},
                                          speculative_config={"method": "ngram", "num_speculative_tokens": k})
        assert config.rejection_sampler.enable_block_verify is block
        assert config.rejection_sampler.enable_entropy_verify


def _standard_and_ruled(model_dir, spec: dict) -> list[LLM]:
    rules = {"enable_block_verify": True, "enable_entropy_verify": True, "posterior_alpha": 2.0}
    return [LLM(model=str(model_dir), dtype="float32", speculative_config=spec,
                additional_config={"rejection_sampler_config": extra}) for extra in ({}, rules)]


def test_engine_greedy_outputs_unaffected(tiny_model_dir, tiny_llm):
    """Self-drafting with probabilities: greedy drafts are all accepted, with or without the rules."""
    spec = {"method": "draft_model", "model": str(tiny_model_dir), "num_speculative_tokens": 4,
            "draft_sample_method": "probabilistic"}
    expected = [o.outputs[0].token_ids for o in tiny_llm.generate(PROMPTS[:4], greedy(24), use_tqdm=False)]
    metrics = []
    for llm in _standard_and_ruled(tiny_model_dir, spec):
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:4], greedy(24), use_tqdm=False)] == expected
        metrics.append(llm.get_spec_decode_stats())
    assert metrics[0] == metrics[1] and metrics[0]["spec_decode_num_accepted_tokens"] > 0


def test_engine_sampled_acceptance_rises(tiny_model_dir):
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    prompts = ["one two three four five six " * 6] + PROMPTS[:3]
    params = [SamplingParams(temperature=0.8, max_tokens=32, seed=i, ignore_eos=True) for i in range(len(prompts))]
    rates = []
    for llm in _standard_and_ruled(tiny_model_dir, spec):
        llm.generate(prompts, params, use_tqdm=False)
        rates.append(llm.get_spec_decode_stats()["spec_decode_acceptance_rate"])
    assert rates[1] > rates[0]


def test_engine_block_verify_follows_target_distribution(small_vocab_pair):
    """End to end with draft probabilities: tokens 2 and 3 of 4000 seeded requests follow the
    target model's exact joint distribution under lossless block verify."""
    from test_spec_equivalence import _exact_joint, _pooled

    target_dir, draft_dir = small_vocab_pair
    prompt = {"prompt_token_ids": [1, 2, 3, 1, 2]}
    llm = LLM(model=str(target_dir), dtype="float32", max_num_seqs=512,
              speculative_config={"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": 3,
                                  "draft_sample_method": "probabilistic"},
              additional_config={"rejection_sampler_config": {"enable_block_verify": True}})
    num, vocab = 4000, 10
    params = [SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True, seed=i) for i in range(num)]
    outs = llm.generate([prompt] * num, params, use_tqdm=False)
    assert llm.get_spec_decode_stats()["spec_decode_num_accepted_tokens"] > 0
    counts = torch.zeros(vocab * vocab)
    for o in outs:
        _, a, b, _ = o.outputs[0].token_ids
        counts[a * vocab + b] += 1
    exact = _exact_joint(target_dir, prompt["prompt_token_ids"], vocab)
    assert _chi2_pvalue(_pooled(counts, exact), _pooled(exact, exact)) > 1e-3
