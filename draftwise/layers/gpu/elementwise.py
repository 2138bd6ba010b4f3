"""A decoder layer's elementwise steps, each one Triton kernel.

* ``add_rms_norm(x, delta, weight, eps, out_dtype)``: the residual stream ``x + delta`` (fp32) and
  its RMSNorm cast to ``out_dtype``, in one pass (torch: add, norm, cast).
* ``rope_and_cache(qkv, cos, signed_sin, positions, kv_cache, slots, ...)``: neox rotary embedding of
  the q and k heads of a fused qkv projection, q written out, k and v written into the paged cache
  at ``slots`` (torch: two gathers of the tables, flip, multiply-adds, stack, scatter).
* ``silu_mul(gate_up)``: ``silu(gate) * up`` of a fused gate/up projection.

Each computes in fp32 and rounds once to the output dtype; torch's bf16 ops round after each op, so
the two agree to bf16 rounding, and exactly in fp32 up to the order of a row's sum of squares.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_kernel(x_ptr, delta_ptr, weight_ptr, residual_ptr, out_ptr, dim, eps,
                         HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < dim
    x = tl.load(x_ptr + row * dim + cols, mask=inside, other=0.0).to(tl.float32)
    if HAS_DELTA:
        x += tl.load(delta_ptr + row * dim + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(residual_ptr + row * dim + cols, x, mask=inside)
    rms = tl.rsqrt(tl.sum(x * x, axis=0) / dim + eps)
    weight = tl.load(weight_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * dim + cols, (x * rms * weight).to(out_ptr.dtype.element_ty), mask=inside)


def add_rms_norm(x: torch.Tensor,  # [num_tokens, dim] fp32 residual stream
                 delta: torch.Tensor | None,  # [num_tokens, dim] any float dtype, added to x first
                 weight: torch.Tensor,  # [dim] fp32
                 eps: float, out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(``x + delta`` as a new fp32 tensor, or ``x`` itself without delta; its RMSNorm in ``out_dtype``)."""
    num_tokens, dim = x.shape
    residual = torch.empty_like(x) if delta is not None else x
    out = torch.empty(num_tokens, dim, dtype=out_dtype, device=x.device)
    if num_tokens:
        _add_rms_norm_kernel[(num_tokens,)](x, delta if delta is not None else x, weight, residual, out, dim, eps,
                                           HAS_DELTA=delta is not None, BLOCK=triton.next_power_of_2(dim))
    return residual, out


@triton.jit
def _rope_and_cache_kernel(qkv_ptr, cos_ptr, sin_ptr, positions_ptr, q_ptr, cache_ptr, slots_ptr,
                           stride_kv, num_slots_stride, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                           HEAD_DIM: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)  # q heads, then k heads, then v heads
    half = tl.arange(0, HEAD_DIM // 2)
    width = (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM
    src = qkv_ptr + token * width + head * HEAD_DIM
    first = tl.load(src + half).to(tl.float32)
    second = tl.load(src + HEAD_DIM // 2 + half).to(tl.float32)
    slot = tl.load(slots_ptr + token)
    if head < NUM_HEADS + NUM_KV_HEADS:  # rotary: x * cos + (halves exchanged) * signed sin
        table = tl.load(positions_ptr + token) * HEAD_DIM
        cos1 = tl.load(cos_ptr + table + half).to(tl.float32)
        cos2 = tl.load(cos_ptr + table + HEAD_DIM // 2 + half).to(tl.float32)
        sin1 = tl.load(sin_ptr + table + half).to(tl.float32)
        sin2 = tl.load(sin_ptr + table + HEAD_DIM // 2 + half).to(tl.float32)
        rotated = first * cos1 + second * sin1
        second = second * cos2 + first * sin2
        first = rotated
    if head < NUM_HEADS:
        dst = q_ptr + (token * NUM_HEADS + head) * HEAD_DIM
    elif head < NUM_HEADS + NUM_KV_HEADS:
        dst = cache_ptr + slot * num_slots_stride + (head - NUM_HEADS) * HEAD_DIM
    else:
        dst = cache_ptr + stride_kv + slot * num_slots_stride + (head - NUM_HEADS - NUM_KV_HEADS) * HEAD_DIM
    tl.store(dst + half, first.to(dst.dtype.element_ty))
    tl.store(dst + HEAD_DIM // 2 + half, second.to(dst.dtype.element_ty))


def rope_and_cache(qkv: torch.Tensor,  # [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim]
                   cos: torch.Tensor, signed_sin: torch.Tensor,  # [max_positions, head_dim] contiguous
                   positions: torch.Tensor,  # [num_tokens] int64
                   kv_cache: torch.Tensor,  # [2, num_slots, num_kv_heads, head_dim], rows written in place
                   slots: torch.Tensor,  # [num_tokens] int64 cache slot of each token
                   num_heads: int, num_kv_heads: int, head_dim: int
                   ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim] rotated queries
    num_tokens = qkv.shape[0]
    q = torch.empty(num_tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if num_tokens:
        _rope_and_cache_kernel[(num_tokens, num_heads + 2 * num_kv_heads)](
            qkv, cos, signed_sin, positions, q, kv_cache, slots, kv_cache.stride(0), kv_cache.stride(1),
            NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim)
    return q


@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < inter
    gate = tl.load(gate_up_ptr + row * 2 * inter + cols, mask=inside, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * 2 * inter + inter + cols, mask=inside, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * inter + cols, out.to(out_ptr.dtype.element_ty), mask=inside)


def silu_mul(gate_up: torch.Tensor  # [num_tokens, 2 * inter]
             ) -> torch.Tensor:  # [num_tokens, inter]
    num_tokens, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(num_tokens, inter, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(inter))
    if num_tokens:
        _silu_mul_kernel[(num_tokens, triton.cdiv(inter, block))](gate_up, out, inter, BLOCK=block)
    return out
