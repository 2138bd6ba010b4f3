"""Suffix decoding without a model: draftwise's ``suffix`` proposer vs arctic-inference's
``SuffixDecodingCache`` on the same token streams, plus the proposer's cost per call.

Streams are real prompts with reference responses: HumanEval problems followed by their
canonical solutions, and the code-edit workload's prompts followed by the function they show
(the answer a perfect model would mostly copy). Requests run one after another, so both global
caches hold the earlier responses. At each step the proposers draft up to K tokens for the
context so far; the accepted prefix is what matches the reference, and the stream advances by
accepted + 1 tokens, as greedy verification would.

arctic-inference is optional (it is not a draftwise dependency): with it installed the table
has a second row per workload; without it, ours alone is printed.

    python benchmarks/bench_suffix_acceptance.py --num-prompts 40 --k 8
"""
from __future__ import annotations

import argparse
import gzip
import json
import re
import time
from dataclasses import dataclass

from transformers import AutoTokenizer

from draftwise.sequence import Sequence, SequenceStatus
from draftwise.models.loader import resolve_model
from draftwise.sampling_params import SamplingParams
from draftwise.spec_decode.config import SpeculativeConfig
from draftwise.spec_decode.interface import ProposeBatch
from draftwise.bench.workloads import humaneval_path, load_workload

DEPTH = 24


@dataclass
class Tally:
    num_steps: int = 0
    num_tokens: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted: int = 0
    seconds: float = 0.0  # in propose / speculate calls
    num_calls: int = 0

    def row(self, name: str) -> str:
        rate = self.num_accepted / self.num_draft_tokens if self.num_draft_tokens else 0.0
        mean_len = 1 + self.num_accepted / self.num_drafts if self.num_drafts else 1.0
        per_call = 1e6 * self.seconds / self.num_calls if self.num_calls else 0.0
        return (f"{name:<10} {self.num_tokens / self.num_steps:>11.2f} {100 * rate:>7.1f}% {mean_len:>9.2f} "
                f"{self.num_drafts:>7} {per_call:>10.1f}")


class Ours:
    def __init__(self, k: int, max_cached: int):
        config = SpeculativeConfig.from_value({"method": "suffix", "num_speculative_tokens": k,
                                               "suffix_decoding_max_tree_depth": DEPTH,
                                               "suffix_decoding_max_cached_requests": max_cached})
        self.proposer = config.proposer_cls(config, None)
        self.seq: Sequence | None = None

    def start(self, prompt: list[int]) -> None:
        self.seq = Sequence("bench", 0, prompt, SamplingParams(), 0, 0.0)

    def draft(self, context: list[int], k: int) -> list[int]:
        self.seq.all_token_ids = list(context)
        return self.proposer.propose(ProposeBatch([self.seq], [k])).token_ids[0].tolist()

    def stop(self) -> None:
        self.seq.status = SequenceStatus.FINISHED
        self.proposer.on_finished(self.seq)


class Arctic:
    def __init__(self, k: int, max_cached: int):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.cache = SuffixDecodingCache(max_tree_depth=DEPTH, max_cached_requests=max_cached)
        self.num_requests = 0
        self.seen = 0

    def start(self, prompt: list[int]) -> None:
        self.num_requests += 1
        self.cache.start_request(self.num_requests, prompt)
        self.seen = len(prompt)

    def draft(self, context: list[int], k: int) -> list[int]:
        if len(context) > self.seen:
            self.cache.add_active_response(self.num_requests, context[self.seen:])
            self.seen = len(context)
        return list(self.cache.speculate(self.num_requests, context[-DEPTH:], max_spec_tokens=k).token_ids)

    def stop(self) -> None:
        self.cache.stop_request(self.num_requests)


def run(proposer, streams: list[tuple[list[int], list[int]]], k: int) -> Tally:
    tally = Tally()
    for prompt, response in streams:
        proposer.start(prompt)
        pos = 0
        while pos < len(response):
            context = prompt + response[:pos]
            start = time.perf_counter()
            draft = [t for t in proposer.draft(context, min(k, len(response) - pos - 1)) if t >= 0]
            tally.seconds += time.perf_counter() - start
            tally.num_calls += 1
            accepted = 0
            while accepted < len(draft) and draft[accepted] == response[pos + accepted]:
                accepted += 1
            if draft:
                tally.num_drafts += 1
                tally.num_draft_tokens += len(draft)
                tally.num_accepted += accepted
            tally.num_steps += 1
            pos += accepted + 1
        tally.num_tokens += len(response)
        proposer.stop()
    return tally


def streams_for(workload: str, tokenizer, num_prompts: int) -> list[tuple[list[int], list[int]]]:
    if workload == "humaneval":
        with gzip.open(humaneval_path(), "rt", encoding="utf-8") as f:
            problems = [json.loads(line) for line in f if line.strip()][:num_prompts]
        pairs = [(p["prompt"], p["canonical_solution"]) for p in problems]
    else:
        pairs = []
        for item in load_workload("code-edit", num_prompts):
            content = item.messages[0]["content"]
            code = re.search(r"```python\n(.*?)```", content, re.S).group(1)
            pairs.append((content, code))
    return [(tokenizer.encode(p), tokenizer.encode(r)) for p, r in pairs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=40)
    parser.add_argument("--k", type=int, default=8, help="max drafts per step")
    parser.add_argument("--max-cached-requests", type=int, default=10000)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(None))
    try:
        Arctic(args.k, args.max_cached_requests)
        others = {"arctic": Arctic}
    except ImportError:
        print("arctic-inference is not installed: only draftwise's proposer is measured")
        others = {}
    print(f"K={args.k}, tree depth {DEPTH}, max_cached_requests {args.max_cached_requests}")
    print(f"{'proposer':<10} {'tokens/step':>11} {'accept':>8} {'mean len':>9} {'drafts':>7} {'us/call':>10}")
    for workload in ("humaneval", "code-edit"):
        streams = streams_for(workload, tokenizer, args.num_prompts)
        print(f"{workload}: {len(streams)} streams, {sum(len(r) for _, r in streams)} response tokens")
        for name, cls in {"draftwise": Ours, **others}.items():
            print(run(cls(args.k, args.max_cached_requests), streams, args.k).row(name))


if __name__ == "__main__":
    main()
