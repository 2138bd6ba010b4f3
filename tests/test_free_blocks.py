"""Free KV blocks are handed out so that resident memory follows the work (``paged/free_blocks.py``):
blocks holding nothing findable are reused first, most recently freed first; then blocks never
used; then cached blocks, least recently freed first. An engine serving one request after another
touches no new block once its first requests ran, speculating or not; with prefix caching it
touches new blocks only for what the cache keeps."""
from __future__ import annotations

import pytest
from conftest import greedy
from test_spec_equivalence import spec_configs

from draftwise import LLM
from draftwise.paged.free_blocks import FreeBlocks


def test_the_order_is_reusable_then_never_used_then_cached_lru():
    free = FreeBlocks(6)
    assert len(free) == 6 and [free.pop() for _ in range(3)] == [0, 1, 2] and free.num_touched == 3
    free.push(0, cached=True)
    free.push(1, cached=False)
    free.push(2, cached=True)
    assert len(free) == 6
    assert free.pop() == 1  # holds nothing findable: reused before touching a new block
    assert [free.pop() for _ in range(3)] == [3, 4, 5] and free.num_touched == 6
    assert free.pop() == 0 and free.pop() == 2 and len(free) == 0  # then the cached ones, oldest first


def test_recently_freed_blocks_come_back_first_and_a_hit_takes_a_cached_block():
    free = FreeBlocks(4)
    ids = [free.pop() for _ in range(4)]
    for block_id in ids[:3]:
        free.push(block_id, cached=False)
    free.push(ids[3], cached=True)
    free.take(ids[3])  # a prefix hit claims it: no longer free
    assert len(free) == 3 and [free.pop() for _ in range(3)] == [2, 1, 0]
    with pytest.raises(KeyError):
        free.take(ids[3])


def test_a_cached_block_replaced_in_the_cache_is_reused_first():
    free = FreeBlocks(3)
    ids = [free.pop() for _ in range(2)]
    free.push(ids[0], cached=True)
    free.push(ids[1], cached=True)
    free.forget(ids[1])  # the prefix cache took another block for its prefix
    assert len(free) == 3 and free.pop() == ids[1] and free.pop() == 2 and free.pop() == ids[0]


def _serve_one_by_one(llm: LLM, prompts: list[str]) -> list[int]:
    """Blocks touched after each request, the requests run one at a time."""
    touched = []
    for prompt in prompts:
        llm.generate(prompt, greedy(24, ignore_eos=True), use_tqdm=False)
        touched.append(llm.llm_engine.block_manager.free_blocks.num_touched)
    return touched


@pytest.mark.parametrize("method", [None, "ngram"])
def test_one_request_after_another_touches_no_new_block(tiny_model_dir, spec_dirs, method):
    spec = spec_configs(spec_dirs)[method] if method else None
    llm = LLM(model=str(tiny_model_dir), dtype="float32", enable_prefix_caching=False, speculative_config=spec)
    prompts = [f"Request {i}: " + "the same words again and again " * 4 for i in range(10)]
    touched = _serve_one_by_one(llm, prompts)
    bm = llm.llm_engine.block_manager
    assert touched[1:] == [touched[0]] * (len(prompts) - 1), touched
    assert touched[0] < bm.num_blocks and bm.num_free_blocks == bm.num_blocks
    if method:  # drafts were verified, so blocks past the accepted ones were trimmed and reused
        assert llm.get_spec_decode_stats()["spec_decode_num_draft_tokens"] > 0


def test_with_prefix_caching_new_blocks_are_only_what_the_cache_keeps(tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", enable_prefix_caching=True)
    bm = llm.llm_engine.block_manager
    prompts = [f"Question {i} of many, asked in full words each time: " * 3 for i in range(8)]
    _serve_one_by_one(llm, prompts[:1])
    touched, cached = bm.free_blocks.num_touched, len(bm.prefix_cache)
    _serve_one_by_one(llm, prompts[1:])
    assert 0 < bm.free_blocks.num_touched - touched <= len(bm.prefix_cache) - cached
