"""The start-up self-check of the Triton kernels: each runs once on small random inputs of the model's
dtype on the device and is compared with its torch reference (the torch layers' own ops, in fp32).
Returns an error message, or "" when every kernel builds and matches."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..common import apply_rope
from ..static_attention import static_attend
from .elementwise import add_rms_norm, rope_and_cache, silu_mul
from .static_attention import static_paged_attention

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 4, 2, 64, 16


def check_kernels(device: torch.device, dtype: torch.dtype) -> str:
    gen = torch.Generator().manual_seed(0)
    tol = 1e-4 if dtype == torch.float32 else 2e-2

    def rand(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen).to(device, dt)

    def differs(name: str, got: torch.Tensor, want: torch.Tensor) -> str:
        err = (got.float() - want.float()).abs().max().item()
        return "" if err <= tol * max(1.0, want.float().abs().max().item()) else f"{name} off by {err:.3g}"

    x, delta, weight = rand(3, 96, dt=torch.float32), rand(3, 96), rand(96, dt=torch.float32)
    residual, normed = add_rms_norm(x, delta, weight, 1e-6, dtype)
    want = F.rms_norm(x + delta.float(), (96,), weight, 1e-6)
    problems = [differs("add_rms_norm residual", residual, x + delta.float()), differs("add_rms_norm", normed, want)]
    gate_up = rand(3, 2 * 80)
    problems.append(differs("silu_mul", silu_mul(gate_up), F.silu(gate_up[:, :80].float()) * gate_up[:, 80:].float()))
    problems += _check_attention(device, dtype, rand, differs)
    return "; ".join(p for p in problems if p)


def _check_attention(device, dtype, rand, differs) -> list[str]:
    num_seqs, query_len = 2, 3
    num_tokens = num_seqs * query_len
    qkv = rand(num_tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM)
    cos, sin = rand(64, HEAD_DIM), rand(64, HEAD_DIM)
    table = torch.tensor([[5, 2, 7, 0], [1, 3, 0, 0]], device=device)
    context_lens = torch.tensor([40, 20], device=device)
    positions = torch.cat([torch.arange(n - query_len, n) for n in (40, 20)]).to(device)
    slots = table.gather(1, (positions // BLOCK_SIZE).view(num_seqs, query_len)).flatten() * BLOCK_SIZE \
        + positions % BLOCK_SIZE
    cache = rand(2, 8 * BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    expected_cache = cache.clone()
    q = rope_and_cache(qkv, cos, sin, positions, cache, slots, HEADS, KV_HEADS, HEAD_DIM)
    heads = qkv.view(num_tokens, -1, HEAD_DIM)
    rotated = apply_rope(heads[:, :HEADS + KV_HEADS].float(), cos[positions, None].float(), sin[positions, None].float())
    expected_cache[0, slots] = rotated[:, HEADS:].to(dtype)
    expected_cache[1, slots] = heads[:, HEADS + KV_HEADS:]
    problems = [differs("rope_and_cache q", q, rotated[:, :HEADS]), differs("rope_and_cache cache", cache,
                                                                             expected_cache)]
    for window in (None, 9):
        got = static_paged_attention(q, cache, table, context_lens, BLOCK_SIZE, 0.125, window)
        want = static_attend(q.float(), cache.float(), table, context_lens, BLOCK_SIZE, 0.125, window, None)
        problems.append(differs(f"static_paged_attention (window {window})", got, want))
    return problems
