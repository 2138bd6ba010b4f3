"""speculative_config validation: every rule rejects bad input with a message naming the key."""
from __future__ import annotations

import pytest

from draftwise.config import EngineConfig
from draftwise.spec_decode.config import SpeculativeConfig


def parse(raw, tp=1):
    return SpeculativeConfig.from_value(raw, tp)


def test_ngram_defaults_like_vllm():
    cfg = parse({"method": "ngram", "num_speculative_tokens": 3})
    assert (cfg.options.prompt_lookup_min, cfg.options.prompt_lookup_max) == (5, 5)
    ngram = {"method": "ngram", "num_speculative_tokens": 3}
    assert parse({**ngram, "prompt_lookup_max": 4}).options.prompt_lookup_min == 4
    assert parse({**ngram, "prompt_lookup_min": 2}).options.prompt_lookup_max == 2


def test_json_text_is_accepted():
    cfg = parse('{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}')
    assert cfg.num_speculative_tokens == 5 and cfg.options.prompt_lookup_max == 4


def test_suffix_defaults_and_auto_num_tokens():
    cfg = parse({"method": "suffix"})
    assert cfg.num_speculative_tokens == 24
    assert cfg.options.suffix_decoding_max_cached_requests == 10000
    assert parse({"method": "suffix", "suffix_decoding_max_tree_depth": 8}).num_speculative_tokens == 8


def test_draft_model_alias_key():
    assert parse({"method": "draft_model", "draft_model": "x", "num_speculative_tokens": 2}).model == "x"


@pytest.mark.parametrize("raw, words", [
    ("{not json", ["not valid JSON"]),
    (["method"], ["must be a dict"]),
    ({"num_speculative_tokens": 3}, ["'method' is required"]),
    ({"method": "magic", "num_speculative_tokens": 3}, ["'method'", "magic", "ngram"]),
    ({"method": "ngram"}, ["num_speculative_tokens", "required"]),
    ({"method": "ngram", "num_speculative_tokens": 0}, ["num_speculative_tokens", "0", "[1, 128]"]),
    ({"method": "ngram", "num_speculative_tokens": 2.5}, ["num_speculative_tokens", "2.5"]),
    ({"method": "ngram", "num_speculative_tokens": True}, ["num_speculative_tokens", "True"]),
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     ["prompt_lookup_min", "4", "prompt_lookup_max", "2"]),
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 0}, ["prompt_lookup_min", "0"]),
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": -1}, ["prompt_lookup_max", "-1"]),
    ({"method": "ngram", "num_speculative_tokens": 3, "bogus": 1}, ["unknown", "bogus", "prompt_lookup_max"]),
    ({"method": "ngram", "num_speculative_tokens": 3, "suffix_decoding_max_tree_depth": 4},
     ["unknown", "suffix_decoding_max_tree_depth"]),
    ({"method": "ngram", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 2},
     ["draft_tensor_parallel_size", "2", "1 or the target"]),
    ({"method": "ngram", "num_speculative_tokens": 3, "disable_padded_drafter_batch": "maybe"},
     ["disable_padded_drafter_batch", "maybe"]),
    ({"method": "suffix", "suffix_decoding_max_tree_depth": 0}, ["suffix_decoding_max_tree_depth", "0"]),
    ({"method": "suffix", "suffix_decoding_max_cached_requests": -1}, ["suffix_decoding_max_cached_requests"]),
    ({"method": "suffix", "suffix_decoding_max_spec_factor": -0.5}, ["suffix_decoding_max_spec_factor"]),
    ({"method": "suffix", "suffix_decoding_min_token_prob": 1.5}, ["suffix_decoding_min_token_prob", "1.5"]),
    ({"method": "draft_model", "num_speculative_tokens": 3}, ["draft_model", "needs 'model'"]),
    ({"method": "draft_model", "model": "a", "draft_model": "b", "num_speculative_tokens": 3}, ["disagree"]),
    ({"method": "draft_model", "model": "a", "num_speculative_tokens": 3, "draft_sample_method": "best"},
     ["draft_sample_method", "best", "probabilistic"]),
])
def test_bad_configs_are_rejected_with_the_key(raw, words):
    with pytest.raises(ValueError) as info:
        parse(raw)
    for word in words:
        assert word in str(info.value)


def test_mtp_aliases_and_default_model():
    cfg = parse({"method": "deepseek_mtp", "num_speculative_tokens": 1})
    assert cfg.method == "mtp" and cfg.model is None
    assert SpeculativeConfig.from_value({"method": "mtp", "num_speculative_tokens": 1},
                                        target_model="/some/target").model == "/some/target"


def test_engine_config_parses_it_and_rejects_bad_values():
    cfg = EngineConfig.from_kwargs(speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    assert cfg.speculative.method == "ngram" and cfg.speculative.num_speculative_tokens == 4
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        EngineConfig.from_kwargs(speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                                     "prompt_lookup_min": 9, "prompt_lookup_max": 3})


def test_draft_model_errors_at_load(tiny_model_dir, tmp_path):
    from draftwise import LLM

    with pytest.raises(ValueError, match="no network access|not found|does not exist"):
        LLM(model=str(tiny_model_dir), dtype="float32",
            speculative_config={"method": "draft_model", "model": str(tmp_path / "missing"),
                                "num_speculative_tokens": 2})
