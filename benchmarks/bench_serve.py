"""Load benchmark of ``draftwise serve``: throughput and latency at several concurrency levels,
with and without speculation, side by side in one run.

One server per method (``none`` = no speculation) is started on 127.0.0.1 before measuring and
all stay up; the methods then take turns at each concurrency level, so the drift of a shared
machine hits them alike. At level ``c``, ``c`` clients stream chat completions (greedy, or
sampled at ``--temperature`` with a seed per request, the same for every method; prompts from
``draftwise.bench.workloads``) until ``max(c, --min-requests)`` requests are done or
``--time-limit`` seconds pass (no new request starts after that). Reported per (level, method):
requests/s, output tokens/s, speedup over ``none``, and percentiles of TTFT (time to the first
content chunk), TPOT (per request: time after the first chunk / tokens after the first) and
ITL (gaps between streamed chunks, vLLM's definition: a chunk may carry several tokens when
drafts were accepted), and from the server's ``/metrics``: the level's prefix-cache hit rate
(prompt tokens read from the cache), the mean acceptance length (1 + accepted drafts per
verified draft) and the draft tokens verified per output token (how much speculation the
draft-length policy kept). The client is a small stdlib SSE reader, to keep its CPU use low.

With ``--turns T`` (> 1) each request is a conversation instead: a system prompt shared by all
conversations, then ``T`` user turns (prompts of the workload), every turn resending the
conversation so far with the answers received, as a chat client does; each turn is a sample.
A method written ``METHOD:nocache`` runs on a server started with ``--no-enable-prefix-caching``,
so prefix caching can be compared side by side.

``--rounds R`` (> 1) measures each level R times, the methods' order reversed every other round
(A B, B A, A B, ...), so a machine that slows down during the run does not favour the method
measured first; every round sends other prompts (shifted by the requests of a round), so a
round does not find the previous one's conversations in the prefix cache. A level's figures
are over all its rounds (tokens/s: all tokens over all seconds):

    python benchmarks/bench_serve.py --methods none,ngram --concurrency 1,8,32
    python benchmarks/bench_serve.py --workload chat --turns 4 --methods none:nocache,none
    python benchmarks/bench_serve.py --workload chat --turns 4 --methods none,suffix --rounds 3
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from draftwise.bench.workloads import SYSTEM_PROMPT, load_workload

COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:spec_decode_num_drafts",
            "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


@dataclass
class Sample:
    ttft: float
    tpot: float | None
    gaps: list[float]
    num_tokens: int
    text: str = ""


@dataclass
class Level:
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0
    counters: dict[str, float] = field(default_factory=dict)  # COUNTERS' increase during the level
    round_tok_s: list[float] = field(default_factory=list)  # tokens/s of each round pooled here

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.samples)

    def ratio(self, numerator: str, denominator: str) -> float:
        den = self.counters.get(denominator, 0.0)
        return self.counters.get(numerator, 0.0) / den if den else float("nan")

    def add(self, other: "Level") -> None:
        """Pool another round of the same level into this one."""
        self.samples.extend(other.samples)
        self.seconds += other.seconds
        for name, value in other.counters.items():
            self.counters[name] = self.counters.get(name, 0.0) + value
        self.round_tok_s.append(other.num_tokens / other.seconds)


async def stream_chat(port: int, body: dict) -> Sample:
    """POST a streaming chat request; time its chunks (HTTP/1.1, chunked transfer encoding)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = json.dumps(body).encode()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(payload), payload))
    start = time.perf_counter()
    status = await reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(f"server answered {status!r}: {await reader.read()!r}")
    while (await reader.readline()) not in (b"\r\n", b""):
        pass
    times, num_tokens, buffer, text = [], 0, b"", []
    while True:
        size = int((await reader.readline()).strip() or b"0", 16)
        if size == 0:
            break
        buffer += (await reader.readexactly(size + 2))[:-2]  # chunk data, then CRLF
        *events, buffer = buffer.split(b"\n\n")
        for event in events:
            data = event.removeprefix(b"data: ").strip()
            if not data or data == b"[DONE]":
                continue
            chunk = json.loads(data)
            if chunk.get("usage"):
                num_tokens = chunk["usage"]["completion_tokens"]
            content = "".join(c["delta"].get("content") or "" for c in chunk["choices"])
            if content:
                times.append(time.perf_counter())
                text.append(content)
    writer.close()
    gaps = [b - a for a, b in zip(times, times[1:])]
    tpot = (times[-1] - times[0]) / (num_tokens - 1) if num_tokens > 1 and times else None
    return Sample(ttft=times[0] - start if times else float("nan"), tpot=tpot, gaps=gaps, num_tokens=num_tokens,
                  text="".join(text))


def chat_body(messages: list[dict], shape: dict, seed: int) -> dict:
    """A streaming chat request; ``shape``: ``max_tokens`` and ``temperature`` (sampled requests get
    ``seed``, the same for every method)."""
    seeded = {"seed": seed} if shape["temperature"] > 0 else {}
    return {"messages": messages, **shape, **seeded, "stream": True, "stream_options": {"include_usage": True}}


def conversation_prompts(num_prompts: int, turns: int, index: int) -> list[int]:
    """The workload prompts of conversation ``index``: ``turns`` distinct ones drawn by a generator
    seeded with ``index``, so conversations differ from each other (24 prompts give 255,024 orders
    of 4) while every method gets the same ones."""
    rng = random.Random(index)
    if turns <= num_prompts:
        return rng.sample(range(num_prompts), turns)
    return [rng.randrange(num_prompts) for _ in range(turns)]


async def converse(port: int, prompts, index: int, turns: int, shape: dict) -> list[Sample]:
    """Conversation ``index``: the shared system prompt, then ``turns`` user turns
    (``conversation_prompts``), each request carrying every earlier turn and answer."""
    messages, samples = [{"role": "system", "content": SYSTEM_PROMPT}], []
    for p in conversation_prompts(len(prompts), turns, index):
        messages.append(prompts[p].messages[-1])
        samples.append(await stream_chat(port, chat_body(messages, shape, index * 100 + len(samples))))
        messages.append({"role": "assistant", "content": samples[-1].text})
    return samples


async def run_level(port: int, prompts, concurrency: int, num_requests: int, shape: dict,
                    time_limit: float, turns: int = 1, first: int = 0) -> Level:
    """Requests (or conversations) ``first .. first + num_requests - 1`` from ``concurrency`` clients."""
    level, queue = Level(), list(range(first, first + num_requests))
    deadline = time.perf_counter() + time_limit

    async def client() -> None:
        while queue and time.perf_counter() < deadline:
            i = queue.pop(0)
            if turns > 1:
                level.samples.extend(await converse(port, prompts, i, turns, shape))
            else:
                level.samples.append(await stream_chat(port, chat_body(prompts[i % len(prompts)].messages,
                                                                       shape, i)))

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    level.seconds = time.perf_counter() - start
    return level


def server_counters(port: int) -> dict[str, float]:
    """The server's ``COUNTERS``, summed over their series, 0 for those it has not written."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        if family.name in values:
            values[family.name] = sum(s.value for s in family.samples if s.name == family.name + "_total")
    return values


def measure_level(port: int, prompts, concurrency: int, num_requests: int, shape: dict,
                  time_limit: float, turns: int = 1, first: int = 0) -> Level:
    before = server_counters(port)
    level = asyncio.run(run_level(port, prompts, concurrency, num_requests, shape, time_limit, turns, first))
    level.counters = {name: value - before[name] for name, value in server_counters(port).items()}
    return level


def start_server(args, spec: dict | None, log, extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, int]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "draftwise.cli", "serve", "--port", str(port), "--dtype", args.dtype,
           "--max-num-seqs", str(max(args.concurrency)), "--log-level", "warning"]
    if args.model:
        cmd[4:4] = [args.model]
    if spec:
        cmd += ["-sc", json.dumps(spec)]
    cmd += args.server_args.split() + list(extra)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), port


def wait_healthy(proc: subprocess.Popen, port: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("server did not become healthy")


def pct(values: list[float], q: float) -> float:
    values = sorted(v for v in values if v == v)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


def report(levels: dict[tuple[int, str], Level], methods: list[str], concurrency: list[int]) -> None:
    print(f"{'conc':>4} {'method':<13} {'reqs':>4} {'req/s':>6} {'tok/s':>7} {'speedup':>7}  "
          f"{'TTFT p50/p90/p99 (ms)':>22}  {'TPOT p50/p90/p99 (ms)':>22}  {'ITL p50/p99 (ms)':>16}  {'cached':>6}  "
          f"{'acc len':>7} {'drafts/tok':>10}")
    for c in concurrency:
        base = levels[(c, methods[0])]
        for method in methods:
            lv = levels[(c, method)]
            tok_s = lv.num_tokens / lv.seconds
            ttft = [s.ttft * 1e3 for s in lv.samples]
            tpot = [s.tpot * 1e3 for s in lv.samples if s.tpot is not None]
            gaps = [g * 1e3 for s in lv.samples for g in s.gaps]
            speedup = tok_s / (base.num_tokens / base.seconds)
            print(f"{c:>4} {method:<13} {len(lv.samples):>4} {len(lv.samples) / lv.seconds:>6.2f} {tok_s:>7.1f} "
                  f"{speedup:>6.2f}x  {pct(ttft, .5):>6.0f} {pct(ttft, .9):>6.0f} {pct(ttft, .99):>7.0f}  "
                  f"{pct(tpot, .5):>6.1f} {pct(tpot, .9):>6.1f} {pct(tpot, .99):>7.1f}  "
                  f"{pct(gaps, .5):>7.1f} {pct(gaps, .99):>7.1f}  "
                  f"{100 * lv.ratio('vllm:prefix_cache_hits', 'vllm:prefix_cache_queries'):>5.0f}%  "
                  f"{1 + lv.ratio('vllm:spec_decode_num_accepted_tokens', 'vllm:spec_decode_num_drafts'):>7.2f} "
                  f"{lv.counters.get('vllm:spec_decode_num_draft_tokens', 0.0) / max(1, lv.num_tokens):>10.2f}"
                  + (f"  rounds {' '.join(f'{a / b:.2f}x' for a, b in zip(lv.round_tok_s, base.round_tok_s))}"
                     if len(lv.round_tok_s) > 1 else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--workload", default="code-edit")
    parser.add_argument("--methods", default="none,ngram", help="none and/or speculative methods")
    parser.add_argument("--speculative-config", default=json.dumps(NGRAM),
                        help="JSON config used for the method it names (others: method and 5 drafts)")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--min-requests", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0: sampled, seeded per request")
    parser.add_argument("--turns", type=int, default=1, help="user turns per conversation (> 1: multi-turn chats "
                        "sharing a system prompt, each turn a sample)")
    parser.add_argument("--rounds", type=int, default=1, help="measurements per level, the methods' order "
                        "reversed every other round, each round with other prompts")
    parser.add_argument("--time-limit", type=float, default=180.0, help="seconds per (level, method)")
    parser.add_argument("--log-dir", default=None, help="keep each server's log here as METHOD.log "
                        "(default: a temporary directory, deleted at the end)")
    parser.add_argument("--server-args", default="", help="extra draftwise serve flags, e.g. "
                        "'--max-num-batched-tokens 512'")
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    methods = args.methods.split(",")
    prompts = load_workload(args.workload, num_prompts=max(args.concurrency + [args.min_requests]))
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    sampling = "greedy" if args.temperature == 0 else f"temperature {args.temperature}, seeded"
    print(f"workload {args.workload}: {len(prompts)} prompts, max_tokens {args.max_tokens}, {sampling}, streaming chat"
          f"{f', {args.turns}-turn conversations sharing a system prompt' if args.turns > 1 else ''}"
          f"{'; server flags: ' + args.server_args if args.server_args else ''}")
    logs = tempfile.TemporaryDirectory()
    log_dir = args.log_dir or logs.name
    os.makedirs(log_dir, exist_ok=True)
    servers = {}
    try:
        given = json.loads(args.speculative_config)
        for method in methods:
            name, _, variant = method.partition(":")
            spec = None if name == "none" else given if name == given.get("method") \
                else {"method": name, "num_speculative_tokens": 5}
            extra = ("--no-enable-prefix-caching",) if variant == "nocache" else ()
            log = open(os.path.join(log_dir, f"{method.replace(':', '-')}.log"), "w")
            # one start-up at a time: a server times its steps at start-up (the step-cost model's
            # seed), and another server starting beside it distorts those timings
            servers[method] = proc, port = start_server(args, spec, log, extra)
            print(f"{method}: speculative_config {spec}{' ' + ' '.join(extra) if extra else ''}")
            wait_healthy(proc, port)
            asyncio.run(run_level(port, prompts, 1, 1, {"max_tokens": 16, "temperature": 0}, 60))  # warm-up
        levels = {(c, method): Level() for c in args.concurrency for method in methods}
        shape = {"max_tokens": args.max_tokens, "temperature": args.temperature}
        first = 1  # request 0 warmed the servers up
        for c in args.concurrency:
            num = max(c, args.min_requests)
            for r in range(args.rounds):
                for method in methods if r % 2 == 0 else methods[::-1]:
                    levels[(c, method)].add(measure_level(servers[method][1], prompts, c, num, shape,
                                                          args.time_limit, args.turns, first))
                first += num
        report(levels, methods, args.concurrency)
        print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=30)
        logs.cleanup()


if __name__ == "__main__":
    main()
