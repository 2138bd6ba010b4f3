"""Paged attention of a uniform batch (``layers/static_attention.py``'s contract) as one Triton kernel.

A batch of ``num_seqs`` sequences with ``query_len`` rows each (decode: 1; a chain verify: drafts + 1)
attends straight from the paged KV cache: one program per (sequence, kv head) holds that head's
``group * query_len`` query rows, walks the sequence's keys ``BLOCK_N`` at a time through its block
table up to its context length (read on the device, so a CUDA graph replays it for any lengths), and
keeps an online softmax. No gather of the context, no mask tensor. Row ``r`` of a program is query
``r // group`` of head ``kv_head * group + r % group``; a row sees the keys at positions ``<=`` its own
(and inside the sliding window on sliding layers). Scores and sums in fp32; the probabilities are
rounded to the cache dtype for the value product (flash attention's convention).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 64  # keys per iteration
MIN_ROWS = 16  # tl.dot's smallest tile


@triton.jit
def _static_attention_kernel(q_ptr, cache_ptr, table_ptr, context_lens_ptr, out_ptr, stride_kv, stride_slot,
                             num_blocks, scale, window, QUERY_LEN: tl.constexpr, GROUP: tl.constexpr,
                             NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                             ROWS: tl.constexpr, BLOCK_N: tl.constexpr, SLIDING: tl.constexpr,
                             PRECISION: tl.constexpr):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    rows = tl.arange(0, ROWS)
    real = rows < QUERY_LEN * GROUP
    token = seq * QUERY_LEN + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    dims = tl.arange(0, HEAD_DIM)
    row_offsets = (token * NUM_HEADS + head)[:, None] * HEAD_DIM + dims[None, :]  # [ROWS, HEAD_DIM]
    q = tl.load(q_ptr + row_offsets, mask=real[:, None], other=0.0)
    context_len = tl.load(context_lens_ptr + seq)
    query_pos = context_len - QUERY_LEN + rows // GROUP  # [ROWS]
    best = tl.full([ROWS], float("-inf"), tl.float32)
    total = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM], tl.float32)
    start = 0
    if SLIDING:
        start = tl.maximum(context_len - QUERY_LEN - window + 1, 0) // BLOCK_N * BLOCK_N
    for first in range(start, context_len, BLOCK_N):
        keys = first + tl.arange(0, BLOCK_N)
        inside = keys < context_len
        block = tl.load(table_ptr + seq * num_blocks + keys // BLOCK_SIZE, mask=inside, other=0)
        slot = block * BLOCK_SIZE + keys % BLOCK_SIZE
        kv_offsets = slot[:, None] * stride_slot + kv_head * HEAD_DIM + dims[None, :]  # [BLOCK_N, HEAD_DIM]
        k = tl.load(cache_ptr + kv_offsets, mask=inside[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [ROWS, BLOCK_N]
        seen = inside[None, :] & (keys[None, :] <= query_pos[:, None])
        if SLIDING:
            seen = seen & (keys[None, :] > query_pos[:, None] - window)
        scores = tl.where(seen, scores, float("-inf"))
        new_best = tl.maximum(best, tl.max(scores, axis=1))
        shift = tl.where(new_best == float("-inf"), 0.0, new_best)  # a row with nothing seen yet
        p = tl.exp(scores - shift[:, None])
        rescale = tl.exp(best - shift)
        total = total * rescale + tl.sum(p, axis=1)
        v = tl.load(cache_ptr + stride_kv + kv_offsets, mask=inside[:, None], other=0.0)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        best = new_best
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(out_ptr + row_offsets, out.to(out_ptr.dtype.element_ty), mask=real[:, None])


def static_paged_attention(q: torch.Tensor,  # [num_seqs * query_len, num_heads, head_dim], this step's K/V cached
                           kv_cache: torch.Tensor,  # [2, num_slots, num_kv_heads, head_dim]
                           block_table: torch.Tensor,  # [num_seqs, num_blocks] int64
                           context_lens: torch.Tensor,  # [num_seqs] int64, this step's rows included
                           block_size: int, scale: float, window: int | None
                           ) -> torch.Tensor:  # [num_seqs * query_len, num_heads * head_dim]
    num_seqs, num_blocks = block_table.shape
    num_rows, num_heads, head_dim = q.shape
    num_kv_heads = kv_cache.shape[2]
    group, query_len = num_heads // num_kv_heads, num_rows // num_seqs
    out = torch.empty(num_rows, num_heads * head_dim, dtype=q.dtype, device=q.device)
    precision = "ieee" if q.dtype == torch.float32 else None
    _static_attention_kernel[(num_seqs, num_kv_heads)](
        q, kv_cache, block_table, context_lens, out, kv_cache.stride(0), kv_cache.stride(1), num_blocks, scale,
        window or 0, QUERY_LEN=query_len, GROUP=group, NUM_HEADS=num_heads, HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, ROWS=max(MIN_ROWS, triton.next_power_of_2(group * query_len)), BLOCK_N=BLOCK_N,
        SLIDING=bool(window), PRECISION=precision)
    return out
