"""The OpenAI server through the official ``openai`` client: a real ``draftwise serve`` on 127.0.0.1
(tiny model, fp32, ngram speculation on). Greedy and seeded outputs over HTTP equal ``LLM``'s."""
from __future__ import annotations

import asyncio
import time
import urllib.request

import openai
import pytest
from conftest import API_KEY, PROMPTS, SERVED_NAME
from prometheus_client.parser import text_string_to_metric_families

from draftwise import SamplingParams


@pytest.fixture(scope="module")
def client(api_server):
    return openai.OpenAI(base_url=api_server + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def scrape(url: str) -> dict[str, float]:
    """``/metrics`` as {sample name with labels: value}, parsed by prometheus-client's parser (without the
    ``model_name`` and ``engine`` labels, the same on every sample)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k not in ("model_name", "engine"))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def wait_idle(url: str, timeout: float = 30.0) -> dict[str, float]:
    """Poll /metrics until no request runs or waits; return the last scrape."""
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(url)
        idle = m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
        if idle and m["vllm:kv_cache_usage_perc"] == 0 or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


def test_models_and_version(client, api_server):
    assert [m.id for m in client.models.list().data] == [SERVED_NAME]
    with urllib.request.urlopen(api_server + "/version") as resp:
        assert resp.status == 200 and b"version" in resp.read()


def test_completion_equals_offline_generate(client, tiny_llm):
    prompt = PROMPTS[2]
    resp = client.completions.create(model=SERVED_NAME, prompt=prompt, max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True})
    expected = tiny_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
                                 use_tqdm=False)[0]
    assert resp.choices[0].text == expected.outputs[0].text
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert resp.usage.completion_tokens == 24


def test_completion_prompt_list_logprobs_echo(client, tiny_llm):
    resp = client.completions.create(model=SERVED_NAME, prompt=PROMPTS[:2], max_tokens=5, temperature=0,
                                     logprobs=2, extra_body={"ignore_eos": True})
    expected = tiny_llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True,
                                                             logprobs=2), use_tqdm=False)
    assert [c.index for c in resp.choices] == [0, 1]
    for choice, out in zip(resp.choices, expected):
        assert choice.text == out.outputs[0].text
        assert len(choice.logprobs.tokens) == 5 and len(choice.logprobs.top_logprobs[0]) == 2
        first = out.outputs[0].logprobs[0][out.outputs[0].token_ids[0]].logprob
        assert choice.logprobs.token_logprobs[0] == pytest.approx(first, abs=1e-5)
    echoed = client.completions.create(model=SERVED_NAME, prompt=PROMPTS[1], max_tokens=3, temperature=0,
                                       echo=True)
    assert echoed.choices[0].text.startswith(PROMPTS[1])


def test_chat_equals_offline_chat(client, tiny_llm):
    messages = [{"role": "user", "content": "The weather today is"}]
    resp = client.chat.completions.create(model=SERVED_NAME, messages=messages, max_tokens=20, temperature=0,
                                          logprobs=True, top_logprobs=3)
    expected = tiny_llm.chat(messages, SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)[0]
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == expected.outputs[0].text
    assert len(resp.choices[0].logprobs.content) == len(expected.outputs[0].token_ids)
    assert len(resp.choices[0].logprobs.content[0].top_logprobs) == 3


def test_streaming_chat_matches_non_streaming(client):
    messages = [{"role": "user", "content": "def fibonacci(n):"}]
    kwargs = dict(model=SERVED_NAME, messages=messages, max_tokens=30, temperature=0)
    full = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                                 **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_n_and_seed_are_reproducible_and_match_offline(client, tiny_llm):
    kwargs = dict(model=SERVED_NAME, prompt=PROMPTS[3], max_tokens=12, temperature=1.0, n=3, seed=7,
                  extra_body={"ignore_eos": True})
    first, second = client.completions.create(**kwargs), client.completions.create(**kwargs)
    texts = [c.text for c in sorted(first.choices, key=lambda c: c.index)]
    assert texts == [c.text for c in sorted(second.choices, key=lambda c: c.index)]
    assert len(set(texts)) > 1  # n samples, not one repeated
    expected = tiny_llm.generate(PROMPTS[3], SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=12,
                                                            ignore_eos=True), use_tqdm=False)[0]
    assert texts == [c.text for c in expected.outputs]


def test_32_concurrent_streams_get_their_own_tokens(api_server, tiny_llm):
    prompts = [f"{PROMPTS[i % len(PROMPTS)]} {i}" for i in range(32)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    expected = [o.outputs[0].text for o in tiny_llm.generate(prompts, params, use_tqdm=False)]
    aclient = openai.AsyncOpenAI(base_url=api_server + "/v1", api_key=API_KEY, max_retries=0, timeout=120)

    async def one(prompt: str) -> str:
        stream = await aclient.completions.create(model=SERVED_NAME, prompt=prompt, max_tokens=24,
                                                  temperature=0, stream=True, extra_body={"ignore_eos": True})
        return "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])

    async def run_all() -> list[str]:
        return await asyncio.wait_for(asyncio.gather(*(one(p) for p in prompts)), timeout=180)

    got = asyncio.run(run_all())
    assert got == expected
    m = wait_idle(api_server)
    assert m["vllm:kv_cache_usage_perc"] == 0 and m["vllm:num_requests_running"] == 0


ABORTED = "vllm:request_success_total{finished_reason=abort}"


def test_disconnect_mid_stream_aborts_and_frees_blocks(api_server):
    import http.client
    import json
    from urllib.parse import urlparse

    before = scrape(api_server).get(ABORTED, 0)
    body = {"model": SERVED_NAME, "prompt": PROMPTS[0], "max_tokens": 400, "temperature": 0,
            "stream": True, "ignore_eos": True}
    url = urlparse(api_server)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.readline().startswith(b"data:")  # the stream has started ...
    conn.close()  # ... and the client goes away
    m = wait_idle(api_server)
    assert m[ABORTED] == before + 1
    assert m["vllm:kv_cache_usage_perc"] == 0 and m["vllm:num_requests_running"] == 0


def test_metrics_parse_and_spec_counters_grow(client, api_server):
    names = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
             "vllm:generation_tokens_total")
    before = scrape(api_server)
    client.completions.create(model=SERVED_NAME, prompt=PROMPTS[4], max_tokens=40, temperature=0,
                              extra_body={"ignore_eos": True})
    after = wait_idle(api_server)
    for name in names:
        assert after[name] > before.get(name, 0), name
    accepted = after["vllm:spec_decode_num_accepted_tokens_total"]
    per_pos_name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    per_pos = sum(v for k, v in after.items() if k.startswith(per_pos_name))
    assert per_pos == accepted
    assert after["vllm:time_to_first_token_seconds_count"] >= 1
    assert after["vllm:inter_token_latency_seconds_count"] >= 39


def test_response_carries_request_spec_figures(client):
    resp = client.completions.create(model=SERVED_NAME, prompt=PROMPTS[4], max_tokens=40, temperature=0,
                                     extra_body={"ignore_eos": True})
    spec = resp.model_extra["spec_decode"]
    assert spec["num_drafts"] > 0 and spec["num_draft_tokens"] >= spec["num_drafts"]
    assert spec["mean_acceptance_length"] == pytest.approx(1 + spec["num_accepted_tokens"] / spec["num_drafts"])


def test_shared_system_prompt_reports_cached_tokens(client, api_server):
    """Chat requests sharing a system prompt: the second reads its prefix from the cache, says so in
    ``usage.prompt_tokens_details.cached_tokens``, and ``/metrics`` counts the lookups and hits."""
    system = {"role": "system", "content": "You answer in one short sentence and never guess. " * 4}
    before = scrape(api_server)
    usages = [client.chat.completions.create(model=SERVED_NAME, max_tokens=4, temperature=0,
                                             messages=[system, {"role": "user", "content": q}]).usage
              for q in ("Hello there", "Name a colour")]
    assert usages[0].prompt_tokens_details.cached_tokens % 16 == 0
    assert usages[1].prompt_tokens_details.cached_tokens >= 48
    after = wait_idle(api_server)
    queries = after["vllm:prefix_cache_queries_total"] - before.get("vllm:prefix_cache_queries_total", 0)
    hits = after["vllm:prefix_cache_hits_total"] - before.get("vllm:prefix_cache_hits_total", 0)
    assert queries == sum(u.prompt_tokens for u in usages)
    assert hits == sum(u.prompt_tokens_details.cached_tokens for u in usages)
