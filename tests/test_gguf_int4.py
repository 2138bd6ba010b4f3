"""4-bit GGUF layers on the int4 kernel: exact weights from the file, bf16-class results."""
import gguf
import pytest
import torch

from draftwise import LLM, SamplingParams
from draftwise.layers.linear import can_pack
from draftwise.models.gguf_int4 import Int4Linear, _layer_q4

needs_bf16 = pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.bfloat16),
                                reason="oneDNN bf16 not available on this CPU")


def _dequant(q, scale, zero):  # the kernel's formula: (q - 8) * scale + zero per group of 32
    out_features, in_features = q.shape
    return ((q.view(out_features, -1, 32) - 8) * scale[..., None] + zero[..., None]).view(out_features, in_features)


@needs_bf16
def test_int4_linear_matches_its_weights():
    torch.manual_seed(0)
    q = torch.randint(0, 16, (64, 128), dtype=torch.int32)
    scale, zero = torch.rand(64, 4) * 0.1, torch.randn(64, 4) * 0.1
    layer = Int4Linear(q, scale, zero, None)
    x = torch.randn(3, 128)
    ref = x @ _dequant(q, scale, zero).t()
    out = layer(x.bfloat16()).float()
    assert ((out - ref).norm() / ref.norm()) < 1e-2  # bf16 activations and scales


@pytest.mark.slow
def test_q4_blocks_read_from_gguf_equal_transformers_dequantisation():
    from draftwise.models.loader import gguf_source, load_transformers_model, resolve_model
    from draftwise.models.registry import load_config

    path = resolve_model(None)
    tensors = {t.name: t for t in gguf.GGUFReader(str(gguf_source(path))).tensors}
    weights = load_transformers_model(path, torch.float32).state_dict()
    parts = _layer_q4(tensors, 5, load_config(path))
    names = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
             "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
    for key, hf_name in names.items():
        assert torch.equal(_dequant(*parts[key]), weights[f"model.layers.5.{hf_name}.weight"]), key


@pytest.mark.slow
@needs_bf16
def test_smollm2_int4_logprobs_close_to_fp32():
    prompt = "Write a Python function that reverses a string."
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=5)
    ref = LLM(dtype="float32").generate(prompt, params, use_tqdm=False)[0].outputs[0].logprobs[0]
    llm = LLM(dtype="bfloat16", additional_config={"gguf_int4": True})
    assert llm.llm_engine.runner.model.int4_layers
    out = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].logprobs[0]
    shared = set(ref) & set(out)
    assert len(shared) >= 3
    assert all(abs(ref[t].logprob - out[t].logprob) < 0.2 for t in shared)  # measured 0.12 (bf16: 0.04)


@pytest.mark.parametrize("extra", [{"nope": 1}, {"gguf_int4": "yes"}, "gguf_int4"])
def test_additional_config_is_validated(tiny_model_dir, extra):
    with pytest.raises(ValueError, match="additional_config"):
        LLM(model=str(tiny_model_dir), additional_config=extra)


def test_gguf_int4_ignored_for_non_gguf_models(tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir), dtype="bfloat16", additional_config={"gguf_int4": True})
    assert not llm.llm_engine.runner.model.int4_layers


@pytest.mark.slow
def test_q4_cache_equals_a_fresh_read_of_the_gguf():
    from safetensors.torch import load_file

    from draftwise.models.gguf_int4 import _CACHE_FILE, _load_fused, _read_fused
    from draftwise.models.loader import gguf_source, resolve_model
    from draftwise.models.registry import load_config

    path = resolve_model(None)
    config = load_config(path)
    _load_fused(path, gguf_source(path), config, config.num_hidden_layers)  # writes the cache if absent
    cached = load_file(path / _CACHE_FILE)
    fresh = _read_fused(gguf_source(path), config, config.num_hidden_layers)
    assert cached.keys() == fresh.keys()
    assert all(torch.equal(cached[k], fresh[k]) for k in fresh)
