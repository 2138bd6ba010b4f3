"""``enable_suffix_decoding``: a model drafter's drafts mixed with suffix drafts, per sequence and step.

Greedy outputs equal plain decoding for every model drafter with the mix on; on text that repeats
itself the suffix drafts win and on fresh text the model's do (counted per source); sampled
verification receives one-hot probabilities for suffix drafts beside the model's own; bad configs
name the key.
"""
from __future__ import annotations

import pytest
import torch
from conftest import PROMPTS, greedy
from test_spec_equivalence import REPEAT_PROMPT, spec_configs

from draftwise import LLM, SamplingParams
from draftwise.spec_decode.suffix_mix import SuffixMix

MODEL_METHODS = ["draft_model", "eagle", "eagle3", "medusa", "mtp", "dflash"]


@pytest.fixture(scope="module")
def plain(tiny_llm):
    prompts = PROMPTS + [REPEAT_PROMPT] * 2
    return prompts, [o.outputs[0].token_ids for o in tiny_llm.generate(prompts, greedy(40), use_tqdm=False)]


@pytest.mark.parametrize("method", MODEL_METHODS)
def test_mixed_drafts_keep_greedy_outputs_and_count_each_source(method, tiny_model_dir, spec_dirs, plain):
    prompts, expected = plain
    config = {**spec_configs(spec_dirs)[method], "enable_suffix_decoding": True}
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, speculative_config=config)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(40), use_tqdm=False)] == expected
    stats = llm.get_spec_decode_stats()
    assert stats["spec_decode_suffix_num_drafts"] > 0 and stats["spec_decode_model_num_drafts"] > 0
    assert stats["spec_decode_suffix_num_drafts"] + stats["spec_decode_model_num_drafts"] == \
        stats["spec_decode_num_drafts"]
    assert stats["spec_decode_suffix_num_accepted_tokens"] + stats["spec_decode_model_num_accepted_tokens"] == \
        stats["spec_decode_num_accepted_tokens"]
    # the random drafters rarely guess right, the repeated text is copied: suffix drafts pay more
    suffix_rate = stats["spec_decode_suffix_num_accepted_tokens"] / stats["spec_decode_suffix_num_drafts"]
    model_rate = stats["spec_decode_model_num_accepted_tokens"] / stats["spec_decode_model_num_drafts"]
    assert suffix_rate > model_rate


def test_sampled_drafts_get_one_hot_probabilities_where_suffix_wins():
    model_probs = torch.softmax(torch.randn(3, 2, 10), dim=-1)  # [num_seqs, width, vocab]
    drafts, wins = [[4, 7, 1], [2, 3], []], [True, False, False]
    probs = SuffixMix._probs(model_probs, drafts, wins)
    assert probs.shape == (3, 3, 10)
    assert torch.equal(probs[0], torch.nn.functional.one_hot(torch.tensor([4, 7, 1]), 10).float())
    assert torch.equal(probs[1, :2], model_probs[1]) and not probs[2].any()
    assert SuffixMix._probs(None, drafts, wins) is None


def test_sampled_mix_runs_both_sources(tiny_model_dir, spec_dirs):
    config = {**spec_configs(spec_dirs)["draft_model"], "enable_suffix_decoding": "true",
              "suffix_decoding_min_token_prob": 0.05}
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, speculative_config=config)
    params = SamplingParams(temperature=0.7, seed=3, max_tokens=40)
    outs = llm.generate(PROMPTS[:4] + [REPEAT_PROMPT] * 2, params, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 40 or o.outputs[0].finish_reason == "stop" for o in outs)
    stats = llm.get_spec_decode_stats()
    assert stats["spec_decode_suffix_num_drafts"] > 0 and stats["spec_decode_model_num_drafts"] > 0


@pytest.mark.parametrize("config, words", [
    ({"method": "suffix", "enable_suffix_decoding": True}, ["enable_suffix_decoding", "'suffix'"]),
    ({"method": "ngram", "num_speculative_tokens": 2, "suffix_decoding_max_tree_depth": 8},
     ["unknown key", "suffix_decoding_max_tree_depth"]),
    ({"method": "ngram", "num_speculative_tokens": 2, "enable_suffix_decoding": "maybe"},
     ["enable_suffix_decoding"]),
    ({"method": "ngram", "num_speculative_tokens": 2, "enable_suffix_decoding": True,
      "suffix_decoding_min_token_prob": 2.0}, ["suffix_decoding_min_token_prob"]),
])
def test_bad_configs_name_the_key(tiny_model_dir, config, words):
    with pytest.raises(ValueError) as err:
        LLM(model=str(tiny_model_dir), dtype="float32", speculative_config=config)
    assert all(w in str(err.value) for w in words), str(err.value)
