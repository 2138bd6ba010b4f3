"""Prefix caching with a drafter that keeps K/V in the blocks and may compute a sequence's positions
later than the target (``paged/block_manager.py``): a block is shared for the target as soon as the
target computed it and for the drafter once the drafter did. A sequence that finds blocks without
the drafter's K/V recomputes a short hole and drafts, or takes a long hole for the target alone and
decodes plainly; outputs stay those of plain decoding (fp32, greedy) either way."""
from __future__ import annotations

import pytest
from conftest import greedy
from test_spec_equivalence import spec_configs

from draftwise import LLM
from draftwise.paged.block_manager import DRAFTER_RECOMPUTE_TOKENS

BLOCK = 16
TEXT = "You are a careful assistant. Answer briefly and check every step twice. " * 6


def _llm(model_dir, **kwargs):
    return LLM(model=str(model_dir), dtype="float32", seed=0, **kwargs)


class Probe:
    """Runs one request at a time on a speculative engine and reports what it found in the cache."""

    def __init__(self, llm):
        self.llm = llm
        self.engine = llm.llm_engine
        self.bm = self.engine.block_manager

    def run(self, token_ids: list[int], max_tokens: int) -> tuple[list[int], int, int]:
        """(output token ids, prompt tokens found in the cache, drafts verified for it)."""
        before = self.engine.get_spec_decode_stats()["spec_decode_num_drafts"]
        out = self.llm.generate({"prompt_token_ids": token_ids}, greedy(max_tokens, ignore_eos=True),
                                use_tqdm=False)[0]
        drafts = self.engine.get_spec_decode_stats()["spec_decode_num_drafts"] - before
        return out.outputs[0].token_ids, out.num_cached_tokens, drafts

    def cached_blocks(self) -> list[int]:
        return list(self.bm.prefix_cache._key_of)

    def ready(self, blocks: list[int]) -> list[bool]:
        return [bool(self.bm.drafter_ready[b]) for b in blocks]


@pytest.fixture(scope="module")
def prompts(tiny_model_dir):
    ids = LLM(model=str(tiny_model_dir), dtype="float32").get_tokenizer()(TEXT).input_ids
    long_a, long_b = ids[:120], ids[1:121]  # 7 full blocks: a hole longer than the recompute bound
    short = ids[2:42]  # 2 full blocks: a hole the sequence recomputes
    assert (len(long_a) - 1) // BLOCK * BLOCK > DRAFTER_RECOMPUTE_TOKENS >= (len(short) - 1) // BLOCK * BLOCK
    return long_a, long_b, short


@pytest.fixture(scope="module")
def plain(tiny_model_dir, prompts):
    llm = _llm(tiny_model_dir, enable_prefix_caching=False)
    return [llm.generate({"prompt_token_ids": p}, greedy(24, ignore_eos=True), use_tqdm=False)[0]
            .outputs[0].token_ids for p in prompts]


@pytest.mark.parametrize("method", ["eagle", "draft_model"])
def test_a_long_hole_is_shared_for_the_target_and_the_sequence_decodes_plainly(
        method, tiny_model_dir, spec_dirs, prompts, plain):
    probe = Probe(_llm(tiny_model_dir, speculative_config=spec_configs(spec_dirs)[method]))
    long_a = prompts[0]
    _, cached, drafts = probe.run(long_a, 1)  # prefill only: the drafter never runs on it
    assert cached == 0 and drafts == 0
    blocks = probe.cached_blocks()
    assert len(blocks) == len(long_a) // BLOCK and not any(probe.ready(blocks))  # published for the target
    tokens, cached, drafts = probe.run(long_a, 24)
    assert cached == (len(long_a) - 1) // BLOCK * BLOCK  # the whole hole, for the target
    assert drafts == 0 and tokens == plain[0]  # no drafter K/V to draft from: plain decoding


@pytest.mark.parametrize("method", ["eagle", "eagle3", "draft_model"])
def test_blocks_the_drafter_computed_are_shared_for_both(method, tiny_model_dir, spec_dirs, prompts, plain):
    probe = Probe(_llm(tiny_model_dir, speculative_config=spec_configs(spec_dirs)[method]))
    long_b = prompts[1]
    tokens, cached, drafts = probe.run(long_b, 24)  # it drafts: the drafter computes its prompt
    assert cached == 0 and drafts > 0 and tokens == plain[1]
    assert all(probe.ready(probe.cached_blocks()))
    tokens, cached, drafts = probe.run(long_b, 24)
    assert cached == (len(long_b) - 1) // BLOCK * BLOCK and drafts > 0 and tokens == plain[1]


@pytest.mark.parametrize("method", ["eagle", "draft_model"])
def test_a_short_hole_is_recomputed_and_its_drafter_ready_copy_replaces_it(
        method, tiny_model_dir, spec_dirs, prompts, plain):
    probe = Probe(_llm(tiny_model_dir, speculative_config=spec_configs(spec_dirs)[method]))
    short = prompts[2]
    probe.run(short, 1)  # target-only blocks
    target_only = probe.cached_blocks()
    tokens, cached, drafts = probe.run(short, 24)
    assert cached == 0 and drafts > 0 and tokens == plain[2]  # the hole recomputed: it drafts
    assert not set(probe.cached_blocks()) & set(target_only)  # its drafter-ready blocks took their place
    tokens, cached, drafts = probe.run(short, 24)
    assert cached == (len(short) - 1) // BLOCK * BLOCK and drafts > 0 and tokens == plain[2]
