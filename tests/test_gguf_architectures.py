"""Every architecture loads from a GGUF as llama.cpp writes it, and matches transformers.

Phi-3 stores q/k/v and gate/up fused (``attn_qkv``, ``ffn_up``): they load as the fused tensors.

A tiny random transformers model of each architecture is written the way llama.cpp's converter
writes it (gguf's tensor names, llama's q/k rows permuted, Gemma's norms as 1 + w, F32 values), with
the metadata keys of its architecture and a small BPE vocabulary. draftwise then loads the file
(config and tokenizer cached, weights read from the file) and its logits must equal the original
model's and (where it reads the architecture: not Mistral's) those of transformers' own GGUF reader
on the same file.
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from test_loader import _logits

from draftwise.layers import gguf_linear
from draftwise.layers.gguf_linear import GGUFLinear
from draftwise.models.loader import load_transformers_model, resolve_model
from transformers import AutoConfig, AutoTokenizer

from draftwise.models.registry import build_model, load_config, load_tokenizer

VOCAB = 96
COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=128, rms_norm_eps=1e-6,
              bos_token_id=1, eos_token_id=2)


def _config(arch: str):
    import transformers as tf

    if arch == "llama":
        return tf.LlamaConfig(**COMMON, rope_theta=10000.0, tie_word_embeddings=False)
    if arch == "llama-tied":
        return tf.LlamaConfig(**COMMON, rope_theta=500000.0, tie_word_embeddings=True)
    if arch == "qwen2":
        return tf.Qwen2Config(**COMMON, rope_theta=1000000.0, tie_word_embeddings=True)
    if arch == "mistral":  # stored as llama (permuted q/k), told apart by general.name
        return tf.MistralConfig(**COMMON, rope_theta=1000000.0, sliding_window=None, tie_word_embeddings=False)
    if arch == "qwen3":  # head_dim (Qwen3's 128) != hidden / heads, q/k norms
        return tf.Qwen3Config(**COMMON, head_dim=128, rope_theta=1000000.0, tie_word_embeddings=False)
    if arch == "gemma3":  # sandwich norms stored as 1 + w, q/k norms, sliding-window layers
        return tf.Gemma3TextConfig(**COMMON, head_dim=32, rope_theta=1000000.0, sliding_window=4)
    if arch == "phi3":  # q/k/v and gate/up stored fused, one sliding window for every layer
        return tf.Phi3Config(**COMMON, rope_theta=10000.0, tie_word_embeddings=False, sliding_window=4,
                             pad_token_id=0)
    raise KeyError(arch)


def _random_model(arch: str):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(7)
    model = AutoModelForCausalLM.from_config(_config(arch)).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.uniform_(0.5, 1.5) if "norm" in name else param.normal_(0.0, 0.2)
    return model


def _metadata(writer: gguf.GGUFWriter, config) -> None:
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    rope = config.rope_parameters
    writer.add_rope_freq_base((rope.get("full_attention") or rope)["rope_theta"])
    if getattr(config, "sliding_window", None):
        writer.add_sliding_window(config.sliding_window)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    tokens = ["<unk>", "<s>", "</s>", "a", "b", "ab"] + [f"t{i}" for i in range(VOCAB - 6)]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (VOCAB - 3))
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)  # Phi-3's default pad id (32000) is past this vocabulary


def _permuted(weight: np.ndarray, n_head: int) -> np.ndarray:  # llama.cpp's rotary row order
    return weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def write_gguf(path, model, gguf_arch: str, qtype: str | None = None) -> None:
    """``model`` as llama.cpp writes it for ``gguf_arch``: F32, or its projections in ``qtype``."""
    config = model.config
    arch_id = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}[gguf_arch]
    names = gguf.get_tensor_name_map(arch_id, config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), gguf_arch)
    if config.model_type == "mistral":
        writer.add_name("mistral")
    _metadata(writer, config)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        array = tensor.detach().numpy().astype(np.float32).copy()
        if gguf_arch == "llama" and ".attn_q." in name:
            array = _permuted(array, config.num_attention_heads)
        elif gguf_arch == "llama" and ".attn_k." in name:
            array = _permuted(array, config.num_key_value_heads)
        elif gguf_arch == "gemma3" and name.endswith("norm.weight"):
            array = array + 1.0
        if qtype is not None and array.ndim == 2 and name.startswith("blk."):
            kind = gguf.GGMLQuantizationType[qtype]
            writer.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("arch", ["llama", "llama-tied", "mistral", "qwen2", "qwen3", "gemma3", "phi3"])
def test_architecture_loads_from_gguf_and_matches_transformers(arch, tmp_path, cache):
    model = _random_model(arch)
    path = tmp_path / f"{arch}.gguf"
    write_gguf(path, model, {"llama-tied": "llama", "mistral": "llama"}.get(arch, arch))
    out = resolve_model(path)
    config = load_config(out)
    assert config.model_type == model.config.model_type and config.tie_word_embeddings == model.config.tie_word_embeddings
    resolved = AutoConfig.from_pretrained(out)  # what the architecture's own class makes of the folder
    keys = set(resolved.to_dict()) - {"_name_or_path", "use_cache"}  # where it was read from; generation's
    assert {k: getattr(config, k, None) for k in keys} == {k: getattr(resolved, k) for k in keys}
    tokenizer, auto = load_tokenizer(out), AutoTokenizer.from_pretrained(out)
    assert type(tokenizer) is type(auto) and tokenizer.chat_template == auto.chat_template
    ids = list(range(VOCAB))
    assert tokenizer.convert_ids_to_tokens(ids) == auto.convert_ids_to_tokens(ids)
    assert tokenizer.decode(ids) == auto.decode(ids)
    assert tokenizer.all_special_ids == auto.all_special_ids and tokenizer.eos_token_id == auto.eos_token_id
    ours = build_model(out, config, torch.float32, torch.device("cpu"), max_positions=64)
    ids = torch.tensor([1, 5, 9, 30, 31, 7, 2, 44, 60])
    with torch.no_grad():
        ref = model(ids[None]).logits[0]
        # transformers' GGUF reader looks for a gguf arch named "mistral", which has none, and drops Phi-3's
        # attention.sliding_window (its model then attends past the window)
        if arch not in ("mistral", "phi3"):
            theirs = load_transformers_model(out, torch.float32)(ids[None]).logits[0]
            assert torch.allclose(theirs, ref, atol=1e-4)  # transformers reads the file as we wrote it
    assert torch.allclose(_logits(ours, ids), ref, atol=1e-4)


@pytest.mark.skipif(not gguf_linear.available(), reason="the C++ CPU kernels did not build")
def test_fused_projections_run_on_their_blocks(tmp_path, cache):
    """Phi-3's fused q/k/v and gate/up, quantized, run on the file's blocks as one linear each."""
    model = _random_model("phi3")
    path = tmp_path / "phi3-q8.gguf"
    write_gguf(path, model, "phi3", "Q8_0")
    out = resolve_model(path)
    config, cpu = load_config(out), torch.device("cpu")
    blocks = build_model(out, config, torch.float32, cpu, max_positions=64, gguf_weights="quantized")
    floats = build_model(out, config, torch.float32, cpu, max_positions=64)  # de-quantized from the same file
    assert all(isinstance(getattr(layer, m), GGUFLinear) for layer in blocks.layers
               for m in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))
    ids = torch.tensor([1, 5, 9, 30, 31, 7, 2, 44, 60])
    ref = _logits(floats, ids)
    assert (_logits(blocks, ids) - ref).norm() / ref.norm() < 0.05  # 8-bit activations against float ones
