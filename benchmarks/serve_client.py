"""The client side of ``bench_serve.py``: streamed OpenAI chat completions against a server on
127.0.0.1, timed per chunk (a small stdlib SSE reader, to keep its CPU use low), and the server's
``/metrics`` counters around a level.

A ``Level`` is what ``concurrency`` clients measured together: its samples (TTFT, TPOT, the gaps
between streamed chunks, tokens), its seconds, and how much each of ``COUNTERS`` grew. Requests are
greedy or sampled with a seed per request; a prompt with a JSON schema asks for it through
``response_format``; a conversation re-sends every earlier turn and answer, as a chat client does.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from draftwise.bench.workloads import SYSTEM_PROMPT

COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:spec_decode_num_drafts",
            "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
DRAFTED, ACCEPTED = COUNTERS[3:]


@dataclass
class Sample:
    ttft: float
    tpot: float | None
    gaps: list[float]
    num_tokens: int
    text: str = ""
    turn: int = 0  # its turn in a conversation (0: the first, or a single request)


@dataclass
class Level:
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0
    counters: dict[str, float] = field(default_factory=dict)  # COUNTERS' increase during the level
    round_tok_s: list[float] = field(default_factory=list)  # tokens/s of each round pooled here
    peak_rss_mb: float = 0.0  # the server's peak resident memory at the end of the level

    @property
    def tok_s(self) -> float:
        return self.num_tokens / self.seconds

    def figures(self) -> dict[str, float]:
        """The level's summary: throughput, latency percentiles (ms), acceptance, memory."""
        ttft = [s.ttft * 1e3 for s in self.samples]
        tpot = [s.tpot * 1e3 for s in self.samples if s.tpot is not None]
        gaps = [g * 1e3 for s in self.samples for g in s.gaps]
        later = [s.ttft * 1e3 for s in self.samples if s.turn > 0]  # conversations from their second turn
        return {"requests": len(self.samples), "req_s": len(self.samples) / self.seconds, "tok_s": self.tok_s,
                "ttft_p50": pct(ttft, .5), "ttft_p90": pct(ttft, .9), "ttft_p99": pct(ttft, .99),
                "ttft_later_turns_p50": pct(later, .5), "ttft_later_turns_p99": pct(later, .99),
                "tpot_p50": pct(tpot, .5), "tpot_p90": pct(tpot, .9), "tpot_p99": pct(tpot, .99),
                "itl_p50": pct(gaps, .5), "itl_p99": pct(gaps, .99),
                "cached": self.ratio("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"),
                "acceptance_length": 1 + self.ratio(ACCEPTED, "vllm:spec_decode_num_drafts"),
                "drafts_per_token": self.counters.get(DRAFTED, 0.0) / max(1, self.num_tokens),
                "peak_rss_mb": self.peak_rss_mb}

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
        self.round_tok_s.append(other.tok_s)
        self.peak_rss_mb = max(self.peak_rss_mb, other.peak_rss_mb)


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
    num_tokens = num_tokens or len(times)  # a server that reports no usage streams a token per chunk
    gaps = [b - a for a, b in zip(times, times[1:])]
    tpot = (times[-1] - times[0]) / (num_tokens - 1) if num_tokens > 1 and times else None
    return Sample(ttft=times[0] - start if times else float("nan"), tpot=tpot, gaps=gaps, num_tokens=num_tokens,
                  text="".join(text))


def chat_body(messages: list[dict], shape: dict, seed: int, schema: dict | None = None) -> dict:
    """A streaming chat request; ``shape``: ``max_tokens`` and ``temperature`` (sampled requests get
    ``seed``, the same for every method); with ``schema``, the answer is asked in that JSON schema."""
    seeded = {"seed": seed} if shape["temperature"] > 0 else {}
    body = {"messages": messages, **shape, **seeded, "stream": True, "stream_options": {"include_usage": True}}
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    return body


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
        samples[-1].turn = len(samples) - 1
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
                prompt = prompts[i % len(prompts)]
                level.samples.append(await stream_chat(port, chat_body(prompt.messages, shape, i, prompt.schema)))

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    level.seconds = time.perf_counter() - start
    return level


def server_counters(port: int) -> dict[str, float]:
    """The server's ``COUNTERS``, summed over their series, 0 for those it has not written (all of
    them for a server without vLLM's metrics)."""
    values = dict.fromkeys(COUNTERS, 0.0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return values
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


def pct(values: list[float], q: float) -> float:
    values = sorted(v for v in values if v == v)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]
