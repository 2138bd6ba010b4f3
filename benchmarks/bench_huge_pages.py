"""Weights on huge pages: decode tokens/s with the GGUF blocks on 2 MiB pages vs 4 KiB pages.

For each model file (``--models``), two engines load it in this one process: one with
``DRAFTWISE_HUGE_PAGES=0`` (blocks on the 4 KiB pages ``torch.empty`` gets) and one as draftwise
loads by default (``draftwise/kernels/huge_pages.py``). They take turns, each pass one greedy chat
pass of ``--num-prompts`` prompts and ``--max-tokens`` tokens, one request at a time; ``ratio`` is
the median over rounds of the huge-page engine's tokens/s over the other's in the same round, with
the rounds' range. Also reported: how much of the process's memory the kernel backed with huge
pages (``AnonHugePages``), and the kernel's THP mode.

    flock /tmp/draftwise-bench.lock python benchmarks/bench_huge_pages.py \\
        --out benchmarks/results/huge-pages-$(date +%F).json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from draftwise.bench.measure import build_engine, run_pass, sampling_params, tokenize_prompts
from draftwise.bench.options import BenchOptions, Configuration
from draftwise.bench.run import machine_info
from draftwise.bench.workloads import load_workload
from draftwise.kernels import huge_pages
from draftwise.models.loader import SMOLLM2_NAME

sys.path.insert(0, str(Path(__file__).parent))
from bench_never_loses import cpu_flags  # noqa: E402

SHAPED = Path.home() / ".cache" / "draftwise" / "shaped"  # random-weight GGUFs in real shapes (bench_scale)


def anon_huge_mib() -> float:
    """This process's anonymous memory on huge pages, MiB."""
    for line in Path(f"/proc/{os.getpid()}/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) / 1024
    return 0.0


def engine(options: BenchOptions, huge: bool):
    os.environ[huge_pages.ENV] = "1" if huge else "0"
    try:
        before = anon_huge_mib()
        llm = build_engine(options, Configuration("none", 0, None), 1)
        return llm, anon_huge_mib() - before
    finally:
        os.environ.pop(huge_pages.ENV, None)


def run_model(model: str, args) -> list:
    options = BenchOptions(workloads=["chat"], methods=["none"], depths=[1], concurrency=[1], out=Path("/tmp"),
                           model=model, max_tokens=args.max_tokens, num_prompts=args.num_prompts, temperature=0.0)
    prompts = load_workload("chat", args.num_prompts, 0)
    (small, _), (huge, huge_mib) = engine(options, False), engine(options, True)
    inputs = tokenize_prompts(small.get_tokenizer(), prompts)
    params = sampling_params(options, prompts)
    passes: dict[bool, list[float]] = {False: [], True: []}
    for r in range(args.rounds):
        for is_huge in ((False, True) if r % 2 == 0 else (True, False)):
            passes[is_huge].append(run_pass(huge if is_huge else small, inputs, params, 1).tokens_per_s)
    ratios = [h / s for h, s in zip(passes[True], passes[False])]
    del small, huge
    return [Path(model).name, round(statistics.median(passes[False]), 1), round(statistics.median(passes[True]), 1),
            f"{statistics.median(ratios):.3f}x", f"{min(ratios):.2f}-{max(ratios):.2f}", round(huge_mib)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default = ",".join([SMOLLM2_NAME] + [str(SHAPED / f) for f in ("llama-3.2-1b-Q4_0.gguf",
                                                                    "llama-3.2-1b-Q4_K_M.gguf",
                                                                    "llama-3.2-3b-Q4_0.gguf")])
    parser.add_argument("--models", default=default, help="comma-separated model files")
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    start, load = time.time(), os.getloadavg()
    rows = []
    for model in args.models.split(","):
        rows.append(run_model(model, args))
        print(rows[-1], flush=True)
    info = machine_info()
    result = {"benchmark": "huge-pages", "date": time.strftime("%Y-%m-%d"),
              "cpu": {"cpu": info["processor"], "flags": cpu_flags()}, "threads": info["torch_threads"],
              "thp_mode": huge_pages.thp_mode(), "load_average": f"{load[0]:.1f} -> {os.getloadavg()[0]:.1f}",
              "command": f"python benchmarks/bench_huge_pages.py --num-prompts {args.num_prompts} "
                         f"--max-tokens {args.max_tokens} --rounds {args.rounds}",
              "minutes": round((time.time() - start) / 60, 1),
              "tables": [{"title": "Decode, one request, greedy chat: GGUF blocks on 4 KiB vs huge pages",
                          "columns": ["model", "4 KiB pages tok/s", "huge pages tok/s", "ratio", "rounds' range",
                                      "MiB on huge pages"],
                          "rows": rows}]}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
