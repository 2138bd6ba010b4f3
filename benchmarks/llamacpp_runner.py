"""Runs llama.cpp (llama-cpp-python) on a job written by ``bench_vs_llamacpp.py``, in the venv
``make llamacpp`` builds (imports llama_cpp, not draftwise).

    .venv-llamacpp/bin/python benchmarks/llamacpp_runner.py JOB.json LABEL RESULT.json

The job names the GGUF file, the thread count, max_tokens, n_ctx and the prompts of each
workload as token ids. ``LABEL`` is ``plain`` or ``prompt_lookup`` (llama-cpp-python's
``LlamaPromptLookupDecoding``, which needs ``logits_all``). The model is loaded once (timed),
warmed up, and every prompt runs alone, one after the other, greedy; the result holds wall
times and output token ids.
"""
from __future__ import annotations

import json
import sys
import time


def build(job: dict, label: str):
    from llama_cpp import Llama

    extra = {}
    if label == "prompt_lookup":
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        extra = {"draft_model": LlamaPromptLookupDecoding(num_pred_tokens=job["num_pred_tokens"]),
                 "logits_all": True}
    return Llama(model_path=job["gguf"], n_threads=job["threads"], n_threads_batch=job["threads"],
                 n_ctx=job["n_ctx"], n_batch=512, seed=0, verbose=False, **extra)


def generate(llm, ids: list[int], max_tokens: int) -> list[int]:
    """Greedy continuation of ``ids``, stopping at EOS or ``max_tokens``."""
    out, eos = [], llm.token_eos()
    llm.reset()
    for token in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
        if token == eos:
            break
        out.append(token)
        if len(out) >= max_tokens:
            break
    return out


def main() -> None:
    job = json.loads(open(sys.argv[1]).read())
    label = sys.argv[2]
    start = time.perf_counter()
    llm = build(job, label)
    result = {"startup_s": time.perf_counter() - start, "workloads": {}}
    generate(llm, next(iter(job["workloads"].values()))[0], 8)  # warm-up
    for name, prompts in job["workloads"].items():
        alone, alone_ids = [], []
        for ids in prompts:
            start = time.perf_counter()
            alone_ids.append(generate(llm, ids, job["max_tokens"]))
            alone.append(time.perf_counter() - start)
        result["workloads"][name] = {"alone_s": alone, "alone_ids": alone_ids}
    with open(sys.argv[3], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
