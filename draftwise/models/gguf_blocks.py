"""A GGUF model's weights as the file stores them: linears on blocks, the embedding mapped.

``apply_gguf_blocks(model, gguf)`` runs on a ``DecoderLM`` built on the meta device, before any
float weight exists, and swaps in what the file holds:

* each fused linear of every layer (``qkv_proj``, ``o_proj``, ``gate_up_proj``, ``down_proj``)
  for a ``GGUFLinear`` over the file's blocks where every tensor it fuses has a type the
  kernel runs (``QTYPE_IDS``); parts of different types (Q4_K_M's Q6_K values beside Q4_K
  queries) run side by side in a ``ConcatLinear``;
* the output head (the embedding table where they are tied) for a ``GGUFLinear`` likewise;
* the embedding for a ``GGUFEmbedding`` over a mapping of the file (rows de-quantized when
  looked up).

What stays on meta (norms, biases, a projection or head of a type the kernel does not run) is
loaded as floats afterwards by the caller. No float copy of a swapped weight is ever made.
Returns the number of linears swapped.
"""
from __future__ import annotations

import torch
from torch import nn

from ..layers.gguf_embedding import GGUFEmbedding
from ..layers.gguf_linear import QTYPE_IDS, ConcatLinear, GGUFLinear
from .gguf_file import GGUFFile

_FUSED = {"qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "o_proj": ("self_attn.o_proj",),
          "gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"), "down_proj": ("mlp.down_proj",)}
EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def _fused(gguf: GGUFFile, names: list[str], bias: torch.Tensor | None) -> nn.Module:
    """One module for a fused projection of the tensors ``names``: one ``GGUFLinear`` over their
    rows where they share a type, side by side otherwise."""
    qtypes = [gguf.qtype(name) for name in names]
    if len(set(qtypes)) == 1:
        return GGUFLinear(gguf.blocks(*names), qtypes[0], bias)
    return ConcatLinear([GGUFLinear(gguf.blocks(name), qtype) for name, qtype in zip(names, qtypes)], bias)


def _on_blocks(gguf: GGUFFile, names: list[str]) -> bool:
    return all(name in gguf and gguf.qtype(name) in QTYPE_IDS for name in names)


def _swap_layer(layer: nn.Module, gguf: GGUFFile, prefix: str) -> int:
    swapped = 0
    for module, parts in _FUSED.items():
        names = [f"{prefix}{part}.weight" for part in parts]
        if not _on_blocks(gguf, names):
            continue
        bias = None
        if getattr(layer, module).bias is not None:
            bias = torch.cat([gguf.read(f"{prefix}{part}.bias") for part in parts])
        setattr(layer, module, _fused(gguf, names, bias))
        swapped += 1
    return swapped


def apply_gguf_blocks(model, gguf: GGUFFile) -> int:
    swapped = sum(_swap_layer(layer, gguf, f"model.layers.{i}.") for i, layer in enumerate(model.layers))
    head = HEAD if HEAD in gguf else EMBED
    hidden = model.config.hidden_size
    if _on_blocks(gguf, [head]):
        model.lm_head = GGUFLinear(gguf.blocks(head), gguf.qtype(head))
        swapped += 1
    elif model.lm_head is None:  # tied to a table the kernel does not run: a float head, loaded as HEAD
        with torch.device("meta"):
            model.lm_head = nn.Linear(hidden, model.embed_tokens.num_embeddings, bias=False)
    model.embed_tokens = GGUFEmbedding(gguf.table(EMBED), gguf.qtype(EMBED), hidden)
    return swapped
