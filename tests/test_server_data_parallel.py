"""``draftwise serve --data-parallel-size 2``: two engine replicas (processes of their own) behind one
server, through the official ``openai`` client on 127.0.0.1 (tiny model, fp32, ngram speculation, as
``test_server.py``; on the CPU, so that a one-GPU machine runs it too: each replica would need a GPU
of its own). Greedy texts equal a single engine's; requests spread over both replicas (seen in
``/metrics``' per-replica series, vLLM's ``engine`` label) and their counts add up; a bad request is a
400 while others stream; a killed replica fails its requests in flight with 500 and the server exits
non-zero (the module's last test: it ends the server)."""
from __future__ import annotations

import asyncio
import os
import re
import signal
import time
import urllib.request

import openai
import pytest
from conftest import API_KEY, PROMPTS, SERVED_NAME, free_port, start_server, stop_server
from prometheus_client.parser import text_string_to_metric_families

from draftwise import LLM, SamplingParams
from draftwise.cli import main

SUCCESS = "vllm:request_success_total"


@pytest.fixture(scope="module")
def dp_server(tiny_model_dir, tmp_path_factory):
    """``(process, base URL, log path)`` of a server with two replicas (log lines every second)."""
    log_path = tmp_path_factory.mktemp("dp-server") / "serve.log"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("VLLM_LOG_STATS_INTERVAL", "1")
        proc, url = start_server(tiny_model_dir, log_path, ["--data-parallel-size", "2", "--device", "cpu",
                                                            "--log-level", "info"])
    yield proc, url, log_path
    stop_server(proc)


@pytest.fixture(scope="module")
def cpu_llm(request, tiny_model_dir):
    """The single engine to compare with, on the CPU as the server's replicas."""
    import torch

    if not torch.cuda.is_available():
        return request.getfixturevalue("tiny_llm")  # (on the CPU already)
    return LLM(model=str(tiny_model_dir), dtype="float32", seed=0, device="cpu")


def aclient(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def scrape(url: str) -> dict[str, dict[str, float]]:
    """``/metrics`` per replica: {engine label: {sample name with its other labels but model_name: value}}."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    engines: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k not in ("model_name", "engine"))
            engines.setdefault(s.labels["engine"], {})[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return engines


def finished(engine: dict[str, float]) -> float:
    return sum(value for name, value in engine.items() if name.startswith(SUCCESS))


def wait_for(url: str, ready, timeout: float = 30.0) -> dict[str, dict[str, float]]:
    """Scrape until ``ready(scrape)``; the last scrape (fails after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        metrics = scrape(url)
        if ready(metrics):
            return metrics
        assert time.monotonic() < deadline, f"/metrics never got there: {metrics}"
        time.sleep(0.02)


def idle(metrics) -> bool:
    return all(m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
               and m["vllm:kv_cache_usage_perc"] == 0 for m in metrics.values())


def replica_pids(log_path) -> dict[int, int]:
    found = re.findall(r"data-parallel replica (\d+) runs in process (\d+)", open(log_path).read())
    return {int(index): int(pid) for index, pid in found}


async def stream_text(client: openai.AsyncOpenAI, prompt, max_tokens: int, started: asyncio.Event | None = None):
    stream = await client.completions.create(model=SERVED_NAME, prompt=prompt, max_tokens=max_tokens,
                                             temperature=0, stream=True, extra_body={"ignore_eos": True})
    text = []
    async for chunk in stream:
        if started is not None:
            started.set()
        text += [chunk.choices[0].text] if chunk.choices else []
    return "".join(text)


def test_16_concurrent_streams_spread_over_both_replicas(dp_server, cpu_llm):
    _, url, log_path = dp_server
    assert sorted(replica_pids(log_path)) == [0, 1]
    before = scrape(url)
    assert sorted(before) == ["0", "1"]  # one series per replica, as vLLM's DP server
    prompts = [f"{PROMPTS[i % len(PROMPTS)]} {i}" for i in range(16)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    expected = [o.outputs[0].text for o in cpu_llm.generate(prompts, params, use_tqdm=False)]
    client = aclient(url)

    async def run_all() -> list[str]:
        return await asyncio.wait_for(asyncio.gather(*(stream_text(client, p, 24) for p in prompts)), 120)

    assert asyncio.run(run_all()) == expected
    after = wait_for(url, idle)
    done = {engine: finished(after[engine]) - finished(before[engine]) for engine in after}
    assert done["0"] > 0 and done["1"] > 0, done  # both replicas served some
    assert sum(done.values()) == 16  # summed over replicas: every request once
    generated = sum(after[e]["vllm:generation_tokens_total"] - before[e]["vllm:generation_tokens_total"]
                    for e in after)
    assert generated == 16 * 24
    deadline = time.monotonic() + 10  # each replica logs its own interval lines, as vLLM's "Engine 00i"
    while not all(re.search(rf"Engine 00{i}: Avg prompt throughput: [0-9.]+ tokens/s, Avg generation "
                            r"throughput: [1-9]", open(log_path).read()) for i in (0, 1)):
        assert time.monotonic() < deadline, "no 'Engine 000'/'Engine 001' lines with tokens in the log"
        time.sleep(0.2)


def test_bad_request_is_400_while_others_stream(dp_server, cpu_llm):
    _, url, _ = dp_server
    prompts = PROMPTS[:4]
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    expected = [o.outputs[0].text for o in cpu_llm.generate(prompts, params, use_tqdm=False)]
    client = aclient(url)

    async def scenario():
        started = [asyncio.Event() for _ in prompts]
        streams = [asyncio.create_task(stream_text(client, p, 64, s)) for p, s in zip(prompts, started)]
        await asyncio.wait_for(asyncio.gather(*(s.wait() for s in started)), 60)  # all four in flight
        with pytest.raises(openai.BadRequestError) as bad:  # token ids outside the vocabulary: a replica's
            await client.completions.create(model=SERVED_NAME, prompt=[10 ** 7], max_tokens=4)  # ValueError
        return bad.value, await asyncio.wait_for(asyncio.gather(*streams), 120)

    error, texts = asyncio.run(scenario())
    assert error.status_code == 400
    assert error.body["param"] == "prompt" and "prompt_token_ids must be in [0," in error.body["message"]
    assert texts == expected
    wait_for(url, idle)


def test_offline_data_parallel_is_refused_naming_the_field(tiny_model_dir):
    with pytest.raises(ValueError, match=r"data_parallel_size=2 cannot run here: .*`draftwise serve`"):
        LLM(model=str(tiny_model_dir), data_parallel_size=2)


@pytest.mark.parametrize("flags, needle", [
    (["--data-parallel-size", "0"], "data_parallel_size=0"),
    (["--data-parallel-size", "4", "--data-parallel-size-local", "2"], "other nodes"),
    (["--data-parallel-size", "2", "--data-parallel-start-rank", "2"], "data_parallel_start_rank=2"),
    (["--data-parallel-size", "2", "--data-parallel-rank", "1"], "data_parallel_rank=1"),
])
def test_multi_node_layouts_exit_before_binding(tiny_model_dir, flags, needle, capsys):
    assert main(["serve", str(tiny_model_dir), "--port", str(free_port()), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("draftwise: error:") and needle in err and err.count("\n") == 1


def test_killed_replica_fails_its_requests_and_the_server_exits_nonzero(dp_server):
    """Last: it ends the module's server. Request A goes to replica 0 (both idle: the lowest index),
    B to replica 1 (the least loaded); SIGKILL replica 1 while B runs."""
    proc, url, log_path = dp_server
    pids = replica_pids(log_path)
    client = aclient(url)
    long = dict(model=SERVED_NAME, prompt=PROMPTS[0], max_tokens=480, n=16, temperature=0,
                extra_body={"ignore_eos": True})

    def running(engine: str):
        return lambda metrics: metrics[engine]["vllm:num_requests_running"] == 1

    async def scenario():
        a = asyncio.create_task(client.completions.create(**long))
        await asyncio.to_thread(wait_for, url, running("0"))
        b = asyncio.create_task(client.completions.create(**long))
        await asyncio.to_thread(wait_for, url, running("1"))
        os.kill(pids[1], signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(openai.InternalServerError) as failed:
            await asyncio.wait_for(b, 30)
        waited = time.monotonic() - killed
        await asyncio.gather(a, return_exceptions=True)  # (it finishes, or the shutdown cuts it)
        return failed.value, waited

    error, waited = asyncio.run(scenario())
    assert error.status_code == 500 and error.body["type"] == "server_error" and waited < 10
    assert str(pids[1]) not in error.body["message"]  # the log names what died, the client gets no details
    assert proc.wait(timeout=60) != 0  # a supervisor restarts it
    log = open(log_path).read()
    assert re.search(rf"data-parallel replica 1 \(pid {pids[1]}\) exited \(killed by SIGKILL\)", log)
    for pid in pids.values():  # no replica outlives the server
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
