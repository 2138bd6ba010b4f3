"""Runs vLLM on a job written by ``bench_vs_vllm.py`` (in the anchor venv; imports vLLM, not draftwise).

    .venv-anchor/bin/python benchmarks/vllm_runner.py JOB.json LABEL RESULT.json

The job names the model directory, dtype, max_tokens, the configurations (a
label and a ``speculative_config`` or null), the prompts of each workload as
token ids and, for structured outputs, each prompt's JSON schema (``schemas``). The
configuration ``LABEL`` gets one ``vllm.LLM`` in this process
(its start-up is timed), warmed up, and each workload is run the way ``timed_workload`` in
``bench_vs_vllm.py`` runs draftwise: every prompt alone, one after the other,
then all prompts at once. The result holds wall times and output token ids.
"""
from __future__ import annotations

import json
import sys
import time


def workload_params(job: dict, name: str) -> list:
    """Greedy params for each prompt of workload ``name``, constrained to its schema when the job has them."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    schemas = job.get("schemas", {}).get(name) or [None] * len(job["workloads"][name])
    return [SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], detokenize="schemas" in job,
                           structured_outputs=StructuredOutputsParams(json=schema) if schema else None)
            for schema in schemas]


def run_config(job: dict, config: dict) -> dict:
    from vllm import LLM, SamplingParams

    schemas = job.get("schemas", {})
    start = time.perf_counter()
    llm = LLM(model=job["model"], dtype=job["dtype"], seed=0, max_model_len=job["max_model_len"],
              max_num_seqs=max(len(p) for p in job["workloads"].values()), skip_tokenizer_init=not schemas,
              speculative_config=config["speculative_config"])
    startup = time.perf_counter() - start
    warm = next(iter(job["workloads"].values()))[0]
    llm.generate([{"prompt_token_ids": warm}], SamplingParams(temperature=0.0, max_tokens=8, detokenize=False),
                 use_tqdm=False)
    out = {"startup_s": startup, "workloads": {}}
    for name, prompts in job["workloads"].items():
        alone, alone_ids, each = [], [], workload_params(job, name)
        for ids, p in zip(prompts, each):
            start = time.perf_counter()
            result = llm.generate([{"prompt_token_ids": ids}], p, use_tqdm=False)[0]
            alone.append(time.perf_counter() - start)
            alone_ids.append(list(result.outputs[0].token_ids))
        start = time.perf_counter()
        results = llm.generate([{"prompt_token_ids": ids} for ids in prompts], each, use_tqdm=False)
        together = time.perf_counter() - start
        out["workloads"][name] = {"alone_s": alone, "alone_ids": alone_ids, "together_s": together,
                                  "together_ids": [list(r.outputs[0].token_ids) for r in results]}
    return out


def main() -> None:
    job = json.loads(open(sys.argv[1]).read())
    (config,) = [c for c in job["configs"] if c["label"] == sys.argv[2]]
    result = run_config(job, config)
    with open(sys.argv[3], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
