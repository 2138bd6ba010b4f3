"""Weights as stored vs de-quantized: one GGUF model's step and decode speed, side by side.

Configurations, one engine at a time in this process (SmolLM2-135M-Instruct Q4_1 unless --model):
``stored`` (dtype auto: the file's blocks, ``GGUFLinear``, the layers as one C++ stack),
``stored-python`` (the same with the layers in Python, op by op), ``stored-fp32`` (the blocks, fp32
activations and KV cache), ``fp32`` and ``bf16`` (de-quantized at load; bf16 only where oneDNN
runs it). For each, rounds alternating between engines:
  * target step time (forward + logits) at 1, 2, 4, 8, 16 rows after --context tokens, and each
    row count's cost relative to one row (a verify step of K+1 rows against a decode step);
  * the linears alone (every layer linear and the head, called back to back) at 1 and 8 rows:
    what the rest of the step (attention, norms, Python) costs is the difference;
  * plain greedy decode tokens/s, one request, --max-tokens new tokens.
Also the bytes one step streams (weights as held, the head included) and the floor they set at
the memory read bandwidth measured here. Prints the CPU's ISA flags and the load average, and
writes ``benchmarks/results/weights-<date>.json``.

    flock /tmp/draftwise-bench.lock .venv/bin/python benchmarks/bench_weights.py
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import statistics
import time
from pathlib import Path

import torch
from bench_kernels import PROMPT, decode_tps, step_ms

from draftwise import LLM, SamplingParams
from draftwise.layers.gguf_linear import ConcatLinear, GGUFLinear
from draftwise.layers.kernel_choice import cpu_signature
from draftwise.layers.linear import PackedLinear, can_pack

ROWS = (1, 2, 4, 8, 16)
PYTHON_LAYERS = {"stored-python"}  # the same blocks with the C++ decoder stack off: the layers run in Python
CONFIGS = {"stored": {"dtype": "auto"}, "stored-python": {"dtype": "auto"}, "stored-fp32": {"dtype": "float32", "additional_config": {"gguf_weights": "quantized"}},
           "fp32": {"dtype": "float32"}, "bf16": {"dtype": "bfloat16"}}


def linears(model) -> list:
    kinds = (GGUFLinear, ConcatLinear, PackedLinear, torch.nn.Linear)
    mods = [m for layer in model.layers for m in layer.children() if isinstance(m, kinds)]
    return mods + [model.lm_head]


def streamed_bytes(model) -> int:
    """Bytes of weights one step reads: every linear as held (blocks or floats) and the norms."""
    total = 0
    for module in linears(model):
        tensors = [module.blocks] if isinstance(module, GGUFLinear) else \
            [p.blocks for p in module.parts] if isinstance(module, ConcatLinear) else [module.weight]
        total += sum(t.numel() * t.element_size() for t in tensors)
    return total


@torch.inference_mode()
def linears_ms(model, rows: int, dtype: torch.dtype, repeats: int = 5) -> float:
    mods = linears(model)
    inputs = [torch.randn(rows, m.in_features).to(dtype) for m in mods]
    samples = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        for m, x in zip(mods, inputs):
            m(x)
        samples.append(time.perf_counter() - start)
    return 1000 * min(samples[1:])


def read_bandwidth() -> float:
    """GB/s of a sum over 1 GiB of fp32, best of 3."""
    x = torch.ones(2 ** 28)
    best = min(_timed(lambda: x.sum().item()) for _ in range(4))
    return x.numel() * 4 / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=f"benchmarks/results/weights-{datetime.date.today()}.json")
    args = parser.parse_args()
    names = [n for n in args.configs.split(",") if n != "bf16" or can_pack(torch.device("cpu"), torch.bfloat16)]
    sig = cpu_signature()
    print(f"{sig['cpu']}, flags {' '.join(sig['flags'])}, torch {torch.__version__}, {torch.get_num_threads()} "
          f"threads; load average {os.getloadavg()}")
    bandwidth = read_bandwidth()
    results = {n: {"steps": {r: [] for r in ROWS}, "linears": {1: [], 8: []}, "tps": []} for n in names}
    for _ in range(args.rounds):
        for name in names:
            llm = LLM(model=args.model, **CONFIGS[name])
            engine, model = llm.llm_engine, llm.llm_engine.runner.model
            if name in PYTHON_LAYERS:
                model.stack = None
            llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up
            res = results[name]
            res["bytes"], res["dtype"] = streamed_bytes(model), str(engine.dtype)
            for rows in ROWS:
                res["steps"][rows].append(step_ms(engine, args.context, rows))
            for rows in res["linears"]:
                res["linears"][rows].append(linears_ms(model, rows, engine.dtype))
            res["tps"].append(decode_tps(llm, args.max_tokens))
            del llm, engine, model
            gc.collect()
    report(results, bandwidth, args, sig)


def report(results: dict, bandwidth: float, args, sig: dict) -> None:
    med = {n: {"steps": {r: statistics.median(v) for r, v in res["steps"].items()},
               "linears": {r: statistics.median(v) for r, v in res["linears"].items()},
               "tps": statistics.median(res["tps"]), "bytes": res["bytes"], "dtype": res["dtype"]}
           for n, res in results.items()}
    print(f"\nread bandwidth {bandwidth:.1f} GB/s; step time, ms (forward + logits, context {args.context}; "
          f"median over {args.rounds} rounds of best-of-5)")
    print(f"{'config':<12} {'MB/step':>8} {'floor ms':>8} " + " ".join(f"{r:>6}r" for r in ROWS)
          + "   8r/1r  linears 1r / 8r  decode tok/s")
    for name, m in med.items():
        floor = m["bytes"] / bandwidth / 1e6
        steps = " ".join(f"{m['steps'][r]:7.2f}" for r in ROWS)
        print(f"{name:<12} {m['bytes'] / 1e6:8.1f} {floor:8.2f} {steps}  {m['steps'][8] / m['steps'][1]:5.2f}x"
              f"  {m['linears'][1]:6.2f} / {m['linears'][8]:6.2f}  {m['tps']:8.1f}")
    base = med.get("fp32")
    if base:
        print("decode vs fp32 de-quantized: " + ", ".join(f"{n} {m['tps'] / base['tps']:.2f}x" for n, m in med.items()))
    print(f"load average at the end {os.getloadavg()}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"date": str(datetime.date.today()), "cpu": sig, "args": vars(args),
                                          "bandwidth_gb_s": bandwidth, "load_average_end": os.getloadavg(),
                                          "results": med}, indent=1))


if __name__ == "__main__":
    main()
