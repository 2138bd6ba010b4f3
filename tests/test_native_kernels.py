"""draftwise's C++ CPU kernels (``kernels/csrc/``: attention, RMSNorm) compute
what torch computes. The paged attention kernel: ragged decode and verify batches over scattered blocks, GQA, sliding
windows, bf16 and fp32, and an engine running it decodes exactly as one running SDPA (fp32).
The RMSNorm kernel: equal to ``F.rms_norm`` within fp32 rounding; training keeps torch's op."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import PROMPTS, greedy

from draftwise import LLM
from draftwise.kernels import native
from draftwise.layers.common import RMSNorm
from draftwise.layers.attention import build_metadata, for_kernel, paged_attention, with_paged_kernel

pytestmark = pytest.mark.skipif(not native.load(), reason="no C++ compiler: the kernel is not built here")
BLOCK_SIZE, NUM_BLOCKS, HEADS, KV_HEADS, HEAD_DIM = 16, 160, 6, 2, 32


def _attend(query_lens, context_lens, dtype, window=None, sliding=False, seed=0, head_dim=HEAD_DIM):
    """(kernel output, torch output) for one layer: the same K/V cache, queries and block tables."""
    gen = torch.Generator().manual_seed(seed)
    tables = torch.randperm(NUM_BLOCKS, generator=gen)
    width = -(-max(context_lens) // BLOCK_SIZE)
    table = tables[:len(context_lens) * width].view(len(context_lens), width)
    meta = build_metadata(table, query_lens, context_lens, BLOCK_SIZE, window, torch.device("cpu"))
    num_tokens = sum(query_lens)
    q, k, v = (torch.randn(num_tokens, h, head_dim, generator=gen).to(dtype) for h in (HEADS, KV_HEADS, KV_HEADS))
    cache = torch.randn(2, NUM_BLOCKS * BLOCK_SIZE, KV_HEADS, head_dim, generator=gen).to(dtype)
    outputs = []
    for run_meta in (with_paged_kernel(meta), dataclasses.replace(meta, compute_dtype=torch.float32)):
        outputs.append(paged_attention(q, k, v, cache.clone(), run_meta, head_dim ** -0.5, sliding).float())
    assert with_paged_kernel(meta).cu_query_lens is not None
    return outputs


@pytest.mark.parametrize("query_lens, context_lens", [
    ([1], [1]), ([1], [37]), ([1, 1, 1], [5, 80, 33]),  # decodes
    ([4], [50]), ([6, 6], [6, 70]), ([1, 5, 3], [17, 40, 3]),  # verify rows, ragged
    ([13, 24], [150, 24]), ([64, 1], [200, 9]),  # long drafts, a short prompt chunk
])
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_kernel_matches_torch(query_lens, context_lens, dtype, atol):
    kernel, reference = _attend(query_lens, context_lens, dtype)
    torch.testing.assert_close(kernel, reference, atol=atol, rtol=0)


@pytest.mark.parametrize("head_dim", [64, 128, 48])  # the kernel's fixed-dim builds and its generic one
@pytest.mark.parametrize("query_lens, context_lens", [([1, 1], [300, 129]), ([5, 2, 1], [700, 256, 128])])
def test_long_contexts_split_into_chunks_merge_exactly(query_lens, context_lens, head_dim):
    """Contexts of several 128-key chunks (the kernel splits them and merges each row's chunks)."""
    kernel, reference = _attend(query_lens, context_lens, torch.float32, seed=5, head_dim=head_dim)
    torch.testing.assert_close(kernel, reference, atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 48])
def test_a_row_does_not_depend_on_the_rows_after_it(dtype, head_dim):
    """Position p's output, bit for bit, whether p is decoded alone or verified with 1-5 draft rows
    after it (its chunk then holds more keys): speculation must not change what plain decoding
    computes. Contexts put p at every offset within a 16-key vector and across a chunk's end."""
    gen = torch.Generator().manual_seed(3)
    table = torch.randperm(NUM_BLOCKS, generator=gen)[:40].view(1, 40)
    cache = torch.randn(2, NUM_BLOCKS * BLOCK_SIZE, KV_HEADS, head_dim, generator=gen).to(dtype)
    for position in [5, 96, 100, 101, 102, 110, 126, 127, 130, 300]:
        q = torch.randn(6, HEADS, head_dim, generator=gen).to(dtype)
        k, v = (torch.randn(6, KV_HEADS, head_dim, generator=gen).to(dtype) for _ in range(2))
        alone = None
        for num_rows in range(1, 7):
            meta = with_paged_kernel(build_metadata(table, [num_rows], [position + num_rows], BLOCK_SIZE, None,
                                                    torch.device("cpu")))
            out = paged_attention(q[:num_rows], k[:num_rows], v[:num_rows], cache.clone(), meta, head_dim ** -0.5,
                                  False)
            if alone is None:
                alone = out[0]
            assert torch.equal(out[0], alone), (position, num_rows)


@pytest.mark.parametrize("sliding", [True, False])
def test_a_window_across_chunks_hides_the_early_chunks(sliding):
    """Queries whose window starts in a later chunk than the first visible key of the sequence."""
    kernel, reference = _attend([6, 1], [400, 300], torch.float32, window=133, sliding=sliding, seed=7)
    torch.testing.assert_close(kernel, reference, atol=1e-5, rtol=0)


@pytest.mark.parametrize("sliding", [True, False])
def test_kernel_honours_the_sliding_window_only_on_sliding_layers(sliding):
    kernel, reference = _attend([3, 1], [60, 45], torch.float32, window=20, sliding=sliding, seed=3)
    torch.testing.assert_close(kernel, reference, atol=1e-5, rtol=0)


def test_one_kernel_attends_the_whole_batch():
    """Decodes, verify rows and a prompt chunk in one batch: the plan's kernel for all of them."""
    table = torch.arange(24).view(3, 8)
    meta = build_metadata(table, [1, 3, 70], [40, 60, 120], BLOCK_SIZE, None, torch.device("cpu"))
    assert for_kernel(meta, "paged").cu_query_lens is not None
    assert for_kernel(meta, "fp32").compute_dtype == torch.float32 and for_kernel(meta, "fp32").cu_query_lens is None
    assert for_kernel(meta, "native").compute_dtype is None and for_kernel(meta, "native").cu_query_lens is None


def test_prompts_run_the_kernel_and_non_causal_queries_keep_the_torch_path():
    table = torch.arange(8).view(1, 8)
    prompt = build_metadata(table, [120], [120], BLOCK_SIZE, None, torch.device("cpu"))
    dflash = build_metadata(table, [4], [40], BLOCK_SIZE, None, torch.device("cpu"), causal=False)
    assert with_paged_kernel(prompt).cu_query_lens is not None and with_paged_kernel(dflash).cu_query_lens is None


def test_engine_on_the_kernel_decodes_as_on_sdpa(tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, device="cpu")
    model = llm.llm_engine.runner.model
    params = [greedy(n) for n in (12, 20, 8, 16, 10, 14, 6, 18)]
    outputs = {}
    for kernel in ("native", "paged"):
        model.set_attention_plan({1: kernel, 16: "native"})
        outputs[kernel] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    assert outputs["paged"] == outputs["native"]


@pytest.mark.parametrize("shape", [(1, 64), (7, 576), (3, 2, 40)])
def test_rms_norm_matches_torch(shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1)) * 3
    norm = RMSNorm(shape[-1], 1e-5)
    norm.weight.data = torch.rand(shape[-1]) + 0.5
    reference = torch.nn.functional.rms_norm(x, (shape[-1],), norm.weight, 1e-5)
    torch.testing.assert_close(torch.ops.draftwise_cpu.rms_norm(x, norm.weight, 1e-5), reference, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(norm(x.bfloat16()), torch.nn.functional.rms_norm(x.bfloat16().float(), (shape[-1],),
                                                                               norm.weight, 1e-5), atol=1e-6, rtol=1e-5)


def test_rms_norm_keeps_autograd():
    norm = RMSNorm(16, 1e-6)
    norm.weight.requires_grad_(True)
    norm(torch.randn(2, 16)).sum().backward()  # training runs torch's op, which has a gradient
    assert norm.weight.grad is not None
