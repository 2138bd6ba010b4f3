"""Speculative decoding benchmark: tokens/s and acceptance per method, one request at a time, greedy.

For each workload (``draftwise.workloads``) and each method (``none`` = no speculation), every
prompt runs on one engine per method, methods interleaved per prompt (their order rotating)
so that the drift of a shared machine hits all methods alike. Reported per workload:
output tokens/s (total output tokens / total request time, prefill included), decode tokens/s
(tokens after the first / time after the first token: 1 / time per output token), speedups
over ``none``, acceptance rate (accepted / drafted), mean acceptance length (1 + accepted / drafts),
per-position acceptance (from ``LLM.get_metrics()`` differences around each request), and the
share of prompts whose greedy output equals ``none``'s token for token (must be all of them in
float32; bf16 may differ slightly because verifying several rows changes the rounding).
``--sweep`` adds a num_speculative_tokens table for ngram on the first workload.

With ``--repeats R`` each request runs R times (interleaved too) and its median time counts;
acceptance and outputs come from the first run. Suffix decoding's global tree then already
holds the same prompt's earlier output, which flatters its later runs.

    python benchmarks/bench_spec.py --workloads code-edit,humaneval,chat --methods none,ngram,suffix
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from dataclasses import dataclass, field

import torch

from draftwise import LLM, SamplingParams
from draftwise.outputs import RequestOutput
from draftwise.workloads import BenchPrompt, load_workload

WARMUP = BenchPrompt("warmup", messages=[{"role": "user", "content": "Say hello."}])
COUNTERS = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")


@dataclass
class Engine:
    label: str
    method: str  # "none" or a speculative_config method
    num_speculative_tokens: int | None
    llm: LLM


@dataclass
class Tally:
    """One engine on one workload; spec counters are differences of ``get_metrics``."""
    num_tokens: int = 0
    seconds: float = 0.0
    decode_seconds: float = 0.0  # after each request's first token (prefill excluded)
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    num_matched: int = 0  # prompts whose output equals the none engine's
    num_compared: int = 0
    has_metrics: bool = False

    num_requests: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds if self.seconds else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first per second after the first: 1 / time per output token."""
        return (self.num_tokens - self.num_requests) / self.decode_seconds if self.decode_seconds else 0.0

    def add_counters(self, before: dict, after: dict) -> None:
        self.has_metrics = True
        self.num_drafts += after[COUNTERS[0]] - before[COUNTERS[0]]
        self.num_draft_tokens += after[COUNTERS[1]] - before[COUNTERS[1]]
        self.num_accepted_tokens += after[COUNTERS[2]] - before[COUNTERS[2]]
        per_pos = [a - b for a, b in zip(after["spec_decode_num_accepted_tokens_per_pos"],
                                         before["spec_decode_num_accepted_tokens_per_pos"])]
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * len(per_pos)
        self.num_accepted_tokens_per_pos = [t + d for t, d in zip(self.num_accepted_tokens_per_pos, per_pos)]

    def acceptance(self) -> tuple[str, str, str]:
        """(acceptance rate, mean acceptance length, per-position acceptance) as table cells."""
        if not self.has_metrics:
            return "-", "-", "-"
        rate = self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0
        mean_len = 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0
        per_pos = " ".join(f"{c / self.num_drafts:.2f}" if self.num_drafts else "0.00"
                           for c in self.num_accepted_tokens_per_pos)
        return f"{100 * rate:.1f}%", f"{mean_len:.2f}", per_pos

    def match(self) -> str:
        return f"{self.num_matched}/{self.num_compared}" if self.num_compared else "-"


# ---- running ------------------------------------------------------------------------------


def make_engine(args, label: str, method: str, k: int | None) -> Engine:
    spec = None if method == "none" else {"method": method, "num_speculative_tokens": k}
    extra = {"additional_config": {"gguf_int4": True}} if args.gguf_int4 else {}
    start = time.perf_counter()
    llm = LLM(model=args.model, dtype=args.dtype, speculative_config=spec,
              kv_cache_memory_bytes=args.kv_cache_mib << 20, **extra)
    run_prompt(llm, WARMUP, SamplingParams(temperature=0, max_tokens=8))
    costs = llm.llm_engine.speculator.policy.step_costs if llm.llm_engine.speculator else None
    note = f" (a step verifying 1 / {k} drafts costs {costs[1]:.2f} / {costs[-1]:.2f} plain steps)" if costs else ""
    print(f"  engine {label}: ready in {time.perf_counter() - start:.1f} s{note}")
    return Engine(label, method, k, llm)


def run_request(llm: LLM, prompt: BenchPrompt, params: SamplingParams) -> tuple[RequestOutput, float]:
    """The output of one request and its wall seconds."""
    start = time.perf_counter()
    if prompt.messages is not None:
        out = llm.chat(prompt.messages, params, use_tqdm=False)[0]
    else:
        out = llm.generate(prompt.prompt, params, use_tqdm=False)[0]
    return out, time.perf_counter() - start


def run_prompt(llm: LLM, prompt: BenchPrompt, params: SamplingParams) -> tuple[list[int], float, float]:
    """Output token ids, wall seconds of one request, and seconds after its first token."""
    out, seconds = run_request(llm, prompt, params)
    return list(out.outputs[0].token_ids), seconds, out.metrics.finished_time - out.metrics.first_token_time


def spec_counters(engine: Engine) -> dict | None:
    """Cumulative spec-decode counters, or None for the plain engine (never asked)."""
    get_metrics = getattr(engine.llm, "get_metrics", None)
    if engine.method == "none" or get_metrics is None:
        return None
    metrics = get_metrics()
    return metrics if metrics and all(key in metrics for key in COUNTERS) else None


def bench_workload(engines: list[Engine], prompts: list[BenchPrompt], args) -> dict[str, Tally]:
    tallies = {e.label: Tally() for e in engines}
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    for index, prompt in enumerate(prompts):
        shift = index % len(engines)
        order = engines[shift:] + engines[:shift]
        outputs: dict[str, list[int]] = {}
        times: dict[str, list[tuple[float, float]]] = {e.label: [] for e in engines}
        for repeat in range(args.repeats):
            for engine in order:
                before = spec_counters(engine) if repeat == 0 else None
                token_ids, seconds, decode_seconds = run_prompt(engine.llm, prompt, params)
                times[engine.label].append((seconds, decode_seconds))
                if repeat == 0:
                    outputs[engine.label] = token_ids
                    after = spec_counters(engine)
                    if before is not None and after is not None:
                        tallies[engine.label].add_counters(before, after)
        for engine in engines:
            tally = tallies[engine.label]
            tally.num_tokens += len(outputs[engine.label])
            tally.num_requests += 1
            tally.seconds += statistics.median(t for t, _ in times[engine.label])
            tally.decode_seconds += statistics.median(d for _, d in times[engine.label])
            if "none" in outputs and engine.method != "none":
                tally.num_compared += 1
                tally.num_matched += outputs[engine.label] == outputs["none"]
    return tallies


# ---- reporting ----------------------------------------------------------------------------


def speedup(tally: Tally, tallies: dict[str, Tally], decode: bool = False) -> str:
    base = tallies.get("none")
    if decode:
        ok = base and base.decode_tokens_per_s
        return f"{tally.decode_tokens_per_s / base.decode_tokens_per_s:.2f}x" if ok else "-"
    return f"{tally.tokens_per_s / base.tokens_per_s:.2f}x" if base and base.tokens_per_s else "-"


def print_method_table(workload: str, num_prompts: int, engines: list[Engine], tallies: dict[str, Tally]) -> None:
    print(f"\n{workload}: {num_prompts} prompts")
    print(f"{'method':<8} {'K':>3} {'tokens/s':>9} {'speedup':>8} {'decode/s':>9} {'speedup':>8} {'accept':>7} "
          f"{'mean len':>8} {'match':>6}  per-position acceptance")
    for engine in engines:
        tally = tallies[engine.label]
        rate, mean_len, per_pos = tally.acceptance()
        k = engine.num_speculative_tokens or "-"
        print(f"{engine.label:<8} {k:>3} {tally.tokens_per_s:>9.1f} {speedup(tally, tallies):>8} "
              f"{tally.decode_tokens_per_s:>9.1f} {speedup(tally, tallies, True):>8} {rate:>7} "
              f"{mean_len:>8} {tally.match():>6}  {per_pos}")


def print_sweep_table(workload: str, engines: list[Engine], tallies: dict[str, Tally]) -> None:
    print(f"\nngram num_speculative_tokens sweep on {workload}")
    print(f"{'K':>4} {'tokens/s':>9} {'speedup':>8} {'decode/s':>9} {'speedup':>8} {'accept':>7} {'mean len':>8} "
          f"{'match':>6}")
    for engine in engines:
        tally = tallies[engine.label]
        rate, mean_len, _ = tally.acceptance()
        k = engine.num_speculative_tokens or "none"
        print(f"{k:>4} {tally.tokens_per_s:>9.1f} {speedup(tally, tallies):>8} {tally.decode_tokens_per_s:>9.1f} "
              f"{speedup(tally, tallies, True):>8} {rate:>7} {mean_len:>8} {tally.match():>6}")


def print_load(when: str) -> None:
    one, five, fifteen = os.getloadavg()
    print(f"load average {when}: {one:.2f} {five:.2f} {fifteen:.2f} ({os.cpu_count()} CPUs)")


# ---- main ---------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="default: the bundled SmolLM2-135M-Instruct")
    parser.add_argument("--workloads", default="code-edit,humaneval,chat",
                        help="comma-separated: humaneval, code-edit, chat, json or a .jsonl path")
    parser.add_argument("--methods", default="none,ngram,suffix", help="comma-separated; none = no speculation")
    parser.add_argument("--num-speculative-tokens", type=int, default=5, help="K for the method comparison")
    parser.add_argument("--sweep", default="1,3,5,7,10",
                        help="K values for an ngram sweep on the first workload ('' to skip)")
    parser.add_argument("--num-prompts", type=int, default=4, help="prompts per workload")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--gguf-int4", action="store_true", help='additional_config={"gguf_int4": True}')
    parser.add_argument("--repeats", type=int, default=1, help="runs per request; the median time counts")
    parser.add_argument("--seed", type=int, default=0, help="workload order")
    parser.add_argument("--kv-cache-mib", type=int, default=256, help="KV cache per engine")
    args = parser.parse_args()
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.methods = [m for m in args.methods.split(",") if m]
    args.sweep = [int(k) for k in args.sweep.split(",") if k]
    if args.repeats < 1 or not args.workloads or not args.methods:
        parser.error("need --repeats >= 1, at least one workload and at least one method")
    return args


def run_sweep(args, workload: str, prompts: list[BenchPrompt], base: Engine | None) -> None:
    print(f"\nbuilding the sweep engines (ngram, K = {args.sweep})")
    engines = [base] if base else []
    engines += [make_engine(args, f"K={k}", "ngram", k) for k in args.sweep]
    print_sweep_table(workload, engines, bench_workload(engines, prompts, args))


def main() -> None:
    args = parse_args()
    print_load("at start")
    print(f"threads: {torch.get_num_threads()}  max_tokens: {args.max_tokens}  repeats: {args.repeats}")
    workloads = {name: load_workload(name, args.num_prompts, args.seed) for name in args.workloads}
    engines = [make_engine(args, m, m, None if m == "none" else args.num_speculative_tokens) for m in args.methods]
    print(f"model: {engines[0].llm.llm_engine.config.model_path.name}  dtype: {engines[0].llm.llm_engine.dtype}")
    for name, prompts in workloads.items():
        print_method_table(name, len(prompts), engines, bench_workload(engines, prompts, args))
    if args.sweep:
        base = next((e for e in engines if e.method == "none"), None)
        del engines  # free the comparison engines before building the sweep's
        gc.collect()
        first = args.workloads[0]
        run_sweep(args, first, workloads[first], base)
    print()
    print_load("at end")


if __name__ == "__main__":
    main()
