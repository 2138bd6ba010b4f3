"""The draft length policy: drafts are cut where they cannot pay for their verify rows, and
that changes speed only, never outputs."""
from __future__ import annotations

import pytest
from conftest import PROMPTS, greedy

from draftwise import LLM
from draftwise.engine.draft_length import (
    DraftLengthPolicy,
    best_num_drafts,
    linear_step_costs,
    measure_step_costs,
)
from draftwise.sequence import Sequence
from draftwise.sampling_params import SamplingParams

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 2}


def _linear(c: float, k: int = 10) -> list[float]:
    return linear_step_costs(c, k)


def test_best_num_drafts_follows_the_cost_model():
    assert best_num_drafts(0.9, _linear(0.0, 7), 7) == 7  # free rows: always the longest draft
    assert best_num_drafts(0.05, _linear(0.1), 7) == 0  # drafts almost never accepted cost a step share
    assert best_num_drafts(0.99, _linear(0.01), 10) == 10
    assert best_num_drafts(0.99, _linear(0.01), 4) == 4  # never past the limit
    lengths = [best_num_drafts(a / 10, _linear(0.08), 10) for a in range(10)]
    assert lengths == sorted(lengths) and lengths[0] == 0 and lengths[-1] > 3
    # (1 + a) / (1 + c) > 1 exactly when a > c: the first draft pays iff its acceptance beats its cost
    assert best_num_drafts(0.21, _linear(0.2), 1) == 1 and best_num_drafts(0.19, _linear(0.2), 1) == 0
    # a costly first row and cheap further ones (fp32 on AVX2): one draft does not pay, five do
    jump = [1.0] + [1.45 + 0.03 * (k - 1) for k in range(1, 11)]
    assert best_num_drafts(0.38, jump, 1) == 0 and best_num_drafts(0.38, jump, 10) >= 3


def test_policy_learns_from_verified_drafts_and_probes_again():
    policy = DraftLengthPolicy(_linear(0.15, 8))
    seq = Sequence("r", 0, [1, 2, 3], SamplingParams(), 0, 0.0)
    start = policy.limit(seq, 8)
    assert 0 < start < 8  # the prior (0.5) is worth a short draft
    for _ in range(10):
        DraftLengthPolicy.observe(seq, 4, 0)
    assert policy.limit(seq, 8) == 0
    probes = [policy.limit(seq, 8) for _ in range(40)]  # withheld steps fade the evidence
    assert probes[0] == 0 and max(probes) > 0
    for _ in range(20):
        DraftLengthPolicy.observe(seq, 8, 8)
    assert policy.limit(seq, 8) == 8


def _run(tiny_model_dir, row_cost: float, prompts, params):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", speculative_config=NGRAM)
    llm.llm_engine.speculator.policy = DraftLengthPolicy(_linear(row_cost, NGRAM["num_speculative_tokens"]))
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], llm.get_metrics()


def test_cut_drafts_change_nothing_but_the_draft_count(tiny_model_dir, tiny_llm):
    prompts = PROMPTS[:6]
    params = greedy(32)
    expected = [o.outputs[0].token_ids for o in tiny_llm.generate(prompts, params, use_tqdm=False)]
    free, free_metrics = _run(tiny_model_dir, 0.0, prompts, params)
    costly, costly_metrics = _run(tiny_model_dir, 0.3, prompts, params)
    assert free == expected and costly == expected
    assert costly_metrics["spec_decode_num_draft_tokens"] < free_metrics["spec_decode_num_draft_tokens"]


def test_measured_step_costs_are_sane_and_free_their_blocks(tiny_llm):
    engine = tiny_llm.llm_engine
    costs = measure_step_costs(engine.runner.paged, engine.block_manager, max_num_drafts=4, context_len=32)
    assert len(costs) == 5 and costs[0] == 1.0 and all(0.0 < c < 50.0 for c in costs)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_row_cost_env_override(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_VERIFY_ROW_COST", "0.25")
    llm = LLM(model=str(tiny_model_dir), dtype="float32", speculative_config=NGRAM)
    assert llm.llm_engine.speculator.policy.step_costs == [1.0, 1.25, 1.5, 1.75, 2.0]
    monkeypatch.setenv("DRAFTWISE_VERIFY_ROW_COST", "cheap")
    with pytest.raises(ValueError, match="DRAFTWISE_VERIFY_ROW_COST='cheap'.*number >= 0"):
        LLM(model=str(tiny_model_dir), dtype="float32", speculative_config=NGRAM)


def test_confident_prefix_is_kept_and_doubtful_tail_cut():
    jump = [1.0] + [1.45 + 0.03 * (k - 1) for k in range(1, 9)]
    policy = DraftLengthPolicy(jump)
    assert policy.cut(6, [0.95, 0.9, 0.9, 0.85, 0.04, 0.01]) == 4  # the tail does not pay its rows
    assert policy.cut(3, [0.3, 0.1, 0.05]) == 0  # a doubtful draft is dropped
    assert DraftLengthPolicy(_linear(0.0, 8)).cut(3, [0.3, 0.1, 0.05]) == 3  # free rows: keep all
    assert policy.cut(0, []) == 0
