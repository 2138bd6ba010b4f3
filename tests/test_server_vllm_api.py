"""What a vLLM user's client code finds on the server: ``/tokenize``, ``/detokenize``, ``/version``,
vLLM's model card, vLLM's per-request speculative figures (``metrics.speculative_decoding``), and no
request field ignored: an unknown or unimplemented one is a 400 naming it, through the official
``openai`` client. One ``draftwise serve`` (tiny model, ngram k=3, API key,
``--per-request-spec-decode-metrics detailed``) serves the module."""
from __future__ import annotations

import json
import urllib.request

import openai
import pytest
from conftest import API_KEY, PROMPTS, SERVED_NAME, SERVER_SPEC, start_server, stop_server
from test_server_errors import call

import draftwise

K = SERVER_SPEC["num_speculative_tokens"]
SPEC_FIELDS = {"mean_acceptance_length", "draft_acceptance_rate", "acceptance_histogram", "num_spec_steps",
               "num_accepted_draft_tokens", "num_draft_tokens", "num_spec_tokens", "per_step_accepted",
               "per_step_drafted"}
MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "The weather today is"}]


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    proc, url = start_server(tiny_model_dir, tmp_path_factory.mktemp("vllm-api") / "serve.log",
                             ["--per-request-spec-decode-metrics", "detailed"])
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def _ok(url: str, path: str, body=None, **kw) -> dict:
    status, payload = call(url, path, body, **kw)
    assert status == 200, payload
    return payload


def _refused(url: str, path: str, body, status: int, param: str) -> dict:
    got, payload = call(url, path, body)
    assert got == status, payload
    error = payload["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param, error
    return error


# ---------------------------------------------------------------------- /tokenize, /detokenize
def test_tokenize_completion_form_as_the_benchmark_client_sends_it(server, hf_tokenizer):
    prompt = PROMPTS[2]
    for special in (False, True):
        got = _ok(server, "/tokenize", {"model": SERVED_NAME, "prompt": prompt, "add_special_tokens": special})
        expected = hf_tokenizer(prompt, add_special_tokens=special)["input_ids"]
        assert got == {"count": len(expected), "max_model_len": 512, "tokens": expected, "token_strs": None}
    with_strs = _ok(server, "/tokenize", {"prompt": prompt, "return_token_strs": True})
    assert with_strs["token_strs"] == hf_tokenizer.convert_ids_to_tokens(with_strs["tokens"])


def test_tokenize_counts_what_the_completion_endpoint_counts(server, client):
    prompt = PROMPTS[4]
    usage = client.completions.create(model=SERVED_NAME, prompt=prompt, max_tokens=1).usage
    assert _ok(server, "/tokenize", {"model": SERVED_NAME, "prompt": prompt})["count"] == usage.prompt_tokens
    long = _ok(server, "/tokenize", {"prompt": "hello " * 600})  # counted, not refused, as vLLM does
    assert long["count"] > long["max_model_len"] and len(long["tokens"]) == long["count"]


def test_tokenize_chat_form_matches_the_chat_endpoint(server, client, hf_tokenizer):
    got = _ok(server, "/tokenize", {"model": SERVED_NAME, "messages": MESSAGES})
    text = hf_tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert got["tokens"] == hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    usage = client.chat.completions.create(model=SERVED_NAME, messages=MESSAGES, max_tokens=1).usage
    assert got["count"] == usage.prompt_tokens
    bare = _ok(server, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False})
    assert bare["tokens"] == got["tokens"][:bare["count"]] and bare["count"] < got["count"]
    parts = [{"role": "user", "content": [{"type": "text", "text": "The weather "}, {"type": "text", "text": "today"}]}]
    joined = [{"role": "user", "content": "The weather today"}]
    assert _ok(server, "/tokenize", {"messages": parts})["tokens"] == \
        _ok(server, "/tokenize", {"messages": joined})["tokens"]


def test_detokenize_round_trips(server, hf_tokenizer):
    tokens = _ok(server, "/tokenize", {"prompt": PROMPTS[6], "add_special_tokens": False})["tokens"]
    assert _ok(server, "/detokenize", {"model": SERVED_NAME, "tokens": tokens}) == {"prompt": PROMPTS[6]}
    assert _ok(server, "/detokenize", {"tokens": []}) == {"prompt": ""}
    special = hf_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert _ok(server, "/detokenize", {"tokens": [special]}) == {"prompt": "<|im_end|>"}


@pytest.mark.parametrize("path, body, status, param", [
    ("/detokenize", {"tokens": [5, 400]}, 400, "tokens"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/detokenize", {"tokens": [2**70]}, 400, "tokens"),
    ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
    ("/detokenize", {"model": "gpt-4", "tokens": [5]}, 404, "model"),
    ("/detokenize", {"tokens": [5], "skip_special_tokens": True}, 400, "skip_special_tokens"),
    ("/tokenize", {"model": "gpt-4", "prompt": "hi"}, 404, "model"),
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/tokenize", {}, 400, "prompt"),
    ("/tokenize", {"prompt": "hi \ud800"}, 400, "prompt"),
    ("/tokenize", {"prompt": "hi", "foo": 1}, 400, "foo"),
    ("/tokenize", {"messages": MESSAGES, "continue_final_message": True}, 400, "continue_final_message"),
    ("/tokenize", {"messages": MESSAGES, "tools": [{"type": "function"}]}, 400, "tools.0.function"),
    ("/tokenize", {"messages": MESSAGES, "chat_template": "{{ messages }}"}, 400, "chat_template"),
    ("/tokenize", {"messages": "hi"}, 400, "messages"),
])
def test_tokenize_bad_input_gets_openai_error(server, path, body, status, param):
    error = _refused(server, path, body, status, param)
    assert error["type"] == "invalid_request_error" and error["message"]


def _stream_usage(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(url + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        chunks = [json.loads(line[6:]) for line in resp if line.startswith(b"data: {")]
    assert all("error" not in c for c in chunks), chunks
    return chunks[-1]["usage"]


def test_the_vllm_benchmark_clients_requests_are_served(server):
    """The bodies ``vllm bench serve`` posts (``benchmarks/lib/endpoint_request_func.py``), field for field."""
    completion = {"model": SERVED_NAME, "prompt": PROMPTS[0], "repetition_penalty": 1.0, "max_tokens": 8,
                  "logprobs": None, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    assert _stream_usage(server, "/v1/completions", completion)["completion_tokens"] == 8
    chat = {"model": SERVED_NAME, "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPTS[0]}]}],
            "max_completion_tokens": 8, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    assert _stream_usage(server, "/v1/chat/completions", chat)["completion_tokens"] == 8


def test_tokenize_and_version_are_open_as_in_vllm_and_v1_is_not(server):
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [5]})):
        status, _ = call(server, path, body, key=None)  # vLLM's key guards /v1 only
        assert status == 200
    status, payload = call(server, "/v1/completions", {"prompt": "hi", "max_tokens": 1}, key=None)
    assert status == 401 and payload["error"]["code"] == "invalid_api_key"
    assert _ok(server, "/version", key=None) == {"version": draftwise.__version__}


def test_model_card_has_vllms_fields(server, client):
    card = _ok(server, "/v1/models")["data"][0]
    assert set(card) == {"id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"}
    assert card["id"] == SERVED_NAME and card["object"] == "model" and card["max_model_len"] == 512
    assert card["parent"] is None and len(card["permission"]) == 1
    permission = card["permission"][0]
    assert set(permission) == {"id", "object", "created", "allow_create_engine", "allow_sampling", "allow_logprobs",
                               "allow_search_indices", "allow_view", "allow_fine_tuning", "organization", "group",
                               "is_blocking"}
    assert permission["object"] == "model_permission" and permission["id"].startswith("modelperm-")
    assert client.models.list().data[0].model_extra["permission"][0]["allow_sampling"] is True


# ---------------------------------------------------------------------- metrics.speculative_decoding
def _check_spec(spec: dict, ours: dict) -> None:
    """vLLM's per-request figures, consistent with each other and with our ``spec_decode``."""
    assert set(spec) == SPEC_FIELDS
    steps, accepted, drafted = spec["num_spec_steps"], spec["num_accepted_draft_tokens"], spec["num_draft_tokens"]
    assert steps == ours["num_drafts"] > 0 and accepted == ours["num_accepted_tokens"]
    assert drafted == ours["num_draft_tokens"] and spec["num_spec_tokens"] == K
    hist = spec["acceptance_histogram"]
    assert len(hist) == K + 1 and sum(hist) == steps and sum(j * c for j, c in enumerate(hist)) == accepted
    assert spec["per_step_accepted"] and len(spec["per_step_accepted"]) == steps
    assert sum(spec["per_step_accepted"]) == accepted and sum(spec["per_step_drafted"]) == drafted
    assert all(0 <= a <= d <= K for a, d in zip(spec["per_step_accepted"], spec["per_step_drafted"]))
    assert [spec["per_step_accepted"].count(j) for j in range(K + 1)] == hist
    assert spec["mean_acceptance_length"] == pytest.approx(1 + accepted / steps)
    assert spec["draft_acceptance_rate"] == pytest.approx(accepted / drafted)


def test_completion_carries_vllms_spec_metrics(client):
    # 120 greedy tokens of PROMPTS[4]: ~40 verify steps, a few of them accepting a draft token
    resp = client.completions.create(model=SERVED_NAME, prompt=PROMPTS[4], max_tokens=120, temperature=0,
                                     extra_body={"ignore_eos": True})
    spec = resp.model_extra["metrics"]["speculative_decoding"]
    _check_spec(spec, resp.model_extra["spec_decode"])
    assert spec["acceptance_histogram"][0] < spec["num_spec_steps"]  # steps that accepted something are counted


def test_chat_carries_vllms_spec_metrics(client):
    resp = client.chat.completions.create(model=SERVED_NAME, messages=[{"role": "user", "content": PROMPTS[4]}],
                                          max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
    _check_spec(resp.model_extra["metrics"]["speculative_decoding"], resp.model_extra["spec_decode"])


def test_spec_metrics_only_for_one_sequence(client):
    """As vLLM: with n > 1 or several prompts the figures belong to no single stream, so none."""
    kwargs = dict(model=SERVED_NAME, max_tokens=20, temperature=0, extra_body={"ignore_eos": True})
    for resp in (client.completions.create(prompt=PROMPTS[4], n=2, **kwargs),
                 client.completions.create(prompt=[PROMPTS[4], PROMPTS[6]], **kwargs),
                 client.chat.completions.create(messages=MESSAGES, n=2, **kwargs)):
        assert resp.model_extra["metrics"] is None and resp.model_extra["spec_decode"]["num_drafts"] > 0


def test_streams_carry_spec_metrics_on_the_usage_chunk_only(client):
    chat = dict(model=SERVED_NAME, messages=[{"role": "user", "content": PROMPTS[4]}], max_tokens=40,
                temperature=0, extra_body={"ignore_eos": True}, stream=True)
    completion = dict(model=SERVED_NAME, prompt=PROMPTS[4], max_tokens=40, temperature=0,
                      extra_body={"ignore_eos": True}, stream=True)
    for create, kwargs in ((client.chat.completions.create, chat), (client.completions.create, completion)):
        chunks = list(create(stream_options={"include_usage": True}, **kwargs))
        assert all("metrics" not in (c.model_extra or {}) for c in chunks[:-1])
        last = chunks[-1].model_extra
        assert chunks[-1].choices == [] and "metrics" in last
        _check_spec(last["metrics"]["speculative_decoding"], last["spec_decode"])
        assert all("metrics" not in (c.model_extra or {}) for c in create(**kwargs))


def test_spec_metrics_need_a_speculative_config(tiny_model_dir):
    from transformers import AutoTokenizer

    from draftwise.config import EngineConfig
    from draftwise.engine.engine import LLMEngine
    from draftwise.server.app import build_app
    from draftwise.server.async_engine import AsyncEngine
    from draftwise.server.options import ServerOptions

    with pytest.raises(ValueError, match="per-request-spec-decode-metrics"):
        ServerOptions(per_request_spec_decode_metrics="everything")
    engine = AsyncEngine(LLMEngine(EngineConfig(model=str(tiny_model_dir), dtype="float32")))
    with pytest.raises(ValueError, match="needs speculative decoding"):
        build_app(engine, ["tiny"], AutoTokenizer.from_pretrained(tiny_model_dir),
                  ServerOptions(per_request_spec_decode_metrics="summary"))


# ---------------------------------------------------------------------- per-request speculation
def test_vllm_xargs_cap_a_requests_drafts_with_outputs_unchanged(client):
    """``vllm_xargs`` (and the same key at the top level of extra_body) cap one request's drafts per step,
    chat and completions, streaming or not; 0 turns drafting off; the text is the uncapped request's."""
    chat = dict(model=SERVED_NAME, messages=[{"role": "user", "content": PROMPTS[4]}], max_tokens=40, temperature=0)
    completion = dict(model=SERVED_NAME, prompt=PROMPTS[4], max_tokens=60, temperature=0)
    for create, kwargs, text_of in ((client.chat.completions.create, chat, lambda r: r.choices[0].message.content),
                                    (client.completions.create, completion, lambda r: r.choices[0].text)):
        plain = create(extra_body={"ignore_eos": True}, **kwargs)
        assert plain.model_extra["spec_decode"]["num_draft_tokens"] > plain.model_extra["spec_decode"]["num_drafts"]
        for extra in ({"vllm_xargs": {"num_speculative_tokens": 0}}, {"num_speculative_tokens": 0}):
            resp = create(extra_body={"ignore_eos": True, **extra}, **kwargs)
            assert text_of(resp) == text_of(plain)
            assert resp.model_extra["spec_decode"] is None  # never drafted
            assert resp.model_extra["metrics"]["speculative_decoding"]["num_spec_steps"] == 0
        resp = create(extra_body={"ignore_eos": True, "vllm_xargs": {"num_speculative_tokens": 1}}, **kwargs)
        spec = resp.model_extra["metrics"]["speculative_decoding"]
        assert text_of(resp) == text_of(plain) and spec["num_spec_steps"] > 0
        assert max(spec["per_step_drafted"]) == 1
        chunks = list(create(stream=True, stream_options={"include_usage": True},
                             extra_body={"ignore_eos": True, "num_speculative_tokens": 1}, **kwargs))
        assert max(chunks[-1].model_extra["metrics"]["speculative_decoding"]["per_step_drafted"]) == 1


def test_bad_vllm_xargs_are_a_400_naming_the_field(client):
    completion = client.completions.create
    for extra, says in (({"vllm_xargs": {"num_speculative_tokens": K + 1}}, f"must be in [0, {K}]"),
                        ({"vllm_xargs": {"num_speculative_tokens": -1}}, "an int >= 0"),
                        ({"num_speculative_tokens": "two"}, "an int >= 0"),
                        ({"vllm_xargs": {"bogus": 1}}, "unknown: ['bogus']"),
                        ({"vllm_xargs": {"num_speculative_tokens": 1}, "num_speculative_tokens": 2}, "given twice")):
        error = _bad_request(completion, prompt="hi", extra_body=extra)
        assert error["param"] == "vllm_xargs" and says in error["message"], (extra, error)


def test_a_batch_of_prompts_up_to_openais_limit(client):
    """256 prompts in one completions request (OpenAI takes 2048): one choice each, in order; n is
    bounded by --max-n alone; 2049 prompts are a 400 naming prompt."""
    prompts = [f"{i} {PROMPTS[i % len(PROMPTS)]}" for i in range(256)]
    resp = client.completions.create(model=SERVED_NAME, prompt=prompts, max_tokens=1, temperature=0)
    assert [c.index for c in resp.choices] == list(range(256)) and resp.usage.completion_tokens == 256
    resp = client.completions.create(model=SERVED_NAME, prompt=prompts[:100], max_tokens=1, n=2, temperature=0)
    assert len(resp.choices) == 200
    error = _bad_request(client.completions.create, prompt=["hi"] * 2049)
    assert error["param"] == "prompt" and "--max-prompts=2048" in error["message"]


# ---------------------------------------------------------------------- no field ignored
def _bad_request(create, **kwargs) -> dict:
    with pytest.raises(openai.BadRequestError) as info:
        create(model=SERVED_NAME, max_tokens=4, **kwargs)
    assert info.value.status_code == 400
    error = info.value.body  # the client unwraps {"error": {...}}
    assert error["type"] == "invalid_request_error"
    return error


def test_removed_and_unknown_fields_are_refused(client):
    chat, completion = client.chat.completions.create, client.completions.create
    cases = [  # (structured outputs and tools themselves: test_server_structured.py)
        (chat, dict(messages=MESSAGES, extra_body={"guided_json": {"type": "object"}}), "guided_json",
         "guided_json is not supported yet"),
        (completion, dict(prompt="hi", extra_body={"guided_regex": "[ab]"}), "guided_regex",
         "guided_regex is not supported yet"),
        (chat, dict(messages=MESSAGES, tools=[{"type": "function", "function": {"name": "f"}}]), "tool_choice",
         "tool_choice='auto'"),
        (completion, dict(prompt="hi", extra_body={"tools": [{"type": "function", "function": {"name": "f"}}]}),
         "tools", "tools is not supported yet"),
        (chat, dict(messages=MESSAGES, extra_body={"foo": 1}), "foo", "unknown field 'foo'"),
        (completion, dict(prompt="hi", extra_body={"max_completion_tokens": 3}), "max_completion_tokens",
         "unknown field 'max_completion_tokens'"),
        (completion, dict(prompt="hi", extra_body={"use_beam_search": True}), "use_beam_search",
         "use_beam_search is not supported yet"),
        (chat, dict(messages=MESSAGES, store=True), "store", "store is not supported yet"),
        (chat, dict(messages=MESSAGES, stream=True, stream_options={"include_usage": True, "bogus": 1}),
         "stream_options.bogus", "unknown field 'stream_options.bogus'"),
        (completion, dict(prompt="hi", stream=True, stream_options={"continuous_usage_stats": True}),
         "stream_options.continuous_usage_stats", "continuous_usage_stats is not supported yet"),
        (completion, dict(prompt="hi", logit_bias={"5": 10}), "logit_bias", "logit_bias is not supported yet"),
    ]
    for create, kwargs, param, text in cases:
        error = _bad_request(create, **kwargs)
        assert error["param"] == param and text in error["message"], (kwargs, error)


def test_the_clients_default_and_harmless_fields_are_accepted(client, server):
    harmless = dict(user="someone", metadata={"team": "a"}, store=False, service_tier="auto",
                    parallel_tool_calls=False, response_format={"type": "text"}, tool_choice="none", logprobs=False,
                    prompt_cache_key="k", safety_identifier="s")
    resp = client.chat.completions.create(model=SERVED_NAME, messages=MESSAGES, max_tokens=4, **harmless)
    assert resp.choices[0].message.content is not None
    neutral = {"structured_outputs": None, "use_beam_search": False, "length_penalty": 1.0, "priority": 0,
               "top_k": 5, "repetition_penalty": 1.0, "add_special_tokens": True, "bad_words": []}
    resp = client.completions.create(model=SERVED_NAME, prompt="hi", max_tokens=4, user="someone",
                                     extra_body=neutral)
    assert resp.usage.completion_tokens >= 1
    chunks = list(client.chat.completions.create(
        model=SERVED_NAME, messages=MESSAGES, max_tokens=4, stream=True, user="someone",
        stream_options={"include_usage": True, "include_obfuscation": False}))
    assert chunks[-1].usage.completion_tokens >= 1


def test_refusals_leave_the_server_serving(client, server):
    for _ in range(3):
        _bad_request(client.chat.completions.create, messages=MESSAGES, extra_body={"structured_outputs": {}})
        _bad_request(client.completions.create, prompt="hi", extra_body={"nope": True})
    resp = client.completions.create(model=SERVED_NAME, prompt=PROMPTS[1], max_tokens=4, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert len(resp.choices) == 1 and resp.usage.completion_tokens == 4
    with urllib.request.urlopen(server + "/health", timeout=5) as health:
        assert health.status == 200
    assert _ok(server, "/tokenize", {"prompt": "hi"})["count"] > 0
