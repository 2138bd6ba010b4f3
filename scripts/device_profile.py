"""Profile decode steps of a model on the device at hand: where a step's time goes.

    python scripts/device_profile.py MODEL_DIR [--steps 20] [--concurrency 1]

Prints tokens/s, then torch.profiler's top operators by CPU and by device time
over ``--steps`` engine steps of greedy decoding.
"""
from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from draftwise import LLM, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--enforce-eager", action="store_true")
    args = parser.parse_args()
    llm = LLM(model=args.model, dtype=args.dtype, enforce_eager=args.enforce_eager)
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    prompts = [f"Write a story about a robot, version {i}." for i in range(args.concurrency)]
    llm.generate(prompts, params, use_tqdm=False)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    print(f"concurrency {args.concurrency}: {tokens / (time.perf_counter() - start):.1f} tokens/s")
    engine = llm.llm_engine
    for i, p in enumerate(prompts):
        engine.add_request(f"p{i}", p, SamplingParams(temperature=0.0, max_tokens=args.steps + 8, ignore_eos=True))
    for _ in range(3):
        engine.step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(args.steps):
            engine.step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        step_ms = (time.perf_counter() - start) / args.steps * 1e3
    print(f"profiled step: {step_ms:.2f} ms")
    averages = prof.key_averages()
    print(averages.table(sort_by="cpu_time_total", row_limit=40, max_name_column_width=60))
    if torch.cuda.is_available():
        print(averages.table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=60))
    while engine.has_unfinished_requests():
        engine.step()


if __name__ == "__main__":
    main()
