"""Speculation never changes outputs: fp32 greedy (and seeded sampling with one-hot drafts)
outputs with every method equal plain decoding, token for token, alone and batched, with
preemption, and sampled outputs follow the target distribution end to end."""
from __future__ import annotations

import pytest
import torch
from conftest import PROMPTS, greedy

from draftwise import LLM, SamplingParams
from draftwise.spec_decode import registered_methods

MAX_TOKENS = [30, 12, 40, 16, 8, 24, 36, 20]
# A prompt that repeats itself, so n-gram and suffix drafts get accepted.
REPEAT_PROMPT = "one two three four five six " * 6


def spec_configs(dirs: dict) -> dict:
    """One config per registered method (``dirs``: the ``spec_dirs`` fixture)."""
    return {
        "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3},
        "suffix": {"method": "suffix", "num_speculative_tokens": 6},
        "draft_model": {"method": "draft_model", "model": str(dirs["draft"]), "num_speculative_tokens": 3},
        "eagle": {"method": "eagle", "model": str(dirs["eagle"]), "num_speculative_tokens": 3},
        "eagle3": {"method": "eagle3", "model": str(dirs["eagle3"]), "num_speculative_tokens": 4,
                   "disable_padded_drafter_batch": True},
        "medusa": {"method": "medusa", "model": str(dirs["medusa"])},
        "mtp": {"method": "mtp", "model": str(dirs["mtp_target"]), "num_speculative_tokens": 4},
        "dflash": {"method": "dflash", "model": str(dirs["dflash"])},
    }


# Methods that never draft (one output token per request), tested in their own file.
NON_DRAFTING = {"extract_hidden_states"}


def drafting_methods() -> list[str]:
    return [m for m in registered_methods() if m not in NON_DRAFTING]


def test_every_registered_method_is_covered(spec_dirs):
    assert sorted(spec_configs(spec_dirs)) == drafting_methods()


EXTRA_CONFIGS = {
    "draft_model_self": lambda dirs, target: {"method": "draft_model", "model": target, "num_speculative_tokens": 4},
    # speculators format, method and num_speculative_tokens read from its config.json
    "eagle3_speculators": lambda dirs, target: {"model": str(dirs["eagle3_speculators"])},
    "medusa_vllm": lambda dirs, target: {"method": "medusa", "model": str(dirs["medusa_vllm"]),
                                         "num_speculative_tokens": 2},
}


@pytest.fixture(scope="module", params=["ngram", "suffix", "draft_model", "draft_model_self", "eagle", "eagle3",
                                        "eagle3_speculators", "medusa", "medusa_vllm", "mtp", "dflash"])
def spec_llm(request, tiny_model_dir, spec_dirs):
    if request.param in EXTRA_CONFIGS:
        config = EXTRA_CONFIGS[request.param](spec_dirs, str(tiny_model_dir))
    else:
        config = spec_configs(spec_dirs)[request.param]
    return LLM(model=str(tiny_model_dir), dtype="float32", seed=0, speculative_config=config)


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def plain_outputs(tiny_llm):
    prompts = PROMPTS + [REPEAT_PROMPT]
    params = [greedy(m) for m in MAX_TOKENS] + [greedy(48)]
    return prompts, params, [tiny_llm.generate(p, sp, use_tqdm=False)[0].outputs[0].token_ids
                             for p, sp in zip(prompts, params)]


def test_greedy_alone_equals_plain(spec_llm, plain_outputs):
    prompts, params, expected = plain_outputs
    got = [spec_llm.generate(p, sp, use_tqdm=False)[0].outputs[0].token_ids for p, sp in zip(prompts, params)]
    assert got == expected
    assert spec_llm.get_spec_decode_stats()["spec_decode_num_drafts"] > 0


def test_greedy_batched_equals_plain(spec_llm, plain_outputs):
    prompts, params, expected = plain_outputs
    assert _tokens(spec_llm.generate(prompts, params, use_tqdm=False)) == expected


def test_seeded_sampling_reproducible_and_equal_to_plain(spec_llm, tiny_llm):
    params = [SamplingParams(temperature=0.9, top_p=0.95, max_tokens=24, seed=100 + i) for i in range(len(PROMPTS))]
    first = _tokens(spec_llm.generate(PROMPTS, params, use_tqdm=False))
    assert first == _tokens(spec_llm.generate(PROMPTS[::-1], params[::-1], use_tqdm=False))[::-1]
    # Greedy drafters are verified as one-hot drafts with plain decoding's own noise, so a seeded
    # request emits exactly the tokens it emits without speculation.
    assert first == _tokens(tiny_llm.generate(PROMPTS, params, use_tqdm=False))


def test_penalties_and_min_tokens_equal_plain(spec_llm, tiny_llm):
    params = [greedy(20, repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2, min_tokens=12),
              SamplingParams(temperature=0.8, max_tokens=20, seed=5, frequency_penalty=0.5)]
    prompts = [REPEAT_PROMPT, REPEAT_PROMPT]
    assert _tokens(spec_llm.generate(prompts, params, use_tqdm=False)) == \
        _tokens(tiny_llm.generate(prompts, params, use_tqdm=False))


def test_logprobs_equal_plain(spec_llm, tiny_llm):
    params = greedy(16, logprobs=2)
    spec = spec_llm.generate(REPEAT_PROMPT, params, use_tqdm=False)[0].outputs[0]
    plain = tiny_llm.generate(REPEAT_PROMPT, params, use_tqdm=False)[0].outputs[0]
    assert spec.token_ids == plain.token_ids
    assert len(spec.logprobs) == len(plain.logprobs) == 16
    for a, b in zip(spec.logprobs, plain.logprobs):
        assert a.keys() == b.keys()
        for tid in a:
            assert a[tid].rank == b[tid].rank
            assert a[tid].logprob == pytest.approx(b[tid].logprob, abs=1e-4)


def test_preemption_keeps_outputs(tiny_model_dir, spec_dirs, plain_outputs):
    prompts, params, expected = plain_outputs
    for config in spec_configs(spec_dirs).values():
        llm = LLM(model=str(tiny_model_dir), dtype="float32", speculative_config=config,
                  kv_cache_memory_bytes=12 * 16 * 2 * 2 * 2 * 16 * 4 * 2)  # 12 blocks: target + draft
        assert _tokens(llm.generate(prompts, params, use_tqdm=False)) == expected
        assert llm.llm_engine.scheduler.num_preemptions > 0, config["method"]
        assert llm.llm_engine.block_manager.num_free_blocks == llm.llm_engine.block_manager.num_blocks


def test_self_draft_accepts_everything(tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir), dtype="float32",
              speculative_config={"method": "draft_model", "model": str(tiny_model_dir), "num_speculative_tokens": 4})
    outs = llm.generate(PROMPTS, greedy(33, ignore_eos=True), use_tqdm=False)
    metrics = llm.get_spec_decode_stats()
    assert metrics["spec_decode_acceptance_rate"] == 1.0
    assert metrics["spec_decode_num_accepted_tokens"] == metrics["spec_decode_num_draft_tokens"]
    # 33 tokens = 1 from the prefill + 32 from 6 full steps (5 tokens each) and one of 2 (clipped).
    assert all(o.metrics.spec_num_drafts == 7 for o in outs)


def test_sampled_draft_model_follows_target_distribution(small_vocab_pair):
    """End to end, with draft probabilities: the joint frequencies of output tokens 2 and 3 (the
    first token comes from the prefill; the next ones from verified drafts) match the target
    model's exact distribution (chi-square, 4000 seeded requests)."""
    from test_rejection_sampler import _chi2_pvalue

    target_dir, draft_dir = small_vocab_pair
    prompt = {"prompt_token_ids": [1, 2, 3, 1, 2]}
    llm = LLM(model=str(target_dir), dtype="float32", max_num_seqs=512,
              speculative_config={"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": 2,
                                  "draft_sample_method": "probabilistic"})
    num = 4000
    params = [SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True, seed=i) for i in range(num)]
    outs = llm.generate([prompt] * num, params, use_tqdm=False)
    assert llm.get_spec_decode_stats()["spec_decode_num_accepted_tokens"] > 0
    vocab = 10
    counts = torch.zeros(vocab * vocab)
    for o in outs:
        _, a, b, _ = o.outputs[0].token_ids
        counts[a * vocab + b] += 1
    assert _chi2_pvalue(_pooled(counts, exact := _exact_joint(target_dir, prompt["prompt_token_ids"], vocab)),
                        _pooled(exact, exact)) > 1e-3


def _exact_joint(model_dir, prompt: list[int], vocab: int) -> torch.Tensor:  # [vocab * vocab]
    """P(token 2 = a, token 3 = b) = sum over token 1 of P(t1) P(a | t1) P(b | t1, a)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        p1 = model(torch.tensor([prompt])).logits[0, -1].softmax(-1)  # [vocab]
        p2 = model(torch.tensor([prompt + [t] for t in range(vocab)])).logits[:, -1].softmax(-1)  # [t1, a]
        ids = torch.tensor([prompt + [t, a] for t in range(vocab) for a in range(vocab)])
        p3 = model(ids).logits[:, -1].softmax(-1).view(vocab, vocab, vocab)  # [t1, a, b]
    return (p1[:, None, None] * p2[:, :, None] * p3).sum(0).flatten()


def _pooled(values: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """Cells expected to hold fewer than 5 of 4000 draws are merged into one."""
    small = exact * 4000 < 5
    return torch.cat([values[~small], values[small].sum()[None]])


@pytest.mark.slow
def test_smollm2_greedy_equals_plain_fp32():
    """The real model in fp32: ngram and suffix outputs equal plain greedy, alone and batched."""
    prompts = ["def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):",
               "List the days of the week, then list them again in reverse order."]
    params = greedy(48)
    plain = LLM(dtype="float32")
    expected = _tokens(plain.generate(prompts, params, use_tqdm=False))
    del plain
    for config in ({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2,
                    "prompt_lookup_max": 4}, {"method": "suffix", "num_speculative_tokens": 8}):
        llm = LLM(dtype="float32", speculative_config=config)
        assert [_tokens(llm.generate(p, params, use_tqdm=False))[0] for p in prompts] == expected
        assert _tokens(llm.generate(prompts, params, use_tqdm=False)) == expected
        assert llm.get_spec_decode_stats()["spec_decode_num_accepted_tokens"] > 0
