"""Prefix caching on and off, side by side: multi-turn chats that resend their history.

``--conversations`` chats share one system prompt; each has ``--turns`` user turns (questions
from the chat workload), and every turn sends the whole conversation so far through the chat
template, as an OpenAI client does. Two engines (``enable_prefix_caching`` True / False) take
the same turns, alternating turn by turn. Per turn: TTFT (request added -> its first token, the
prefill included) and the prompt tokens found in the cache. Prints TTFT p50/p90 of both, the
ratio, the hit rate and whether the answers match, with the CPU flags and the load average.
Not part of ``make test``; run one benchmark at a time:

    flock /tmp/draftwise-bench.lock .venv/bin/python benchmarks/bench_prefix_cache.py
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from draftwise import LLM, SamplingParams
from draftwise.kernels.cpu_info import cpu_signature
from draftwise.models.loader import resolve_model
from draftwise.bench.workloads import SYSTEM_PROMPT as SYSTEM
from draftwise.bench.workloads import load_workload


def ttft_and_answer(llm: LLM, rid: str, prompt: str, max_tokens: int) -> tuple[float, str, int]:
    """(seconds to the first token, the answer, prompt tokens read from the cache)."""
    engine = llm.llm_engine
    start = time.perf_counter()
    engine.add_request(rid, prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    first, final = None, None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if first is None and out.outputs[0].token_ids:
                first = time.perf_counter() - start
            if out.finished:
                final = out
    return first, final.outputs[0].text, final.num_cached_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    model = resolve_model(None)
    llms = {caching: LLM(model=str(model), dtype=args.dtype, seed=0, enable_prefix_caching=caching)
            for caching in (True, False)}
    tokenizer = llms[True].get_tokenizer()
    questions = [p.messages[-1]["content"] for p in load_workload("chat", args.conversations * args.turns)]
    sig = cpu_signature()
    print(f"{sig['cpu']}, flags {' '.join(sig['flags'])}, torch {torch.__version__}, {args.dtype}; "
          f"{args.conversations} chats x {args.turns} turns, {args.max_tokens} tokens a turn; "
          f"load {os.getloadavg()}")
    ttft = {True: [], False: []}
    cached = prompt_tokens = same = 0
    for c in range(args.conversations):
        history = {True: [{"role": "system", "content": SYSTEM}], False: [{"role": "system", "content": SYSTEM}]}
        for t in range(args.turns):
            answers = {}
            for caching, llm in llms.items():
                history[caching].append({"role": "user", "content": questions[c * args.turns + t]})
                prompt = tokenizer.apply_chat_template(history[caching], tokenize=False, add_generation_prompt=True)
                seconds, answers[caching], hit = ttft_and_answer(llm, f"c{c}t{t}", prompt, args.max_tokens)
                ttft[caching].append(seconds)
                history[caching].append({"role": "assistant", "content": answers[caching]})
                if caching:
                    cached += hit
                    prompt_tokens += len(tokenizer(prompt, add_special_tokens=False).input_ids)
            same += answers[True] == answers[False]
    p50 = {k: statistics.median(v) for k, v in ttft.items()}
    p90 = {k: statistics.quantiles(v, n=10)[-1] for k, v in ttft.items()}
    print(f"TTFT p50: caching off {1000 * p50[False]:.1f} ms, on {1000 * p50[True]:.1f} ms, "
          f"{p50[False] / p50[True]:.2f}x lower")
    print(f"TTFT p90: caching off {1000 * p90[False]:.1f} ms, on {1000 * p90[True]:.1f} ms, "
          f"{p90[False] / p90[True]:.2f}x lower")
    print(f"prompt tokens from the cache: {cached} of {prompt_tokens} ({100 * cached / prompt_tokens:.0f}%); "
          f"identical answers {same}/{len(ttft[True])}; load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
