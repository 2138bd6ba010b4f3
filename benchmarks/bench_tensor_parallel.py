"""Tensor parallelism: TP=1 vs TP=2 side by side in one run, and what more ranks would give.

Two engines on the same model (SmolLM2-135M-Instruct unless --model): ``tensor_parallel_size=1``
with every thread, and ``tensor_parallel_size=2`` (the mp executor, gloo on 127.0.0.1) with the
threads split between its two ranks. Rounds alternate between them; each prints greedy decode
tokens/s for one request and for --batch requests, and the ratio TP2 / TP1. Then:

* memory per rank: the parameter bytes each rank holds, its KV bytes per token, and the
  resident memory of the driver and of the worker process;
* the collectives: an all-reduce of one step's ``[rows, hidden]`` between two processes of this
  machine, through shared memory (the mp executor on CPU) and through loopback gloo (the Ray
  executor), per call and per decode step (two per layer, one for the embedding);
* a projection for N ranks that each have their own cores: the TP=1 step on one thread split N
  ways, plus the collectives measured here scaled by N - 1 (an all-reduce this small is
  latency-bound; across machines add the network's latency per hop; on NVLink an NCCL
  all-reduce this small takes ~10-30 us).

    flock /tmp/draftwise-bench.lock python benchmarks/bench_tensor_parallel.py
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

import torch

from bench_compile import tokens_per_s  # greedy decode tokens/s of one generate call
from draftwise import LLM
from draftwise.distributed.executor import SHM_SLOT_BYTES
from draftwise.distributed.group import TPGroup
from draftwise.distributed.shm_collectives import ShmCollectives
from draftwise.kernels.cpu_info import cpu_signature

PROMPTS = ["Write a Python function that checks whether a number is prime.",
           "Explain what a hash map is, with an example.",
           "Write a short story about a robot who learns to paint.",
           "List the planets of the solar system with one fact each.",
           "Describe how a bicycle gear system works.",
           "Summarise the causes of the French revolution.",
           "Give three tips for writing clear code.",
           "What is the difference between TCP and UDP?"]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def shard_bytes(llm: LLM) -> tuple[float, float]:
    """(parameter MiB, KV bytes per token) of the driver's rank."""
    engine = llm.llm_engine
    params = sum(p.numel() * p.element_size() for p in engine.runner.model.parameters())
    kv = engine.runner.paged.kv_cache
    per_token = kv[:, :, 0].numel() * kv.element_size()
    return params / 2 ** 20, per_token


def _reduce_peer(port: int, shm_path: str, shapes: list[tuple[int, int]], repeats: int, dtype: str) -> None:
    torch.set_num_threads(1)
    group = TPGroup.connect("127.0.0.1", port, 1, 2, torch.device("cpu"))
    shm = ShmCollectives(shm_path, 1, 2, SHM_SLOT_BYTES, create=False)
    for reduce in (group.all_reduce, shm.all_reduce):
        for shape in shapes:
            x = torch.ones(shape, dtype=getattr(torch, dtype))
            for _ in range(repeats):
                reduce(x)


def all_reduce_us(shapes: list[tuple[int, int]], repeats: int, dtype: str) -> dict[str, dict]:
    """Median microseconds of one all-reduce of each shape between this process and another, over
    loopback gloo and over shared memory ({"gloo": {shape: us}, "shm": {shape: us}})."""
    store = TPGroup.host_store("127.0.0.1", 2)
    shm = ShmCollectives(ShmCollectives.new_path(), 0, 2, SHM_SLOT_BYTES, create=True)
    peer = mp.get_context("spawn").Process(target=_reduce_peer, args=(store.port, shm.path, shapes, repeats, dtype))
    peer.start()
    group = TPGroup.from_store(store, 0, 2, torch.device("cpu"))
    out = {}
    for name, reduce in (("gloo", group.all_reduce), ("shm", shm.all_reduce)):
        out[name] = {}
        for shape in shapes:
            x, times = torch.ones(shape, dtype=getattr(torch, dtype)), []
            for _ in range(repeats):
                start = time.perf_counter()
                reduce(x)
                times.append(time.perf_counter() - start)
            out[name][shape] = 1e6 * statistics.median(times[repeats // 5:])
    peer.join()
    shm.unlink()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    threads = torch.get_num_threads()
    print(f"CPU: {cpu_signature()}; {os.cpu_count()} cores, torch threads {threads}; load {os.getloadavg()}")
    tp1 = LLM(model=args.model, dtype=args.dtype, seed=0)
    tp2 = LLM(model=args.model, dtype=args.dtype, seed=0, tensor_parallel_size=2)
    engines = {"TP=1": (tp1, threads), "TP=2": (tp2, max(1, threads // 2))}
    figures: dict[str, dict[str, list[float]]] = {name: {"1": [], "batch": []} for name in engines}
    for llm, n in engines.values():  # warm-up
        torch.set_num_threads(n)
        tokens_per_s(llm, PROMPTS[:1], 8)
    for _ in range(args.rounds):
        for name, (llm, n) in engines.items():
            torch.set_num_threads(n)
            figures[name]["1"].append(tokens_per_s(llm, PROMPTS[:1], args.max_tokens))
            figures[name]["batch"].append(tokens_per_s(llm, PROMPTS[:args.batch], args.max_tokens))
    print(f"\ngreedy decode tokens/s (median of {args.rounds} alternating rounds, {args.max_tokens} tokens each)")
    print(f"{'':8}{'1 request':>12}{f'{args.batch} requests':>14}")
    med = {name: {k: statistics.median(v) for k, v in f.items()} for name, f in figures.items()}
    for name in engines:
        print(f"{name:8}{med[name]['1']:12.1f}{med[name]['batch']:14.1f}")
    ratio = {k: med["TP=2"][k] / med["TP=1"][k] for k in ("1", "batch")}
    print(f"{'TP2/TP1':8}{ratio['1']:12.2f}x{ratio['batch']:13.2f}x")

    full, kv1 = shard_bytes(tp1)
    half, kv2 = shard_bytes(tp2)
    worker = tp2.llm_engine.executor.worker_pids[0]
    print(f"\nmemory per rank: TP=1 params {full:.1f} MiB, KV {kv1} B/token; TP=2 driver params {half:.1f} MiB, "
          f"KV {kv2} B/token; RSS driver (both engines) {rss_mib(os.getpid()):.0f} MiB, "
          f"worker {rss_mib(worker):.0f} MiB")

    config = tp1.llm_engine.hf_config
    dtype = str(tp1.llm_engine.dtype).removeprefix("torch.")
    hidden, layers = config.hidden_size, config.num_hidden_layers
    shapes = [(rows, hidden) for rows in (1, args.batch, 64)]
    cost = all_reduce_us(shapes, 500, dtype)
    per_step = 2 * layers + 1
    print(f"\nall-reduce between two processes ({dtype}), per call and per step ({per_step} per step):")
    for name, label in (("shm", "shared memory (what the mp executor uses on CPU)"),
                        ("gloo", "gloo over loopback TCP (the Ray executor; across machines add the network)")):
        print(f"  {label}:")
        for (rows, _), us in cost[name].items():
            print(f"    [{rows:3d}, {hidden}]: {us:7.1f} us per call, {us * per_step / 1e3:6.2f} ms per step")

    torch.set_num_threads(1)
    one_thread = statistics.median(tokens_per_s(tp1, PROMPTS[:1], args.max_tokens) for _ in range(2))
    step_ms = 1e3 / one_thread
    print(f"\nprojection, one request, N ranks with a core each: TP=1 step on one thread {step_ms:.1f} ms")
    for name in ("shm", "gloo"):
        comm_ms = cost[name][shapes[0]] * per_step / 1e3
        for n in (2, 4, 8):  # small all-reduces are latency-bound: ~(N - 1) times the 2-rank cost
            projected = step_ms / n + comm_ms * (n - 1)
            print(f"  {name:4} N={n}: {step_ms / n:5.1f} ms compute + {comm_ms * (n - 1):6.1f} ms collectives = "
                  f"{projected:6.1f} ms/step, {step_ms / projected:.2f}x one rank")
    tp2.llm_engine.shutdown()


if __name__ == "__main__":
    main()
