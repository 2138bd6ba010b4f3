"""Tiny random drafter checkpoints in the exact public layouts (tensor names, shapes, config keys),
for the tiny target of conftest.py (hidden 64, 4 heads / 2 KV heads, 2 layers)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM = 64, 128, 4, 2, 16


def layer_config(vocab_size: int, **extra) -> dict:
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": HIDDEN,
            "intermediate_size": INTER, "num_hidden_layers": 1, "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS, "vocab_size": vocab_size, "max_position_embeddings": 512,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
            **extra}


def _randn(gen: torch.Generator, *shape: int, scale: float = 0.2) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * scale


def decoder_layer_tensors(gen: torch.Generator, prefix: str, qkv_in: int = HIDDEN, input_norm: bool = True,
                          hidden_norm: bool = False) -> dict[str, torch.Tensor]:
    t = {f"{prefix}self_attn.q_proj.weight": _randn(gen, HEADS * HEAD_DIM, qkv_in),
         f"{prefix}self_attn.k_proj.weight": _randn(gen, KV_HEADS * HEAD_DIM, qkv_in),
         f"{prefix}self_attn.v_proj.weight": _randn(gen, KV_HEADS * HEAD_DIM, qkv_in),
         f"{prefix}self_attn.o_proj.weight": _randn(gen, HIDDEN, HEADS * HEAD_DIM),
         f"{prefix}mlp.gate_proj.weight": _randn(gen, INTER, HIDDEN),
         f"{prefix}mlp.up_proj.weight": _randn(gen, INTER, HIDDEN),
         f"{prefix}mlp.down_proj.weight": _randn(gen, HIDDEN, INTER),
         f"{prefix}post_attention_layernorm.weight": 1 + _randn(gen, HIDDEN, scale=0.05)}
    if input_norm:
        t[f"{prefix}input_layernorm.weight"] = 1 + _randn(gen, HIDDEN, scale=0.05)
    if hidden_norm:
        t[f"{prefix}hidden_norm.weight"] = 1 + _randn(gen, HIDDEN, scale=0.05)
    return t


def _save(out: Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    return out


def write_eagle(out: Path, vocab_size: int, seed: int = 0, fc_bias: bool = False) -> Path:
    """EAGLE-1 (SafeAILab/EAGLE): fc [H, 2H], layers.0.* without input_layernorm, no lm_head / norm."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {"fc.weight": _randn(gen, HIDDEN, 2 * HIDDEN), **decoder_layer_tensors(gen, "layers.0.",
                                                                                  input_norm=False)}
    if fc_bias:
        tensors["fc.bias"] = _randn(gen, HIDDEN)
    return _save(out, layer_config(vocab_size, bias=fc_bias), tensors)


def eagle3_tensors(gen: torch.Generator, vocab_size: int, draft_vocab: int, prefix: str) -> dict:
    ids = torch.randperm(vocab_size, generator=gen)[:draft_vocab].sort().values
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return {"fc.weight": _randn(gen, HIDDEN, 3 * HIDDEN), "norm.weight": 1 + _randn(gen, HIDDEN, scale=0.05),
            "lm_head.weight": _randn(gen, draft_vocab, HIDDEN), "d2t": ids - torch.arange(draft_vocab),
            "t2d": t2d, **decoder_layer_tensors(gen, prefix, qkv_in=2 * HIDDEN, hidden_norm=True)}


def write_eagle3(out: Path, vocab_size: int, aux_ids=(0, 1, 2), draft_vocab: int = 200, seed: int = 1) -> Path:
    """EAGLE-3 checkpoint in the EAGLE repo's layout (midlayer.*, d2t/t2d, reduced vocabulary)."""
    gen = torch.Generator().manual_seed(seed)
    config = layer_config(vocab_size, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=draft_vocab,
                          target_hidden_size=HIDDEN, eagle_config={"eagle_aux_hidden_state_layer_ids": list(aux_ids)})
    return _save(out, config, eagle3_tensors(gen, vocab_size, draft_vocab, "midlayer."))


def write_eagle3_speculators(out: Path, vocab_size: int, target: str, aux_ids=(0, 1, 2), draft_vocab: int = 150,
                             num_tokens: int = 3, seed: int = 2) -> Path:
    """EAGLE-3 in vllm-project/speculators' format: nested layer config, layers.0.*, proposal methods."""
    gen = torch.Generator().manual_seed(seed)
    config = {"speculators_model_type": "eagle3", "speculators_version": "0.1.0",
              "architectures": ["Eagle3Speculator"], "transformer_layer_config": layer_config(vocab_size),
              "draft_vocab_size": draft_vocab, "norm_before_residual": True, "target_hidden_size": HIDDEN,
              "eagle_aux_hidden_state_layer_ids": list(aux_ids),
              "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                     "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": num_tokens,
                                                           "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                                     "verifier": {"name_or_path": target, "architectures": ["LlamaForCausalLM"]}}}
    return _save(out, config, eagle3_tensors(gen, vocab_size, draft_vocab, "layers.0."))


def write_medusa(out: Path, vocab_size: int, layout: str = "original", num_heads: int = 3, num_layers: int = 1,
                 seed: int = 3) -> Path:
    """Medusa heads: ``original`` = FasterDecoding's medusa_lm_head.pt, ``vllm`` = blocks/lm_heads safetensors."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(num_heads):
        for j in range(num_layers):
            prefix = f"medusa_head.{i}.{j}.linear." if layout == "original" else f"blocks.{i}.layers.{j}."
            tensors[prefix + "weight"] = _randn(gen, HIDDEN, HIDDEN)
            tensors[prefix + "bias"] = _randn(gen, HIDDEN)
        head = f"medusa_head.{i}.{num_layers}.weight" if layout == "original" else f"lm_heads.{i}.weight"
        tensors[head] = _randn(gen, vocab_size, HIDDEN)
    out.mkdir(parents=True, exist_ok=True)
    if layout == "original":
        config = {"medusa_num_heads": num_heads, "medusa_num_layers": num_layers, "hidden_size": HIDDEN,
                  "vocab_size": vocab_size, "base_model_name_or_path": "tiny-llama"}
        (out / "config.json").write_text(json.dumps(config))
        torch.save(tensors, out / "medusa_lm_head.pt")
        return out
    config = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": HIDDEN,
              "vocab_size": vocab_size, "num_heads": num_heads, "num_hidden_layers": num_layers,
              "medusa_fc_bias": True, "truncated_vocab_size": None}
    return _save(out, config, tensors)


def write_mtp_target(out: Path, target_dir: Path, num_layers: int = 2, seed: int = 4) -> Path:
    """The tiny target with DeepSeek-V3-style MTP layers appended: model.layers.{L+i}.*."""
    import shutil

    from safetensors.torch import load_file

    shutil.copytree(target_dir, out)
    config = json.loads((out / "config.json").read_text())
    first = config["num_hidden_layers"]
    config["num_nextn_predict_layers"] = num_layers
    (out / "config.json").write_text(json.dumps(config, indent=2))
    weights = load_file(str(out / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    for i in range(num_layers):
        prefix = f"model.layers.{first + i}."
        weights.update(decoder_layer_tensors(gen, prefix))
        weights[prefix + "enorm.weight"] = 1 + _randn(gen, HIDDEN, scale=0.05)
        weights[prefix + "hnorm.weight"] = 1 + _randn(gen, HIDDEN, scale=0.05)
        weights[prefix + "eh_proj.weight"] = _randn(gen, HIDDEN, 2 * HIDDEN)
        weights[prefix + "shared_head.norm.weight"] = 1 + _randn(gen, HIDDEN, scale=0.05)
        if i == 0:  # one layer with its own head, the other sharing the target's lm_head
            weights[prefix + "shared_head.head.weight"] = _randn(gen, config["vocab_size"], HIDDEN)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"))
    return out


def write_dflash(out: Path, vocab_size: int, target_layer_ids=(0, 1), block_size: int = 4, num_layers: int = 2,
                 mask_token_id: int = 3, seed: int = 5) -> Path:
    """DFlash (z-lab layout): Qwen3 layers with q/k norms, fc over target layers, hidden_norm, norm."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {"fc.weight": _randn(gen, HIDDEN, len(target_layer_ids) * HIDDEN),
               "hidden_norm.weight": 1 + _randn(gen, HIDDEN, scale=0.05),
               "norm.weight": 1 + _randn(gen, HIDDEN, scale=0.05)}
    for i in range(num_layers):
        tensors.update(decoder_layer_tensors(gen, f"layers.{i}."))
        tensors[f"layers.{i}.self_attn.q_norm.weight"] = 1 + _randn(gen, HEAD_DIM, scale=0.05)
        tensors[f"layers.{i}.self_attn.k_norm.weight"] = 1 + _randn(gen, HEAD_DIM, scale=0.05)
    config = layer_config(vocab_size, model_type="qwen3", architectures=["DFlashDraftModel"], head_dim=HEAD_DIM,
                          num_hidden_layers=num_layers, block_size=block_size, num_target_layers=2,
                          dflash_config={"target_layer_ids": list(target_layer_ids), "mask_token_id": mask_token_id})
    return _save(out, config, tensors)
