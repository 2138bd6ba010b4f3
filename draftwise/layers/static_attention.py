"""Paged attention with static shapes: what a CUDA graph can capture.

Contract
--------
A static batch is ``num_seqs`` sequences of ``query_len`` query rows each (decode: 1; a chain
verify: drafts + 1), laid out sequence after sequence. Every tensor's shape depends only on
``(num_seqs, query_len, num_blocks)``, and nothing is read back to the host, so the same kernels
run for any content of the inputs:

* ``block_table`` ``[num_seqs, num_blocks]``: each sequence's blocks, any block id past its
  context (those keys are masked);
* ``context_lens`` ``[num_seqs]`` on the device: the context length, this step's rows included;
  the queries are its last ``query_len`` positions.

Each row attends to the keys at positions ``<=`` its own (and inside the sliding window on
sliding layers); the K/V of a sequence is gathered from its ``num_blocks`` blocks, so a batch
of short contexts should take a small ``num_blocks`` (the caller buckets it). Grouped-query heads
are folded into the query rows (``[num_seqs, kv_heads, group * query_len, head_dim]``), so SDPA sees
one K/V head per query group without a repeated copy.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class StaticBatch:
    """The device tensor a static batch adds to ``AttentionMetadata`` (its block table is the meta's)."""
    context_lens: torch.Tensor  # [num_seqs] int64, on the model's device


def static_attend(q: torch.Tensor,  # [num_seqs * query_len, num_heads, head_dim]
                  kv_cache: torch.Tensor,  # [2, num_slots, num_kv_heads, head_dim], this step's K/V written
                  block_table: torch.Tensor,  # [num_seqs, num_blocks] int64
                  context_lens: torch.Tensor,  # [num_seqs] int64
                  block_size: int, scale: float, window: int | None,
                  compute_dtype: torch.dtype | None) -> torch.Tensor:  # [num_seqs * query_len, heads * head_dim]
    num_seqs, num_blocks = block_table.shape
    num_rows, num_heads, head_dim = q.shape
    query_len, num_kv_heads = num_rows // num_seqs, kv_cache.shape[2]
    group = num_heads // num_kv_heads
    blocks = kv_cache.view(2, -1, block_size, num_kv_heads, head_dim).index_select(1, block_table.flatten())
    keys, values = blocks.view(2, num_seqs, num_blocks * block_size, num_kv_heads, head_dim).transpose(2, 3).unbind(0)
    # [num_seqs, query_len, kv_heads, group, d] -> [num_seqs, kv_heads, group * query_len, d]
    queries = q.view(num_seqs, query_len, num_kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
    queries = queries.reshape(num_seqs, num_kv_heads, group * query_len, head_dim)
    mask = _mask(context_lens, query_len, num_blocks * block_size, window)  # [num_seqs, 1, query_len, ctx]
    mask = mask.expand(num_seqs, group, query_len, mask.shape[-1]).reshape(num_seqs, 1, group * query_len, -1)
    if compute_dtype is not None and compute_dtype != queries.dtype:
        queries, keys, values = (t.to(compute_dtype) for t in (queries, keys, values))
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale)
    out = out.view(num_seqs, num_kv_heads, group, query_len, head_dim).permute(0, 3, 1, 2, 4)
    return out.reshape(num_rows, num_heads * head_dim).to(q.dtype)


def _mask(context_lens: torch.Tensor,  # [num_seqs]
          query_len: int, num_keys: int, window: int | None
          ) -> torch.Tensor:  # [num_seqs, 1, query_len, num_keys] True = attend
    key_pos = torch.arange(num_keys, device=context_lens.device)
    query_pos = context_lens[:, None] - query_len + torch.arange(query_len, device=context_lens.device)
    mask = key_pos[None, None, :] <= query_pos[:, :, None]  # [num_seqs, query_len, num_keys]
    if window:
        mask &= key_pos[None, None, :] > query_pos[:, :, None] - window
    return mask.unsqueeze(1)
