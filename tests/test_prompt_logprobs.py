"""``SamplingParams(prompt_logprobs=N)`` and ``RequestOutput.prompt_logprobs`` (vLLM's shapes).

The reference is one plain forward of the tiny fp32 model by transformers over the whole
prompt: token ``i``'s logprob is ``log_softmax`` of the logits at position ``i - 1``, its
rank is 1 + the number of tokens scored higher, and the top-N are that row's best tokens.
The engine must give those figures however it runs the prompt: in one chunk or many,
beside other requests, after the prompt was cached, with speculative decoding, with
``n > 1``, under preemption, and whatever other requests ask.
"""
from __future__ import annotations

import math

import pytest
import torch
from conftest import PROMPTS, greedy

from draftwise import LLM, SamplingParams

ATOL = 1e-4  # our paged fp32 forward vs transformers' eager one
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 4  # K+V x layers x kv_heads x head_dim x fp32
BLOCK = 16
LONG = PROMPTS[4]  # ~80 tokens: several chunks, several cached blocks


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """prompt token ids -> log_softmax of transformers' logits, [len(ids), vocab]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()

    def log_softmax(token_ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return model(torch.tensor([token_ids])).logits[0].log_softmax(dim=-1)
    return log_softmax


def _llm(tiny_model_dir, **kwargs) -> LLM:
    return LLM(model=str(tiny_model_dir), dtype="float32", seed=0, **kwargs)


def _check(out, reference, tokenizer, num_top: int) -> None:
    """``out.prompt_logprobs`` has vLLM's shape and the reference's figures. Tokens whose reference
    logprobs lie within ``ATOL`` of each other may trade places (two forwards never agree closer)."""
    ids, scored = out.prompt_token_ids, out.prompt_logprobs
    assert scored is not None and len(scored) == len(ids) and scored[0] is None
    rows = reference(ids)
    for i in range(1, len(ids)):
        row, token, entry = rows[i - 1], ids[i], scored[i]
        value = row[token].item()
        assert next(iter(entry)) == token, f"position {i}: the prompt token must come first"
        assert int((row > value + ATOL).sum()) < entry[token].rank <= int((row > value - ATOL).sum()) + 1
        top = sorted((lp.rank, tid) for tid, lp in entry.items() if lp.rank <= num_top)
        assert [rank for rank, _ in top] == list(range(1, num_top + 1))
        assert len(entry) == num_top + (entry[token].rank > num_top)
        assert list(entry)[1:] == [tid for _, tid in top if tid != token]  # then best first
        expected = row.topk(num_top).values if num_top else torch.zeros(0)
        assert torch.allclose(row[[tid for _, tid in top]], expected, atol=ATOL)
        for tid, lp in entry.items():
            assert lp.logprob == pytest.approx(row[tid].item(), abs=ATOL)
            assert lp.decoded_token == tokenizer.decode([tid])


def _same_figures(a, b, atol: float = 1e-5) -> None:
    """Two prompt_logprobs lists hold the same tokens, ranks and (to ``atol``) logprobs."""
    assert len(a) == len(b) and a[0] is None and b[0] is None
    for x, y in zip(a[1:], b[1:]):
        assert list(x) == list(y)
        for tid in x:
            assert x[tid].rank == y[tid].rank and x[tid].decoded_token == y[tid].decoded_token
            assert x[tid].logprob == pytest.approx(y[tid].logprob, abs=atol)


@pytest.mark.parametrize("num_top", [0, 3])
def test_figures_equal_a_full_forward(tiny_llm, tokenizer, reference, num_top):
    prompts = [PROMPTS[1], PROMPTS[2], LONG]
    outs = tiny_llm.generate(prompts, greedy(6, prompt_logprobs=num_top), use_tqdm=False)
    plain = tiny_llm.generate(prompts, greedy(6), use_tqdm=False)
    for out, alone in zip(outs, plain):
        _check(out, reference, tokenizer, num_top)
        assert out.outputs[0].token_ids == alone.outputs[0].token_ids  # sampling is untouched
        assert alone.prompt_logprobs is None


def test_one_token_prompt_has_a_single_none(tiny_llm):
    out = tiny_llm.generate({"prompt_token_ids": [5]}, greedy(2, prompt_logprobs=2), use_tqdm=False)[0]
    assert out.prompt_logprobs == [None]


def test_prompt_logprobs_are_the_raw_distribution(tiny_llm, tokenizer, reference):
    """Temperature, top-k and penalties shape sampling only: the figures stay the model's own."""
    params = SamplingParams(temperature=1.7, top_k=5, repetition_penalty=1.5, presence_penalty=1.0,
                            seed=3, max_tokens=4, prompt_logprobs=2)
    _check(tiny_llm.generate(LONG, params, use_tqdm=False)[0], reference, tokenizer, 2)


def test_chunked_prefill_equals_one_chunk(tiny_model_dir, tiny_llm, tokenizer, reference):
    whole = tiny_llm.generate(LONG, greedy(4, prompt_logprobs=3), use_tqdm=False)[0]
    assert len(whole.prompt_token_ids) > 3 * 16
    chunked = _llm(tiny_model_dir, max_num_batched_tokens=16)
    chunked.llm_engine.runner.prompt_rows_per_slice = 5  # logits slices that do not align with chunks
    out = chunked.generate(LONG, greedy(4, prompt_logprobs=3), use_tqdm=False)[0]
    _check(out, reference, tokenizer, 3)
    _same_figures(out.prompt_logprobs, whole.prompt_logprobs)
    assert out.outputs[0].token_ids == whole.outputs[0].token_ids


def test_a_cached_prompt_still_gets_every_position(tiny_llm, tokenizer, reference):
    prompt = PROMPTS[6]
    first = tiny_llm.generate(prompt, greedy(3), use_tqdm=False)[0]
    again = tiny_llm.generate(prompt, greedy(3), use_tqdm=False)[0]
    assert again.num_cached_tokens > 0, "the prompt was not cached: the test would prove nothing"
    scored = tiny_llm.generate(prompt, greedy(3, prompt_logprobs=1), use_tqdm=False)[0]
    assert scored.num_cached_tokens == 0  # it skipped the cache, as vLLM does
    _check(scored, reference, tokenizer, 1)
    assert scored.outputs[0].token_ids == first.outputs[0].token_ids
    twice = tiny_llm.generate(prompt, greedy(3, prompt_logprobs=1), use_tqdm=False)[0]
    _same_figures(twice.prompt_logprobs, scored.prompt_logprobs, atol=0.0)
    after = tiny_llm.generate(prompt, greedy(3), use_tqdm=False)[0]
    assert after.num_cached_tokens > 0  # the scored request's blocks stay shareable


def test_a_plain_request_beside_one_that_scores_is_unchanged(tiny_model_dir):
    plain = SamplingParams(temperature=0.8, seed=7, max_tokens=10, logprobs=2)
    alone = _llm(tiny_model_dir, enable_prefix_caching=False).generate(PROMPTS[2], plain, use_tqdm=False)[0]
    llm = _llm(tiny_model_dir, enable_prefix_caching=False)
    outs = llm.generate([LONG, PROMPTS[2]], [greedy(5, prompt_logprobs=4), plain], use_tqdm=False)
    beside = outs[1]
    assert outs[0].prompt_logprobs is not None and beside.prompt_logprobs is None
    a, b = alone.outputs[0], beside.outputs[0]
    assert b.token_ids == a.token_ids and b.text == a.text
    assert b.cumulative_logprob == pytest.approx(a.cumulative_logprob, abs=1e-5)
    for x, y in zip(a.logprobs, b.logprobs):
        assert list(x) == list(y)
        assert all(x[t].logprob == pytest.approx(y[t].logprob, abs=1e-5) for t in x)


def test_n_gt_1_scores_the_prompt_once_per_request(tiny_llm, tokenizer, reference):
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=6, prompt_logprobs=2)
    out = tiny_llm.generate(LONG, params, use_tqdm=False)[0]
    _check(out, reference, tokenizer, 2)
    plain = tiny_llm.generate(LONG, SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=6),
                              use_tqdm=False)[0]
    assert [c.token_ids for c in out.outputs] == [c.token_ids for c in plain.outputs]


def test_speculative_ngram(tiny_model_dir, tiny_llm, tokenizer, reference):
    config = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    llm = _llm(tiny_model_dir, speculative_config=config)
    prompts = [LONG, PROMPTS[6]]
    outs = llm.generate(prompts, greedy(24, ignore_eos=True, prompt_logprobs=3), use_tqdm=False)
    plain = tiny_llm.generate(prompts, greedy(24, ignore_eos=True), use_tqdm=False)
    assert sum(o.metrics.spec_num_draft_tokens for o in outs) > 0, "no draft was verified"
    for out, alone in zip(outs, plain):
        _check(out, reference, tokenizer, 3)
        assert out.outputs[0].token_ids == alone.outputs[0].token_ids


def test_preemption_and_chunking_keep_every_position(tiny_model_dir, tokenizer, reference):
    prompts = [LONG, PROMPTS[6], PROMPTS[2], LONG]
    lens = [len(tokenizer(p).input_ids) for p in prompts]
    blocks = -(-(max(lens) + 24) // BLOCK) + 1  # the largest request fits, all of them do not
    llm = _llm(tiny_model_dir, max_num_batched_tokens=32, kv_cache_memory_bytes=blocks * BLOCK * KV_BYTES_PER_TOKEN)
    params = [greedy(24, ignore_eos=True, prompt_logprobs=2), greedy(24, ignore_eos=True),
              greedy(24, ignore_eos=True, prompt_logprobs=0), greedy(24, ignore_eos=True, prompt_logprobs=5)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.llm_engine.scheduler.num_preemptions > 0, "the KV cache was sized to force preemption"
    for out, p in zip(outs, params):
        if p.prompt_logprobs is None:
            assert out.prompt_logprobs is None
        else:
            _check(out, reference, tokenizer, p.prompt_logprobs)


def test_whole_vocabulary(tiny_model_dir, tokenizer, reference):
    vocab = len(tokenizer)
    llm = _llm(tiny_model_dir, max_logprobs=vocab)
    out = llm.generate(PROMPTS[1], greedy(2, prompt_logprobs=-1), use_tqdm=False)[0]
    _check(out, reference, tokenizer, vocab)
    for entry in out.prompt_logprobs[1:]:
        assert len(entry) == vocab
        assert sorted(lp.rank for lp in entry.values()) == list(range(1, vocab + 1))
        assert math.log(sum(math.exp(lp.logprob) for lp in entry.values())) == pytest.approx(0.0, abs=1e-4)


def test_every_step_output_carries_the_whole_prompt(tiny_model_dir, tokenizer, reference):
    """Engine level (what streaming reads): each output of the request holds every prompt position."""
    for async_scheduling in (False, True):
        engine = _llm(tiny_model_dir, max_num_batched_tokens=16, async_scheduling=async_scheduling).llm_engine
        engine.add_request("r", LONG, greedy(5, prompt_logprobs=1))
        engine.add_request("plain", PROMPTS[2], greedy(5))
        seen = []
        while engine.has_unfinished_requests():
            seen += [o for o in engine.step() if o.request_id == "r"]
        assert len(seen) == 5
        for out in seen:
            _check(out, reference, tokenizer, 1)


@pytest.mark.parametrize("value", [-2, 1.5, True, "3", [1]])
def test_invalid_values_are_refused(value):
    with pytest.raises(ValueError, match=r"SamplingParams\.prompt_logprobs="):
        SamplingParams(prompt_logprobs=value)


def test_values_past_max_logprobs_are_refused(tiny_llm):
    engine = tiny_llm.llm_engine
    for value, words in ((21, "at most 20"), (-1, "-1 asks for all")):
        with pytest.raises(ValueError, match=r"SamplingParams\.prompt_logprobs=") as info:
            tiny_llm.generate(PROMPTS[0], SamplingParams(prompt_logprobs=value), use_tqdm=False)
        assert "max_logprobs" in str(info.value) and words in str(info.value)
        assert not engine.has_unfinished_requests()
    assert tiny_llm.generate(PROMPTS[1], greedy(2, prompt_logprobs=20), use_tqdm=False)[0].prompt_logprobs
