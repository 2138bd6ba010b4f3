"""Write a random-weight GGUF with a real model's shapes and llama.cpp's type mix, for benchmarks.

    python scripts/make_shaped_gguf.py SHAPE FTYPE [--out DIR]   # prints the file's path

SHAPE: llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, qwen3-8b. FTYPE: Q4_0, Q4_K_M, Q8_0. Files land in
``$DRAFTWISE_CACHE/shaped`` (``~/.cache/draftwise/shaped``) and are reused; never commit them.

Speed and memory do not depend on the weights' values, so the blocks are random bytes with
sane fp16 scales (a few milli-units) written tensor by tensor (an 8B file never sits in memory).
Types follow llama.cpp's quantizer for the ftype: the output head (the embedding where tied) in
Q6_K, Q4_K_M's ``attn_v`` and ``ffn_down`` in Q6_K on its "more bits" layers, norms in F32. The
tokenizer is the bundled SmolLM2's (tokens, merges, chat template), padded with unreachable
tokens to the shape's vocabulary.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from draftwise.models.gguf_header import read_header  # noqa: E402
from draftwise.models.loader import _smollm2_gguf, cache_root  # noqa: E402


@dataclass(frozen=True)
class Shape:
    arch: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    rope_theta: float
    qk_norm: bool = False


SHAPES = {
    "llama-3.2-1b": Shape("llama", 2048, 8192, 16, 32, 8, 64, 128256, True, 500000.0),
    "llama-3.2-3b": Shape("llama", 3072, 8192, 28, 24, 8, 128, 128256, True, 500000.0),
    "llama-3.1-8b": Shape("llama", 4096, 14336, 32, 32, 8, 128, 128256, False, 500000.0),
    "qwen3-8b": Shape("qwen3", 4096, 12288, 36, 32, 8, 128, 151936, False, 1000000.0, qk_norm=True),
}
FTYPES = ("Q4_0", "Q4_K_M", "Q8_0")
_SCALE_OFFSETS = {"Q4_0": (0,), "Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}  # fp16 d / dmin
_TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.bos_token_id",
                   "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.chat_template")


def tensor_types(shape: Shape, ftype: str) -> dict[str, str]:
    """GGUF tensor name -> ggml type, as llama.cpp's quantizer picks them for ``ftype``."""
    base = {"Q4_K_M": "Q4_K"}.get(ftype, ftype)
    head = "Q8_0" if ftype == "Q8_0" else "Q6_K"
    types = {"token_embd.weight": head if shape.tied else base, "output_norm.weight": "F32"}
    if not shape.tied:
        types["output.weight"] = head
    for i in range(shape.layers):
        more_bits = i < shape.layers // 8 or i >= 7 * shape.layers // 8 or (i - shape.layers // 8) % 3 == 2
        for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            kind = "Q6_K" if ftype == "Q4_K_M" and name in ("attn_v", "ffn_down") and more_bits else base
            types[f"blk.{i}.{name}.weight"] = kind
        for name in ("attn_norm", "ffn_norm") + (("attn_q_norm", "attn_k_norm") if shape.qk_norm else ()):
            types[f"blk.{i}.{name}.weight"] = "F32"
    return types


def tensor_shape(shape: Shape, name: str) -> tuple[int, ...]:
    """[rows, cols] (Hugging Face order) of a tensor of ``tensor_types``."""
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    part = name.split(".")[-2]
    return {"token_embd": (shape.vocab, shape.hidden), "output": (shape.vocab, shape.hidden),
            "output_norm": (shape.hidden,), "attn_norm": (shape.hidden,), "ffn_norm": (shape.hidden,),
            "attn_q_norm": (shape.head_dim,), "attn_k_norm": (shape.head_dim,),
            "attn_q": (q, shape.hidden), "attn_k": (kv, shape.hidden), "attn_v": (kv, shape.hidden),
            "attn_output": (shape.hidden, q), "ffn_gate": (shape.intermediate, shape.hidden),
            "ffn_up": (shape.intermediate, shape.hidden), "ffn_down": (shape.hidden, shape.intermediate)}[part]


def random_tensor(rng: np.random.Generator, dims: tuple[int, ...], qtype: str) -> np.ndarray:
    """Random blocks of ``qtype`` ([rows, row_bytes] uint8) or F32 values near 1 (norms)."""
    if qtype == "F32":
        return (1.0 + 0.1 * rng.standard_normal(dims)).astype(np.float32)
    block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    rows, cols = dims
    blocks = rng.integers(0, 256, (rows, cols // block_size, type_size), dtype=np.uint8)
    for offset in _SCALE_OFFSETS[qtype]:
        scales = (rng.random((rows, cols // block_size)) * 2e-3 + 1e-3).astype(np.float16)
        blocks[:, :, offset:offset + 2] = scales.view(np.uint8).reshape(rows, -1, 2)
    return blocks.reshape(rows, -1)


def write(shape_name: str, ftype: str, out: Path) -> None:
    shape = SHAPES[shape_name]
    smol = read_header(_smollm2_gguf())
    writer = GGUFWriter(str(out), shape.arch)
    writer.add_name(f"random {shape_name} {ftype}")
    writer.add_block_count(shape.layers)
    writer.add_context_length(8192)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(shape.vocab)
    tokens = smol.array("tokenizer.ggml.tokens")
    pad = shape.vocab - len(tokens)
    writer.add_token_list(tokens + [f"<unused_{i}>" for i in range(pad)])
    writer.add_token_types(smol.array("tokenizer.ggml.token_type") + [1] * pad)
    writer.add_token_merges(smol.array("tokenizer.ggml.merges"))
    for key in _TOKENIZER_KEYS:
        value = smol.get(key)
        if value is not None:
            writer.add_string(key, value) if isinstance(value, str) else writer.add_uint32(key, value)
    types = tensor_types(shape, ftype)
    for name, qtype in types.items():
        dims = tensor_shape(shape, name)
        kind = GGMLQuantizationType[qtype]
        block_size, type_size = GGML_QUANT_SIZES[kind]
        nbytes = int(np.prod(dims)) // block_size * type_size
        byte_dims = dims if qtype == "F32" else (dims[0], dims[1] // block_size * type_size)
        writer.add_tensor_info(name, byte_dims, np.dtype(np.float32 if qtype == "F32" else np.uint8), nbytes,
                               None if qtype == "F32" else kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    for name, qtype in types.items():
        writer.write_tensor_data(random_tensor(rng, tensor_shape(shape, name), qtype))
    writer.close()


def shaped_gguf(shape_name: str, ftype: str, out_dir: Path | None = None) -> Path:
    """The cached file for (shape, ftype), written first if absent."""
    out_dir = out_dir or cache_root() / "shaped"
    out = out_dir / f"{shape_name}-{ftype}.gguf"
    if not out.is_file():
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        try:
            write(shape_name, ftype, tmp)
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("ftype", choices=FTYPES)
    parser.add_argument("--out", type=Path, default=None, help="directory (default: the draftwise cache)")
    args = parser.parse_args()
    print(shaped_gguf(args.shape, args.ftype, args.out))


if __name__ == "__main__":
    main()
