"""GPU benchmark in one run: draftwise with CUDA graphs and the fused Triton layers (the default), with
graphs over torch's ops (``DRAFTWISE_TRITON=0``), draftwise eager and transformers' ``generate`` on the
same GPU and weights, against the bandwidth floor; the step time by verify rows (what a draft costs),
and suffix decoding on a repeated request (its best case).

    python benchmarks/bench_cuda.py [--model DIR] [--max-tokens 128] [--concurrency 16] [--out JSON]

Without ``--model`` it writes a random Llama with SmolLM2-135M's shapes (``scripts/device_model.py``):
its per-step cost is the real model's, its text is not, so acceptance figures need real weights.
Greedy, EOS ignored. Prints one line per figure and the ratios; ``--out`` writes them as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from draftwise import LLM, SamplingParams
from draftwise.engine.compile_target import attach_static_step
from draftwise.engine.drafting.step_timing import measure_step_seconds

PROMPT = "Write a short story about a robot who learns to paint. Describe the colours it sees."


def tokens_per_s(llm: LLM, prompts: list[str], max_tokens: int, repeats: int = 1) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    speeds = []
    for _ in range(repeats):
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        speeds.append(sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - start))
    return statistics.median(speeds)


def bench_engine(model: str, max_tokens: int, concurrency: int, profile: str | None = None, **kwargs) -> dict:
    llm = LLM(model=model, dtype="bfloat16", **kwargs)
    tokens_per_s(llm, [PROMPT, PROMPT + " Again."], 16)  # warm-up: the graphs of 1 and 2 sequences
    batch = [f"{PROMPT} Version {i}." for i in range(concurrency)]
    tokens_per_s(llm, batch, 8)
    figures = {"single": tokens_per_s(llm, [PROMPT], max_tokens, repeats=3),
               f"concurrent_{concurrency}": tokens_per_s(llm, batch, max_tokens)}
    if profile:
        write_profile(llm, max_tokens, profile)
    step = llm.llm_engine.runner.paged.static_step
    figures["graphs_captured"] = step.num_graphs_captured if step is not None else 0
    return figures


def write_profile(llm: LLM, max_tokens: int, path: str) -> None:
    """Where the host's time goes in one request: cProfile's top functions by cumulative time."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.runcall(tokens_per_s, llm, [PROMPT], max_tokens)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(45)
    Path(path).write_text(text.getvalue())


def bench_transformers(model: str, max_tokens: int) -> float:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).cuda().eval()
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids.cuda()
    with torch.inference_mode():
        hf.generate(ids, max_new_tokens=8, do_sample=False)
        start = time.perf_counter()
        out = hf.generate(ids, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)
    return (out.shape[1] - ids.shape[1]) / (time.perf_counter() - start)


def floor_steps_per_s(llm: LLM) -> tuple[float, float]:
    """(copy bandwidth GB/s, steps/s at which one step reads every streamed weight once)."""
    buf = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    out = torch.empty_like(buf)
    out.copy_(buf)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        out.copy_(buf)
    torch.cuda.synchronize()
    bandwidth = 2 * 10 * buf.numel() / (time.perf_counter() - start)  # bytes read + written
    model = llm.llm_engine.runner.model
    return bandwidth / 1e9, bandwidth / (model.num_streamed_params * 2)


def capture_verify(llm: LLM, max_query_len: int) -> None:
    """Capture the engine's verify batches too (up to ``max_query_len`` rows per sequence)."""
    engine = llm.llm_engine
    attach_static_step(engine.runner.paged, engine.block_manager.num_blocks, engine.runner.paged.static_step.sizes,
                       max_query_len, engine.max_model_len, capture=True)


def verify_row_ms(model: str, rows: list[int]) -> dict[int, float]:
    """Step time (forward + logits of every row) by rows of one sequence at 128 tokens of context, every
    row count captured."""
    llm = LLM(model=model, dtype="bfloat16")
    capture_verify(llm, max(rows))
    engine = llm.llm_engine
    seconds = measure_step_seconds(engine.runner.paged, engine.block_manager, rows, 128, repeats=20)
    return {r: round(s * 1e3, 3) for r, s in seconds.items()}


def suffix_repeat(model: str, max_tokens: int) -> dict:
    """A request asked twice: the second time suffix decoding's tree holds the whole answer."""
    llm = LLM(model=model, dtype="bfloat16", speculative_config={"method": "suffix", "num_speculative_tokens": 8})
    tokens_per_s(llm, [PROMPT], max_tokens)
    speed = tokens_per_s(llm, [PROMPT], max_tokens, repeats=3)
    stats = llm.get_spec_decode_stats()
    return {"tokens_per_s": speed, "mean_acceptance_length": stats["spec_decode_mean_acceptance_length"]}


def without_triton(run, *args, **kwargs):
    """``run`` with the fused Triton layers off (each layer as torch's ops)."""
    os.environ["DRAFTWISE_TRITON"] = "0"
    try:
        return run(*args, **kwargs)
    finally:
        del os.environ["DRAFTWISE_TRITON"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out")
    parser.add_argument("--profile", help="write the host profile of one graphed request here")
    args = parser.parse_args()
    model = args.model or "/tmp/smol-random"
    if not args.model and not Path(model, "config.json").exists():
        subprocess.run([sys.executable, str(Path(__file__).parents[1] / "scripts/device_model.py"), model], check=True)
    results = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "model": model,
               "max_tokens": args.max_tokens}
    results["graphs"] = bench_engine(model, args.max_tokens, args.concurrency, profile=args.profile)
    print("draftwise, CUDA graphs, fused Triton layers:", results["graphs"], flush=True)
    results["graphs_torch_ops"] = without_triton(bench_engine, model, args.max_tokens, args.concurrency)
    print("draftwise, CUDA graphs, torch ops:", results["graphs_torch_ops"], flush=True)
    results["eager"] = bench_engine(model, args.max_tokens, args.concurrency, enforce_eager=True)
    print("draftwise, eager (fused Triton layers):", results["eager"], flush=True)
    results["transformers_single"] = bench_transformers(model, args.max_tokens)
    print("transformers generate, single:", round(results["transformers_single"], 1), flush=True)
    results["copy_gb_s"], results["floor_steps_per_s"] = floor_steps_per_s(LLM(model=model, dtype="bfloat16"))
    print(f"bandwidth floor: {results['floor_steps_per_s']:.0f} steps/s ({results['copy_gb_s']:.0f} GB/s)", flush=True)
    results["verify_step_ms"] = verify_row_ms(model, [1, 2, 4, 8, 16])
    print("step ms by verify rows (graphs):", results["verify_step_ms"], flush=True)
    results["suffix_repeat"] = suffix_repeat(model, args.max_tokens)
    print("suffix, repeated request:", results["suffix_repeat"], flush=True)
    graphs, eager, torch_ops = results["graphs"], results["eager"], results["graphs_torch_ops"]
    many = f"concurrent_{args.concurrency}"
    print(f"graphs/eager single {graphs['single'] / eager['single']:.2f}x; fused/torch ops under graphs "
          f"{graphs['single'] / torch_ops['single']:.2f}x single, {graphs[many] / torch_ops[many]:.2f}x concurrent; "
          f"graphs/transformers {graphs['single'] / results['transformers_single']:.2f}x; "
          f"suffix repeat/plain {results['suffix_repeat']['tokens_per_s'] / graphs['single']:.2f}x")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
