"""draftwise vs llama.cpp on the same GGUF file: the same prompts as token ids, greedy, one request
at a time, one engine at a time.

llama.cpp is llama-cpp-python (``make llamacpp`` builds it from source in its own venv), run by
``llamacpp_runner.py`` on the bundled SmolLM2 Q4_1 file (or ``--model``'s GGUF) with ``--threads`` threads: plain, and its
prompt-lookup decoding (``LlamaPromptLookupDecoding``, ``--num-pred-tokens``). draftwise runs the
file's blocks as stored (dtype auto): plain, ngram (K=5, lookup 2-4) and suffix, plus plain on
the de-quantized fp32 weights for reference. Workloads from ``draftwise/bench/workloads.py`` (code
edits, chat), chat-templated once here. Prints tokens/s, draftwise / llama.cpp plain and
/ llama.cpp prompt lookup, the CPU's flags and the load average; writes
``benchmarks/results/vs_llamacpp-<date>.json``. Not part of ``make test``; one benchmark at a time:

    make bench-vs-llamacpp
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from bench_vs_vllm import side_by_side
from transformers import AutoTokenizer

from draftwise.bench.measure import tokenize_prompts
from draftwise.models.loader import gguf_source, resolve_model
from draftwise.bench.workloads import load_workload

OURS = {
    "plain": {"speculative_config": None},
    "ngram": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2,
                                     "prompt_lookup_max": 4}},
    "suffix": {"speculative_config": {"method": "suffix"}},
    "plain-fp32": {"speculative_config": None, "dtype": "float32"},
}
THEIRS = ("plain", "prompt_lookup")
RUNNER = Path(__file__).with_name("llamacpp_runner.py")


def run_llamacpp(job: dict, python: str, workdir: Path) -> dict:
    job_path = workdir / "job.json"
    job_path.write_text(json.dumps(job))
    results = {}
    for label in THEIRS:
        print(f"llama.cpp: {label}", file=sys.stderr, flush=True)
        out = workdir / f"llamacpp-{label}.json"
        subprocess.run([python, str(RUNNER), str(job_path), label, str(out)], check=True)
        results[label] = json.loads(out.read_text())
    return results


def tokens_per_s(result: dict) -> float:
    return sum(map(len, result["alone_ids"])) / sum(result["alone_s"])


def report(job: dict, ours: dict, theirs: dict) -> list[dict]:
    rows = []
    print(f"\n{'workload':<10} {'draftwise':<11} {'tok/s':>7} {'llama.cpp':>10} {'ratio':>7} "
          f"{'lookup':>7} {'ratio':>7} {'same as llama.cpp':>18}")
    for name in job["workloads"]:
        plain, lookup = (theirs[label]["workloads"][name] for label in THEIRS)
        for label in ours:
            mine = ours[label]["workloads"][name]
            tps, base, pld = tokens_per_s(mine), tokens_per_s(plain), tokens_per_s(lookup)
            same = sum(a == b for a, b in zip(mine["alone_ids"], plain["alone_ids"]))
            rows.append({"workload": name, "method": label, "draftwise_tokens_per_s": tps,
                         "llamacpp_tokens_per_s": base, "llamacpp_lookup_tokens_per_s": pld,
                         "ratio": tps / base, "ratio_vs_lookup": tps / pld, "same_outputs": same})
            print(f"{name:<10} {label:<11} {tps:>7.1f} {base:>10.1f} {tps / base:>6.2f}x {pld:>7.1f} "
                  f"{tps / pld:>6.2f}x {same:>15}/{len(plain['alone_ids'])}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llamacpp-python", required=True, help="python of the venv `make llamacpp` built")
    parser.add_argument("--model", default=None, help="a GGUF file or bundled name (default: SmolLM2-135M Q4_1)")
    parser.add_argument("--workloads", default="code-edit,chat")
    parser.add_argument("--methods", default=",".join(OURS))
    parser.add_argument("--num-prompts", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-pred-tokens", type=int, default=5)
    parser.add_argument("--out", default=f"benchmarks/results/vs_llamacpp-{datetime.date.today()}.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    workloads = {name: [p.token_ids for p in tokenize_prompts(tokenizer, load_workload(name, args.num_prompts))]
                 for name in args.workloads.split(",")}
    longest = max(len(ids) for prompts in workloads.values() for ids in prompts)
    job = {"model": str(model), "gguf": str(gguf_source(model)), "dtype": "auto", "max_tokens": args.max_tokens,
           "max_model_len": longest + args.max_tokens + 64, "n_ctx": longest + args.max_tokens + 64,
           "threads": args.threads, "num_pred_tokens": args.num_pred_tokens, "workloads": workloads,
           "configs": [{"label": m, **OURS[m]} for m in args.methods.split(",")]}
    sig, ours, theirs, rows = side_by_side(job, lambda tmp: run_llamacpp(job, args.llamacpp_python, tmp), report,
                                           f"{args.threads} threads")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"date": str(datetime.date.today()), "cpu": sig, "args": vars(args),
                                          "load_average_end": os.getloadavg(), "rows": rows,
                                          "startup_s": {**{f"llamacpp-{k}": v["startup_s"] for k, v in theirs.items()},
                                                        **{f"draftwise-{k}": v["startup_s"] for k, v in ours.items()}}},
                                         indent=1))


if __name__ == "__main__":
    main()
