"""``run_bench(options)``: every configuration, one after another, in this process.

For each configuration (``options.configurations``), workload and concurrency level, passes
repeat until stable (``summary.repeat_until_stable``). Every pass runs on a freshly built
engine, warmed up with short requests (as many at once as the pass runs) and freed after, so
nothing a pass leaves behind speeds up the next: suffix decoding's global tree of earlier
outputs would otherwise draft a repeated prompt from its own earlier answer.

With ``--compare transformers``, transformers' ``generate`` and its prompt lookup at each
depth run last, on the weights the engines loaded, one request at a time (listed at
concurrency 1). A tqdm bar counts measurements.

Returns the measurements and what describes the run; ``report`` turns them into the table,
results.json and the plots.
"""
from __future__ import annotations

import gc
import os
import platform
import sys
import time
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from ..workloads import BenchPrompt, load_workload
from .measure import PassResult, PromptInput, build_engine, run_pass, sampling_params, tokenize_prompts
from .options import BenchOptions, Configuration, configurations
from .summary import Measurement, repeat_until_stable, summarize


@dataclass
class BenchRun:
    options: BenchOptions
    measurements: list[Measurement] = field(default_factory=list)
    engines: dict[str, dict] = field(default_factory=dict)  # per configuration: build times, step costs
    model: dict = field(default_factory=dict)
    machine: dict = field(default_factory=dict)
    workload_sizes: dict[str, int] = field(default_factory=dict)


def run_bench(options: BenchOptions) -> BenchRun:
    workloads = load_workloads(options)
    configs = configurations(options)
    run = BenchRun(options, machine={"load_average_start": os.getloadavg()},
                   workload_sizes={name: len(prompts) for name, prompts in workloads.items()})
    num_hf = (1 + len(options.depths)) * len(workloads) if "transformers" in options.compare else 0
    total = len(configs) * len(workloads) * len(options.concurrency) + num_hf
    bar = tqdm(total=total, desc="draftwise bench", unit="measurement", dynamic_ncols=True)
    session = _Session(run, workloads, bar)
    try:
        for config in configs:
            session.run_configuration(config)
        if num_hf:
            session.run_transformers()
    finally:
        bar.close()
    run.machine.update(machine_info())
    return run


def load_workloads(options: BenchOptions) -> dict[str, list[BenchPrompt]]:
    workloads = {name: load_workload(name, options.num_prompts, options.seed) for name in options.workloads}
    for name, prompts in workloads.items():
        if len(prompts) < max(options.concurrency):
            raise ValueError(f"workload {name} has {len(prompts)} prompts, fewer than --concurrency "
                             f"{max(options.concurrency)} needs")
    return workloads


def machine_info() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "python": sys.version.split()[0], "load_average_end": os.getloadavg(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


class _Session:
    """The state shared by the configurations: prompts tokenized once, the bar, the results."""

    def __init__(self, run: BenchRun, workloads: dict[str, list[BenchPrompt]], bar):
        self.run, self.options, self.workloads, self.bar = run, run.options, workloads, bar
        self.inputs: dict[str, list[PromptInput]] = {}

    def run_configuration(self, config: Configuration) -> None:
        for name in self.workloads:
            for concurrency in self.options.concurrency:
                labels = dict(workload=name, label=config.label, backend="draftwise", method=config.method,
                              num_speculative_tokens=config.num_speculative_tokens, concurrency=concurrency)
                self._measure(lambda: self._fresh_pass(config, name, concurrency), labels)

    def _fresh_pass(self, config: Configuration, workload: str, concurrency: int) -> PassResult:
        """One pass on a newly built, warmed-up engine, freed afterwards."""
        start = time.perf_counter()
        llm = build_engine(self.options, config, concurrency)
        self._describe(config, llm, time.perf_counter() - start)
        prompts = self.workloads[workload]
        inputs = self.inputs.setdefault(workload, tokenize_prompts(llm.get_tokenizer(), prompts))
        try:
            return run_pass(llm, inputs, sampling_params(self.options, len(inputs)), concurrency)
        finally:
            del llm
            gc.collect()

    def run_transformers(self) -> None:
        from .hf import HFRunner

        self.bar.set_description("transformers: loading the model")
        model = self.run.model
        runner = HFRunner(model["path"], getattr(torch, model["dtype"]), torch.device(model["device"]),
                          model["eos_token_ids"])
        for name, inputs in self.inputs.items():
            params = sampling_params(self.options, len(inputs))
            for depth in [None, *self.options.depths]:
                runner.warm_up(inputs[0], depth)
                label = "transformers generate" if depth is None else f"transformers prompt lookup K={depth}"
                labels = dict(workload=name, label=label, backend="transformers",
                              method="none" if depth is None else "prompt_lookup",
                              num_speculative_tokens=depth, concurrency=1)
                self._measure(lambda: runner.run_pass(inputs, params, depth), labels)

    def _measure(self, run_one, labels: dict) -> None:
        where = f"{labels['label']} on {labels['workload']} at concurrency {labels['concurrency']}"
        self.bar.set_description(where)

        def on_pass(number: int, result: PassResult) -> None:
            self.bar.set_postfix_str(f"pass {number}: {result.tokens_per_s:.1f} tokens/s")

        o = self.options
        passes = repeat_until_stable(run_one, o.min_repeats, o.max_repeats, o.max_rel_error, on_pass)
        self.run.measurements.append(summarize(passes, o.max_rel_error, **labels))
        self.bar.update(1)

    def _describe(self, config: Configuration, llm, seconds: float) -> None:
        engine = llm.llm_engine
        if not self.run.model:
            self.run.model = {"path": str(engine.config.model_path), "name": engine.config.model_path.name,
                              "dtype": str(engine.dtype).removeprefix("torch."), "device": str(engine.device),
                              "eos_token_ids": sorted(engine.eos_token_ids)}
        entry = self.run.engines.setdefault(config.label, {"speculative_config": config.speculative_config,
                                                           "build_seconds": [], "step_costs": []})
        entry["build_seconds"].append(seconds)
        if engine.speculator:
            entry["step_costs"].append(engine.speculator.policy.step_costs)
