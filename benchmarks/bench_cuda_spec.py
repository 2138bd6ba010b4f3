"""Speculative decoding on a GPU with real weights: plain vs ngram and suffix on code edits, plain vs
EAGLE-3 (a chain and a token tree) on chat, one request at a time and 16 at once, in one run.

    python benchmarks/bench_cuda_spec.py [--model GGUF_OR_DIR] [--num-prompts 8] [--max-tokens 128] [--out JSON]

The model defaults to the bundled SmolLM2-135M-Instruct (its Q4_1 file, de-quantized to bf16 on the
GPU) and EAGLE-3 to the head that ships for it. Prompts come from ``draftwise/bench/workloads.py``,
chat-templated; greedy, EOS ignored, so every configuration emits the same tokens and the same count.
Prints tokens/s, mean acceptance length and the ratio to plain for each row; ``--out`` writes JSON.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from draftwise import LLM, SamplingParams
from draftwise.bench.measure import tokenize_prompts
from draftwise.bench.workloads import load_workload
from draftwise.models.loader import resolve_model

EAGLE3 = {"method": "eagle3", "model": "draftwise/SmolLM2-135M-Instruct-eagle3"}
TREE = "[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"
CONFIGS = {  # workload -> label -> speculative_config
    "code-edit": {"plain": None,
                  "ngram": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2,
                            "prompt_lookup_max": 4},
                  "suffix": {"method": "suffix"}},
    "chat": {"plain": None, "eagle3 K=3": {**EAGLE3, "num_speculative_tokens": 3},
             "eagle3 tree": {**EAGLE3, "speculative_token_tree": TREE}},
}


def run(llm: LLM, prompts: list[list[int]], max_tokens: int, concurrency: int) -> tuple[float, list[list[int]]]:
    """(tokens/s, each prompt's tokens) with ``concurrency`` requests at a time."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start, outputs = time.perf_counter(), []
    for i in range(0, len(prompts), concurrency):
        batch = [{"prompt_token_ids": ids} for ids in prompts[i:i + concurrency]]
        outputs += [o.outputs[0].token_ids for o in llm.generate(batch, params, use_tqdm=False)]
    return sum(map(len, outputs)) / (time.perf_counter() - start), outputs


def bench(model: Path, prompts: list[list[int]], spec: dict | None, max_tokens: int, concurrency: list[int]) -> dict:
    llm = LLM(model=str(model), dtype="bfloat16", speculative_config=spec, max_model_len=2048)
    run(llm, prompts[:2], 16, 2)  # warm-up: kernels built, first graphs captured
    row = {}
    for c in concurrency:
        speed, tokens = run(llm, prompts, max_tokens, c)
        row[f"c{c}_tokens_per_s"], row[f"c{c}_tokens"] = round(speed, 1), tokens
    if spec is not None:
        row["mean_acceptance_length"] = round(llm.get_spec_decode_stats()["spec_decode_mean_acceptance_length"], 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a GGUF file or HF folder (default: the bundled SmolLM2)")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--out")
    args = parser.parse_args()
    model = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    concurrency = [int(c) for c in args.concurrency.split(",")]
    results = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
               "torch": torch.__version__, "model": str(args.model or model), "args": vars(args), "rows": {}}
    for workload, configs in CONFIGS.items():
        prompts = [p.token_ids for p in tokenize_prompts(tokenizer, load_workload(workload, args.num_prompts))]
        plain = None  # the plain row, with its tokens
        for label, spec in configs.items():
            row = bench(model, prompts, spec, args.max_tokens, concurrency)
            plain = plain or dict(row)
            for c in concurrency:
                row[f"c{c}_over_plain"] = round(row[f"c{c}_tokens_per_s"] / plain[f"c{c}_tokens_per_s"], 2)
                row[f"c{c}_same_tokens_as_plain"] = row.pop(f"c{c}_tokens") == plain[f"c{c}_tokens"]
            print(workload, label, row, flush=True)
            results["rows"][f"{workload} / {label}"] = row
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
