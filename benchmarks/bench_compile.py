"""Compiled forward vs eager, side by side in one process (SmolLM2-135M-Instruct unless --model).

Three engines on the same file: the default (``LLM(model)``: a GGUF's linears on its blocks, the
layers as one C++ stack), and in --dtype ``enforce_eager=True`` and ``compilation_config={"mode": 3}``
(plus --compilation-config keys). Prints each start-up (the compile included), then plain greedy
decode tokens/s for one request and for --batch requests at once, alternating the engines round
by round, with the ratios compiled / eager and compiled / default, the CPU's flags and the load average.

    flock /tmp/draftwise-bench.lock python benchmarks/bench_compile.py
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from draftwise import LLM, SamplingParams
from draftwise.kernels.cpu_info import cpu_signature

PROMPTS = ["Write a Python function that checks whether a number is prime.",
           "Explain what a hash map is, with an example.",
           "Write a short story about a robot who learns to paint.",
           "List the planets of the solar system with one fact each.",
           "Describe how a bicycle gear system works."]


def tokens_per_s(llm: LLM, prompts: list[str], max_tokens: int) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outputs) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--compilation-config", default="{}", help="JSON keys added to mode 3")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the figures as JSON here (benchmarks/results/)")
    args = parser.parse_args()
    sig = cpu_signature()
    print(f"{sig['cpu']}, flags {' '.join(sig['flags'])}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {args.dtype}; load average {os.getloadavg()}")
    engines, started = {}, {}
    configs = {"default": {"dtype": "auto"}, "eager": {"dtype": args.dtype, "enforce_eager": True},
               "compiled": {"dtype": args.dtype,
                            "compilation_config": {"mode": 3, **json.loads(args.compilation_config)}}}
    for name, kwargs in configs.items():
        start = time.perf_counter()
        engines[name] = LLM(model=args.model, **kwargs)
        started[name] = time.perf_counter() - start
        print(f"{name}: started in {started[name]:.1f} s")
    workloads = {"one request": PROMPTS[:1], f"{args.batch} at once": (PROMPTS * args.batch)[:args.batch]}
    tps = {(w, n): [] for w in workloads for n in engines}
    for llm in engines.values():
        tokens_per_s(llm, PROMPTS[:2], 8)  # warm-up
    for _ in range(args.rounds):
        for workload, prompts in workloads.items():
            for name, llm in engines.items():
                tps[(workload, name)].append(tokens_per_s(llm, prompts, args.max_tokens))
    print(f"\nplain greedy decode, {args.max_tokens} tokens, median of {args.rounds} rounds (tokens/s)")
    print(f"{'workload':>14} {'default':>8} {'eager':>8} {'compiled':>9} {'c/eager':>8} {'c/default':>10}")
    for workload in workloads:
        default, eager, compiled = (statistics.median(tps[(workload, n)]) for n in ("default", "eager", "compiled"))
        print(f"{workload:>14} {default:8.1f} {eager:8.1f} {compiled:9.1f} {compiled / eager:7.2f}x "
              f"{compiled / default:9.2f}x")
    print(f"load average {os.getloadavg()}")
    if args.out:
        rows = [{"workload": w, **{n: round(statistics.median(tps[(w, n)]), 1) for n in engines}} for w in workloads]
        result = {"date": time.strftime("%Y-%m-%d"), **sig, "torch": torch.__version__,
                  "threads": torch.get_num_threads(), "command": " ".join(["python", *sys.argv]),
                  "dtype": args.dtype, "startup_s": {n: round(t, 1) for n, t in started.items()},
                  "tokens_per_s": rows, "load_average_end": os.getloadavg()}
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
