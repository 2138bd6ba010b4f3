"""One arithmetic per row: the paged CPU kernel gives a query row the same output, bit for bit,
whatever it is computed with: alone (decode), as one of a few verify rows, inside a long prompt
(the kernel's row-block path), in a prefill chunk after cached blocks, or beside other sequences.
Positions sit at every offset within a 16-key group and across 128-key chunks; fp32 and bf16;
the fixed head dims and the generic one; with and without a sliding window; two and three KV
heads (short queries are computed by units of several KV heads, halved to keep both threads busy)."""
from __future__ import annotations

import pytest
import torch

from draftwise.kernels import native
from draftwise.layers.attention import build_metadata, paged_attention, with_paged_kernel

pytestmark = pytest.mark.skipif(not native.load(), reason="no C++ compiler: the kernel is not built here")
BLOCK_SIZE, GROUP, CONTEXT = 16, 2, 300  # GROUP: query heads per KV head
POSITIONS = [0, 5, 15, 16, 100, 127, 128, 129, 200, 255, 256, 299]


def _run(cache, table, q, query_lens, context_lens, window, head_dim):
    """The kernel's output [num_tokens, heads * head_dim] for a batch of sequences."""
    meta = with_paged_kernel(build_metadata(table, query_lens, context_lens, BLOCK_SIZE, window,
                                            torch.device("cpu")))
    assert meta.cu_query_lens is not None
    slots = meta.slot_mapping
    kv = cache.clone()
    k, v = kv[0, slots].clone(), kv[1, slots].clone()  # rewrite the cache's own K/V: nothing changes
    return paged_attention(q, k, v, kv, meta, head_dim ** -0.5, window is not None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128, 48])
@pytest.mark.parametrize("window", [None, 70])
@pytest.mark.parametrize("kv_heads", [2, 3])
def test_a_row_computes_alike_under_every_schedule(dtype, head_dim, window, kv_heads):
    gen = torch.Generator().manual_seed(head_dim)
    num_blocks = 2 * -(-CONTEXT // BLOCK_SIZE)
    tables = torch.randperm(num_blocks, generator=gen).view(2, -1)
    cache = torch.randn(2, num_blocks * BLOCK_SIZE, kv_heads, head_dim, generator=gen).to(dtype)
    q = torch.randn(CONTEXT, GROUP * kv_heads, head_dim, generator=gen).to(dtype)
    prompt = _run(cache, tables[:1], q, [CONTEXT], [CONTEXT], window, head_dim)  # the whole prompt at once
    for pos in POSITIONS:
        decode = _run(cache, tables[:1], q[pos:pos + 1], [1], [pos + 1], window, head_dim)
        assert torch.equal(decode[0], prompt[pos]), ("decode", pos)
        rows = min(5, CONTEXT - pos)  # pos is the first of a few verify rows
        verify = _run(cache, tables[:1], q[pos:pos + rows], [rows], [pos + rows], window, head_dim)
        assert torch.equal(verify, prompt[pos:pos + rows]), ("verify", pos)
    for start in (0, 16, 40, 128, 250):  # a prefill chunk after `start` cached tokens, after a decode
        other = q[:1]
        chunk = _run(cache, tables.flip(0), torch.cat((other, q[start:])), [1, CONTEXT - start], [77, CONTEXT], window,
                     head_dim)
        assert torch.equal(chunk[1:], prompt[start:]), ("chunk", start)
