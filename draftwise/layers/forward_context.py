"""The forward context: what every attention layer of one target forward shares.

A compiled forward cannot take ``AttentionMetadata`` (a Python object of index
tensors, ints and lists) as a graph input, nor write the KV cache inside its
graph (inductor would copy the whole cache on every call). So the runner sets
the step's metadata and the model's KV cache here around the forward, and each
attention layer reads them by its layer index: through the opaque
``draftwise::attention`` op inside a compiled graph, directly in eager mode
(the same design as vLLM's forward context and unified attention op).

Contract: ``forward_context(meta, kv_caches)`` is entered around exactly one
forward; ``meta`` describes the step's real tokens. A compiled graph may run
more rows than that (inputs padded to a bucket): rows past
``meta.slot_mapping.numel()`` are padding, their K/V are never written and
their attention output is zero.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

from .attention import AttentionMetadata, paged_attention


@dataclass
class ForwardContext:
    meta: AttentionMetadata
    kv_caches: torch.Tensor  # [num_layers, 2, num_slots, num_kv_heads, head_dim]


_current: ForwardContext | None = None


@contextmanager
def forward_context(meta: AttentionMetadata, kv_caches: torch.Tensor) -> Iterator[ForwardContext]:
    global _current
    previous, _current = _current, ForwardContext(meta, kv_caches)
    try:
        yield _current
    finally:
        _current = previous


def get_forward_context() -> ForwardContext:
    if _current is None:
        raise RuntimeError("no forward context: run the model inside forward_context(meta, kv_caches)")
    return _current


def context_attention(q: torch.Tensor,  # [num_rows, num_heads, head_dim], num_rows >= the step's tokens
                      k: torch.Tensor, v: torch.Tensor,  # [num_rows, num_kv_heads, head_dim]
                      layer_index: int, scale: float,
                      sliding: bool) -> torch.Tensor:  # [num_rows, num_heads * head_dim]
    """Paged attention of one layer over the forward context's metadata and KV cache."""
    if torch.compiler.is_compiling():
        return torch.ops.draftwise.attention(q, k, v, layer_index, scale, sliding)
    return _attend(q, k, v, layer_index, scale, sliding)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_index: int, scale: float,
            sliding: bool) -> torch.Tensor:
    context = get_forward_context()
    num_tokens = context.meta.slot_mapping.numel()
    out = paged_attention(q[:num_tokens], k[:num_tokens], v[:num_tokens], context.kv_caches[layer_index],
                          context.meta, scale, sliding)
    if num_tokens == q.shape[0]:
        return out
    return torch.cat((out, out.new_zeros(q.shape[0] - num_tokens, out.shape[1])))


# The compiled graph's view of ``_attend``: opaque to inductor, its KV write stays in place.
torch.library.custom_op("draftwise::attention", _attend, mutates_args=())


@torch.library.register_fake("draftwise::attention")
def _(q, k, v, layer_index, scale, sliding):
    return q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
