"""Sampled decoding against greedy decoding, and the sampler's fast paths against its reference paths.

64 requests at once on the default model (``--model``), 64 tokens each (EOS ignored): greedy,
temperature 1.0, temperature 1.0 with top-p 0.95, and with top-k 50, each with per-request seeds,
first with the sampler as it runs (the C++ noise, top-k / top-p settled from each row's largest
logits) and then with its reference paths (the torch noise, a sort of the whole vocabulary).
Prints output tokens/s and each row's ratio to greedy and to its reference.

    flock /tmp/draftwise-bench.lock python benchmarks/bench_sampling.py [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import os
import time
from unittest import mock

from draftwise import LLM, SamplingParams
from draftwise.bench.run import machine_info
from draftwise.sample import logits

PROMPT = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
CASES = {"greedy": {"temperature": 0.0}, "temperature 1.0": {"temperature": 1.0},
         "top-p 0.95": {"temperature": 1.0, "top_p": 0.95}, "top-k 50": {"temperature": 1.0, "top_k": 50}}


def tokens_per_second(llm: LLM, num: int, max_tokens: int, case: dict) -> float:
    params = [SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=i, **case) for i in range(num)]
    start = time.perf_counter()
    outs = llm.generate([PROMPT] * num, params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - start)


def reference_paths():
    """The sampler with its reference paths (what ran before the fast ones)."""
    return mock.patch.multiple(logits, uniform_noise=logits.uniform_noise_reference,
                               apply_top_k_top_p=logits._top_k_top_p_sorted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    llm = LLM(model=args.model, max_num_seqs=args.num_requests)
    tokens_per_second(llm, 8, 8, CASES["temperature 1.0"])  # warm-up
    results = {}
    for name, case in CASES.items():
        fast = tokens_per_second(llm, args.num_requests, args.max_tokens, case)
        with reference_paths():
            reference = tokens_per_second(llm, args.num_requests, args.max_tokens, case)
        results[name] = {"tokens_per_s": round(fast, 1), "reference_tokens_per_s": round(reference, 1)}
    greedy = results["greedy"]["tokens_per_s"]
    print(f"{'case':18s} {'tokens/s':>9s} {'/greedy':>8s} {'reference':>10s} {'speed-up':>9s}")
    for name, r in results.items():
        print(f"{name:18s} {r['tokens_per_s']:9.1f} {r['tokens_per_s'] / greedy:7.2f}x "
              f"{r['reference_tokens_per_s']:10.1f} {r['tokens_per_s'] / r['reference_tokens_per_s']:8.2f}x")
    if args.out:
        record = {"machine": machine_info(), "args": vars(args), "load_average_end": os.getloadavg(),
                  "results": results}
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
