"""Kernel plans side by side: the one measured at start-up vs the fixed default.

One engine (SmolLM2-135M-Instruct unless --model); its linears switch plan in place, so
both plans run the same weights in the same process, alternating round by round:
  * target step time (forward + logits) at 1, 2, 4, 6, 8 rows on a --context-token context,
    and the cost of a K+1-row verify step relative to a one-row step,
  * plain greedy decode tokens/s, one request, --max-tokens new tokens.
Prints the plans, the CPU's ISA flags, the load average, and the ratios measured / default.

    flock /tmp/draftwise-bench.lock python benchmarks/bench_kernels.py [--dtype bfloat16]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from draftwise import LLM, SamplingParams
from draftwise.layers.kernel_choice import cpu_signature, describe
from draftwise.models.registry import kernel_groups
from draftwise.paged import ForwardInput
from draftwise.sequence import Sequence

PROMPT = "Write a short story about a robot who learns to paint. Describe the colours it sees."
ROWS = (1, 2, 4, 6, 8)


def apply(groups: dict, plans: dict[str, dict[int, str]]) -> None:
    """Switch the model's kernel groups (linears, attention) to ``plans`` in place."""
    for name, group in groups.items():
        group.apply(plans[name])


@torch.inference_mode()
def step_ms(engine, context: int, rows: int, repeats: int = 5) -> float:
    """Best time of a target forward + logits over ``rows`` rows after ``context`` tokens."""
    paged, manager = engine.runner.paged, engine.block_manager
    dummy = Sequence("kernels", 0, [1] * context, SamplingParams(temperature=0.0), 0, 0.0)
    assert manager.ensure(dummy, context + rows)
    try:
        paged.forward([ForwardInput(dummy.all_token_ids, 0, dummy.block_ids)])
        samples = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            hidden, _, _ = paged.forward([ForwardInput([1] * rows, context, dummy.block_ids)])
            paged.compute_logits(hidden).argmax(dim=-1).tolist()
            samples.append(time.perf_counter() - start)
    finally:
        manager.free(dummy)
    return 1000 * min(samples[1:])


def decode_tps(llm: LLM, max_tokens: int) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    out = llm.generate(PROMPT, params, use_tqdm=False)[0]
    return len(out.outputs[0].token_ids) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    start = time.perf_counter()
    llm = LLM(model=args.model, dtype=args.dtype)
    print(f"engine built in {time.perf_counter() - start:.1f} s")
    engine = llm.llm_engine
    model = engine.runner.model
    dtype = getattr(torch, args.dtype)
    groups = kernel_groups(model, dtype)
    plans = {"measured": model.kernel_plans, "default": {name: g.default_plan for name, g in groups.items()}}
    sig = cpu_signature()
    print(f"{sig['cpu']}, flags {' '.join(sig['flags'])}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {args.dtype}; load average {os.getloadavg()}")
    for name, plan in plans.items():
        print(f"{name:>8}: {describe(plan)}")
    steps = {name: {r: [] for r in ROWS} for name in plans}
    tps = {name: [] for name in plans}
    llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up
    for _ in range(args.rounds):
        for name, plan in plans.items():
            apply(groups, plan)
            for rows in ROWS:
                steps[name][rows].append(step_ms(engine, args.context, rows))
            tps[name].append(decode_tps(llm, args.max_tokens))
    apply(groups, plans["measured"])
    report(steps, tps, args)


def report(steps: dict, tps: dict, args) -> None:
    med = {n: {r: statistics.median(v) for r, v in by_rows.items()} for n, by_rows in steps.items()}
    print(f"\nstep time, ms (forward + logits, context {args.context}; median of best-of-5 over rounds)")
    print(f"{'rows':>6} " + " ".join(f"{n:>9}" for n in med) + "  measured/default  rows cost vs 1 row (measured)")
    for rows in ROWS:
        cells = " ".join(f"{med[n][rows]:9.2f}" for n in med)
        print(f"{rows:>6} {cells}  {med['measured'][rows] / med['default'][rows]:15.2f}x"
              f"  {med['measured'][rows] / med['measured'][1]:.2f}x")
    t = {n: statistics.median(v) for n, v in tps.items()}
    print(f"\nplain decode, one request, {args.max_tokens} tokens: measured {t['measured']:.1f} tokens/s, "
          f"default {t['default']:.1f} tokens/s, ratio {t['measured'] / t['default']:.2f}x; "
          f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
