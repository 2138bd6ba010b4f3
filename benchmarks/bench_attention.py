"""The paged CPU attention kernel against torch's SDPA, one layer, side by side.

The kernel (``draftwise_cpu::paged_attention``) serves every causal CPU row with one arithmetic per
row; this measures what that costs against the flash SDPA it replaced for prompts: one sequence's
prompt of 1K, 2K and 4K tokens (causal), a decode row and verify rows (4, 8) at 300 and 2K keys,
and a decode row through 16 layers' caches at 2K and 8K keys ("stream": read from memory, as a
step reads them; the other cases reuse one layer's cache, which stays in the CPU's caches).
Shapes of SmolLM2-135M (9 heads, 3 KV heads, dim 64) and Llama-3.2-1B (32, 8, 64), the KV cache
in bf16 and fp32; SDPA reads the context as one contiguous tensor (no block gather: its best
case). Each case alternates the two, best of ``--repeats``; prints ms and SDPA / kernel (above 1:
the kernel is faster), the CPU's flags and the load average, and writes
``benchmarks/results/attention-<date>.json``.

    flock /tmp/draftwise-bench.lock .venv/bin/python benchmarks/bench_attention.py
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from draftwise.kernels import native
from draftwise.kernels.cpu_info import cpu_signature

SHAPES = {"SmolLM2-135M": (9, 3, 64), "Llama-3.2-1B": (32, 8, 64)}
BLOCK_SIZE = 16
CASES = [("prefill", 1024, 1024), ("prefill", 2048, 2048), ("prefill", 4096, 4096),
         ("decode", 300, 1), ("decode", 2048, 1), ("verify", 2048, 4), ("verify", 2048, 8),
         ("stream", 2048, 1), ("stream", 8192, 1)]
STREAM_LAYERS = 16  # a "stream" case: one decode row through this many layers' caches, as a step reads them


def _inputs(shape, context: int, rows: int, dtype: torch.dtype):
    heads, kv_heads, dim = shape
    gen = torch.Generator().manual_seed(0)
    slots = -(-context // BLOCK_SIZE) * BLOCK_SIZE
    cache = torch.randn(2, slots, kv_heads, dim, generator=gen).to(dtype)  # [2, slots, kv_heads, dim]
    q = torch.randn(rows, heads, dim, generator=gen).to(dtype)  # [rows, heads, dim]
    return cache, q


def _stream_runners(shape, context: int, dtype: torch.dtype):
    """(kernel, sdpa): one decode row through ``STREAM_LAYERS`` layers, each its own cache, so the
    keys and values come from memory as in a decode step (a single layer's cache stays in cache)."""
    layers = [_runners(shape, context, 1, dtype) for _ in range(STREAM_LAYERS)]

    def kernel():
        for run, _ in layers:
            run()

    def sdpa():
        for _, run in layers:
            run()
    return kernel, sdpa


def _runners(shape, context: int, rows: int, dtype: torch.dtype):
    """(kernel, sdpa): each attends the last ``rows`` positions of one ``context``-token sequence."""
    cache, q = _inputs(shape, context, rows, dtype)
    dim = shape[2]
    table = torch.arange(cache.shape[1] // BLOCK_SIZE)[None]
    starts, lens = torch.tensor([0, rows]), torch.tensor([context])
    keys, values = (cache[i, :context].transpose(0, 1)[None] for i in (0, 1))  # [1, kv_heads, context, dim]
    queries = q.transpose(0, 1)[None]  # [1, heads, rows, dim]
    mask = None
    if rows not in (1, context):  # verify rows: each sees the keys up to its own position
        mask = torch.arange(context)[None, :] <= torch.arange(context - rows, context)[:, None]

    def kernel():
        torch.ops.draftwise_cpu.paged_attention(q, cache, table, starts, lens, BLOCK_SIZE, dim ** -0.5, 0, None)

    def sdpa():
        F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, is_causal=rows == context,
                                       enable_gqa=True)
    return kernel, sdpa


def _best(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=f"benchmarks/results/attention-{datetime.date.today()}.json")
    args = parser.parse_args()
    if not native.load():
        raise SystemExit("the C++ kernels did not build here: nothing to compare")
    signature = cpu_signature()
    cpu, flags = signature["cpu"], signature["flags"]
    print(f"{cpu}, flags {' '.join(flags)}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"load average {os.getloadavg()}")
    print(f"{'shape':<14} {'dtype':<9} {'case':<8} {'keys':>5} {'rows':>5} {'kernel ms':>10} {'sdpa ms':>9} "
          f"{'sdpa/kernel':>12}")
    rows = []
    for name, shape in SHAPES.items():
        for dtype in (torch.bfloat16, torch.float32):
            for case, context, num_rows in CASES:
                if case == "stream":
                    kernel, sdpa = _stream_runners(shape, context, dtype)
                else:
                    kernel, sdpa = _runners(shape, context, num_rows, dtype)
                times = {"kernel": [], "sdpa": []}
                for _ in range(2):  # alternated
                    times["kernel"].append(_best(kernel, args.repeats))
                    times["sdpa"].append(_best(sdpa, args.repeats))
                ours, theirs = min(times["kernel"]), min(times["sdpa"])
                rows.append({"shape": name, "dtype": str(dtype).removeprefix("torch."), "case": case,
                             "keys": context, "rows": num_rows, "kernel_ms": ours, "sdpa_ms": theirs,
                             "sdpa_over_kernel": theirs / ours})
                print(f"{name:<14} {rows[-1]['dtype']:<9} {case:<8} {context:>5} {num_rows:>5} {ours:>10.3f} "
                      f"{theirs:>9.3f} {theirs / ours:>11.2f}x")
    print(f"load average at the end {os.getloadavg()}")
    result = {"date": str(datetime.date.today()), "cpu": cpu, "flags": flags, "torch": torch.__version__,
              "threads": torch.get_num_threads(), "command": "benchmarks/bench_attention.py", "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
