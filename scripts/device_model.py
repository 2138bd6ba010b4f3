"""Write a random Llama with SmolLM2-135M's shapes (and the test suite's small tokenizer) to a folder.

A stand-in with the real model's per-step cost for machines that cannot carry the real weights:
    python scripts/device_model.py OUT_DIR
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import _build_tokenizer  # noqa: E402


def main(out_dir: str) -> None:
    tokenizer = _build_tokenizer(out_dir)
    eos_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                         max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True,
                         bos_token_id=eos_id, eos_token_id=eos_id, initializer_range=0.02)
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).eval().save_pretrained(out_dir, safe_serialization=True)


if __name__ == "__main__":
    main(sys.argv[1])
