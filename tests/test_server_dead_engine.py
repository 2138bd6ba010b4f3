"""A dead engine ends the server; a failed step does not.

``EngineDeadError`` (``draftwise/errors.py``) is what an engine raises when a part of it outside the
process died (a tensor-parallel worker). ``AsyncEngine`` then fails every request in flight with it
(a 500 in OpenAI's format), refuses new ones, ends its loop and calls ``on_dead`` (``launch.py`` stops
uvicorn there and exits 1; ``test_server_data_parallel.py`` sees that end to end with a killed
replica). An ordinary exception from a step still fails only the requests in it and the loop goes on.
The engines here are real ones whose ``step`` raises from its Nth call on.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from conftest import PROMPTS, free_port

from draftwise.config import EngineConfig
from draftwise.engine.engine import LLMEngine
from draftwise.errors import EngineDeadError
from draftwise.sampling_params import SamplingParams
from draftwise.server.async_engine import AsyncEngine, RequestFailed

DEATH = "tensor-parallel worker 1 (pid 4242) exited: killed by SIGKILL"


class FailingEngine(LLMEngine):
    """An engine whose ``step`` raises ``error()`` from its ``fail_at``-th call on (``once``: that call only)."""

    def __init__(self, config: EngineConfig, fail_at: int, error, once: bool = False):
        super().__init__(config)
        self.fail_at, self.error, self.once = fail_at, error, once
        self.steps = 0

    def step(self):
        self.steps += 1
        if self.steps == self.fail_at or (self.steps > self.fail_at and not self.once):
            raise self.error()
        return super().step()


def engine(tiny_model_dir, fail_at: int, error, once: bool = False) -> FailingEngine:
    return FailingEngine(EngineConfig(model=str(tiny_model_dir), dtype="float32"), fail_at, error, once)


async def run(async_engine: AsyncEngine, request_id: str, max_tokens: int = 40):
    """The request's outputs, then what ended it (None: finished)."""
    handle = await async_engine.add_request(request_id, PROMPTS[0], SamplingParams(max_tokens=max_tokens,
                                                                                  ignore_eos=True))
    outputs = []
    try:
        async for out in handle.outputs():
            outputs.append(out)
    except Exception as exc:
        return outputs, exc
    return outputs, None


def test_engine_dead_error_fails_requests_in_flight_and_ends_the_loop(tiny_model_dir):
    async_engine = AsyncEngine(engine(tiny_model_dir, 3, lambda: EngineDeadError(DEATH)))
    called = []
    async_engine.on_dead = lambda: called.append(threading.current_thread())
    async_engine.start()

    async def scenario():
        results = await asyncio.gather(*(run(async_engine, f"r{i}") for i in range(3)))
        with pytest.raises(EngineDeadError):  # refused after: nothing is served by a dead engine
            await async_engine.add_request("late", PROMPTS[1], SamplingParams(max_tokens=4))
        return results

    try:
        results = asyncio.run(asyncio.wait_for(scenario(), 60))
        async_engine._thread.join(timeout=10)
        assert not async_engine._thread.is_alive()  # the loop ended
    finally:
        async_engine.stop()
    for outputs, ended in results:
        assert isinstance(ended, EngineDeadError) and str(ended) == DEATH
        assert len(outputs) <= 2 and not any(out.finished for out in outputs)  # two steps ran, the third died
    assert isinstance(async_engine.dead, EngineDeadError)
    assert called == [async_engine._thread]  # once, on the engine thread


def test_ordinary_step_error_fails_its_requests_and_the_loop_goes_on(tiny_model_dir):
    async_engine = AsyncEngine(engine(tiny_model_dir, 2, lambda: RuntimeError("injected"), once=True))
    async_engine.on_dead = lambda: pytest.fail("a failed step is not a dead engine")
    async_engine.start()
    try:
        first_outputs, first_end = asyncio.run(run(async_engine, "fails"))
        second_outputs, second_end = asyncio.run(run(async_engine, "runs", max_tokens=8))
    finally:
        async_engine.stop()
    assert isinstance(first_end, RequestFailed) and len(first_outputs) <= 1
    assert second_end is None and len(second_outputs[-1].outputs[0].token_ids) == 8
    assert async_engine.dead is None


def call(url: str, path: str, body: dict | None = None) -> tuple[int, dict | None]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw, status = resp.read(), resp.status
    except urllib.error.HTTPError as err:
        raw, status = err.read(), err.code
    return status, json.loads(raw) if raw else None


def test_dead_engine_over_http_is_500_and_health_503(tiny_model_dir):
    """Over HTTP (``build_app``, uvicorn on 127.0.0.1): the requests in flight get a 500 in OpenAI's
    format that does not echo what died, ``/health`` answers 503, a new request gets 500."""
    import uvicorn
    from transformers import AutoTokenizer

    from draftwise.server.app import build_app

    async_engine = AsyncEngine(engine(tiny_model_dir, 3, lambda: EngineDeadError(DEATH)))
    died = threading.Event()
    async_engine.on_dead = died.set  # (launch.py stops uvicorn here; this test looks at the server first)
    app = build_app(async_engine, ["tiny"], AutoTokenizer.from_pretrained(tiny_model_dir))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.config.port}"
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert call(url, "/health")[0] == 200
        body = {"prompt": PROMPTS[0], "max_tokens": 40, "ignore_eos": True}
        answers = []
        clients = [threading.Thread(target=lambda: answers.append(call(url, "/v1/completions", body)))
                   for _ in range(3)]
        for client in clients:
            client.start()
        for client in clients:
            client.join(timeout=60)
        assert died.wait(10)
        assert len(answers) == 3
        for status, payload in answers:
            assert status == 500 and payload["error"]["type"] == "server_error"
            assert "pid 4242" not in payload["error"]["message"]  # the log names what died
        assert call(url, "/health")[0] == 503
        assert call(url, "/v1/completions", body)[0] == 500
    finally:
        server.should_exit = True
        thread.join(timeout=30)
