"""A vLLM user's engine arguments as pasted: accepted with their meaning, logged as no-ops, or refused
with the reason; vLLM's EngineArgs / LLMEngine surface; the first vLLM guide's speculative keywords."""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil

import pytest

from draftwise import LLM, EngineArgs, LLMEngine, SamplingParams, TextPrompt, TokensPrompt
from draftwise.cli import build_parser, engine_kwargs, main
from draftwise.compat.vllm.engine_args import VLLM_ENGINE_ARGS
from draftwise.config import KVTransferConfig
from draftwise.engine.arg_utils import engine_config_from_kwargs

PASTED = dict(trust_remote_code=True, gpu_memory_utilization=0.9, enable_chunked_prefill=True,
              disable_log_stats=True, max_num_seqs=None, limit_mm_per_prompt={"image": 0},
              disable_chunked_mm_input=True, allowed_local_media_path="/tmp", enable_prefix_caching=True,
              async_scheduling=None, tokenizer_mode="auto", swap_space=4)


def test_vllm_examples_arguments_run_and_the_noops_are_named(tiny_model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="draftwise"):
        llm = LLM(model=str(tiny_model_dir), dtype="float32", device="cpu", **PASTED)  # a GPU uses the memory share
    config = llm.llm_engine.config
    assert config.max_num_seqs == 256 and config.async_scheduling is False and config.disable_log_stats is True
    noops = " ".join(r.getMessage() for r in caplog.records if "no effect here" in r.getMessage())
    for name in ("trust_remote_code", "enable_chunked_prefill", "limit_mm_per_prompt", "disable_chunked_mm_input",
                 "allowed_local_media_path", "gpu_memory_utilization"):
        assert name in noops
    assert "tokenizer_mode" not in noops  # vLLM's default value: nothing to say
    assert len(llm.generate("hello", SamplingParams(max_tokens=3, temperature=0))[0].outputs[0].token_ids) == 3


@pytest.mark.parametrize("kwargs, words", [
    ({"enable_lora": True}, ["enable_lora", "LoRA"]),
    ({"quantization": "awq"}, ["quantization", "GGUF"]),
    ({"kv_cache_dtype": "fp8"}, ["kv_cache_dtype", "change outputs"]),
    ({"pipeline_parallel_size": 2}, ["pipeline_parallel_size", "not supported"]),
    ({"max_loras": "x"}, ["max_loras", "an int"]),
    ({"logprobs_mode": "processed_logits"}, ["logprobs_mode", "raw"]),
    ({"trust_remote_cod": True}, ["trust_remote_cod", "did you mean 'trust_remote_code'"]),
    ({"speculative_model": "[ngram]", "speculative_config": {"method": "suffix"}}, ["speculative_model", "disagree"]),
    ({"spec_tokens": 3, "speculative_config": {"method": "ngram", "num_speculative_tokens": 2}}, ["spec_tokens"]),
])
def test_what_cannot_work_here_is_refused_naming_the_argument(kwargs, words):
    with pytest.raises(ValueError) as info:
        engine_config_from_kwargs(**kwargs)
    message = str(info.value)
    assert "\n" not in message and all(word in message for word in words), message


def test_every_engine_args_field_is_an_llm_keyword_and_a_serve_flag(tiny_model_dir):
    names = [f.name for f in dataclasses.fields(EngineArgs)]
    assert set(VLLM_ENGINE_ARGS) <= set(names)  # every vLLM name, plus our own
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    flags = set(serve._option_string_actions)
    assert [n for n in names if "--" + n.replace("_", "-") not in flags] == []
    # vLLM's examples: LLM(**dataclasses.asdict(engine_args))
    args = EngineArgs(model=str(tiny_model_dir), dtype="float32")
    llm = LLM(**dataclasses.asdict(args))
    assert llm.llm_engine.config.dtype == "float32"


def test_underscored_flags_equal_dashed_ones_and_refusals_say_why(tiny_model_dir, capsys):
    dashed = engine_kwargs(build_parser().parse_args(["serve", "m", "--max-num-seqs", "4", "--trust-remote-code"]))
    from draftwise.cli import with_dashes

    underscored = engine_kwargs(build_parser().parse_args(
        with_dashes(["serve", "m", "--max_num_seqs", "4", "--trust_remote_code"])))
    assert dashed == underscored and dashed["max_num_seqs"] == 4 and dashed["trust_remote_code"] is True
    code = main(["generate", "--model", str(tiny_model_dir), "--prompt", "hi", "--enable_lora"])
    err = capsys.readouterr().err
    assert code == 2 and "enable_lora" in err and "LoRA adapters are not supported" in err


def test_engine_args_cli_round_trip_and_llm_engine_surface(tiny_model_dir):
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = parser.parse_args(["--model", str(tiny_model_dir), "--dtype", "float32", "--max-num-seqs", "8",
                              "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'])
    engine_args = EngineArgs.from_cli_args(args)
    assert engine_args.speculative_config == {"method": "ngram", "num_speculative_tokens": 3}
    engine = LLMEngine.from_engine_args(engine_args)
    params = SamplingParams(max_tokens=8, temperature=0)
    engine.add_request("a", TextPrompt(prompt="the cat sat on the mat"), params)
    engine.add_request("b", TokensPrompt(prompt_token_ids=[5, 6, 7, 8]), params)
    engine.add_request("c", "to be aborted", params)
    engine.abort_request(["c"])
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({out.request_id: out for out in engine.step() if out.finished})
    assert sorted(finished) == ["a", "b"]
    llm = LLM(model=str(tiny_model_dir), dtype="float32")
    expected = llm.generate(["the cat sat on the mat", {"prompt_token_ids": [5, 6, 7, 8]}], params, use_tqdm=False)
    assert [finished[r].outputs[0].token_ids for r in "ab"] == [o.outputs[0].token_ids for o in expected]


def test_the_first_vllm_guides_speculative_keywords(tiny_model_dir, tiny_draft_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="draftwise"):
        llm = LLM(model=str(tiny_model_dir), dtype="float32", speculative_model="[ngram]", num_speculative_tokens=5,
                  ngram_prompt_lookup_max=4, use_v2_block_manager=True)
    spec = llm.llm_engine.config.speculative
    assert (spec.method, spec.num_speculative_tokens, spec.options.prompt_lookup_max) == ("ngram", 5, 4)
    assert any("speculative_config=" in r.getMessage() for r in caplog.records)  # the modern form, shown once
    draft = engine_config_from_kwargs(speculative_model=str(tiny_draft_dir), num_speculative_tokens=2)
    assert (draft.speculative.method, draft.speculative.model) == ("draft_model", str(tiny_draft_dir))
    short = engine_config_from_kwargs(spec_method="suffix", spec_tokens=3)
    assert (short.speculative.method, short.speculative.num_speculative_tokens) == ("suffix", 3)


def test_default_sampling_params_come_from_the_generation_config(tiny_model_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.9, "top_k": 20,
                                                              "max_new_tokens": 5, "do_sample": True}))
    llm = LLM(model=str(model), dtype="float32")
    params = llm.get_default_sampling_params()
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens) == (0.6, 0.9, 20, 5)
    assert len(llm.generate("hello there", use_tqdm=False)[0].outputs[0].token_ids) == 5  # used when none given
    greedy = LLM(model=str(model), dtype="float32", override_generation_config={"temperature": 0.0})
    assert greedy.get_default_sampling_params().temperature == 0.0
    plain = LLM(model=str(model), dtype="float32", generation_config="vllm").get_default_sampling_params()
    assert (plain.temperature, plain.max_tokens) == (SamplingParams().temperature, SamplingParams().max_tokens)
    with pytest.raises(ValueError, match="override_generation_config"):
        LLM(model=str(model), dtype="float32", override_generation_config={"do_sample": True})


def test_kv_transfer_config_as_vllm_object_or_dict(tmp_path):
    fields = dict(kv_connector="ExampleHiddenStatesConnector", kv_role="kv_producer",
                  kv_connector_extra_config={"shared_storage_path": str(tmp_path)})
    as_object = engine_config_from_kwargs(kv_transfer_config=KVTransferConfig(**fields))
    as_dict = engine_config_from_kwargs(kv_transfer_config=fields)
    assert as_object.kv_transfer == as_dict.kv_transfer and as_dict.kv_transfer.shared_storage_path == tmp_path
    with pytest.raises(ValueError, match="kv_role"):
        KVTransferConfig(**{**fields, "kv_role": "kv_consumer"})


@pytest.mark.parametrize("argv, words", [
    (["--enable-auto-tool-choice", "--tool-call-parser", "hermes"], ["enable_auto_tool_choice", "tool-call parser"]),
    (["--ssl-keyfile", "k.pem"], ["ssl_keyfile", "TLS"]),
    # the seeds' MTP command line, on a model it cannot run here: one line naming the flag and why
    (["--data-parallel-size", "1", "--enable-expert-parallel", "--seed", "1024", "--served-model-name", "dsv3",
      "--max-model-len", "36768", "--max-num-batched-tokens", "5000", "--max-num-seqs", "10", "--quantization",
      "ascend", "--trust-remote-code", "--gpu-memory-utilization", "0.9"], ["quantization='ascend'", "GGUF"]),
    # ... and its 16 ranks on SmolLM2 (9 heads in 3 KV groups)
    (["--model", "HuggingFaceTB/SmolLM2-135M-Instruct", "--data-parallel-size", "1", "--tensor-parallel-size", "16",
      "--enable-expert-parallel", "--seed", "1024", "--served-model-name", "dsv3", "--max-model-len", "36768",
      "--max-num-batched-tokens", "5000", "--max-num-seqs", "10", "--trust-remote-code",
      "--gpu-memory-utilization", "0.9"], ["tensor_parallel_size=16", "9 attention heads in 3 KV groups"]),
])
def test_serve_refuses_vllm_flags_that_cannot_work_here_saying_why(tiny_model_dir, capsys, argv, words):
    code = main(["serve", *([] if "--model" in argv else [str(tiny_model_dir)]), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and err.startswith("draftwise: error:"), err
    assert all(word in err for word in words), err


def test_serve_json_flags_are_parsed_before_their_check(tiny_model_dir):
    from draftwise.server.options import check_vllm_server_flags

    def check(*argv):
        check_vllm_server_flags(build_parser().parse_args(["serve", str(tiny_model_dir), *argv]))

    check("--default-chat-template-kwargs", "{}")  # vLLM's default, given as JSON text
    with pytest.raises(ValueError, match="default_chat_template_kwargs=.*not supported"):
        check("--default-chat-template-kwargs", '{"enable_thinking": false}')
    with pytest.raises(ValueError, match="default-chat-template-kwargs"):
        check("--default-chat-template-kwargs", "{not json")


@pytest.mark.parametrize("extra, words", [({"nope": 1}, "'nope' is unknown; allowed: .*gguf_weights"),
                                          ({"grammar_drafts": "yes"}, "grammar_drafts.*must be a bool"),
                                          ({"gguf_weights": "int4"}, "allowed: \\['quantized', 'dequantized'\\]"),
                                          ("gguf_weights", "must be a dict")])
def test_additional_config_is_validated_naming_the_key(extra, words):
    with pytest.raises(ValueError, match=f"additional_config.*{words}"):
        engine_config_from_kwargs(additional_config=extra)
