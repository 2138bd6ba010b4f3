"""``run_bench(options)``: every configuration in this process, one pass at a time, interleaved.

For each workload and concurrency level, the candidates (every configuration of
``options.configurations``; at concurrency 1 also transformers' ``generate`` and its prompt
lookup at each depth, with ``--compare transformers``) run in rounds: each round, every
candidate that is not yet stable runs one pass, the order rotating from round to round, so
that the drift of a shared machine hits all of them alike instead of whichever ran while
another job was busy. A candidate leaves the rounds once ``summary.is_settled`` says so.

Every pass runs on a freshly built engine, warmed up with short requests (as many at once as
the pass runs) and freed after, so nothing a pass leaves behind speeds up the next: suffix
decoding's global tree of earlier outputs would otherwise draft a repeated prompt from its
own earlier answer. Passes never overlap. A tqdm bar counts finished measurements.
"""
from __future__ import annotations

import gc
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from .workloads import BenchPrompt, load_workload
from .measure import PassResult, PromptInput, build_engine, run_pass, sampling_params, tokenize_prompts
from .options import BenchOptions, Configuration, configurations
from .summary import Measurement, is_settled, summarize


@dataclass
class BenchRun:
    options: BenchOptions
    measurements: list[Measurement] = field(default_factory=list)
    engines: dict[str, dict] = field(default_factory=dict)  # per configuration: build times, step costs
    model: dict = field(default_factory=dict)
    machine: dict = field(default_factory=dict)
    workload_sizes: dict[str, int] = field(default_factory=dict)


@dataclass
class Candidate:
    labels: dict  # workload, label, backend, method, num_speculative_tokens, concurrency
    run_pass: Callable[[], PassResult]
    passes: list[PassResult] = field(default_factory=list)


def run_bench(options: BenchOptions) -> BenchRun:
    workloads = load_workloads(options)
    configs = configurations(options)
    run = BenchRun(options, machine={"load_average_start": os.getloadavg()},
                   workload_sizes={name: len(prompts) for name, prompts in workloads.items()})
    session = _Session(run, workloads)
    cells = [(name, c) for name in workloads for c in options.concurrency]
    total = sum(len(session.candidates(configs, name, c)) for name, c in cells)
    with tqdm(total=total, desc="draftwise bench", unit="measurement", dynamic_ncols=True) as bar:
        for name, concurrency in cells:
            run.measurements += run_rounds(session.candidates(configs, name, concurrency), options, bar)
    run.machine.update(machine_info())
    return run


def run_rounds(candidates: list[Candidate], options: BenchOptions, bar) -> list[Measurement]:
    """Passes in rotating rounds until every candidate is settled; measurements in candidate order."""
    def settled(candidate: Candidate) -> bool:
        return is_settled([p.tokens_per_s for p in candidate.passes], options.min_repeats, options.max_repeats,
                          options.max_rel_error)

    pending, number = list(candidates), 0
    while pending:
        shift = number % len(pending)
        for candidate in pending[shift:] + pending[:shift]:
            labels = candidate.labels
            bar.set_description(f"{labels['label']} on {labels['workload']} at concurrency {labels['concurrency']}")
            candidate.passes.append(candidate.run_pass())
            bar.set_postfix_str(f"pass {len(candidate.passes)}: {candidate.passes[-1].tokens_per_s:.1f} tokens/s")
            bar.update(int(settled(candidate)))
        pending = [c for c in pending if not settled(c)]
        number += 1
    return [summarize(c.passes, options.max_rel_error, **c.labels) for c in candidates]


def load_workloads(options: BenchOptions) -> dict[str, list[BenchPrompt]]:
    workloads = {name: load_workload(name, options.num_prompts, options.seed) for name in options.workloads}
    for name, prompts in workloads.items():
        if len(prompts) < max(options.concurrency):
            raise ValueError(f"workload {name} has {len(prompts)} prompts, fewer than --concurrency "
                             f"{max(options.concurrency)} needs")
    return workloads


def machine_info() -> dict:
    return {"platform": platform.platform(), "processor": _cpu_name(),
            "cpu_count": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "python": sys.version.split()[0], "load_average_end": os.getloadavg(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.machine()


class _Session:
    """What the passes share: prompts tokenized once, the model's description, transformers."""

    def __init__(self, run: BenchRun, workloads: dict[str, list[BenchPrompt]]):
        self.run, self.options, self.workloads = run, run.options, workloads
        self.inputs: dict[str, list[PromptInput]] = {}
        self._hf = None

    def candidates(self, configs: list[Configuration], workload: str, concurrency: int) -> list[Candidate]:
        found = [Candidate(dict(workload=workload, label=c.label, backend="draftwise", method=c.method,
                                num_speculative_tokens=c.num_speculative_tokens, concurrency=concurrency),
                           lambda c=c: self._fresh_pass(c, workload, concurrency)) for c in configs]
        if "transformers" in self.options.compare and concurrency == 1:
            for depth in [None, *self.options.depths]:
                label = "transformers generate" if depth is None else f"transformers prompt lookup K={depth}"
                labels = dict(workload=workload, label=label, backend="transformers",
                              method="none" if depth is None else "prompt_lookup",
                              num_speculative_tokens=depth, concurrency=1)
                found.append(Candidate(labels, lambda depth=depth: self._hf_pass(workload, depth)))
        return found

    def _fresh_pass(self, config: Configuration, workload: str, concurrency: int) -> PassResult:
        """One pass on a newly built, warmed-up engine, freed afterwards."""
        start = time.perf_counter()
        llm = build_engine(self.options, config, concurrency)
        self._describe(config, llm, time.perf_counter() - start)
        inputs = self.inputs.setdefault(workload, tokenize_prompts(llm.get_tokenizer(), self.workloads[workload]))
        try:
            return run_pass(llm, inputs, sampling_params(self.options, self.workloads[workload]), concurrency)
        finally:
            del llm
            gc.collect()

    def _hf_pass(self, workload: str, depth: int | None) -> PassResult:
        """One pass of transformers (loaded on first use, after an engine described the model)."""
        if self._hf is None:
            from .hf import HFRunner

            model = self.run.model
            self._hf = HFRunner(model["path"], getattr(torch, model["dtype"]), torch.device(model["device"]),
                                model["eos_token_ids"])
        inputs = self.inputs[workload]
        self._hf.warm_up(inputs[0], depth)
        return self._hf.run_pass(inputs, sampling_params(self.options, self.workloads[workload]), depth)

    def _describe(self, config: Configuration, llm, seconds: float) -> None:
        engine = llm.llm_engine
        if not self.run.model:
            self.run.model = {"path": str(engine.config.model_path), "name": engine.config.model_path.name,
                              "dtype": str(engine.dtype).removeprefix("torch."), "device": str(engine.device),
                              "eos_token_ids": sorted(engine.eos_token_ids)}
        entry = self.run.engines.setdefault(config.label, {"speculative_config": config.speculative_config,
                                                           "build_seconds": [], "step_ms": []})
        entry["build_seconds"].append(seconds)
        entry["step_ms"].append(engine.step_cost.snapshot())  # start-up step times by rows
