"""EAGLE-3 heads on open chat, against plain decoding in the same run: acceptance and tokens/s.

12 chat prompts (6 of the ``chat`` workload, 6 written here; none is in a drafter's training data),
greedy, ``--max-tokens`` each, one request at a time, on the default model at the default
precision (``--dtype``). For each head (``--heads``, default the shipped one) and each K (``--k``): tokens/s and
its ratio to plain decoding, mean acceptance length, per-position acceptance, whether every output
equals plain decoding's. ``--every-step`` drafts at every step (the draft-length policy's step-cost
pricing off): acceptance as the head makes it; without it, what a user gets. ``--trees`` adds a
run per token tree (``speculative_token_tree``, ``;``-separated; K is then the tree's node count).

    flock /tmp/draftwise-bench.lock python benchmarks/bench_drafter_chat.py [--heads A,B] [--k 2,3] \
        [--trees "[(0,), (1,), (0, 0)];..."] [--every-step] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import os
import time

from draftwise import LLM, SamplingParams
from draftwise.bench.run import machine_info
from draftwise.bench.workloads import load_workload

SHIPPED = "draftwise/SmolLM2-135M-Instruct-eagle3"
OWN_PROMPTS = ["How do I make a simple tomato pasta sauce?", "What are the benefits of regular exercise?",
               "Explain how a rainbow forms.", "Write a short poem about autumn leaves.",
               "What should I pack for a weekend camping trip?", "How can I improve my sleep?"]


def chats() -> list[list[dict]]:
    return [p.messages for p in load_workload("chat", num_prompts=6)] + \
        [[{"role": "user", "content": text}] for text in OWN_PROMPTS]


def run(config: dict | None, conversations: list[list[dict]], max_tokens: int, dtype: str = "auto") -> dict:
    """One engine, the conversations one at a time: tokens/s, outputs, acceptance figures."""
    llm = LLM(speculative_config=config, dtype=dtype) if config else LLM(dtype=dtype)
    llm.chat(conversations[:1], SamplingParams(max_tokens=8), use_tqdm=False)  # warm-up
    before = llm.get_spec_decode_stats()
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    outputs, num_tokens, start = [], 0, time.perf_counter()
    for conversation in conversations:
        out = llm.chat([conversation], params, use_tqdm=False)[0].outputs[0]
        outputs.append(list(out.token_ids))
        num_tokens += len(out.token_ids)
    result = {"tokens_per_s": num_tokens / (time.perf_counter() - start), "outputs": outputs}
    stats = llm.get_spec_decode_stats()
    if stats:
        drafts = stats["spec_decode_num_drafts"] - before.get("spec_decode_num_drafts", 0)
        now = stats["spec_decode_num_accepted_tokens_per_pos"]
        per_pos = [a - b for a, b in zip(now, before.get("spec_decode_num_accepted_tokens_per_pos", [0] * len(now)))]
        result.update(num_drafts=drafts, mean_acceptance_length=1 + sum(per_pos) / max(drafts, 1),
                      per_position=[round(n / max(drafts, 1), 3) for n in per_pos])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", default=SHIPPED, help="comma-separated EAGLE-3 drafter paths or bundled names")
    parser.add_argument("--k", default="3", help="comma-separated num_speculative_tokens")
    parser.add_argument("--trees", default="", help="';'-separated speculative_token_tree values, run per head")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="auto", help="the engines' dtype (auto: the default precision)")
    parser.add_argument("--every-step", action="store_true", help="draft at every step (no step-cost pricing)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.every_step:
        os.environ["DRAFTWISE_VERIFY_ROW_COST"] = "0"
    conversations = chats()
    plain = run(None, conversations, args.max_tokens, args.dtype)
    print(f"{'drafter':52s} {'K':>2s} {'tokens/s':>9s} {'ratio':>6s} {'MAL':>6s}  per position  same")
    print(f"{'(plain)':52s} {'-':>2s} {plain['tokens_per_s']:9.1f} {1:6.2f}x")
    rows = []
    for head in args.heads.split(","):
        configs = [{"method": "eagle3", "model": head, "num_speculative_tokens": int(k)} for k in args.k.split(",")]
        configs += [{"method": "eagle3", "model": head, "speculative_token_tree": tree}
                    for tree in args.trees.split(";") if tree.strip()]
        for config in configs:
            r = run(config, conversations, args.max_tokens, args.dtype)
            k = len(r["per_position"])
            same = r["outputs"] == plain["outputs"]
            ratio = r["tokens_per_s"] / plain["tokens_per_s"]
            print(f"{head[-52:]:52s} {k:2d} {r['tokens_per_s']:9.1f} {ratio:5.2f}x {r['mean_acceptance_length']:6.3f}"
                  f"  {' '.join(f'{p:.3f}' for p in r['per_position'])}  {same}")
            rows.append({"head": head, "k": k, "tree": config.get("speculative_token_tree"),
                         "tokens_per_s": round(r["tokens_per_s"], 1),
                         "ratio_to_plain": round(ratio, 3),
                         "mean_acceptance_length": round(r["mean_acceptance_length"], 3),
                         "per_position": r["per_position"], "num_drafts": r["num_drafts"], "same_as_plain": same})
    if args.out:
        record = {"machine": machine_info(), "args": vars(args), "load_average_end": os.getloadavg(),
                  "plain_tokens_per_s": round(plain["tokens_per_s"], 1), "results": rows}
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
