"""Batching must not change results: fp32 greedy outputs of requests scheduled together
(continuous batching, chunked prefill, preemption, staggered arrival) equal the outputs
of each request generated alone, token for token."""
from __future__ import annotations

import pytest
from conftest import PROMPTS, greedy

from draftwise import LLM
from draftwise.engine.model_limits import CPU_PREFILL_CHUNK
from draftwise.engine.scheduler import MIN_PREFILL_CHUNK
from draftwise.engine.drafting.step_cost import StepCostModel

# Different lengths so that requests finish at different steps; PROMPTS[3] is the EOS
# prompt of the fixture model and stops early on EOS (ignore_eos is off here).
MAX_TOKENS = [20, 12, 24, 16, 8, 20, 10, 18]
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 4  # K+V x layers x kv_heads x head_dim x fp32
BLOCK = 16


def _params():
    return [greedy(m) for m in MAX_TOKENS]


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def alone(tiny_llm):
    """Reference: every prompt generated on its own."""
    return [tiny_llm.generate(p, sp, use_tqdm=False)[0].outputs[0].token_ids
            for p, sp in zip(PROMPTS, _params())]


@pytest.fixture(scope="module")
def prompt_lens(tiny_llm):
    tok = tiny_llm.get_tokenizer()
    return [len(tok(p).input_ids) for p in PROMPTS]


def test_reference_is_meaningful(alone, prompt_lens, eos_info):
    assert len(set(map(tuple, alone))) == len(PROMPTS)
    assert max(prompt_lens) >= 3 * min(prompt_lens)
    assert sum(1 for n in prompt_lens if n > 32) >= 2
    # One request stops on EOS, the others run to their max_tokens.
    stopped = [len(t) < m for t, m in zip(alone, MAX_TOKENS)]
    assert stopped == [p == eos_info["eos_prompt"] for p in PROMPTS]


def test_batched_equals_alone(tiny_llm, alone):
    outs = tiny_llm.generate(PROMPTS, _params(), use_tqdm=False)
    assert _tokens(outs) == alone
    for o, m in zip(outs, MAX_TOKENS):
        c = o.outputs[0]
        assert c.finish_reason == ("length" if len(c.token_ids) == m else "stop")


def test_batched_equals_alone_in_other_order(tiny_llm, alone):
    order = [5, 2, 7, 0, 3, 6, 1, 4]
    params = _params()
    outs = tiny_llm.generate([PROMPTS[i] for i in order], [params[i] for i in order], use_tqdm=False)
    assert _tokens(outs) == [alone[i] for i in order]


def test_chunked_prefill_equals_alone(tiny_model_dir, alone, prompt_lens):
    assert max(prompt_lens) > 2 * 32  # prompts really are split into several chunks
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, max_num_batched_tokens=32)
    outs = llm.generate(PROMPTS, _params(), use_tqdm=False)
    assert _tokens(outs) == alone
    # A single long prompt alone is also chunked.
    long_i = prompt_lens.index(max(prompt_lens))
    out = llm.generate(PROMPTS[long_i], _params()[long_i], use_tqdm=False)
    assert out[0].outputs[0].token_ids == alone[long_i]


def test_cpu_budget_defaults_to_the_prefill_chunk(tiny_llm, tiny_model_dir):
    """Unset, a CPU step holds CPU_PREFILL_CHUNK tokens (prefill chunked to it); a user's value wins."""
    assert tiny_llm.llm_engine.config.max_num_batched_tokens is None
    assert tiny_llm.llm_engine.scheduler.max_num_batched_tokens == CPU_PREFILL_CHUNK
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, max_num_batched_tokens=4096)
    assert llm.llm_engine.scheduler.max_num_batched_tokens == 4096


def test_small_max_num_seqs_equals_alone(tiny_model_dir, alone):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, max_num_seqs=2)
    outs = llm.generate(PROMPTS, _params(), use_tqdm=False)
    assert _tokens(outs) == alone


def test_preemption_equals_alone(tiny_model_dir, alone, prompt_lens):
    # KV cache that holds the largest single request (+1 block of slack) but far less than
    # all of them together, so running the batch needs preemption by recomputation.
    need = max(n + m for n, m in zip(prompt_lens, MAX_TOKENS))
    blocks = -(-need // BLOCK) + 1
    assert blocks * BLOCK < sum(n + m for n, m in zip(prompt_lens, MAX_TOKENS)) / 2
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0,
              kv_cache_memory_bytes=blocks * BLOCK * KV_BYTES_PER_TOKEN)
    outs = llm.generate(PROMPTS, _params(), use_tqdm=False)
    assert _tokens(outs) == alone
    preemptions = llm.llm_engine.scheduler.num_preemptions
    assert preemptions > 0, "the KV cache was sized to force preemption, but none happened"
    assert sum(o.metrics.num_preemptions for o in outs) == preemptions


def test_preemption_with_chunked_prefill(tiny_model_dir, alone, prompt_lens):
    need = max(n + m for n, m in zip(prompt_lens, MAX_TOKENS))
    blocks = -(-need // BLOCK) + 1
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, max_num_batched_tokens=32,
              kv_cache_memory_bytes=blocks * BLOCK * KV_BYTES_PER_TOKEN)
    outs = llm.generate(PROMPTS, _params(), use_tqdm=False)
    assert _tokens(outs) == alone
    assert llm.llm_engine.scheduler.num_preemptions > 0


def _drain(engine, results, max_steps=500):
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return
        for out in engine.step():
            assert out.request_id not in results, "output after the request had finished"
            if out.finished:
                results[out.request_id] = out
    raise AssertionError("engine did not finish within max_steps")


def test_staggered_add_request_equals_alone(tiny_llm, alone):
    engine = tiny_llm.llm_engine
    params = _params()
    assert not engine.has_unfinished_requests()
    results = {}
    arrival_plan = {0: [0, 4], 2: [1], 3: [6, 3], 7: [2, 5], 12: [7]}  # step -> prompt indices
    step = 0
    while step <= max(arrival_plan) or engine.has_unfinished_requests():
        for i in arrival_plan.get(step, []):
            engine.add_request(f"stagger-{i}", PROMPTS[i], params[i])
        for out in engine.step():
            assert out.request_id not in results
            if out.finished:
                results[out.request_id] = out
        step += 1
        assert step < 500
    assert sorted(results) == sorted(f"stagger-{i}" for i in range(len(PROMPTS)))
    for i in range(len(PROMPTS)):
        out = results[f"stagger-{i}"]
        assert out.finished
        assert out.outputs[0].token_ids == alone[i]
        assert out.prompt == PROMPTS[i]


def test_long_prompts_do_not_stall_decodes(tiny_model_dir, tiny_llm, alone):
    """With decode_stall_factor, while sequences decode each step takes only the prefill the
    step-cost model allows (a step at most that many times the decode-only step); outputs are unchanged."""
    long_prompts = [" ".join([PROMPTS[i]] * 6) for i in (1, 5)]
    expected = [o.outputs[0].token_ids for o in tiny_llm.generate(long_prompts, greedy(12), use_tqdm=False)]
    llm = LLM(model=str(tiny_model_dir), dtype="float32", max_num_batched_tokens=512, decode_stall_factor=2)
    engine = llm.llm_engine
    cost = StepCostModel.fixed(0.02, 512)  # a step of r rows costs 1 + 0.02 (r - 1)
    engine.scheduler.step_cost = cost
    steps = []  # (decode rows, prefill rows) of each step
    schedule = engine.scheduler.schedule

    def recording_schedule():
        plan = schedule()
        decode = sum(1 for item in plan.scheduled if item.samples and item.num_new_tokens == 1)
        steps.append((decode, plan.num_batched_tokens - decode))
        return plan

    engine.scheduler.schedule = recording_schedule
    params = _params()
    for i in (0, 2):
        engine.add_request(f"short-{i}", PROMPTS[i], params[i])
    engine.step()
    for i, prompt in enumerate(long_prompts):
        engine.add_request(f"long-{i}", prompt, greedy(12))
    results = {}
    _drain(engine, results)
    assert [results[f"short-{i}"].outputs[0].token_ids for i in (0, 2)] == [alone[0], alone[2]]
    assert [results[f"long-{i}"].outputs[0].token_ids for i in (0, 1)] == expected
    held = [(d, p) for d, p in steps if d and p]
    assert len(held) >= 3  # the long prompts were prefilled in chunks beside the decodes
    for decode, prefill in held:
        allowed = cost.max_rows_within(2 * cost.seconds(decode), 512) - decode
        assert prefill <= max(MIN_PREFILL_CHUNK, allowed)


def test_step_reports_progress_incrementally(tiny_llm, alone):
    engine = tiny_llm.llm_engine
    engine.add_request("incr-1", PROMPTS[1], _params()[1])
    seen = []
    for _ in range(100):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            assert out.request_id == "incr-1"
            seen.append(list(out.outputs[0].token_ids))
    assert not engine.has_unfinished_requests()
    assert seen[-1] == alone[1]
    # Unfinished outputs grow monotonically and are prefixes of the final result.
    for a, b in zip(seen, seen[1:]):
        assert b[:len(a)] == a and len(b) >= len(a)
    assert len(seen) >= 2


def test_abort_request(tiny_llm, alone):
    engine = tiny_llm.llm_engine
    params = _params()
    engine.add_request("abort-keep", PROMPTS[0], params[0])
    engine.add_request("abort-drop", PROMPTS[2], params[2])
    engine.step()
    engine.step()
    engine.abort_request("abort-drop")
    results = {}
    _drain(engine, results)
    assert "abort-drop" not in results
    assert results["abort-keep"].outputs[0].token_ids == alone[0]
    assert not engine.has_unfinished_requests()
    # Aborting an unknown / finished id is harmless.
    engine.abort_request("abort-keep")
    engine.abort_request("never-added")
    assert tiny_llm.generate(PROMPTS[2], params[2], use_tqdm=False)[0].outputs[0].token_ids == alone[2]


@pytest.mark.parametrize("bad", [0.5, "2", True, float("nan")])
def test_decode_stall_factor_is_checked(tiny_model_dir, bad):
    with pytest.raises(ValueError, match="decode_stall_factor must be a number >= 1"):
        LLM(model=str(tiny_model_dir), dtype="float32", decode_stall_factor=bad)
