"""Deterministic by default: on the bundled SmolLM2 (its Q4_1 file, the default path) a request's
tokens equal those of the same request alone on a fresh engine, whatever ran before or beside it:
after prefix-cache hits, in one batch with other prompts, with chunked prefill at several token
budgets, preempted and resumed, and with every drafting method that ships for it (ngram, suffix,
the EAGLE-3 head, a token tree, suffix mixed into EAGLE-3), greedy and seeded-sampled, in the
model's dtype and in fp32; and through ``draftwise serve`` with 8 concurrent streams. The claim is the CPU
path's (``docs/design.md``), so every engine here runs on the CPU, also where a GPU is present. Each engine runs the other chats first (prefix hits), then the edits
alone, then the edits inside a batch; a failing case names its schedule."""
from __future__ import annotations

import asyncio
import gc
import json

import openai
import pytest
from conftest import API_KEY, SERVED_NAME, start_server, stop_server

from draftwise import LLM, SamplingParams
from draftwise.bench.workloads import load_workload
from draftwise.kernels import native

pytestmark = pytest.mark.skipif(not native.load(), reason="no C++ compiler: the CPU kernels are not built here")
EAGLE3 = {"method": "eagle3", "model": "draftwise/SmolLM2-135M-Instruct-eagle3"}
TREE = "[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"
SCHEDULES = {  # name -> engine arguments
    "plain": {},
    "chunked prefill 64": {"max_num_batched_tokens": 64},
    "chunked prefill 200, 3 sequences": {"max_num_batched_tokens": 200, "max_num_seqs": 3},
    "preempted": {"kv_cache_memory_bytes": 12 * 2 ** 20},  # one edit fits, two do not
    "ngram": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}},
    "suffix": {"speculative_config": {"method": "suffix"}},
    "eagle3": {"speculative_config": {**EAGLE3, "num_speculative_tokens": 3}},
    "eagle3 tree": {"speculative_config": {**EAGLE3, "speculative_token_tree": TREE}},
    "eagle3 + suffix": {"speculative_config": {**EAGLE3, "num_speculative_tokens": 3,
                                               "enable_suffix_decoding": True}},
}


@pytest.fixture(scope="module")
def prompts():
    return [p.messages for p in load_workload("code-edit", 2)], [p.messages for p in load_workload("chat", 3)]


def _tokens(llm: LLM, chats: list, params: SamplingParams) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.chat(chats, params, use_tqdm=False)]


def _check(dtype: str, prompts, params: SamplingParams, names: list[str]) -> None:
    edits, chats = prompts
    fresh = LLM(dtype=dtype, device="cpu")
    reference = [_tokens(fresh, [edit], params)[0] for edit in edits]  # each edit alone, then "plain" goes on
    for name in names:
        llm = fresh if name == "plain" else LLM(dtype=dtype, device="cpu", **SCHEDULES[name])
        _tokens(llm, chats, params)
        after_hits = [_tokens(llm, [edit], params)[0] for edit in edits]
        in_batch = _tokens(llm, chats[:1] + edits + chats[1:], params)[1:1 + len(edits)]
        where = f"({dtype}, temperature {params.temperature}): tokens differ from the request alone"
        assert after_hits == reference, f"{name}, after prefix-cache hits {where}"
        assert in_batch == reference, f"{name}, in a batch {where}"
        del llm
        gc.collect()
    del fresh


def test_greedy_tokens_do_not_depend_on_the_schedule(prompts):
    _check("auto", prompts, SamplingParams(temperature=0, max_tokens=32), list(SCHEDULES))


def test_seeded_sampling_does_not_depend_on_the_schedule(prompts):
    _check("auto", prompts, SamplingParams(temperature=0.8, seed=7, max_tokens=32), ["plain", "eagle3"])


def test_fp32_tokens_do_not_depend_on_the_schedule(prompts):
    # de-quantized fp32 weights decode ~10x slower than the blocks: fewer tokens, prefix hits and a batch
    _check("float32", prompts, SamplingParams(temperature=0, max_tokens=12), ["plain"])


def test_eight_concurrent_streams_answer_as_each_request_alone(prompts, tmp_path):
    """``draftwise serve`` (bundled model, suffix decoding) streaming 8 chats at once: each text is
    the one the same chat gets alone on a fresh engine."""
    edits, chats = prompts
    requests = (edits + chats) * 2
    requests = requests[:8]
    fresh = LLM(device="cpu")
    params = SamplingParams(temperature=0, max_tokens=24)
    expected = [fresh.chat([messages], params, use_tqdm=False)[0].outputs[0].text for messages in requests]
    del fresh
    gc.collect()
    proc, url = start_server("HuggingFaceTB/SmolLM2-135M-Instruct", tmp_path / "serve.log",
                             ["--dtype", "auto", "--device", "cpu", "-sc", json.dumps({"method": "suffix"})])
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=API_KEY)

    async def stream(messages) -> str:
        chunks = await client.chat.completions.create(model=SERVED_NAME, messages=messages, max_tokens=24,
                                                      temperature=0, stream=True)
        return "".join([chunk.choices[0].delta.content or "" async for chunk in chunks if chunk.choices])

    async def all_at_once() -> list[str]:
        return await asyncio.wait_for(asyncio.gather(*(stream(messages) for messages in requests)), 120)

    try:
        assert asyncio.run(all_at_once()) == expected
    finally:
        stop_server(proc)
