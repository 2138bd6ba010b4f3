"""Bad input raises ValueError and leaves the engine usable."""
from __future__ import annotations

import threading

import pytest
from conftest import PROMPTS, greedy

from draftwise import LLM, SamplingParams


@pytest.fixture(scope="module")
def reference(tiny_llm):
    """Greedy outputs of two prompts, computed before any error is provoked."""
    params = greedy(12, ignore_eos=True)
    outs = tiny_llm.generate(PROMPTS[:2], params, use_tqdm=False)
    return params, [o.outputs[0].token_ids for o in outs]


def _still_works(llm, reference):
    params, ref = reference
    outs = llm.generate(PROMPTS[:2], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == ref
    assert not llm.llm_engine.has_unfinished_requests()


@pytest.mark.parametrize(
    "bad",
    [
        "",
        {"prompt_token_ids": []},
        [PROMPTS[0], ""],
        [{"prompt_token_ids": []}, PROMPTS[1]],
    ],
    ids=["empty-str", "empty-ids", "empty-in-list", "empty-ids-in-list"],
)
def test_empty_prompt(tiny_llm, reference, bad):
    with pytest.raises(ValueError):
        tiny_llm.generate(bad, greedy(4), use_tqdm=False)
    _still_works(tiny_llm, reference)


def test_prompt_longer_than_max_model_len(tiny_llm, reference):
    # The fixture model has max_position_embeddings=512 -> default max_model_len 512.
    with pytest.raises(ValueError):
        tiny_llm.generate({"prompt_token_ids": [5] * 600}, greedy(4), use_tqdm=False)
    too_long_text = " ".join(["The quick brown fox jumps over the lazy dog."] * 80)
    assert len(tiny_llm.get_tokenizer()(too_long_text).input_ids) > 512
    with pytest.raises(ValueError):
        tiny_llm.generate([PROMPTS[0], too_long_text], greedy(4), use_tqdm=False)
    _still_works(tiny_llm, reference)


def test_explicit_max_model_len(tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, max_model_len=64)
    with pytest.raises(ValueError):
        llm.generate({"prompt_token_ids": [5] * 80}, greedy(4), use_tqdm=False)
    out = llm.generate({"prompt_token_ids": [5] * 20}, greedy(4, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


def test_sampling_params_length_mismatch(tiny_llm, reference):
    with pytest.raises(ValueError):
        tiny_llm.generate(PROMPTS[:3], [greedy(4), greedy(4)], use_tqdm=False)
    _still_works(tiny_llm, reference)


@pytest.mark.parametrize("model", ["/nonexistent/path/to/model", "someorg/some-model"])
def test_unknown_model(model):
    with pytest.raises(ValueError):
        LLM(model=model)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(dtype="int3"), "dtype"),
        (dict(max_num_seqs=0), "max_num_seqs"),
        (dict(device="tpu"), "device"),
        (dict(max_model_len=-1), "max_model_len"),
        (dict(not_an_argument=1), "not_an_argument"),
        (dict(max_num_batched_tokens=0), "max_num_batched_tokens"),
    ],
)
def test_invalid_llm_args(tiny_model_dir, kwargs, name):
    with pytest.raises(ValueError) as exc:
        LLM(model=str(tiny_model_dir), **kwargs)
    assert name in str(exc.value)


def test_llm_still_works_after_bad_constructions(tiny_llm, reference):
    _still_works(tiny_llm, reference)


def test_bad_add_request_does_not_disturb_engine(tiny_llm, reference):
    params, ref = reference
    engine = tiny_llm.llm_engine
    engine.add_request("good-0", PROMPTS[0], params)
    engine.add_request("good-1", PROMPTS[1], params)
    engine.step()  # the good requests are already running when the bad ones arrive
    with pytest.raises(ValueError):
        engine.add_request("bad-empty", "", params)
    with pytest.raises(ValueError):
        engine.add_request("bad-empty-ids", {"prompt_token_ids": []}, params)
    with pytest.raises(ValueError):
        engine.add_request("bad-long", {"prompt_token_ids": [5] * 600}, params)
    results = {}
    for _ in range(200):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            assert out.request_id in ("good-0", "good-1")
            if out.finished:
                results[out.request_id] = out.outputs[0].token_ids
    assert not engine.has_unfinished_requests()
    assert results == {"good-0": ref[0], "good-1": ref[1]}
    # The rejected ids were never registered: they can be reused for valid requests.
    engine.add_request("bad-empty", PROMPTS[0], params)
    while engine.has_unfinished_requests():
        outs = engine.step()
    assert outs[-1].request_id == "bad-empty" and outs[-1].outputs[0].token_ids == ref[0]


def test_request_that_can_never_fit_raises(tiny_model_dir):
    # KV cache of 2 blocks = 32 tokens; an 80-token prompt can never fit.
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0,
              kv_cache_memory_bytes=2 * 16 * 512)
    error = _generate_error_within(llm, {"prompt_token_ids": [5] * 80}, greedy(4), timeout=60)
    assert isinstance(error, ValueError), error
    # A request that fits still works on the same LLM afterwards.
    out = llm.generate({"prompt_token_ids": [5] * 8}, greedy(4, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


def test_generation_that_outgrows_kv_cache_raises(tiny_model_dir):
    # The prompt fits (20 tokens) but prompt + max_tokens (20 + 40) exceeds the 32-token cache.
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0,
              kv_cache_memory_bytes=2 * 16 * 512)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    error = _generate_error_within(llm, {"prompt_token_ids": [5] * 20}, params, timeout=60)
    assert isinstance(error, ValueError), error


def _generate_error_within(llm, prompt, params, timeout: float):
    """Run generate() in a thread; fail if it hangs, else return the exception it raised (or None)."""
    result = {}

    def run():
        try:
            llm.generate(prompt, params, use_tqdm=False)
            result["error"] = None
        except Exception as e:  # noqa: BLE001 - inspected by the caller
            result["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=timeout)
    assert not thread.is_alive(), "generate() hangs instead of raising"
    return result["error"]


@pytest.mark.parametrize(
    "params, field",
    [
        (dict(stop_token_ids=[10**6], min_tokens=2), "stop_token_ids"),  # outside the vocabulary
        (dict(n=129), "n"),
        (dict(logprobs=21), "logprobs"),
        (dict(stop=[f"s{i}" for i in range(65)]), "stop"),
        (dict(stop=["x" * 1025]), "stop"),
    ],
)
def test_requests_past_the_model_or_the_caps_are_refused(tiny_llm, reference, params, field):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}="):
        tiny_llm.generate(PROMPTS[0], SamplingParams(max_tokens=4, **params), use_tqdm=False)
    _still_works(tiny_llm, reference)


def test_prompt_with_a_lone_surrogate_is_refused(tiny_llm, reference):
    with pytest.raises(ValueError, match="prompt.*lone surrogate"):
        tiny_llm.generate("hello \ud800 world", greedy(4), use_tqdm=False)
    _still_works(tiny_llm, reference)


def test_caps_are_engine_arguments(tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, max_n=2, max_logprobs=1)
    with pytest.raises(ValueError, match=r"SamplingParams\.n=3 .*max_n"):
        llm.generate(PROMPTS[0], SamplingParams(n=3, max_tokens=2), use_tqdm=False)
    out = llm.generate(PROMPTS[0], SamplingParams(n=2, logprobs=1, max_tokens=2), use_tqdm=False)
    assert len(out[0].outputs) == 2
    with pytest.raises(ValueError, match="max_logprobs"):
        LLM(model=str(tiny_model_dir), max_logprobs=-1)
