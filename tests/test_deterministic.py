"""Deterministic by default: on the bundled SmolLM2 (its Q4_1 file, the default path) a request's
tokens equal those of the same request alone on a fresh engine, whatever ran before or beside it:
after prefix-cache hits, in one batch with other prompts, with chunked prefill at several token
budgets, preempted and resumed, and with every drafting method that ships for it (ngram, suffix,
the EAGLE-3 head, a token tree, suffix mixed into EAGLE-3), greedy and seeded-sampled, in the
model's dtype and in fp32. A failing case names its schedule."""
from __future__ import annotations

import gc

import pytest

from draftwise import LLM, SamplingParams
from draftwise.bench.workloads import load_workload
from draftwise.layers import native

pytestmark = pytest.mark.skipif(not native.load(), reason="no C++ compiler: the CPU kernels are not built here")
EAGLE3 = {"method": "eagle3", "model": "draftwise/SmolLM2-135M-Instruct-eagle3", "num_speculative_tokens": 3}
TREE = "[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"
SCHEDULES = {  # name -> (engine arguments, what the engine runs first)
    "prefix-cache hits": ({}, "chats"),
    "one batch": ({}, "batch"),
    "chunked prefill 64": ({"max_num_batched_tokens": 64}, None),
    "chunked prefill 200": ({"max_num_batched_tokens": 200, "max_num_seqs": 3}, "batch"),
    "preempted": ({"kv_cache_memory_bytes": 12 * 2 ** 20}, "batch"),
    "ngram": ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}}, "chats"),
    "suffix": ({"speculative_config": {"method": "suffix"}}, "batch"),
    "eagle3": ({"speculative_config": EAGLE3}, "chats"),
    "eagle3 tree": ({"speculative_config": {"method": "eagle3", "model": EAGLE3["model"],
                                            "speculative_token_tree": TREE}}, "batch"),
    "eagle3 + suffix": ({"speculative_config": {**EAGLE3, "enable_suffix_decoding": True}}, "batch"),
}


@pytest.fixture(scope="module")
def prompts():
    return [p.messages for p in load_workload("code-edit", 2)], [p.messages for p in load_workload("chat", 3)]


def _tokens(llm: LLM, chats: list, params: SamplingParams) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.chat(chats, params, use_tqdm=False)]


def _check(dtype: str, prompts, params: SamplingParams, names: list[str]) -> None:
    edits, chats = prompts
    reference = [_tokens(LLM(dtype=dtype), [edit], params)[0] for edit in edits]
    for name in names:
        engine_args, before = SCHEDULES[name]
        llm = LLM(dtype=dtype, **engine_args)
        if before == "chats":
            _tokens(llm, chats, params)
            got = [_tokens(llm, [edit], params)[0] for edit in edits]
        elif before == "batch":
            got = _tokens(llm, chats[:1] + edits + chats[1:], params)[1:1 + len(edits)]
        else:
            got = [_tokens(llm, [edit], params)[0] for edit in edits]
        assert got == reference, f"{name} ({dtype}, temperature {params.temperature}): tokens differ from alone"
        del llm
        gc.collect()


def test_greedy_tokens_do_not_depend_on_the_schedule(prompts):
    _check("auto", prompts, SamplingParams(temperature=0, max_tokens=40), list(SCHEDULES))


def test_seeded_sampling_does_not_depend_on_the_schedule(prompts):
    params = SamplingParams(temperature=0.8, seed=7, max_tokens=32)
    _check("auto", prompts, params, ["one batch", "chunked prefill 64", "eagle3"])


def test_fp32_tokens_do_not_depend_on_the_schedule(prompts):
    _check("float32", prompts, SamplingParams(temperature=0, max_tokens=32),
           ["prefix-cache hits", "chunked prefill 200"])
