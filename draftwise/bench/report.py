"""What ``draftwise bench`` prints and writes: the table, recommendations, results.json.

One table per workload, rows by concurrency, then configuration (transformers last):
``tokens/s`` (median of the passes) and ``spread`` ((max - min) / median), ``speedup`` over
``none`` at the same concurrency, ``accept`` (accepted / drafted), ``mean len`` (1 + accepted /
drafts), TTFT / ITL / TPOT (ms, medians over requests), ``match`` (first-pass outputs equal to
``none``'s), ``passes`` (``*``: not stable within --max-repeats) and per-position acceptance.

Recommendation, per workload and concurrency: the draftwise configuration with the highest
median tokens/s; when its slowest pass is not faster than ``none``'s fastest, the line says
the gain is within the noise. With transformers, the ratios draftwise / transformers are
printed: ``none`` / ``generate``, and ``ngram K`` / ``prompt lookup K`` at each depth.
"""
from __future__ import annotations

import datetime
import json
from pathlib import Path

from .run import BenchRun
from .summary import Measurement

RESULTS_FILE = "results.json"


def recommendations(measurements: list[Measurement]) -> list[dict]:
    cells: dict[tuple[str, int], list[Measurement]] = {}
    for m in measurements:
        if m.backend == "draftwise":
            cells.setdefault((m.workload, m.concurrency), []).append(m)
    found = []
    for (workload, concurrency), cell in cells.items():
        best = max(cell, key=lambda m: m.tokens_per_s)
        none = next((m for m in cell if m.method == "none"), None)
        clear = none is None or best is none or min(best.passes_tokens_per_s) > max(none.passes_tokens_per_s)
        found.append({"workload": workload, "concurrency": concurrency, "method": best.method,
                      "num_speculative_tokens": best.num_speculative_tokens, "configuration": best.label,
                      "tokens_per_s": best.tokens_per_s, "speedup": best.speedup, "clear": clear})
    return found


def transformers_ratios(measurements: list[Measurement]) -> list[dict]:
    """draftwise tokens/s / transformers tokens/s for matching pairs at concurrency 1."""
    mine = {(m.workload, m.method, m.num_speculative_tokens): m for m in measurements
            if m.backend == "draftwise" and m.concurrency == 1}
    ratios = []
    for hf in (m for m in measurements if m.backend == "transformers"):
        method = "none" if hf.method == "none" else "ngram"
        ours = mine.get((hf.workload, method, hf.num_speculative_tokens))
        if ours is not None and hf.tokens_per_s > 0:
            ratios.append({"workload": hf.workload, "draftwise": ours.label, "transformers": hf.label,
                           "ratio": ours.tokens_per_s / hf.tokens_per_s})
    return ratios


def print_report(run: BenchRun, recs: list[dict], ratios: list[dict]) -> None:
    o, model, machine = run.options, run.model, run.machine
    print(f"model: {model['name']}  dtype: {model['dtype']}  device: {model['device']}  "
          f"max_tokens: {o.max_tokens}  temperature: {o.temperature}")
    load = " -> ".join(" ".join(f"{x:.2f}" for x in machine[k]) for k in ("load_average_start", "load_average_end"))
    print(f"{machine['processor']}, {machine['cpu_count']} CPUs, torch {machine['torch']} "
          f"({machine['torch_threads']} threads); load average {load}")
    for workload, size in run.workload_sizes.items():
        print(f"\n{workload}: {size} prompt{'' if size == 1 else 's'}")
        print(_header())
        rows = sorted((m for m in run.measurements if m.workload == workload),
                      key=lambda m: (m.concurrency, m.backend == "transformers"))
        for m in rows:
            print(_row(m))
    if ratios:
        print("\ndraftwise / transformers (concurrency 1):")
        for r in ratios:
            print(f"  {r['workload']}: {r['draftwise']} / {r['transformers']} = {r['ratio']:.2f}x")
    print("\nrecommendation (fastest measured):")
    for r in recs:
        speedup = f", {r['speedup']:.2f}x none" if r["speedup"] is not None else ""
        note = "" if r["clear"] else " (within the noise of none: no clear gain)"
        print(f"  {r['workload']} at concurrency {r['concurrency']}: {r['configuration']} "
              f"({r['tokens_per_s']:.1f} tokens/s{speedup}){note}")


def _header() -> str:
    return (f"{'method':<17} {'K':>3} {'conc':>4} {'tokens/s':>9} {'spread':>7} {'speedup':>8} {'accept':>7} "
            f"{'mean len':>8} {'TTFT ms':>8} {'ITL ms':>7} {'TPOT ms':>8} {'match':>6} {'passes':>6}  "
            "per-position acceptance")


def _row(m: Measurement) -> str:
    name = m.label.split(" K=")[0].replace("transformers", "hf")
    if m.backend == "draftwise":
        name = m.method + (" +grammar" if m.label.endswith("+grammar") else "")
    spec = m.spec
    cells = [f"{name:<17}", f"{m.num_speculative_tokens or '-':>3}", f"{m.concurrency:>4}",
             f"{m.tokens_per_s:>9.1f}", f"{100 * m.spread:>6.1f}%", _cell(m.speedup, "{:.2f}x", 8),
             _cell(spec and 100 * spec.acceptance_rate, "{:.1f}%", 7), _cell(spec and spec.mean_acceptance_length,
                                                                             "{:.2f}", 8),
             _cell(m.ttft_s and 1000 * m.ttft_s, "{:.0f}", 8), _cell(m.itl_s and 1000 * m.itl_s, "{:.1f}", 7),
             _cell(m.tpot_s and 1000 * m.tpot_s, "{:.1f}", 8),
             _cell(m.num_matched, "{}/" + str(len(m.outputs)), 6),
             f"{len(m.passes_tokens_per_s)}{'' if m.stable else '*'}".rjust(6)]
    per_pos = " ".join(f"{p:.2f}" for p in spec.per_position_acceptance) if spec else "-"
    if m.grammar:
        per_pos += f"  grammar drafted {m.grammar[0]}, accepted {m.grammar[1]}, {100 * m.grammar[2]:.1f}% of time"
    return " ".join(cells) + "  " + per_pos


def _cell(value, fmt: str, width: int) -> str:
    return (fmt.format(value) if value is not None else "-").rjust(width)


def results_dict(run: BenchRun, recs: list[dict], ratios: list[dict], argv: list[str] | None) -> dict:
    o = run.options
    return {
        "command": ["draftwise", *argv] if argv is not None else None,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": run.model, "machine": run.machine,
        "settings": {"workloads": o.workloads, "methods": o.methods, "num_speculative_tokens": o.depths,
                     "concurrency": o.concurrency, "max_tokens": o.max_tokens, "num_prompts": o.num_prompts,
                     "temperature": o.temperature, "seed": o.seed, "speculative_config": o.spec_options,
                     "additional_config": o.additional_config, "compare": o.compare},
        "stability_rule": {"min_repeats": o.min_repeats, "max_repeats": o.max_repeats,
                           "max_rel_error": o.max_rel_error,
                           "rel_error": "stdev / sqrt(passes) / mean of the passes' output tokens/s",
                           "spread": "(max - min) / median of the passes' output tokens/s"},
        "workloads": run.workload_sizes, "engines": run.engines,
        "measurements": [m.to_dict() for m in run.measurements],
        "transformers_ratios": ratios, "recommendations": recs,
    }


def write_results(results: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / RESULTS_FILE
    path.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return path
