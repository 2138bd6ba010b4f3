"""``draftwise bench``: which speculative method and depth pays on a workload, measured.

``draftwise bench --workload code-edit --methods none,ngram,suffix --num-speculative-tokens 1,3,5,7
--num-prompts 4 --max-tokens 256 --concurrency 1,8 --out DIR`` runs every configuration
(``none`` once, each other method at each depth) in this process, one after another; each
measurement (configuration x workload x concurrency) repeats passes over the same prompts
until its tokens/s is stable (``summary``), every pass on a freshly built, warmed-up engine
(so suffix decoding's memory of earlier answers does not flatter repeats). It prints a
table per workload and a recommendation (the fastest configuration measured), and writes
``DIR/results.json`` and three PNG plots (``plots.PLOTS``).

Modules: ``options`` (flags, configurations), ``measure`` (engine, passes), ``summary``
(stability rule, per-measurement figures), ``hf`` (``--compare transformers``), ``run``
(the order of work), ``report`` (table, recommendations, JSON), ``plots``.
"""
from __future__ import annotations

import argparse

from .options import BenchOptions, add_bench_args

__all__ = ["add_bench_args", "cmd_bench"]


def cmd_bench(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    try:
        from .plots import write_plots
    except ImportError as exc:  # matplotlib comes with the bench extra
        raise SystemExit(f"draftwise bench draws its plots with matplotlib ({exc}): "
                         "pip install 'draftwise[bench]'") from None
    from .report import print_report, recommendations, results_dict, transformers_ratios, write_results
    from .run import run_bench
    from .summary import compare_outputs

    options = BenchOptions.from_args(args)
    run = run_bench(options)
    compare_outputs(run.measurements)
    recs, ratios = recommendations(run.measurements), transformers_ratios(run.measurements)
    print_report(run, recs, ratios)
    path = write_results(results_dict(run, recs, ratios, argv), options.out)
    plots = write_plots(run.measurements, options.out)
    print(f"\nwrote {path} and {', '.join(p.name for p in plots)}")
    return 0
