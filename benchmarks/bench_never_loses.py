"""Speculation never loses: every method beside plain decoding, in one run, on every workload.

For each model file (``--models``: the bundled SmolLM2 Q4_1 and a Q4_0 file requantized from it
by default), each configuration of ``VARIANTS`` and plain decoding run through ``draftwise
bench``'s rounds (``draftwise.bench.run``: a fresh, warmed-up engine per pass, the candidates'
turns rotating until each is stable) on chat, code edits and JSON (greedy), then on chat sampled
at ``--temperature``, at each ``--concurrency`` level. Every method is run as a new user would
configure it; the draft-length policy decides how much of it to use.

Every candidate runs every round (``--rounds`` passes each), its turn rotating, so the passes of
round ``i`` ran within a minute of each other: ``vs plain`` is the median over rounds of a
candidate's tokens/s over plain's in the same round (drift of a shared machine cancels in each
ratio), with the rounds' range beside it.

Reported per cell: output tokens/s (median of the rounds), the ratio to plain on the same file,
workload, level and temperature, mean acceptance length, target rows verified per output token
(``Measurement.rows_per_token``: 1 for plain), whether greedy outputs equal plain's, and, per
file, the cells below ``FLOOR`` x plain. The results JSON (``--out``) holds one table per file
and temperature plus the verdict; ``render_page.py`` shows the newest under ``never-loses``.

    flock /tmp/draftwise-bench.lock python benchmarks/bench_never_loses.py \\
        --out benchmarks/results/never-loses-$(date +%F).json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from draftwise.bench.options import BenchOptions
from draftwise.bench.run import machine_info, run_bench
from draftwise.bench.summary import Measurement, compare_outputs
from draftwise.models.loader import SMOLLM2_NAME

FLOOR = 0.97  # a method below this share of plain's tokens/s loses
EAGLE3_HEAD = "draftwise/SmolLM2-135M-Instruct-eagle3"
TREE = "[(0,), (1,), (0, 0), (1, 0), (0, 0, 0), (0, 0, 0, 0)]"  # 6 nodes, 4 deep
Q4_0_FILE = Path.home() / ".cache" / "draftwise" / "smollm2-135m-q4_0.gguf"  # make $(SERVE_GGUF)


def variants(model: str) -> dict[str, dict]:
    """Label -> speculative_config, each method as its docs show it (the target drafting for itself
    as ``draft_model``: no smaller model with SmolLM2's vocabulary ships)."""
    eagle3 = {"method": "eagle3", "model": EAGLE3_HEAD, "num_speculative_tokens": 3}
    return {
        "ngram": {"method": "ngram", "num_speculative_tokens": 5},
        "suffix": {"method": "suffix", "num_speculative_tokens": 24},
        "eagle3": eagle3,
        "eagle3+suffix": {**eagle3, "enable_suffix_decoding": True},
        "eagle3-tree": {**eagle3, "num_speculative_tokens": 6, "speculative_token_tree": TREE},
        "draft_model-self": {"method": "draft_model", "model": model, "num_speculative_tokens": 3},
    }


def run_file(model: str, workloads: list[str], temperature: float, args) -> list[Measurement]:
    configs = variants(model)
    spec = {label: dict(config) for label, config in configs.items()}
    options = BenchOptions(workloads=workloads, methods=["none", *configs], depths=[1],
                           concurrency=args.concurrency, out=Path(args.scratch), model=model,
                           max_tokens=args.max_tokens, num_prompts=args.num_prompts, temperature=temperature,
                           min_repeats=args.rounds, max_repeats=args.rounds, spec_options=spec)
    run = run_bench(options)
    compare_outputs(run.measurements)
    return run.measurements


def paired_ratios(measurements: list[Measurement]) -> dict[int, list[float]]:
    """Per measurement (by id), its tokens/s over plain's in each round, same workload and level."""
    plain = {(m.workload, m.concurrency): m for m in measurements if m.method == "none"}
    found = {}
    for m in measurements:
        base = plain[(m.workload, m.concurrency)].passes_tokens_per_s
        found[id(m)] = [a / b for a, b in zip(m.passes_tokens_per_s, base)]
    return found


def table(name: str, temperature: float, measurements: list[Measurement], ratios: dict[int, list[float]]) -> dict:
    rows = [[m.workload, m.label.split(" K=")[0], m.concurrency, round(m.tokens_per_s, 1),
             f"{statistics.median(ratios[id(m)]):.2f}x",
             f"{min(ratios[id(m)]):.2f}-{max(ratios[id(m)]):.2f}",
             round(m.spec.mean_acceptance_length, 2) if m.spec and m.spec.num_drafts else "-",
             round(m.rows_per_token, 2),
             "-" if m.num_matched is None or temperature > 0 else f"{m.num_matched}/{len(m.outputs)}"]
            for m in measurements]
    return {"title": f"{name}, {'greedy' if temperature == 0 else f'temperature {temperature}'}",
            "columns": ["workload", "method", "conc", "tokens/s", "vs plain", "rounds' range", "mean len",
                        "rows/token", "match"],
            "rows": rows}


def cpu_flags() -> list[str]:
    text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("Flags")), [])
    return sorted(f for f in flags if f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=f"{SMOLLM2_NAME},{Q4_0_FILE}", help="comma-separated model files")
    parser.add_argument("--workloads", default="chat,code-edit,json", help="greedy workloads")
    parser.add_argument("--sampled", default="chat", help="workloads also run sampled ('' for none)")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--concurrency", type=lambda t: [int(x) for x in t.split(",")], default=[1, 8])
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4, help="passes of every candidate, in rotating rounds")
    parser.add_argument("--scratch", default="/tmp/never-loses")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    start, load = time.time(), os.getloadavg()
    tables, losses = [], []
    for model in args.models.split(","):
        name = Path(model).name
        runs = [(0.0, args.workloads.split(","))] + ([(args.temperature, args.sampled.split(","))]
                                                     if args.sampled else [])
        for temperature, workloads in runs:
            measurements = run_file(model, workloads, temperature, args)
            ratios = paired_ratios(measurements)
            tables.append(table(name, temperature, measurements, ratios))
            losses += [f"{name} t={temperature} {m.workload} c={m.concurrency} {m.label}: "
                       f"{statistics.median(ratios[id(m)]):.2f}x"
                       for m in measurements if m.method != "none" and statistics.median(ratios[id(m)]) < FLOOR]
            print(json.dumps(tables[-1], indent=1), flush=True)
    info = machine_info()
    result = {"benchmark": "never-loses", "date": time.strftime("%Y-%m-%d"),
              "cpu": {"cpu": info["processor"], "flags": cpu_flags()}, "threads": info["torch_threads"],
              "load_average": f"{load[0]:.1f} -> {os.getloadavg()[0]:.1f}",
              "command": "python benchmarks/bench_never_loses.py " + " ".join(
                  f"--{k.replace('_', '-')} {v if not isinstance(v, list) else ','.join(map(str, v))}"
                  for k, v in vars(args).items() if k not in ("out", "scratch")),
              "minutes": round((time.time() - start) / 60, 1), "tables": tables,
              "notes": [f"{len(losses)} cells below {FLOOR}x plain" + (": " + "; ".join(losses) if losses else ".")]}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(result["notes"][0])


if __name__ == "__main__":
    main()
