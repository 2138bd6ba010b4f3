"""async_scheduling on and off, side by side: the same prompts, engine settings and tokens.

For each method (none, ngram) and each output mode (``generate``: text decoded once at the end;
``streaming``: every step's partial text decoded, as the server does), both engines run the
workload's prompts all at once, alternating ``--repeats`` times; the best wall time of each is
kept. Prints tokens/s, the ratio async / sync and whether the tokens match, with the CPU flags
and the load average. Not part of ``make test``; run one benchmark at a time:

    flock /tmp/draftwise-bench.lock .venv/bin/python benchmarks/bench_async.py [--num-prompts 8]
"""
from __future__ import annotations

import argparse
import os
import time

import torch
from transformers import AutoTokenizer

from draftwise import LLM, SamplingParams
from draftwise.bench.measure import tokenize_prompts
from draftwise.kernels.cpu_info import cpu_signature
from draftwise.models.loader import resolve_model
from draftwise.bench.workloads import load_workload

METHODS = {"none": None,
           "ngram": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 4}}


def timed(llm: LLM, prompts: list[list[int]], max_tokens: int, streaming: bool) -> tuple[float, list]:
    engine = llm.llm_engine
    engine.detokenize_unfinished = streaming
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    for i, ids in enumerate(prompts):
        engine.add_request(f"r{i}", {"prompt_token_ids": ids}, params)
    start, final = time.perf_counter(), {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out.outputs[0].token_ids
    return time.perf_counter() - start, [final[f"r{i}"] for i in range(len(prompts))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="code-edit")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    model = resolve_model(None)
    prompts = [p.token_ids for p in tokenize_prompts(AutoTokenizer.from_pretrained(model),
                                                     load_workload(args.workload, args.num_prompts))]
    sig = cpu_signature()
    print(f"{sig['cpu']}, flags {' '.join(sig['flags'])}, torch {torch.__version__}, {args.dtype}; "
          f"{len(prompts)} {args.workload} prompts at once, {args.max_tokens} tokens; load {os.getloadavg()}")
    print(f"{'method':<7} {'outputs':<10} {'sync tok/s':>10} {'async tok/s':>11} {'ratio':>6} {'match':>6}")
    for method, spec in METHODS.items():
        llms = {mode: LLM(model=str(model), dtype=args.dtype, seed=0, max_num_seqs=len(prompts),
                          max_model_len=max(map(len, prompts)) + args.max_tokens + 8, speculative_config=spec,
                          async_scheduling=mode) for mode in (False, True)}
        for streaming in (False, True):
            best, tokens = {False: float("inf"), True: float("inf")}, {}
            for _ in range(args.repeats):
                for mode, llm in llms.items():
                    seconds, tokens[mode] = timed(llm, prompts, args.max_tokens, streaming)
                    best[mode] = min(best[mode], seconds)
            num = sum(map(len, tokens[False]))
            sync, overlapped = num / best[False], num / best[True]
            print(f"{method:<7} {'streaming' if streaming else 'generate':<10} {sync:>10.1f} {overlapped:>11.1f} "
                  f"{overlapped / sync:>5.2f}x {'yes' if tokens[False] == tokens[True] else 'NO':>6}", flush=True)
        del llms
    print(f"load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
