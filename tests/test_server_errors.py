"""Bad input to the server: OpenAI-format errors, API key, start-up failures, and a failing step.
Every error leaves the server serving everyone else."""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest
from conftest import API_KEY, PROMPTS, SERVED_NAME, app_server, free_port

from draftwise.cli import main


def call(url: str, path: str, body=None, key: str | None = API_KEY, method: str | None = None):
    """(status, parsed JSON body or None). ``body`` may be a dict or raw bytes."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw, status = resp.read(), resp.status
    except urllib.error.HTTPError as err:
        raw, status = err.read(), err.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, None


def completion(**fields) -> dict:
    return {"model": SERVED_NAME, "prompt": PROMPTS[1], "max_tokens": 4, **fields}


def chat(**fields) -> dict:
    return {"model": SERVED_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}


BAD_REQUESTS = {
    "malformed json": ("/v1/completions", b'{"prompt": "x",', 400, None),
    "not an object": ("/v1/completions", b"[1, 2]", 400, None),
    "missing prompt": ("/v1/completions", {"model": SERVED_NAME}, 400, "prompt"),
    "unknown model": ("/v1/completions", completion(model="gpt-4"), 404, "model"),
    "negative max_tokens": ("/v1/completions", completion(max_tokens=-5), 400, "max_tokens"),
    "temperature too high": ("/v1/completions", completion(temperature=2.5), 400, "temperature"),
    "negative temperature": ("/v1/chat/completions", chat(temperature=-0.1), 400, "temperature"),
    "top_p zero": ("/v1/completions", completion(top_p=0), 400, "top_p"),
    "n zero": ("/v1/completions", completion(n=0), 400, "n"),
    "penalty out of range": ("/v1/completions", completion(presence_penalty=3), 400, "presence_penalty"),
    "prompt too long": ("/v1/completions", completion(prompt="hello " * 600), 400, "prompt"),
    "max_tokens past context": ("/v1/completions", completion(max_tokens=100000), 400, "max_tokens"),
    "chat past context": ("/v1/chat/completions", chat(max_tokens=100000), 400, "max_tokens"),
    "prompt ids out of vocab": ("/v1/completions", completion(prompt=[10**7]), 400, "prompt"),
    "empty messages": ("/v1/chat/completions", chat(messages=[]), 400, "messages"),
    "suffix": ("/v1/completions", completion(suffix="end"), 400, "suffix"),
    "best_of": ("/v1/completions", completion(best_of=3), 400, "best_of"),
    "logit_bias": ("/v1/completions", completion(logit_bias={"5": 10}), 400, "logit_bias"),
    "json schema": ("/v1/chat/completions", chat(response_format={"type": "json_schema"}), 400,
                    "response_format"),
    "tools with auto": ("/v1/chat/completions", chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400,
                        "tool_choice"),
    "image content": ("/v1/chat/completions",
                      chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
                      400, "messages"),
    "top_logprobs too many": ("/v1/chat/completions", chat(logprobs=True, top_logprobs=50), 400,
                              "top_logprobs"),
    "wrong type": ("/v1/completions", completion(max_tokens="many"), 400, "max_tokens"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_request_gets_openai_error(api_server, case):
    path, body, status, param = BAD_REQUESTS[case]
    got, payload = call(api_server, path, body)
    assert got == status, payload
    error = payload["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param or (error["param"] or "").startswith(param), error
    # ... and the server still serves a good request
    ok, good = call(api_server, "/v1/completions", completion())
    assert ok == 200 and good["choices"][0]["text"] is not None


def test_api_key_required_on_v1_only(api_server):
    for key in (None, "wrong-key"):
        status, payload = call(api_server, "/v1/models", key=key)
        assert status == 401 and payload["error"]["code"] == "invalid_api_key"
        status, _ = call(api_server, "/v1/completions", completion(), key=key)
        assert status == 401
    assert call(api_server, "/health", key=None)[0] == 200
    assert call(api_server, "/v1/models")[0] == 200


def test_unknown_route_is_openai_404(api_server):
    status, payload = call(api_server, "/v1/nothing-here", key=API_KEY)
    assert status == 404 and "error" in payload


@pytest.mark.parametrize("argv, needle", [
    (["serve", "/no/such/model"], "cannot load model"),
    (["serve", "--speculative-config", "{not json"], "--speculative-config is not valid JSON"),
    (["serve", "-sc", '{"method": "ngram", "num_speculative_tokens": 0}'], "num_speculative_tokens"),
    (["serve", "--additional-config", '{"nope": 1}'], "additional_config key 'nope'"),
    (["serve", "--tensor-parallel-size", "4"], "tensor_parallel_size=4 cannot split this model"),
])
def test_serve_bad_flags_exit_before_binding(argv, needle, capsys):
    port = free_port()
    assert main(argv + ["--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("draftwise: error:") and needle in err and err.count("\n") == 1


def test_failing_step_fails_its_request_with_500_and_server_keeps_serving(tiny_model_dir):
    from transformers import AutoTokenizer

    from draftwise.config import EngineConfig
    from draftwise.engine.engine import LLMEngine
    from draftwise.server.app import build_app
    from draftwise.server.async_engine import AsyncEngine

    engine = LLMEngine(EngineConfig(model=str(tiny_model_dir), dtype="float32"))
    real_step, calls = engine.step, {"n": 0}

    def step_failing_once():
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected fault")
        return real_step()

    engine.step = step_failing_once
    app = build_app(AsyncEngine(engine), ["tiny"], AutoTokenizer.from_pretrained(tiny_model_dir))
    with app_server(app) as url:
        body = {"prompt": "hello", "max_tokens": 4}
        status, payload = call(url, "/v1/completions", body, key=None)
        assert status == 500 and payload["error"]["type"] == "server_error"
        assert "injected fault" not in payload["error"]["message"]  # the log has it, the client does not
        status, payload = call(url, "/v1/completions", body, key=None)
        assert status == 200 and len(payload["choices"]) == 1
        assert engine.block_manager.usage == 0 and not engine.has_unfinished_requests()


def test_engine_is_built_and_stepped_on_one_thread(tiny_model_dir):
    """The server builds its engine on the thread that steps it (one OpenMP team), and an engine
    that cannot be built raises in the caller, before any port is bound."""
    import asyncio

    from draftwise.config import EngineConfig
    from draftwise.engine.engine import LLMEngine
    from draftwise.sampling_params import SamplingParams
    from draftwise.server.async_engine import AsyncEngine

    threads = []

    def make_engine():
        threads.append(threading.current_thread())
        engine = LLMEngine(EngineConfig(model=str(tiny_model_dir), dtype="float32"))
        real_step = engine.step
        engine.step = lambda: threads.append(threading.current_thread()) or real_step()
        return engine

    async_engine = AsyncEngine.build(make_engine)
    async_engine.start()

    async def generate():
        handle = await async_engine.add_request("one-thread", "hello", SamplingParams(max_tokens=4))
        return [out async for out in handle.outputs()][-1]

    try:
        assert len(asyncio.run(generate()).outputs[0].token_ids) == 4
    finally:
        async_engine.stop()
    assert threads[0] is not threading.main_thread() and len(threads) > 2
    assert all(t is threads[0] for t in threads)
    with pytest.raises(ValueError, match="max_model_len"):
        AsyncEngine.build(lambda: LLMEngine(EngineConfig(model=str(tiny_model_dir), max_model_len=10 ** 9)))
