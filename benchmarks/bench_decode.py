"""Decode-speed benchmark: draftwise vs Hugging Face transformers, same weights, same run.

Measures, for SmolLM2-135M-Instruct (or --model), greedy decoding of
--max-tokens new tokens (EOS ignored):
  * one request at a time (tokens/s, median of --repeats runs),
  * --concurrency requests at once (aggregate output tokens/s),
  * transformers' `generate` on the same converted weights,
and prints the ratios and the peak resident memory of the process.

    python benchmarks/bench_decode.py [--dtype bfloat16] [--max-tokens 256] [--concurrency 16]
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch

from draftwise import LLM, SamplingParams
from draftwise.models.loader import load_transformers_model, resolve_model

PROMPT = "Write a short story about a robot who learns to paint. Describe the colours it sees."


def bench_draftwise(llm: LLM, max_tokens: int, repeats: int, concurrency: int) -> tuple[float, float]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up
    single = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = llm.generate(PROMPT, params, use_tqdm=False)[0]
        single.append(len(out.outputs[0].token_ids) / (time.perf_counter() - start))
    prompts = [f"{PROMPT} Version {i}." for i in range(concurrency)]
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    batched = sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - start)
    return statistics.median(single), batched


def bench_transformers(path, dtype: torch.dtype, device: torch.device, max_tokens: int, repeats: int) -> float:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = load_transformers_model(path, dtype).to(device)
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids.to(device)
    kwargs = dict(max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)
    model.generate(ids, max_new_tokens=8, do_sample=False)  # warm-up
    speeds = []
    for _ in range(repeats):
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, **kwargs)
        speeds.append((out.shape[1] - ids.shape[1]) / (time.perf_counter() - start))
    return statistics.median(speeds)


def memory_bandwidth_gbs() -> float:
    """Read bandwidth of this machine right now (torch sum over 1 GiB): the decode speed limit."""
    data = torch.ones(256 * 1024 * 1024)
    data.sum()
    start = time.perf_counter()
    for _ in range(3):
        data.sum()
    return 3 * data.numel() * 4 / (time.perf_counter() - start) / 1e9


def weight_bytes(llm: LLM) -> int:
    """Bytes of weights one decode step streams (each distinct tensor once)."""
    return llm.llm_engine.runner.model.num_streamed_params * llm.llm_engine.dtype.itemsize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--no-transformers", action="store_true")
    args = parser.parse_args()
    llm = LLM(model=args.model, dtype=args.dtype, max_num_seqs=max(16, args.concurrency))
    dtype = llm.llm_engine.dtype
    single, batched = bench_draftwise(llm, args.max_tokens, args.repeats, args.concurrency)
    device = llm.llm_engine.device
    print(f"model: {llm.llm_engine.config.model_path.name}  dtype: {dtype}  device: {device}  "
          f"threads: {torch.get_num_threads()}")
    if device.type == "cpu":
        bandwidth = memory_bandwidth_gbs()
        print(f"memory bandwidth now: {bandwidth:.1f} GB/s -> at most "
              f"{bandwidth * 1e9 / weight_bytes(llm):.0f} decode steps/s for these weights")
    print(f"draftwise   single request : {single:7.1f} tokens/s  (median of {args.repeats})")
    print(f"draftwise   {args.concurrency:2d} concurrent  : {batched:7.1f} tokens/s  "
          f"({batched / single:.1f}x single)")
    if not args.no_transformers:
        hf = bench_transformers(resolve_model(args.model), dtype, device, args.max_tokens, args.repeats)
        print(f"transformers generate      : {hf:7.1f} tokens/s  -> draftwise/transformers = {single / hf:.2f}x")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS: {peak:.0f} MiB")


if __name__ == "__main__":
    main()
