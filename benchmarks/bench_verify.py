"""Verification rules side by side: standard, block, entropy, block+entropy (rejection_sampler_config).

For each speculative method one engine per variant is built; every prompt runs on every
engine with the same seed (sampled, temperature 0.8 by default), engines interleaved per
prompt with their order rotating, so that the drift of a shared machine hits all alike.
Reported per method and workload, from each request's own counters: acceptance rate
(accepted / drafted), mean acceptance length (1 + accepted / drafts), output tokens/s
(output tokens / request time, prefill included), each with its ratio to ``standard``, and
the mean logprob of the output tokens under the target (raw logits, vLLM's logprobs): a
lossless variant stays within noise of ``standard``, a lossy one may drift from it.

Variants: ``standard`` (no config), ``block`` (Sun et al. Algorithm 2, lossless),
``entropy`` (posterior_alpha / posterior_threshold below, lossy), ``block+entropy``;
``--variants`` may add ``cumulative`` (vLLM-Ascend's block rule, lossy).

``draft_model`` drafts with SmolLM2 itself minus layers 12-19 (``--draft-skip-layers``; 22 of
30 layers, saved in a temporary directory: no smaller model with SmolLM2's vocabulary ships),
with ``draft_sample_method="probabilistic"`` so that verification sees the drafter's ``q``.
Offline, this drafter's ``sum min(p, q)`` at temperature 0.8 is about 0.42 on code and prose;
an early exit after layer 24 scores 0.26, and a full self-drafting copy has ``q = p``
(everything accepted, nothing to compare). It costs ~3/4 of a target step, so it shows the
rules' effect on acceptance, not a speedup over plain decoding.

Drafts are not cut by the draft-length policy (``DRAFTWISE_VERIFY_ROW_COST=0``, unless
``--draft-length-policy``): every variant verifies full drafts of ``num_speculative_tokens``,
so the rules are compared on the same kind of draft stream, not on the policy's reaction.

    flock /tmp/draftwise-bench.lock python benchmarks/bench_verify.py
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftwise import LLM, SamplingParams
from draftwise.models.loader import load_transformers_model, resolve_model
from draftwise.outputs import RequestOutput
from draftwise.spec_decode.metrics import SpecDecodingStats
from draftwise.bench.workloads import BenchPrompt, load_workload

WARMUP = BenchPrompt("warmup", messages=[{"role": "user", "content": "Say hello."}])

VARIANTS = {
    "standard": {},
    "block": {"enable_block_verify": True},
    "entropy": {"enable_entropy_verify": True},
    "block+entropy": {"enable_block_verify": True, "enable_entropy_verify": True},
    "cumulative": {"enable_block_verify": True, "block_verify_mode": "cumulative"},
}


def run_request(llm: LLM, prompt: BenchPrompt, params: SamplingParams) -> tuple[RequestOutput, float]:
    """The output of one request and its wall seconds."""
    start = time.perf_counter()
    if prompt.messages is not None:
        out = llm.chat(prompt.messages, params, use_tqdm=False)[0]
    else:
        out = llm.generate(prompt.prompt, params, use_tqdm=False)[0]
    return out, time.perf_counter() - start


def print_load(when: str) -> None:
    one, five, fifteen = os.getloadavg()
    print(f"load average {when}: {one:.2f} {five:.2f} {fifteen:.2f} ({os.cpu_count()} CPUs)")


@dataclass
class Tally:
    num_tokens: int = 0
    seconds: float = 0.0
    logprob_sum: float = 0.0
    spec: SpecDecodingStats = field(default_factory=lambda: SpecDecodingStats(0))  # acceptance counters

    def add(self, out, seconds: float) -> None:
        self.num_tokens += len(out.outputs[0].token_ids)
        self.seconds += seconds
        self.logprob_sum += out.outputs[0].cumulative_logprob
        self.spec.num_drafts += out.metrics.spec_num_drafts
        self.spec.num_draft_tokens += out.metrics.spec_num_draft_tokens
        self.spec.num_accepted_tokens += out.metrics.spec_num_accepted_tokens

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds if self.seconds else 0.0

    @property
    def mean_logprob(self) -> float:
        return self.logprob_sum / self.num_tokens if self.num_tokens else 0.0


def layer_skip_drafter(skip: range, out: Path) -> Path:
    """SmolLM2 without the layers in ``skip`` (self-speculation by layer skipping), saved in ``out``."""
    from safetensors.torch import save_file

    source = resolve_model(None)
    config = json.loads((source / "config.json").read_text())
    keep = [i for i in range(config["num_hidden_layers"]) if i not in skip]
    renamed = {f"model.layers.{old}.": f"model.layers.{new}." for new, old in enumerate(keep)}
    weights = {}
    for name, tensor in load_transformers_model(source, torch.float32).state_dict().items():
        match = re.match(r"model\.layers\.\d+\.", name)
        if match is None:
            weights[name] = tensor
        elif match.group(0) in renamed:
            weights[renamed[match.group(0)] + name[match.end():]] = tensor
    save_file(weights, str(out / "model.safetensors"))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (source / name).exists():
            (out / name).symlink_to(source / name)
    config["num_hidden_layers"] = len(keep)
    (out / "config.json").write_text(json.dumps(config))
    return out


def spec_config(args, method: str, workdir: Path) -> dict:
    spec = {"method": method, "num_speculative_tokens": args.num_speculative_tokens}
    if method == "draft_model":
        first, last = (int(x) for x in args.draft_skip_layers.split("-"))
        drafter = args.draft_model or layer_skip_drafter(range(first, last + 1), workdir)
        spec |= {"model": str(drafter), "draft_sample_method": "probabilistic"}
    return spec


def make_engine(args, spec: dict, variant: str) -> LLM:
    rules = dict(VARIANTS[variant])
    if rules.get("enable_entropy_verify"):
        rules |= {"posterior_alpha": args.posterior_alpha, "posterior_threshold": args.posterior_threshold}
    start = time.perf_counter()
    llm = LLM(model=args.model, dtype=args.dtype, speculative_config=spec,
              kv_cache_memory_bytes=args.kv_cache_mib << 20, additional_config={"rejection_sampler_config": rules})
    run_request(llm, WARMUP, SamplingParams(temperature=0, max_tokens=8))
    print(f"  engine {spec['method']}/{variant}: ready in {time.perf_counter() - start:.1f} s")
    return llm


def bench_workload(engines: dict[str, LLM], prompts: list[BenchPrompt], args) -> dict[str, Tally]:
    tallies = {name: Tally() for name in engines}
    names = list(engines)
    for index, prompt in enumerate(prompts):
        params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed + index,
                                logprobs=0)
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            out, seconds = run_request(engines[name], prompt, params)
            tallies[name].add(out, seconds)
    return tallies


def print_table(title: str, tallies: dict[str, Tally]) -> None:
    base = tallies.get("standard")
    print(f"\n{title}")
    print(f"{'variant':<14} {'accept':>7} {'ratio':>6} {'mean len':>8} {'ratio':>6} {'tokens/s':>8} {'ratio':>6} "
          f"{'tokens':>6} {'logprob':>7}")

    def ratio(value: float, reference: float | None) -> str:
        return f"{value / reference:.2f}x" if reference else "-"

    for name, t in tallies.items():
        rate, length = t.spec.acceptance_rate, t.spec.mean_acceptance_length
        print(f"{name:<14} {100 * rate:>6.1f}% {ratio(rate, base and base.spec.acceptance_rate):>6} "
              f"{length:>8.2f} {ratio(length, base and base.spec.mean_acceptance_length):>6} "
              f"{t.tokens_per_s:>8.1f} {ratio(t.tokens_per_s, base and base.tokens_per_s):>6} "
              f"{t.num_tokens:>6} {t.mean_logprob:>7.3f}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="default: the bundled SmolLM2-135M-Instruct")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--runs", default="ngram:code-edit,draft_model:chat",
                        help="comma-separated METHOD:WORKLOAD pairs (workloads: see draftwise.bench.workloads)")
    parser.add_argument("--variants", default="standard,block,entropy,block+entropy",
                        help=f"comma-separated, from {list(VARIANTS)}")
    parser.add_argument("--num-prompts", type=int, default=4, help="prompts per workload")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--num-speculative-tokens", type=int, default=5, help="block verify needs >= 3")
    parser.add_argument("--posterior-alpha", type=float, default=0.4)
    parser.add_argument("--posterior-threshold", type=float, default=0.95)
    parser.add_argument("--draft-skip-layers", default="12-19",
                        help="FIRST-LAST: the layers the SmolLM2 drafter skips (inclusive)")
    parser.add_argument("--draft-model", default=None, help="a drafter to use instead of the early-exit copy")
    parser.add_argument("--seed", type=int, default=0, help="request seeds and workload order")
    parser.add_argument("--kv-cache-mib", type=int, default=256, help="KV cache per engine")
    parser.add_argument("--draft-length-policy", action="store_true",
                        help="let the engine cut drafts by measured verify cost (default: full drafts)")
    args = parser.parse_args()
    args.runs = [tuple(run.split(":", 1)) for run in args.runs.split(",") if run]
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or not args.variants or not args.runs or any(len(run) != 2 for run in args.runs):
        parser.error(f"need METHOD:WORKLOAD runs and variants from {list(VARIANTS)} (unknown: {unknown})")
    return args


def main() -> None:
    args = parse_args()
    if not args.draft_length_policy:
        os.environ["DRAFTWISE_VERIFY_ROW_COST"] = "0"  # full drafts (see the module docstring)
    print_load("at start")
    print(f"threads: {torch.get_num_threads()}  dtype: {args.dtype}  temperature: {args.temperature}  "
          f"K: {args.num_speculative_tokens}  max_tokens: {args.max_tokens}  posterior_alpha: {args.posterior_alpha}  "
          f"posterior_threshold: {args.posterior_threshold}")
    workdir = tempfile.TemporaryDirectory(prefix="bench-verify-")
    for method in dict.fromkeys(method for method, _ in args.runs):
        spec = spec_config(args, method, Path(workdir.name))
        print(f"\n{method}: {spec}")
        engines = {variant: make_engine(args, spec, variant) for variant in args.variants}
        for name in [workload for m, workload in args.runs if m == method]:
            prompts = load_workload(name, args.num_prompts, args.seed)
            title = f"{method} on {name}: {len(prompts)} prompts, K={args.num_speculative_tokens}"
            print_table(title, bench_workload(engines, prompts, args))
        del engines
        gc.collect()
    print()
    print_load("at end")


if __name__ == "__main__":
    main()
