"""``draftwise serve --tensor-parallel-size 2`` through the official ``openai`` client on 127.0.0.1 (tiny
model, fp32, ngram speculation, as ``test_server.py``): greedy texts equal the single-rank ``LLM``'s;
a tensor-parallel worker killed while a request streams fails it with a 500, and the server exits
non-zero (a supervisor restarts it) with no worker left behind."""
from __future__ import annotations

import asyncio
import os
import re
import signal
import time

import openai
import pytest
from conftest import API_KEY, PROMPTS, SERVED_NAME, start_server, stop_server

from draftwise import SamplingParams


@pytest.fixture(scope="module")
def tp_server(tiny_model_dir, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("tp-server") / "serve.log"
    proc, url = start_server(tiny_model_dir, log_path,
                             ["--tensor-parallel-size", "2", "--device", "cpu", "--log-level", "info"])
    yield proc, url, log_path
    stop_server(proc)


def worker_pid(log_path) -> int:
    match = re.search(r"tensor-parallel workers started \(mp\): rank 1 pid (\d+)", open(log_path).read())
    assert match, "the server logs its workers' pids"
    return int(match.group(1))


def test_tp2_server_texts_equal_llm(tp_server, tiny_llm):
    _, url, _ = tp_server
    client = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    expected = tiny_llm.generate(PROMPTS[:4], SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)

    async def all_at_once():
        aclient = openai.AsyncOpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
        return await asyncio.gather(*(aclient.completions.create(model=SERVED_NAME, prompt=p, max_tokens=24,
                                                                 temperature=0) for p in PROMPTS[:4]))

    got = asyncio.run(all_at_once())
    assert [r.choices[0].text for r in got] == [o.outputs[0].text for o in expected]
    one = client.completions.create(model=SERVED_NAME, prompt=PROMPTS[0], max_tokens=24, temperature=0)
    assert one.choices[0].text == expected[0].outputs[0].text


def test_killed_worker_fails_the_stream_and_the_server_exits_nonzero(tp_server):
    """Last: it ends the module's server."""
    proc, url, log_path = tp_server
    pid = worker_pid(log_path)
    client = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    stream = client.completions.create(model=SERVED_NAME, prompt=PROMPTS[0], max_tokens=480, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    chunks = iter(stream)
    next(chunks)  # the request runs
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    with pytest.raises(openai.APIError):
        for _ in chunks:
            pass
    assert time.monotonic() - killed < 10
    assert proc.wait(timeout=60) != 0
    log = open(log_path).read()
    assert f"tensor-parallel worker rank 1 (pid {pid}) was killed by signal 9" in log
