"""Load benchmark of ``draftwise serve`` (and llama.cpp's ``llama-server``): throughput, latency
and memory at several concurrency levels, with and without speculation, side by side in one run.

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
are over all its rounds (tokens/s: all tokens over all seconds).

With ``--llama-server PATH``, the method ``llama-server`` is llama.cpp's server on the same GGUF
(``--model``): ``--threads`` threads, a slot per client of the largest level (``--parallel``),
continuous batching, its prompt cache, ``--llama-ctx`` tokens of context per slot. Each server's
peak resident memory (``VmHWM`` of its process) is read after every level. ``--workload`` takes
several workloads, comma-separated, measured one after the other on the same servers; ``NAME*T``
is ``NAME`` as ``T``-turn conversations. ``--out FILE`` writes every level's figures as a
``benchmarks/results`` table per workload, with the ratio of each method to the first:

    python benchmarks/bench_serve.py --methods none,ngram --concurrency 1,8,32
    python benchmarks/bench_serve.py --model M.gguf --llama-server .venv-llamacpp/bin/llama-server \
        --methods llama-server,none,ngram --workload chat,chat*4,code-edit,json --concurrency 1,4,16
    python benchmarks/bench_serve.py --workload chat --turns 4 --methods none:nocache,none
    python benchmarks/bench_serve.py --workload chat --turns 4 --methods none,suffix --rounds 3
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from serve_client import Level, measure_level, run_level

from draftwise.bench.workloads import load_workload

NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
LLAMA_SERVER = "llama-server"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(args, spec: dict | None, log, extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = [sys.executable, "-m", "draftwise.cli", "serve", "--port", str(port), "--dtype", args.dtype,
           "--max-num-seqs", str(max(args.concurrency)), "--log-level", "warning"]
    if args.model:
        cmd[4:4] = [args.model]
    if spec:
        cmd += ["-sc", json.dumps(spec)]
    cmd += args.server_args.split() + list(extra)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), port


def start_llama_server(args, log) -> tuple[subprocess.Popen, int]:
    """llama.cpp's server on ``--model``: a slot per client, continuous batching, its prompt cache."""
    if not args.model or not args.model.endswith(".gguf"):
        raise ValueError("--llama-server needs --model to be a .gguf file")
    port, slots = free_port(), max(args.concurrency)
    cmd = [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port", str(port),
           "-t", str(args.threads), "-tb", str(args.threads), "--parallel", str(slots),
           "-c", str(slots * args.llama_ctx), "--cont-batching", "--metrics"] + args.llama_server_args.split()
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


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory (``VmHWM``), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def parse_workloads(text: str, turns: int) -> list[tuple[str, int]]:
    """``chat,chat*4,code-edit`` -> [(name, turns)], ``turns`` where no ``*T`` is given."""
    out = []
    for item in text.split(","):
        name, _, count = item.partition("*")
        out.append((name, int(count) if count else turns))
    return out


def report(levels: dict[tuple[int, str], Level], methods: list[str], concurrency: list[int]) -> None:
    print(f"{'conc':>4} {'method':<13} {'reqs':>4} {'req/s':>6} {'tok/s':>7} {'speedup':>7}  "
          f"{'TTFT p50/p90/p99 (ms)':>22}  {'TPOT p50/p90/p99 (ms)':>22}  {'ITL p50/p99 (ms)':>16}  {'cached':>6}  "
          f"{'acc len':>7} {'drafts/tok':>10} {'RSS MB':>7}")
    for c in concurrency:
        base = levels[(c, methods[0])]
        for method in methods:
            lv = levels[(c, method)]
            f = lv.figures()
            print(f"{c:>4} {method:<13} {f['requests']:>4} {f['req_s']:>6.2f} {f['tok_s']:>7.1f} "
                  f"{lv.tok_s / base.tok_s:>6.2f}x  {f['ttft_p50']:>6.0f} {f['ttft_p90']:>6.0f} {f['ttft_p99']:>7.0f}  "
                  f"{f['tpot_p50']:>6.1f} {f['tpot_p90']:>6.1f} {f['tpot_p99']:>7.1f}  "
                  f"{f['itl_p50']:>7.1f} {f['itl_p99']:>7.1f}  {100 * f['cached']:>5.0f}%  "
                  f"{f['acceptance_length']:>7.2f} {f['drafts_per_token']:>10.2f} {f['peak_rss_mb']:>7.0f}"
                  + (f"  rounds {' '.join(f'{a / b:.2f}x' for a, b in zip(lv.round_tok_s, base.round_tok_s))}"
                     if len(lv.round_tok_s) > 1 else ""))


COLUMNS = ["clients", "method", "tok/s", "vs first", "TTFT p50 (ms)", "TTFT p99 (ms)", "ITL p50 (ms)", "ITL p99 (ms)",
           "acc len", "peak RSS (MB)", "MB per added client"]
LATER_TURNS = ["TTFT turn 2+ p50 (ms)", "TTFT turn 2+ p99 (ms)"]


def result_table(title: str, levels: dict[tuple[int, str], Level], methods: list[str], concurrency: list[int],
                 turns: int) -> dict:
    """One workload's levels as a ``benchmarks/results`` table; "MB per added client" is the growth of
    the server's peak memory from the smallest level, per client added."""
    rows, c0 = [], min(concurrency)
    for c in concurrency:
        for method in methods:
            lv = levels[(c, method)]
            f = lv.figures()
            acc = f["acceptance_length"]
            growth = (f["peak_rss_mb"] - levels[(c0, method)].peak_rss_mb) / (c - c0) if c > c0 else None
            row = [c, method, round(f["tok_s"], 1), round(lv.tok_s / levels[(c, methods[0])].tok_s, 2),
                   round(f["ttft_p50"]), round(f["ttft_p99"]), round(f["itl_p50"], 1), round(f["itl_p99"], 1),
                   round(acc, 2) if acc == acc else None, round(f["peak_rss_mb"]),
                   round(growth, 1) if growth is not None else None]
            if turns > 1:
                row += [round(f["ttft_later_turns_p50"]), round(f["ttft_later_turns_p99"])]
            rows.append(row)
    return {"title": title, "columns": COLUMNS + (LATER_TURNS if turns > 1 else []), "rows": rows}


def start_all(args, methods: list[str], log_dir: str) -> dict[str, tuple[subprocess.Popen, int]]:
    """A server per method, one start-up at a time (a draftwise server times its steps at start-up,
    the step-cost model's seed; another server starting beside it would distort them)."""
    given, servers = json.loads(args.speculative_config), {}
    given = {spec["method"]: spec for spec in (given if isinstance(given, list) else [given])}
    for method in methods:
        name, _, variant = method.partition(":")
        log = open(os.path.join(log_dir, f"{method.replace(':', '-')}.log"), "w")
        if name == LLAMA_SERVER:
            servers[method] = proc, port = start_llama_server(args, log)
            print(f"{method}: {args.llama_server} --parallel {max(args.concurrency)} {args.llama_server_args}")
        else:
            spec = None if name == "none" else given.get(name, {"method": name, "num_speculative_tokens": 5})
            extra = ("--no-enable-prefix-caching",) if variant == "nocache" else ()
            servers[method] = proc, port = start_server(args, spec, log, extra)
            print(f"{method}: speculative_config {spec}{' ' + ' '.join(extra) if extra else ''}")
        wait_healthy(proc, port)
        for warm_up in ("chat", "json"):  # a chat, and a structured one: a grammar engine's set-up is once a process
            prompts = load_workload(warm_up, num_prompts=1)
            asyncio.run(run_level(port, prompts, 1, 1, {"max_tokens": 16, "temperature": 0}, 60))
    return servers


def measure_workload(args, servers, methods: list[str], name: str, turns: int, first: int):
    """Every level of one workload, methods alternating; returns (levels, the next request index)."""
    prompts = load_workload(name)  # all of them: a level reuses a prompt (and may hit a prompt cache) only past them
    sampling = "greedy" if args.temperature == 0 else f"temperature {args.temperature}, seeded"
    print(f"workload {name}: {len(prompts)} prompts, max_tokens {args.max_tokens}, {sampling}, streaming chat"
          f"{f', {turns}-turn conversations sharing a system prompt' if turns > 1 else ''}", flush=True)
    levels = {(c, method): Level() for c in args.concurrency for method in methods}
    shape = {"max_tokens": args.max_tokens, "temperature": args.temperature}
    for c in args.concurrency:
        num = max(c, args.min_requests)
        for r in range(args.rounds):
            for method in methods if r % 2 == 0 else methods[::-1]:
                proc, port = servers[method]
                level = measure_level(port, prompts, c, num, shape, args.time_limit, turns, first)
                level.peak_rss_mb = peak_rss_mb(proc.pid)
                levels[(c, method)].add(level)
            first += num
    report(levels, methods, args.concurrency)
    return levels, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--workload", default="code-edit", help="one or more, comma-separated; NAME*T: T turns")
    parser.add_argument("--methods", default="none,ngram", help="none, speculative methods, llama-server")
    parser.add_argument("--speculative-config", default=json.dumps(NGRAM),
                        help="JSON config, or a JSON list of them, each used for the method it names "
                        "(others: method and 5 drafts)")
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
    parser.add_argument("--llama-server", default=None, help="llama.cpp's llama-server (`make llama-server`)")
    parser.add_argument("--llama-server-args", default="", help="extra llama-server flags")
    parser.add_argument("--llama-ctx", type=int, default=2048, help="llama-server's context per slot")
    parser.add_argument("--threads", type=int, default=2, help="llama-server's threads")
    parser.add_argument("--out", default=None, help="write the figures here (benchmarks/results form)")
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    methods = args.methods.split(",")
    if LLAMA_SERVER in methods and not args.llama_server:
        parser.error("the method llama-server needs --llama-server PATH")
    load_start = os.getloadavg()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in load_start)} ({os.cpu_count()} CPUs)"
          f"{'; server flags: ' + args.server_args if args.server_args else ''}")
    logs = tempfile.TemporaryDirectory()
    log_dir = args.log_dir or logs.name
    os.makedirs(log_dir, exist_ok=True)
    servers, tables = {}, []
    try:
        servers = start_all(args, methods, log_dir)
        first = 1  # request 0 warmed the servers up
        for name, turns in parse_workloads(args.workload, args.turns):
            levels, first = measure_workload(args, servers, methods, name, turns, first)
            title = f"{name}{f', {turns}-turn conversations' if turns > 1 else ''}"
            tables.append(result_table(title, levels, methods, args.concurrency, turns))
        print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=30)
        logs.cleanup()
    if args.out:
        write_result(args, tables, load_start)


def write_result(args, tables: list[dict], load_start) -> None:
    from draftwise.kernels.cpu_info import cpu_signature

    result = {"date": datetime.date.today().isoformat(), "cpu": cpu_signature(), "command": " ".join(sys.argv),
              "load_average": list(load_start), "tables": tables,
              "notes": [f"max_tokens {args.max_tokens}, temperature {args.temperature}, {args.rounds} round(s), "
                        "streamed chat completions; 'vs first': tokens/s over the first method's at that level",
                        "peak RSS: the server's VmHWM since it started (the workloads run in turn on the same "
                        "servers); MB per added client: its growth from the smallest level"]}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
