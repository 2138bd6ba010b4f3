"""The fixed-shape step that CUDA graphs capture (``compilation/static_step.py``), run eagerly on CPU:
its attention equals the ragged path's, and an engine whose uniform batches take it emits the
same greedy tokens as the ragged forward (padded buckets, verify rows of several drafts, batches
past the largest bucket). On a GPU the same engines capture it; ``test_cuda_graphs`` checks that."""
from __future__ import annotations

import pytest
import torch
from conftest import PROMPTS, greedy

from draftwise import LLM
from draftwise.compilation import CompilationConfig
from draftwise.engine.compile_target import attach_static_step
from draftwise.layers.attention import build_metadata, paged_attention
from draftwise.layers.static_attention import static_attend

MAX_TOKENS = [12, 20, 8, 16, 10, 14, 6, 18]


def _tokens(llm: LLM, prompts=PROMPTS) -> list[list[int]]:
    params = [greedy(n) for n in MAX_TOKENS[:len(prompts)]]
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.mark.parametrize("query_len,window", [(1, None), (4, None), (3, 5)])
def test_static_attention_equals_the_ragged_path(query_len, window):
    torch.manual_seed(0)
    block_size, num_heads, num_kv_heads, head_dim = 4, 6, 2, 8
    context_lens = [9, 3 + query_len, 14]
    kv_cache = torch.randn(2, 64 * block_size, num_kv_heads, head_dim)
    blocks = torch.randperm(64)[:12].view(3, 4)  # each sequence's blocks, scattered
    q = torch.randn(3 * query_len, num_heads, head_dim)
    k, v = torch.randn(2, 3 * query_len, num_kv_heads, head_dim)
    meta = build_metadata(blocks, [query_len] * 3, context_lens, block_size, window, torch.device("cpu"))
    expected = paged_attention(q, k, v, kv_cache.clone(), meta, 0.3, sliding=window is not None)
    paged_attention(q, k, v, kv_cache, meta, 0.3, sliding=False)  # writes this step's K/V
    table = torch.cat((blocks, torch.zeros(3, 4, dtype=torch.int64)), dim=1)  # 8 blocks: past the contexts
    got = static_attend(q, kv_cache, table, torch.tensor(context_lens), block_size, 0.3, window, None)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def _static_llm(model_dir, sizes, **kwargs) -> LLM:
    llm = LLM(model=str(model_dir), dtype="float32", seed=0, **kwargs)
    engine = llm.llm_engine
    k = engine.speculator.num_spec_tokens if engine.speculator else 0
    step = attach_static_step(engine.runner.paged, engine.block_manager.num_blocks, sizes, 1 + k, engine.max_model_len,
                              capture=False)
    assert step is not None and engine.runner.paged.static_step is step
    return llm


def test_uniform_batches_on_the_static_step_give_the_ragged_tokens(tiny_model_dir, tiny_llm):
    expected = _tokens(tiny_llm)
    llm = _static_llm(tiny_model_dir, [1, 2, 4])  # 8 prompts: batches past 4 sequences run ragged
    assert _tokens(llm) == expected
    step = llm.llm_engine.runner.paged.static_step
    buckets = set(step._entries)
    assert {b.num_seqs for b in buckets} >= {1, 2, 4} and {b.query_len for b in buckets} == {1}
    alone = [llm.generate([p], greedy(n), use_tqdm=False)[0].outputs[0].token_ids
             for p, n in zip(PROMPTS[:3], MAX_TOKENS)]  # one sequence: bucket 1
    assert alone == expected[:3]
    engine = llm.llm_engine  # padding rows wrote to the spare block past the manager's: every block is free
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks == step.pad_block
    assert engine.runner.paged.kv_cache.shape[2] == (step.pad_block + 1) * engine.block_manager.block_size


def test_verify_rows_on_the_static_step_give_the_plain_tokens(tiny_model_dir, tiny_llm):
    expected = _tokens(tiny_llm, PROMPTS[:3])
    spec = {"method": "draft_model", "model": str(tiny_model_dir), "num_speculative_tokens": 3}  # all accepted
    llm = _static_llm(tiny_model_dir, [1, 2, 4, 8, 16], speculative_config=spec)
    assert _tokens(llm, PROMPTS[:3]) == expected
    assert any(b.query_len > 1 for b in llm.llm_engine.runner.paged.static_step._entries)


def test_graph_keys_of_compilation_config():
    config = CompilationConfig.from_value({"cudagraph_capture_sizes": [1, 2, 8, 64], "max_cudagraph_capture_size": 8})
    assert config.capture_sizes(512) == [1, 2, 8] and config.captures_cuda_graphs(enforce_eager=False)
    assert CompilationConfig().capture_sizes(16) == [1, 2, 4, 8, 16]
    assert not CompilationConfig.from_value({"cudagraph_mode": "NONE"}).captures_cuda_graphs(False)
    assert not CompilationConfig().captures_cuda_graphs(enforce_eager=True)


def test_only_gpu_engines_capture(tiny_llm):
    engine = tiny_llm.llm_engine
    assert (engine.runner.paged.static_step is not None) == (engine.device.type == "cuda")
