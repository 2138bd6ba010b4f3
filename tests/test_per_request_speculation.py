"""Per-request speculation control in vLLM's shapes: ``SamplingParams(extra_args={"num_speculative_tokens":
k})`` caps one request's drafts per step at k (0: no drafting for it, the grammar's drafts included),
outputs unchanged; a cap outside [0, the engine's K] is refused naming the field."""
from __future__ import annotations

import pytest
from conftest import greedy
from test_spec_equivalence import REPEAT_PROMPT

from draftwise import LLM, SamplingParams, StructuredOutputsParams

K = 4


@pytest.fixture(scope="module")
def ngram_llm(tiny_model_dir):
    return LLM(model=str(tiny_model_dir), dtype="float32", seed=0, speculative_config={
        "method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1, "prompt_lookup_max": 3})


def _capped(cap: int | None) -> SamplingParams:
    return greedy(48, ignore_eos=True, extra_args=None if cap is None else {"num_speculative_tokens": cap})


def test_a_capped_request_never_verifies_more_drafts_than_its_cap(ngram_llm, tiny_llm):
    caps = [None, 0, 1, 2, K]
    outs = ngram_llm.generate([REPEAT_PROMPT] * len(caps), [_capped(c) for c in caps], use_tqdm=False)
    plain = tiny_llm.generate(REPEAT_PROMPT, _capped(None), use_tqdm=False)[0].outputs[0].token_ids
    assert all(o.outputs[0].token_ids == plain for o in outs)  # outputs unchanged
    metrics = {cap: o.metrics for cap, o in zip(caps, outs)}
    assert metrics[0].spec_num_draft_tokens == 0 and metrics[0].spec_num_drafts == 0
    for cap in (1, 2, K):
        assert 0 < metrics[cap].spec_num_draft_tokens <= cap * metrics[cap].spec_num_drafts
    uncapped = metrics[None]
    assert uncapped.spec_num_draft_tokens > 2 * uncapped.spec_num_drafts  # without a cap drafts run deeper


def test_cap_zero_turns_the_grammars_drafts_off_too(tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0)  # (the shared tiny_llm keeps no grammar stats)
    constraint = StructuredOutputsParams(regex=r"(the quick brown fox jumps over the lazy dog)")
    out = llm.generate("Say it:", greedy(30, structured_outputs=constraint,
                                         extra_args={"num_speculative_tokens": 0}), use_tqdm=False)[0]
    assert out.outputs[0].text == "the quick brown fox jumps over the lazy dog"
    assert llm.get_spec_decode_stats()["grammar_num_draft_tokens"] == 0
    llm.generate("Say it:", greedy(30, structured_outputs=constraint), use_tqdm=False)
    assert llm.get_spec_decode_stats()["grammar_num_draft_tokens"] > 0  # (without the cap it drafts)


@pytest.mark.parametrize("extra_args, says", [
    ({"num_speculative_tokens": -1}, "an int >= 0"), ({"num_speculative_tokens": "2"}, "an int >= 0"),
    ({"num_speculative_tokens": True}, "an int >= 0"), ({"num_speculative_tokens": 2.0}, "an int >= 0"),
    ({"foo": 1}, "unknown: ['foo']"), ([("num_speculative_tokens", 1)], "a dict or None")])
def test_bad_extra_args_name_the_field(extra_args, says):
    with pytest.raises(ValueError, match="SamplingParams.extra_args=") as info:
        SamplingParams(extra_args=extra_args)
    assert says in str(info.value)


def test_a_cap_above_the_engines_is_refused_and_changes_nothing(ngram_llm, tiny_llm):
    with pytest.raises(ValueError, match=r"extra_args=.*must be in \[0, 4\]"):
        ngram_llm.generate("hi", _capped(K + 1), use_tqdm=False)
    with pytest.raises(ValueError, match=r"must be in \[0, 0\].*does not speculate"):
        tiny_llm.generate("hi", _capped(1), use_tqdm=False)
    assert tiny_llm.generate("hi", _capped(0), use_tqdm=False)[0].outputs[0].token_ids
    assert not ngram_llm.llm_engine.has_unfinished_requests()
