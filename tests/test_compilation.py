"""The compiled forward: vLLM's ``compilation_config`` keys and what they mean, and compiled
runs that give exactly the eager tokens (fp32, greedy): plain decoding of a ragged batch (one
dynamic graph), speculative verification (EAGLE-3 reads auxiliary hidden states), padded
static buckets, and two compiled engines in one process that must not share frozen weights."""
from __future__ import annotations

import logging

import pytest
from conftest import PROMPTS, _save_random_llama, greedy

from draftwise import LLM
from draftwise.bench.options import BenchOptions
from draftwise.cli import build_parser, engine_kwargs
from draftwise.compilation import CompilationConfig
from draftwise.compilation.config import default_capture_sizes
from draftwise.config import EngineConfig
from draftwise.engine.arg_utils import engine_config_from_kwargs
from draftwise.kernels import native

MAX_TOKENS = [12, 20, 8, 16, 10, 14, 6, 18]


def _tokens(llm: LLM, prompts=PROMPTS, max_tokens=MAX_TOKENS) -> list[list[int]]:
    params = [greedy(n) for n in max_tokens[:len(prompts)]]
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def eager_tokens(tiny_llm):
    return _tokens(tiny_llm)


def test_compiled_equals_eager_on_a_ragged_batch(tiny_model_dir, eager_tokens):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, compilation_config={"mode": 3})
    assert llm.llm_engine.compile_seconds > 0
    assert _tokens(llm) == eager_tokens  # prefill chunks and decodes of every size, one dynamic graph
    assert [_tokens(llm, [p], [16])[0] for p in PROMPTS[:3]] == [t[:16] for t in _tokens(llm, PROMPTS[:3], [16] * 3)]


def test_compiled_buckets_pad_and_beyond_run_eager(tiny_model_dir, eager_tokens):
    config = {"mode": 3, "cudagraph_capture_sizes": [1, 4], "compile_sizes": [3]}
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, compilation_config=config)
    compiled = llm.llm_engine.runner.paged.run
    assert compiled.warm_up_sizes() == [1, 3, 4]
    assert [compiled.padded_size(n) for n in (1, 2, 3, 4, 5)] == [1, 3, 3, 4, None]
    assert _tokens(llm) == eager_tokens


def test_compiled_speculation_equals_eager(tiny_model_dir, spec_dirs, eager_tokens):
    spec = {"method": "eagle3", "model": str(spec_dirs["eagle3"]), "num_speculative_tokens": 4,
            "disable_padded_drafter_batch": True}
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, speculative_config=spec, compilation_config=3)
    assert llm.llm_engine.runner.paged.run.aux_layer_ids  # the compiled graph returns the drafter's inputs
    assert _tokens(llm) == eager_tokens


def test_two_compiled_engines_keep_their_own_weights(tiny_model_dir, tmp_path, eager_tokens):
    other_dir = tmp_path / "other"
    tokenizer = LLM(model=str(tiny_model_dir), dtype="float32").get_tokenizer()
    _save_random_llama(other_dir, tokenizer, seed=7, vocab_size=len(tokenizer))
    other_eager = _tokens(LLM(model=str(other_dir), dtype="float32", seed=0, enforce_eager=True))
    first = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, compilation_config=3)
    second = LLM(model=str(other_dir), dtype="float32", seed=0, compilation_config=3)
    assert _tokens(second) == other_eager != eager_tokens
    assert _tokens(first) == eager_tokens


def test_enforce_eager_and_the_default_run_eager(tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", enforce_eager=True, compilation_config=3)
    assert llm.llm_engine.compile_seconds == 0.0
    assert llm.llm_engine.runner.paged.run is llm.llm_engine.runner.paged.model
    assert CompilationConfig().resolved_mode(enforce_eager=False) == 0


def test_a_model_on_gguf_blocks_runs_its_stack_not_a_compiled_graph(tiny_model_dir, caplog):
    if not native.load():
        pytest.skip("the C++ kernels did not build here")
    kwargs = dict(model=str(tiny_model_dir), dtype="float32", seed=0, quantization="q4_0")
    with caplog.at_level(logging.WARNING, logger="draftwise"):
        llm = LLM(**kwargs, compilation_config=3)
    paged = llm.llm_engine.runner.paged
    assert llm.llm_engine.compile_seconds == 0.0 and paged.run is paged.model
    assert "not applied: the linears run on GGUF blocks" in caplog.text
    assert _tokens(llm) == _tokens(LLM(**kwargs))


@pytest.mark.parametrize("value, mode", [(3, 3), ("3", 3), ('{"level": 1}', 1), ({"mode": "VLLM_COMPILE"}, 3),
                                         ({"mode": "none"}, 0), ({"cudagraph_mode": "FULL_DECODE_ONLY"}, 0)])
def test_config_forms(value, mode):
    assert CompilationConfig.from_value(value).resolved_mode(enforce_eager=False) == mode


def test_bucket_sizes_follow_vllm():
    assert default_capture_sizes(24) == [1, 2, 4, 8, 16, 24]
    assert CompilationConfig.from_value({"max_cudagraph_capture_size": 16}).bucket_sizes() == [1, 2, 4, 8, 16]
    config = {"cudagraph_capture_sizes": [6, 12, 18], "max_cudagraph_capture_size": 12,
              "compile_sizes": [1, "cudagraph_capture_sizes"]}
    assert CompilationConfig.from_value(config).bucket_sizes() == [1, 6, 12]
    assert CompilationConfig.from_value({"mode": 3}).bucket_sizes() == []


@pytest.mark.parametrize("value, words", [
    ({"backend_x": 1}, ["backend_x", "allowed", "cudagraph_mode"]),
    ({"mode": 7}, ["'mode'", "7", "VLLM_COMPILE"]),
    ({"mode": 1, "level": 3}, ["'mode'", "'level'"]),
    ({"cudagraph_mode": "SOMETIMES"}, ["cudagraph_mode", "FULL_DECODE_ONLY"]),
    ({"cudagraph_capture_sizes": [1, 0]}, ["cudagraph_capture_sizes", ">= 1"]),
    ({"compile_sizes": 8}, ["compile_sizes", "list"]),
    ({"max_cudagraph_capture_size": "big"}, ["max_cudagraph_capture_size"]),
    ({"cache_dir": ""}, ["cache_dir"]),
    ("{not json", ["compilation_config", "JSON"]),
    (True, ["compilation_config"]),
])
def test_bad_configs_name_the_key(value, words):
    with pytest.raises(ValueError) as info:
        EngineConfig.from_kwargs(compilation_config=value)
    assert all(word in str(info.value) for word in words), str(info.value)


def test_cli_flags():
    parse = lambda *argv: engine_kwargs(build_parser().parse_args(["generate", "--prompt", "p", *argv]))  # noqa
    assert parse("-O3")["compilation_config"] == 3
    assert parse("-O", "0")["compilation_config"] == 0
    mtp_seed = parse("--compilation-config", '{"cudagraph_mode": "FULL_DECODE_ONLY"}')
    assert mtp_seed["compilation_config"] == {"cudagraph_mode": "FULL_DECODE_ONLY"}
    config = engine_config_from_kwargs(**{k: v for k, v in mtp_seed.items() if k != "model"})
    assert config.compilation.cudagraph_mode == "FULL_DECODE_ONLY"
    assert parse("--enforce-eager")["enforce_eager"] is True
    with pytest.raises(ValueError, match="--compilation-config"):
        parse("-O", "{bad")
    bench = build_parser().parse_args(["bench", "-O3", "--enforce-eager"])
    options = BenchOptions.from_args(bench)
    assert options.compilation_config == 3 and options.enforce_eager is True


def test_the_seeds_mtp_command_starts(tiny_model_dir, spec_dirs, eager_tokens):
    """The seeds' MTP example passes ``--compilation-config '{"cudagraph_mode": "FULL_DECODE_ONLY"}'``."""
    args = build_parser().parse_args(["serve", str(tiny_model_dir), "--dtype", "float32", "-sc",
                                      f'{{"method": "mtp", "model": "{spec_dirs["mtp_target"]}", '
                                      '"num_speculative_tokens": 2}',
                                      "--compilation-config", '{"cudagraph_mode": "FULL_DECODE_ONLY"}'])
    kwargs = engine_kwargs(args)
    kwargs["model"] = args.model or args.model_tag
    llm = LLM(**kwargs)
    assert llm.llm_engine.config.compilation.cudagraph_mode == "FULL_DECODE_ONLY"
    assert _tokens(llm) == eager_tokens  # MTP drafts verified: the plain greedy tokens
