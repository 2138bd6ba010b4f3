"""extract_hidden_states: one safetensors file per request with the prompt's token ids and the
inputs of the chosen target layers (equal to transformers' own), one output token, clear errors."""
from __future__ import annotations

import pytest
import torch
from conftest import PROMPTS
from safetensors.torch import load_file
from test_hidden_drafters import target_states

from draftwise import LLM, SamplingParams

LAYERS = [0, 1, 2]  # inputs of layers 0 and 1, and the last layer's output before the final norm


def make_llm(model_dir, out_dir, **kwargs) -> LLM:
    return LLM(model=str(model_dir), dtype="float32", **kwargs,
               speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                   "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": LAYERS}}},
               kv_transfer_config={"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                                   "kv_connector_extra_config": {"shared_storage_path": str(out_dir)}})


@pytest.mark.parametrize("chunked", [False, True])
def test_files_hold_the_prompts_hidden_states(tiny_model_dir, tmp_path, chunked):
    llm = make_llm(tiny_model_dir, tmp_path, **({"max_num_batched_tokens": 16} if chunked else {}))
    outs = llm.generate(PROMPTS[:4], SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)
    for out in outs:
        assert len(out.outputs[0].token_ids) == 1  # a producer prefills and emits one token
        saved = load_file(out.kv_transfer_params["hidden_states_path"])
        assert saved["token_ids"].tolist() == out.prompt_token_ids
        num = len(out.prompt_token_ids)
        assert saved["hidden_states"].shape == (num, len(LAYERS), 64)
        ref = target_states(tiny_model_dir, out.prompt_token_ids)
        for j, layer in enumerate(LAYERS):
            torch.testing.assert_close(saved["hidden_states"][:, j], ref[layer], atol=1e-4, rtol=1e-4)
    assert llm.llm_engine.speculator.proposer.tracked_seq_ids() == set()


@pytest.mark.parametrize("kwargs, needle", [
    ({"num_speculative_tokens": 2}, "num_speculative_tokens"),
    ({"draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [7]}}}, "layer ids in [0, 2]"),
    ({"draft_model_config": {"layers": [1]}}, "draft_model_config"),
])
def test_bad_configs(tiny_model_dir, tmp_path, kwargs, needle):
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1, **kwargs}
    with pytest.raises(ValueError, match="speculative_config") as err:
        LLM(model=str(tiny_model_dir), dtype="float32", speculative_config=spec,
            kv_transfer_config={"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                                "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)}})
    assert needle in str(err.value)


def test_needs_a_kv_transfer_config(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="needs kv_transfer_config"):
        LLM(model=str(tiny_model_dir), speculative_config={"method": "extract_hidden_states"})
    with pytest.raises(ValueError, match="kv_role"):
        LLM(model=str(tiny_model_dir), kv_transfer_config={"kv_connector": "ExampleHiddenStatesConnector",
                                                           "kv_role": "kv_consumer"})


def test_hidden_states_dtype_is_the_files_dtype(tiny_model_dir, tmp_path):
    """``kv_connector_extra_config["hidden_states_dtype"]``: the states written in that dtype (bf16 here,
    the fp32 states rounded once); any other value is refused naming the key."""
    fp32 = make_llm(tiny_model_dir, tmp_path / "fp32")
    llm = LLM(model=str(tiny_model_dir), dtype="float32",
              speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                  "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": LAYERS}}},
              kv_transfer_config={"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                                  "kv_connector_extra_config": {"shared_storage_path": str(tmp_path / "bf16"),
                                                                "hidden_states_dtype": "bfloat16"}})
    params = SamplingParams(temperature=0, max_tokens=1)
    full = load_file(fp32.generate(PROMPTS[0], params, use_tqdm=False)[0].kv_transfer_params["hidden_states_path"])
    half = load_file(llm.generate(PROMPTS[0], params, use_tqdm=False)[0].kv_transfer_params["hidden_states_path"])
    assert half["hidden_states"].dtype == torch.bfloat16
    assert torch.equal(half["hidden_states"], full["hidden_states"].to(torch.bfloat16))
    with pytest.raises(ValueError, match="hidden_states_dtype.*allowed: \\['float32', 'bfloat16', 'float16'\\]"):
        LLM(model=str(tiny_model_dir), kv_transfer_config={
            "kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": str(tmp_path), "hidden_states_dtype": "int8"}})
