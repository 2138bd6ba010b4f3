"""The three PNG plots of ``draftwise bench`` (matplotlib, Agg canvas, no pyplot state).

* ``tokens_per_s.png``: output tokens/s against depth K, one panel per workload, a line per
  speculative method and concurrency (bars: slowest to fastest pass); ``none`` and
  transformers' ``generate`` are horizontal lines.
* ``acceptance_by_position.png``: per-position acceptance (accepted at draft position i /
  drafts) against i, a line per method and depth, at the lowest concurrency.
* ``speedup_vs_acceptance_length.png``: speedup over ``none`` against mean acceptance length,
  a point per speculative configuration (annotated with K); the dashed diagonal is the ideal
  where verifying drafts costs nothing (speedup = mean acceptance length).

``write_plots(measurements, out)`` returns the paths written.
"""
from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .summary import Measurement

PLOTS = ("tokens_per_s.png", "acceptance_by_position.png", "speedup_vs_acceptance_length.png")
DPI = 90
LINESTYLES = ("-", "--", ":", "-.")


def write_plots(measurements: list[Measurement], out: Path) -> list[Path]:
    workloads = list(dict.fromkeys(m.workload for m in measurements))
    paths = []
    for name, draw in zip(PLOTS, (_tokens_per_s, _acceptance_by_position, _speedup_vs_acceptance)):
        fig = Figure(figsize=(5.2 * len(workloads) if name != PLOTS[2] else 6.5, 4.2), layout="constrained")
        draw(fig, measurements, workloads)
        path = out / name
        fig.savefig(path, dpi=DPI)
        paths.append(path)
    return paths


def _short(workload: str) -> str:
    """A workload's name for a title: a .jsonl path by its file name."""
    return Path(workload).name


def _colors(methods: list[str]) -> dict[str, str]:
    return {method: f"C{i}" for i, method in enumerate(methods)}


def _tokens_per_s(fig: Figure, measurements: list[Measurement], workloads: list[str]) -> None:
    axes = fig.subplots(1, len(workloads), squeeze=False)[0]
    colors = _colors(list(dict.fromkeys(m.label.split(" K=")[0] for m in measurements)))
    levels = sorted({m.concurrency for m in measurements})
    for ax, workload in zip(axes, workloads):
        here = [m for m in measurements if m.workload == workload]
        for key in dict.fromkeys((m.label.split(" K=")[0], m.concurrency) for m in here):
            group = [m for m in here if (m.label.split(" K=")[0], m.concurrency) == key]
            style = LINESTYLES[levels.index(key[1]) % len(LINESTYLES)]
            label = key[0] if len(levels) == 1 else f"{key[0]} (c={key[1]})"
            if group[0].num_speculative_tokens is None:
                ax.axhline(group[0].tokens_per_s, color=colors[key[0]], linestyle=style, label=label)
                continue
            group.sort(key=lambda m: m.num_speculative_tokens)
            xs = [m.num_speculative_tokens for m in group]
            ys = [m.tokens_per_s for m in group]
            err = [[y - min(m.passes_tokens_per_s) for y, m in zip(ys, group)],
                   [max(m.passes_tokens_per_s) - y for y, m in zip(ys, group)]]
            ax.errorbar(xs, ys, yerr=err, color=colors[key[0]], linestyle=style, marker="o", capsize=3, label=label)
        ax.set_title(_short(workload))
        ax.set_xlabel("num_speculative_tokens (K)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("output tokens/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")


def _acceptance_by_position(fig: Figure, measurements: list[Measurement], workloads: list[str]) -> None:
    axes = fig.subplots(1, len(workloads), squeeze=False)[0]
    spec = [m for m in measurements if m.spec is not None and m.spec.num_drafts]
    lowest = min((m.concurrency for m in spec), default=1)
    spec = [m for m in spec if m.concurrency == lowest]
    colors = _colors(list(dict.fromkeys(m.method for m in spec)))
    depths = sorted({m.num_speculative_tokens for m in spec})
    for ax, workload in zip(axes, workloads):
        for m in (m for m in spec if m.workload == workload):
            per_pos = m.spec.per_position_acceptance
            alpha = 0.35 + 0.65 * (depths.index(m.num_speculative_tokens) + 1) / len(depths)
            ax.plot(range(1, len(per_pos) + 1), per_pos, color=colors[m.method], alpha=alpha, marker=".",
                    label=m.label)
        ax.set_title(f"{_short(workload)} (concurrency {lowest})")
        ax.set_xlabel("draft position")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("accepted / drafts")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small", ncol=2)


def _speedup_vs_acceptance(fig: Figure, measurements: list[Measurement], workloads: list[str]) -> None:
    ax = fig.subplots()
    points = [m for m in measurements if m.spec is not None and m.speedup is not None]
    markers = dict(zip(dict.fromkeys(m.method for m in points), "osD^vP*X"))
    colors = _colors(workloads)
    for m in points:
        ax.scatter(m.spec.mean_acceptance_length, m.speedup, color=colors[m.workload], marker=markers[m.method],
                   label=f"{_short(m.workload)} {m.method}")
        ax.annotate(f"K={m.num_speculative_tokens}", (m.spec.mean_acceptance_length, m.speedup),
                    textcoords="offset points", xytext=(4, 3), fontsize="x-small")
    top = max([2.0] + [m.spec.mean_acceptance_length for m in points] + [m.speedup for m in points])
    ax.plot([1, top], [1, top], color="grey", linestyle="--", linewidth=1, label="ideal (free verification)")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("mean acceptance length")
    ax.set_ylabel("speedup over none (tokens/s)")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize="x-small")
