"""Automatic prefix caching: outputs with and without it are identical (fp32, greedy and seeded,
speculation, preemption, eviction under a tiny KV budget), cached blocks are never written,
hit counters and ``num_cached_tokens`` match a hand count, drafters' K/V in the shared blocks is
never stale, and methods whose proposer needs every prompt position turn it off."""
from __future__ import annotations

import pytest
import torch
from conftest import greedy
from test_spec_equivalence import drafting_methods, spec_configs

from draftwise import LLM, SamplingParams
from draftwise.cli import build_parser, engine_kwargs
from draftwise.paged.prefix_cache import PrefixCache, block_keys

BLOCK = 16
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 4  # K+V x layers x kv_heads x head_dim x fp32 (the tiny model)
SYSTEM = "You are a careful assistant. Answer briefly and check every step twice. " * 3
PROMPTS = [SYSTEM + q for q in ("Hello", "The quick brown fox", "def fibonacci(n):", "Hello",
                                "SELECT name FROM users", "Numbers: 0 1 2 3")]
PARAMS = [greedy(n, ignore_eos=True) for n in (20, 33, 12, 20, 40, 16)]


def _record_writes(paged) -> set[int]:
    """The block ids that ``paged``'s forwards write K/V into from now on (filled as they run)."""
    written, forward = set(), paged.forward

    def recording(batch, *args, **kwargs):
        for item in batch:
            written.update(item.block_ids[p // BLOCK] for p in range(item.start, item.start + len(item.token_ids)))
        return forward(batch, *args, **kwargs)
    paged.forward = recording
    return written


def _llm(model_dir, caching, **kwargs):
    return LLM(model=str(model_dir), dtype="float32", seed=0, enable_prefix_caching=caching, **kwargs)


def _outputs(outs):
    return [[(c.token_ids, c.text) for c in o.outputs] for o in outs]


def _twice(llm, prompts, params):
    """Every prompt alone (filling the cache), then all of them together."""
    first = [llm.generate(p, sp, use_tqdm=False)[0] for p, sp in zip(prompts, params)]
    return first, llm.generate(prompts, params, use_tqdm=False)


@pytest.fixture(scope="module")
def uncached(tiny_model_dir):
    return _twice(_llm(tiny_model_dir, False), PROMPTS, PARAMS)


def test_cached_outputs_equal_uncached(tiny_model_dir, uncached):
    llm = _llm(tiny_model_dir, None)  # the default: on
    assert llm.llm_engine.prefix_caching
    first, together = _twice(llm, PROMPTS, PARAMS)
    assert _outputs(first) == _outputs(uncached[0]) and _outputs(together) == _outputs(uncached[1])
    prompt_len = len(first[0].prompt_token_ids)
    assert first[0].num_cached_tokens == 0  # nothing cached yet
    shared = len(block_keys(llm.get_tokenizer()(SYSTEM).input_ids, BLOCK)) * BLOCK
    assert all(o.num_cached_tokens >= shared for o in first[1:])  # the system prompt's full blocks
    assert first[3].num_cached_tokens == (prompt_len - 1) // BLOCK * BLOCK  # "Hello" again
    assert all(o.num_cached_tokens % BLOCK == 0 for o in together)
    bm = llm.llm_engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks  # every block back, cached ones evictable


def test_hit_counters_match_a_hand_count(tiny_model_dir):
    llm = _llm(tiny_model_dir, True)
    bm = llm.llm_engine.block_manager
    out = llm.generate(PROMPTS[0], greedy(5), use_tqdm=False)[0]
    num_tokens = len(out.prompt_token_ids)
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (num_tokens, 0)
    llm.generate(PROMPTS[0], greedy(5), use_tqdm=False)
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (2 * num_tokens, (num_tokens - 1) // BLOCK * BLOCK)


def test_seeded_sampling_and_n_equal_uncached(tiny_model_dir):
    params = [SamplingParams(temperature=0.9, top_p=0.9, seed=7, n=2, max_tokens=24)] * 3
    results = [_twice(_llm(tiny_model_dir, caching), PROMPTS[:3], params) for caching in (False, True)]
    assert _outputs(results[0][0] + results[0][1]) == _outputs(results[1][0] + results[1][1])


def test_cached_blocks_are_never_written(tiny_model_dir):
    """Speculative rows, rollback and other sequences sharing the blocks leave their K/V as it was."""
    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    llm = _llm(tiny_model_dir, True, speculative_config=ngram)
    engine = llm.llm_engine
    llm.generate(PROMPTS[0], greedy(30, ignore_eos=True), use_tqdm=False)
    cache = engine.runner.paged.kv_cache  # [layers, 2, slots, kv_heads, head_dim]
    blocks = list(engine.block_manager.prefix_cache._key_of)
    slots = torch.tensor([b * BLOCK + i for b in blocks for i in range(BLOCK)])
    before = cache[:, :, slots].clone()
    written = _record_writes(engine.runner.paged)
    outs = llm.generate([PROMPTS[0], PROMPTS[0] + " again", PROMPTS[3]], greedy(40, ignore_eos=True),
                        use_tqdm=False)
    assert written and not written & set(blocks)
    assert all(o.num_cached_tokens > 0 for o in outs)
    assert engine.get_spec_decode_stats()["spec_decode_num_drafts"] > 0
    assert torch.equal(cache[:, :, slots], before)


def test_eviction_and_preemption_under_a_tiny_budget(tiny_model_dir, uncached):
    """Few blocks: cached blocks are evicted to make room and sequences get preempted, and the
    outputs stay those of an uncached engine with plenty of room."""
    llm = _llm(tiny_model_dir, True, kv_cache_memory_bytes=14 * BLOCK * KV_BYTES_PER_TOKEN)
    first, together = _twice(llm, PROMPTS, PARAMS)
    assert _outputs(first) == _outputs(uncached[0]) and _outputs(together) == _outputs(uncached[1])
    bm = llm.llm_engine.block_manager
    assert llm.llm_engine.scheduler.num_preemptions > 0
    assert 0 < bm.prefix_cache_hits and len(bm.prefix_cache) <= bm.num_blocks
    assert bm.num_free_blocks == bm.num_blocks


@pytest.mark.parametrize("method", ["eagle", "draft_model"])
def test_drafters_sharing_kv_under_eviction_and_preemption(method, tiny_model_dir, spec_dirs, uncached):
    """A drafter whose K/V lives in the shared blocks, with blocks evicted and sequences preempted
    (and their drafts rolled back) under a tiny budget: outputs stay those of plain decoding."""
    config = spec_configs(spec_dirs)[method]
    target_blocks = 1000 * BLOCK * KV_BYTES_PER_TOKEN  # 1000 blocks of the target's K/V alone
    probe = _llm(tiny_model_dir, True, speculative_config=config, kv_cache_memory_bytes=target_blocks)
    per_block = target_blocks // probe.llm_engine.block_manager.num_blocks  # target + drafter bytes
    llm = _llm(tiny_model_dir, True, speculative_config=config, kv_cache_memory_bytes=15 * per_block)
    first, together = _twice(llm, PROMPTS, PARAMS)
    assert _outputs(first) == _outputs(uncached[0]) and _outputs(together) == _outputs(uncached[1])
    engine = llm.llm_engine
    assert engine.scheduler.num_preemptions > 0 and engine.block_manager.prefix_cache_hits > 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.mark.parametrize("method", drafting_methods())
def test_every_method_with_caching_equals_plain(method, tiny_model_dir, spec_dirs, uncached):
    config = spec_configs(spec_dirs)[method]
    llm = _llm(tiny_model_dir, None, speculative_config=config)
    assert llm.llm_engine.prefix_caching == llm.llm_engine.speculator.needs.prefix_cacheable
    first, together = _twice(llm, PROMPTS, PARAMS)
    assert [o.outputs[0].token_ids for o in first + together] == \
        [o.outputs[0].token_ids for o in uncached[0] + uncached[1]]
    assert llm.llm_engine.prefix_caching == (llm.llm_engine.block_manager.prefix_cache_hits > 0)


def _drafter_kv_after_prefill(llm, token_ids) -> tuple[torch.Tensor, int]:
    """The drafter's K/V of every position it holds once ``token_ids`` has been prefilled (a
    prefill step and its proposal), and the prompt tokens found in the cache. The probe has room to
    draft, so the drafter ingests its prompt at once (rows of a sequence that drafts nothing wait)."""
    engine = llm.llm_engine
    engine.add_request("probe", {"prompt_token_ids": token_ids}, greedy(8))
    seq = engine.requests["probe"].seqs[0]
    for _ in range(3):
        if seq.spec.drafter_num_computed_tokens >= len(token_ids) - 1:
            break
        engine.step()
    assert seq.spec.drafter_num_computed_tokens >= len(token_ids) - 1
    positions = range(seq.spec.drafter_num_computed_tokens)
    slots = torch.tensor([seq.block_ids[p // BLOCK] * BLOCK + p % BLOCK for p in positions])
    kv = engine.speculator.proposer.kv_cache[:, :, slots].clone()  # [layers, 2, positions, heads, dim]
    while engine.has_unfinished_requests():
        engine.step()
    return kv, seq.num_cached_tokens


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp_one_layer", "dflash"])
def test_hidden_state_drafters_share_kv_that_is_never_stale(method, tiny_model_dir, spec_dirs, tmp_path_factory):
    """A hidden-state drafter's K/V read from cached blocks equals what an uncached engine computes
    at every position, also for a prompt that leaves the cached one at a block's first token (the
    EAGLE family's K/V at a block's last slot reads that token, so that block is not shared)."""
    import drafter_ckpts
    if method == "mtp_one_layer":
        model = drafter_ckpts.write_mtp_target(tmp_path_factory.mktemp("mtp1") / "m", tiny_model_dir, num_layers=1)
        config = {"method": "mtp", "model": str(model), "num_speculative_tokens": 2}
    else:
        config = spec_configs(spec_dirs)[method]
    results = {}
    for caching in (False, True):
        llm = _llm(tiny_model_dir, caching, speculative_config=config)
        ids = llm.get_tokenizer()(SYSTEM).input_ids[:45]
        other = ids[:32] + [next(t for t in ids if t != ids[32])] + ids[33:]  # leaves ``ids`` at token 32
        llm.generate({"prompt_token_ids": ids}, greedy(4), use_tqdm=False)
        results[caching] = [_drafter_kv_after_prefill(llm, p) for p in (ids, other)]
        assert llm.llm_engine.prefix_caching == caching
    next_token = llm.llm_engine.speculator.needs.kv_reads_next_token
    assert [hit for _, hit in results[True]] == [32, 16 if next_token else 32]
    for (cached, _), (uncached, _) in zip(results[True], results[False]):
        assert cached.shape == uncached.shape and torch.allclose(cached, uncached, atol=1e-5)


def test_prefix_cache_keeps_the_first_block_for_a_prefix():
    cache = PrefixCache()
    keys = block_keys(list(range(40)), BLOCK)
    assert len(keys) == 2 and block_keys(list(range(40)), BLOCK, keys[0], 1) == keys[1:]
    assert block_keys([5] * 16 + list(range(16)), BLOCK)[1] != keys[1]  # the parent is part of the key
    cache.insert(keys[0], 3)
    cache.insert(keys[0], 4)  # a second block with the same prefix stays private
    cache.insert(keys[1], 5)
    assert cache.lookup(keys) == [3, 5] and cache.lookup(keys[1:]) == [5]
    cache.evict(3)
    assert cache.lookup(keys) == [] and len(cache) == 1


def test_flags_and_validation():
    parse = lambda *argv: engine_kwargs(build_parser().parse_args(["serve", "m", *argv]))  # noqa: E731
    assert parse()["enable_prefix_caching"] is None
    assert parse("--enable-prefix-caching")["enable_prefix_caching"] is True
    assert parse("--no-enable-prefix-caching")["enable_prefix_caching"] is False
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        LLM(model="unused", enable_prefix_caching="yes")


def test_a_draft_model_shares_its_kv_with_the_cached_blocks(tiny_model_dir, spec_dirs):
    """``draft_model`` keeps K/V in the same blocks: they are shared too (its drafter skips the
    cached positions), stay unwritten, and the drafts accepted equal those of an uncached engine."""
    config = spec_configs(spec_dirs)["draft_model"]
    results = {}
    for caching in (False, True):
        llm = _llm(tiny_model_dir, caching, speculative_config=config)
        first = llm.generate(PROMPTS[0], greedy(30, ignore_eos=True), use_tqdm=False)[0]
        engine = llm.llm_engine
        drafter = engine.speculator.proposer.paged.kv_cache  # [layers, 2, slots, kv_heads, head_dim]
        blocks = list(engine.block_manager.prefix_cache._key_of) if caching else []
        slots = torch.tensor([b * BLOCK + i for b in blocks for i in range(BLOCK)], dtype=torch.int64)
        before = drafter[:, :, slots].clone()
        writes = [_record_writes(engine.speculator.proposer.paged), _record_writes(engine.runner.paged)]
        outs = llm.generate([PROMPTS[0], PROMPTS[3]], greedy(30, ignore_eos=True), use_tqdm=False)
        assert torch.equal(drafter[:, :, slots], before) and not set().union(*writes) & set(blocks)
        assert all(writes)  # both models ran
        results[caching] = ([o.outputs[0].token_ids for o in [first, *outs]], [o.num_cached_tokens for o in outs],
                            engine.get_spec_decode_stats()["spec_decode_num_accepted_tokens"])
    assert results[True][0] == results[False][0]
    assert min(results[True][1]) > 0 and results[False][1] == [0, 0]
    assert results[True][2] == results[False][2]
