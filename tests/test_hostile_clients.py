"""One bad request never hurts another: every class of hostile input, sent while healthy streams run.

A dedicated server (small limits, request chat templates trusted so the
sandbox is exercised) serves 6 healthy greedy streams while every probe of
``PROBES`` and the slow-client probes run. Checks: each bad request gets its
4xx naming the field, each healthy stream gets exactly its solo text,
``/health`` answers within 100 ms throughout, and the KV cache is empty after.
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from conftest import API_KEY, PROMPTS, SERVED_NAME, start_server, stop_server
from test_server import wait_idle
from test_server_errors import call, chat, completion

BODY_LIMIT = 64 * 1024
FLAGS = ["--max-request-body-bytes", str(BODY_LIMIT), "--header-read-timeout", "1", "--body-read-timeout", "1",
         "--trust-request-chat-template", "--chat-template-timeout", "1", "--max-n", "8", "--max-prompts", "4"]
SLOW_TEMPLATE = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
HUGE_TEMPLATE = "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}"

# name: (path, body, expected status, expected param)
PROBES = {
    "seed + n overflows int64": ("/v1/completions", completion(seed=2**63 - 1, n=2), 400, "seed"),
    "top_k of 2**64": ("/v1/completions", completion(top_k=2**64), 400, "top_k"),
    "stop_token_ids outside the vocabulary": ("/v1/completions", completion(stop_token_ids=[10**6], min_tokens=2),
                                              400, "stop_token_ids"),
    "negative stop token": ("/v1/completions", completion(stop_token_ids=[-1]), 400, "stop_token_ids"),
    "max_tokens past int64": ("/v1/completions", completion(max_tokens=2**70), 400, "max_tokens"),
    "prompt ids past int64": ("/v1/completions", completion(prompt=[2**70]), 400, "prompt"),
    "NaN temperature": ("/v1/completions", completion(temperature=float("nan")), 400, "temperature"),
    "lone surrogate in prompt": ("/v1/completions", completion(prompt="hi \ud800"), 400, "prompt"),
    "lone surrogate in a prompt list": ("/v1/completions", completion(prompt=["ok", "\udfff"]), 400, "prompt"),
    "lone surrogate in chat": ("/v1/chat/completions", chat(messages=[{"role": "user", "content": "\ud800"}]),
                               400, "messages[0]"),
    "lone surrogate in stop": ("/v1/completions", completion(stop=["\ud800"]), 400, "stop"),
    "top_logprobs without logprobs": ("/v1/chat/completions", chat(top_logprobs=2), 400, "top_logprobs"),
    "stream_options without stream": ("/v1/completions", completion(stream_options={"include_usage": True}), 400,
                                      "stream_options"),
    "min_tokens > max_tokens": ("/v1/completions", completion(min_tokens=9, max_tokens=4), 400, "min_tokens"),
    "n past max_n": ("/v1/completions", completion(n=9), 400, "n"),
    "prompts past max_prompts": ("/v1/completions", completion(prompt=["a"] * 5), 400, "prompt"),
    "logprobs past max_logprobs": ("/v1/completions", completion(logprobs=21), 400, "logprobs"),
    "chat top_logprobs past max_logprobs": ("/v1/chat/completions", chat(logprobs=True, top_logprobs=21), 400,
                                            "top_logprobs"),
    "too many stop strings": ("/v1/completions", completion(stop=[f"s{i}" for i in range(65)]), 400, "stop"),
    "stop string too long": ("/v1/completions", completion(stop=["x" * 1025]), 400, "stop"),
    "body past the limit": ("/v1/completions", completion(prompt="word " * BODY_LIMIT), 413, None),
    "slow chat template": ("/v1/chat/completions", chat(chat_template=SLOW_TEMPLATE), 400, "chat_template"),
    "huge chat template output": ("/v1/chat/completions", chat(chat_template=HUGE_TEMPLATE), 400, "chat_template"),
    "template kwargs override tokenize": ("/v1/chat/completions", chat(chat_template_kwargs={"tokenize": True}),
                                          400, "chat_template_kwargs"),
}


@pytest.fixture(scope="module")
def server_proc(tiny_model_dir, tmp_path_factory):
    proc, url = start_server(tiny_model_dir, tmp_path_factory.mktemp("hostile") / "serve.log", FLAGS)
    proc.url = url
    yield proc
    stop_server(proc)


@pytest.fixture(scope="module")
def server(server_proc):
    return server_proc.url


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


class HealthWatch(threading.Thread):
    """Polls ``/health`` and ``/metrics`` in turn every 20 ms; ``worst`` is the slowest answer seen (s)."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.worst, self.failures, self.running = url, 0.0, 0, True

    def run(self) -> None:
        paths = ("/health", "/metrics")
        while self.running:
            start = time.perf_counter()
            paths = paths[::-1]
            try:
                with urllib.request.urlopen(self.url + paths[0], timeout=5) as resp:
                    assert resp.status == 200
            except Exception:  # noqa: BLE001 - counted, asserted by the test
                self.failures += 1
            self.worst = max(self.worst, time.perf_counter() - start)
            time.sleep(0.02)


def _stream_text(url: str, prompt: str) -> str:
    body = completion(prompt=prompt, max_tokens=48, temperature=0, ignore_eos=True, stream=True)
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    text = []
    with urllib.request.urlopen(req, timeout=120) as resp:
        for line in resp:
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                text.extend(c["text"] for c in chunk["choices"])
    return "".join(text)


def _healthy_streams(url: str, prompts: list[str]) -> tuple[list[threading.Thread], dict[int, str]]:
    texts: dict[int, str] = {}

    def run(i: int) -> None:
        texts[i] = _stream_text(url, prompts[i])

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    return threads, texts


def _send_raw(url: str, data: bytes, wait: float) -> bytes:
    """Send ``data`` on a new connection, then read until the server closes it (or ``wait`` passes)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as sock:
        sock.sendall(data)
        chunks = []
        try:
            while chunk := sock.recv(4096):
                chunks.append(chunk)
        except TimeoutError:
            chunks.append(b"<still open>")
    return b"".join(chunks)


def _slow_client_probes(url: str) -> None:
    # headers never finished: the connection is closed after --header-read-timeout (1 s)
    start = time.monotonic()
    assert _send_raw(url, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", wait=5) == b""
    assert time.monotonic() - start < 3
    # body announced but never sent: 408 after --body-read-timeout (1 s)
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"prompt\": ")
    reply = _send_raw(url, head.encode(), wait=5)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:80]
    # a bearer token with a non-ASCII byte, and malformed Authorization headers: 401, never 500
    for header in (b"Bearer caf\xc3\xa9-\xff", b"Bearer", b"Basic abc", b"", b"Bearer  " + API_KEY.encode() + b"x"):
        request = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: " + header + b"\r\n\r\n"
        reply = _send_raw(url, request, wait=5)
        assert reply.startswith(b"HTTP/1.1 401"), (header, reply[:80])


def test_an_unauthenticated_request_gets_its_401_before_its_body(server):
    """A 20 MB body without the key: the 401 comes as soon as the headers are read, with only a part of
    the body sent, and the server goes on serving."""
    host, port = server.removeprefix("http://").split(":")
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {20 * 1024 * 1024}\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        start = time.monotonic()
        sock.sendall(head + b"{\"prompt\": \"" + b"a" * 65536)
        reply = b""
        while b"invalid_api_key" not in reply and (chunk := sock.recv(65536)):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 401") and b"invalid_api_key" in reply, reply[:200]
    assert time.monotonic() - start < 2
    assert call(server, "/v1/models")[0] == 200


def test_a_whole_unauthenticated_upload_reads_its_401(server):
    """A client that sends all of a 20 MB body without the key reads its 401 to the end (the server
    drains the rest before it closes: a lingering close), never a connection reset."""
    host, port = server.removeprefix("http://").split(":")
    body = b"{\"prompt\": \"" + b"a" * (20 * 1024 * 1024) + b"\"}"
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + body)  # the 401 went out once the headers were read; the rest is drained
        reply = b""
        while chunk := sock.recv(65536):  # to the server's end of stream
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 401") and reply.rstrip().endswith(b"}"), reply[:200]
    assert b"invalid_api_key" in reply and call(server, "/v1/models")[0] == 200


def test_bad_requests_fail_alone_while_healthy_streams_run(server, server_proc):
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(6)]
    solo = [_stream_text(server, p) for p in prompts]
    rss_before = _rss_mib(server_proc.pid)
    watch = HealthWatch(server)
    watch.start()
    threads, texts = _healthy_streams(server, prompts)
    try:
        for name, (path, body, status, param) in PROBES.items():
            got, payload = call(server, path, body)
            assert got == status, (name, payload)
            assert payload["error"]["param"] == param, (name, payload)
        _slow_client_probes(server)
    finally:
        for thread in threads:
            thread.join(timeout=120)
        watch.running = False
        watch.join()
    assert [texts.get(i) for i in range(len(prompts))] == solo
    assert watch.failures == 0 and watch.worst < 0.1, f"/health or /metrics took {watch.worst * 1000:.0f} ms"
    m = wait_idle(server)
    assert m["vllm:kv_cache_usage_perc"] == 0 and m["vllm:num_requests_running"] == 0
    rss_after = _rss_mib(server_proc.pid)
    print(f"\n{len(PROBES)} request probes + 8 connection probes; "
          f"worst /health or /metrics {watch.worst * 1000:.1f} ms; "
          f"server RSS {rss_before:.0f} -> {rss_after:.0f} MiB")
    assert rss_after - rss_before < 512


JSON_VALUES = st.one_of(
    st.integers(-3, 40), st.integers(-2**70, 2**70), st.sampled_from([2**63 - 1, 2**63, -2**63 - 1, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False), st.booleans(), st.none(),
    st.text(st.characters(codec=None, categories=["L", "N", "P", "Zs", "Cs"]), max_size=8),
    st.lists(st.integers(-2, 2**64), max_size=3), st.lists(st.text(max_size=3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(-5, 5), max_size=2))
FIELDS = ["prompt", "n", "max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
          "stop_token_ids", "logprobs", "echo", "best_of", "presence_penalty", "frequency_penalty",
          "repetition_penalty", "ignore_eos", "stream", "stream_options", "logit_bias", "suffix", "user"]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(fields=st.dictionaries(st.sampled_from(FIELDS), JSON_VALUES, max_size=5))
def test_fuzzed_completion_requests_never_get_500(server, fields):
    body = {"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 2, **fields}
    status, payload = call(server, "/v1/completions", body)
    assert status in (200, 400, 404, 413), (body, status, payload)
    if status == 400:
        assert payload["error"]["param"], (body, payload)


def test_server_is_idle_after_the_fuzzing(server):
    m = wait_idle(server)
    assert m["vllm:kv_cache_usage_perc"] == 0 and m["vllm:num_requests_running"] == 0


def test_a_trusted_request_chat_template_is_rendered(server):
    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant]"
    status, payload = call(server, "/v1/chat/completions", chat(chat_template=template, max_tokens=2))
    assert status == 200, payload
    assert payload["usage"]["prompt_tokens"] > 0


def test_request_chat_templates_are_refused_by_default(api_server):
    for body in (chat(chat_template="{{ messages }}"), chat(chat_template_kwargs={"chat_template": "x"})):
        status, payload = call(api_server, "/v1/chat/completions", body)
        assert status == 400 and payload["error"]["param"] in ("chat_template", "chat_template_kwargs.chat_template")
        assert "--trust-request-chat-template" in payload["error"]["message"]


def test_docs_need_the_key_and_models_reveal_no_paths(api_server, tiny_model_dir):
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert call(api_server, path, key=None)[0] == 401
        assert call(api_server, path)[0] == 200
    _, models = call(api_server, "/v1/models")
    assert str(tiny_model_dir) not in json.dumps(models)
    assert models["data"][0]["root"] == SERVED_NAME


def test_a_response_the_client_never_reads_is_abandoned_after_send_timeout():
    from draftwise.server.guards import RequestGuard

    finished = []

    async def app(scope, receive, send):
        try:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for _ in range(100):
                await send({"type": "http.response.body", "body": b"data", "more_body": True})
        finally:  # a handler's finally is where it aborts its engine requests
            finished.append(True)

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        if message["type"] == "http.response.body":
            await asyncio.Event().wait()  # the client never reads: uvicorn's send waits forever

    guard = RequestGuard(app, max_request_body_bytes=1024, body_read_timeout=1.0, send_timeout=0.2)
    start = time.monotonic()
    asyncio.run(guard({"type": "http", "headers": [], "method": "POST", "path": "/v1/completions"}, receive, send))
    assert finished and time.monotonic() - start < 2
