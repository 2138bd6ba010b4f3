"""Acceptance metrics: vLLM's counters and derived rates (``get_spec_decode_stats``), per-request figures
and the log line (``get_metrics()``'s vLLM objects: test_vllm_metrics.py)."""
from __future__ import annotations

import logging

import pytest
from conftest import PROMPTS, greedy

from draftwise import LLM
from draftwise.engine.drafting.step_cost import StepCostModel

KEYS = {"spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
        "spec_decode_num_accepted_tokens_per_pos", "spec_decode_acceptance_rate",
        "spec_decode_mean_acceptance_length", "spec_decode_per_position_acceptance", "spec_decode_draft_limits",
        "spec_decode_step_cost"}


@pytest.fixture(scope="module")
def ngram_llm(tiny_model_dir):
    return LLM(model=str(tiny_model_dir), dtype="float32",
               speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                                   "prompt_lookup_max": 2})


def test_counters_and_derived_figures(ngram_llm):
    outs = ngram_llm.generate(PROMPTS + ["a b c a b c a b c a b c"], greedy(40), use_tqdm=False)
    m = ngram_llm.get_spec_decode_stats()
    assert set(m) == KEYS
    assert m["spec_decode_num_drafts"] > 0
    assert m["spec_decode_num_drafts"] <= m["spec_decode_num_draft_tokens"] <= 3 * m["spec_decode_num_drafts"]
    assert 0 < m["spec_decode_num_accepted_tokens"] <= m["spec_decode_num_draft_tokens"]
    assert sum(m["spec_decode_num_accepted_tokens_per_pos"]) == m["spec_decode_num_accepted_tokens"]
    per_pos = m["spec_decode_num_accepted_tokens_per_pos"]
    assert len(per_pos) == 3 and per_pos == sorted(per_pos, reverse=True)  # a position needs all before it
    assert m["spec_decode_acceptance_rate"] == pytest.approx(
        m["spec_decode_num_accepted_tokens"] / m["spec_decode_num_draft_tokens"])
    assert m["spec_decode_mean_acceptance_length"] == pytest.approx(
        1 + m["spec_decode_num_accepted_tokens"] / m["spec_decode_num_drafts"])
    # Per-request figures add up to the engine's counters (fresh engine: this was its only call).
    assert sum(o.metrics.spec_num_drafts for o in outs) == m["spec_decode_num_drafts"]
    assert sum(o.metrics.spec_num_draft_tokens for o in outs) == m["spec_decode_num_draft_tokens"]
    assert sum(o.metrics.spec_num_accepted_tokens for o in outs) == m["spec_decode_num_accepted_tokens"]
    busy = max(outs, key=lambda o: o.metrics.spec_num_accepted_tokens).metrics
    assert busy.spec_mean_acceptance_length == pytest.approx(1 + busy.spec_num_accepted_tokens / busy.spec_num_drafts)


def test_periodic_log_line(ngram_llm, caplog):
    ngram_llm.llm_engine.stats.logger.interval_s = 0.0  # a line after every step
    with caplog.at_level(logging.INFO, logger="draftwise"):
        ngram_llm.generate("a b c a b c a b c a b c", greedy(30), use_tqdm=False)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("SpecDecoding metrics: ")]
    assert lines and "Mean acceptance length: " in lines[0] and "Per-position acceptance rate: " in lines[0]


def test_plain_engine_has_no_spec_metrics(tiny_llm):
    assert tiny_llm.get_spec_decode_stats() == {}
    out = tiny_llm.generate("Hello", greedy(4), use_tqdm=False)[0]
    assert out.metrics.spec_num_drafts == 0 and out.metrics.spec_mean_acceptance_length == 1.0


def test_draft_plan_names_what_limited_each_sequence(tiny_model_dir, ngram_llm, caplog):
    """Every sequence and step gets one reason: the request's own cap, the room before max_tokens,
    none (full: a self-drafting model always drafts), or the proposer finding nothing (ngram on
    random text); counted in the stats and logged at debug level."""
    llm = LLM(model=str(tiny_model_dir), dtype="float32", speculative_config={
        "method": "draft_model", "model": str(tiny_model_dir), "num_speculative_tokens": 3})
    speculator = llm.llm_engine.speculator
    speculator.price_with(StepCostModel.fixed(0.0, 4))  # every draft kept: no step_cost reason
    with caplog.at_level(logging.DEBUG, logger="draftwise"):
        llm.generate(PROMPTS[:2], greedy(12, ignore_eos=True, extra_args={"num_speculative_tokens": 1}),
                     use_tqdm=False)
    limits = llm.get_spec_decode_stats()["spec_decode_draft_limits"]
    assert limits["request"] > 0 and limits["full"] == 0 and limits["proposer"] == 0
    llm.generate(PROMPTS[:2], greedy(12, ignore_eos=True), use_tqdm=False)
    limits = llm.get_spec_decode_stats()["spec_decode_draft_limits"]
    assert limits["full"] > 0 and limits["max_tokens"] > 0
    assert limits["full"] + limits["max_tokens"] + limits["request"] == sum(limits.values())
    plan = speculator.last_plan
    assert len(plan.num_drafts) == len(plan.reasons) == len(plan.seq_ids)
    assert any("draft plan (seq: drafts/reason)" in r.getMessage() and "1/request" in r.getMessage()
               for r in caplog.records)
    ngram_llm.generate(["zq xw vu"], greedy(8, ignore_eos=True), use_tqdm=False)
    assert ngram_llm.get_spec_decode_stats()["spec_decode_draft_limits"]["proposer"] > 0
