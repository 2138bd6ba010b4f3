"""``draftwise make-data``: the target writes its own training data for a drafter.

``make_data(model, sources, out, ...)`` runs two passes; both are resumable: run the same
command again after an interruption and it goes on where it stopped.

1. *Answer* (``answers.py``): the target answers every prompt greedily, in chunks batched
   together (continuous batching), into ``out/answers.jsonl``. Prompts come from fixed sources
   or from ``magpie``, conversations whose user turns the target writes itself
   (``magpie.py``). Greedy answers are what a drafter must predict for greedy decoding.
2. *Extract*: prompt + answer go through the target again as prompts with the
   ``extract_hidden_states`` method (``ExampleHiddenStatesConnector``); each record's states
   land in ``out/hidden/{index:07d}.safetensors`` (``token_ids`` [T], ``hidden_states``
   [T, num_layers, hidden] in ``hidden_dtype``).

``out/manifest.json``, written last, records the target (path, layer count, hidden size,
vocabulary), the saved ``layer_ids`` (default EAGLE-3's aux layers (2, L // 2, L - 3) and ``L``,
the last layer's output before the final norm, which EAGLE, Medusa and MTP read), the time each
pass took, and per sample its file, ``num_prompt_tokens``, ``num_tokens`` and ``group`` (the
conversation it belongs to). Training reads only this directory (``dataset.load_dataset``).
"""
from __future__ import annotations

import gc
import json
import os
import random
import shutil
import time
from pathlib import Path

from tqdm import tqdm

from ..config.kv_transfer import HIDDEN_STATES_DTYPES
from ..llm import LLM
from ..models.loader import SMOLLM2_NAME
from ..sampling_params import SamplingParams
from ..spec_decode.drafter_networks import eagle3_layer_ids
from ..bench.workloads import WORKLOADS, BenchPrompt, load_workload
from .answers import AnswerLog, AnswerPlan, answer_all
from .prompts import load_instruct

MANIFEST = "manifest.json"
MAGPIE = "magpie"
SOURCES = ("instruct", MAGPIE) + WORKLOADS


def load_prompts(sources: list[str], num_samples: int | None, seed: int) -> tuple[list[BenchPrompt], int]:
    """(fixed prompts shuffled together, number of magpie conversations): ``num_samples`` caps the
    fixed prompts, and is the number of conversations where ``magpie`` is a source (default 1000)."""
    if not sources:
        raise ValueError(f"--prompts is empty; give one or more of {', '.join(SOURCES)} or a .jsonl file")
    if num_samples is not None and num_samples < 1:
        raise ValueError(f"--num-samples must be >= 1, got {num_samples}")
    prompts: list[BenchPrompt] = []
    for source in sources:
        if source == "instruct":
            prompts.extend(load_instruct(seed=seed))
        elif source in WORKLOADS or source.endswith(".jsonl"):
            prompts.extend(load_workload(source, seed=seed))
        elif source != MAGPIE:
            raise ValueError(f"--prompts: unknown source {source!r}; use {', '.join(SOURCES)} or a .jsonl file")
    random.Random(seed).shuffle(prompts)
    if MAGPIE in sources:
        return prompts, num_samples or 1000
    return (prompts[:num_samples] if num_samples is not None else prompts), 0


def default_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's auxiliary layers and ``L`` (the last layer's output, for EAGLE, Medusa and MTP)."""
    return sorted(set(eagle3_layer_ids(num_layers)) | {num_layers})


def make_data(model: str | None, sources: list[str], out: str | Path, max_tokens: int = 256,
              num_samples: int | None = None, max_num_seqs: int = 64, layer_ids: list[int] | None = None,
              seed: int = 0, dtype: str = "auto", device: str = "auto", chunk_size: int = 256,
              hidden_dtype: str = "bfloat16", follow_up_fraction: float = 0.3, opener_fraction: float = 0.0) -> dict:
    """Answer, extract and write ``out`` (going on from where an earlier run stopped); returns the manifest."""
    out = Path(out)
    if max_tokens < 1 or chunk_size < 1:
        raise ValueError(f"--max-tokens and --chunk-size must be >= 1, got {max_tokens} and {chunk_size}")
    if hidden_dtype not in HIDDEN_STATES_DTYPES:
        raise ValueError(f"--hidden-dtype must be one of {', '.join(HIDDEN_STATES_DTYPES)}, got {hidden_dtype!r}")
    for flag, value in (("--follow-up-fraction", follow_up_fraction), ("--magpie-opener-fraction", opener_fraction)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{flag} must be in [0, 1], got {value}")
    if (out / MANIFEST).exists():
        raise ValueError(f"--out {out} already holds a dataset ({MANIFEST}); choose a new directory")
    prompts, num_conversations = load_prompts(sources, num_samples, seed)
    out.mkdir(parents=True, exist_ok=True)
    engine_args = dict(dtype=dtype, device=device, seed=seed, max_num_seqs=max_num_seqs)
    llm = LLM(model, **engine_args)
    hf_config, max_len = llm.llm_engine.hf_config, llm.llm_engine.max_model_len
    num_layers = hf_config.num_hidden_layers
    layer_ids = list(layer_ids) if layer_ids else default_layer_ids(num_layers)
    if not all(0 <= i <= num_layers for i in layer_ids):
        raise ValueError(f"--layer-ids {layer_ids} must be in [0, {num_layers}]")
    log = AnswerLog(out)
    plan = AnswerPlan(prompts, num_conversations, max_tokens, chunk_size, seed, follow_up_fraction, opener_fraction)
    records = [r for r in answer_all(llm, plan, log)
               if r["answer_token_ids"] and len(r["prompt_token_ids"]) + len(r["answer_token_ids"]) <= max_len]
    del llm
    gc.collect()
    start = time.perf_counter()
    extract_all(model, engine_args, layer_ids, records, out, chunk_size, hidden_dtype)
    num_answer_tokens = sum(len(r["answer_token_ids"]) for r in records)
    samples = [{"file": hidden_file(i), "num_prompt_tokens": len(r["prompt_token_ids"]),
                "num_tokens": len(r["prompt_token_ids"]) + len(r["answer_token_ids"]), "group": r["group"]}
               for i, r in enumerate(records)]
    manifest = {"model": str(model) if model else SMOLLM2_NAME, "num_hidden_layers": num_layers,
                "hidden_size": hf_config.hidden_size, "vocab_size": hf_config.vocab_size,
                "layer_ids": layer_ids, "max_tokens": max_tokens, "sources": sources, "seed": seed,
                "hidden_dtype": hidden_dtype, "num_samples": len(samples),
                "num_groups": len({r["group"] for r in records}),
                "num_tokens": sum(s["num_tokens"] for s in samples), "num_answer_tokens": num_answer_tokens,
                "generate_seconds": round(log.seconds, 1),
                "answer_tokens_per_second": round(num_answer_tokens / log.seconds, 1) if log.seconds > 0 else None,
                "extract_seconds": round(time.perf_counter() - start, 1), "samples": samples}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def hidden_file(index: int) -> str:
    return f"hidden/{index:07d}.safetensors"


def extract_all(model: str | None, engine_args: dict, layer_ids: list[int], records: list[dict], out: Path,
                chunk_size: int, hidden_dtype: str) -> None:
    """Write each record's hidden states to ``hidden_file(index)``, skipping files already there."""
    missing = [i for i in range(len(records)) if not (out / hidden_file(i)).exists()]
    if not missing:
        return
    staging = out / "hidden-staging"
    shutil.rmtree(staging, ignore_errors=True)
    extractor = LLM(model, **engine_args, speculative_config={
        "method": "extract_hidden_states", "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layer_ids}}},
        kv_transfer_config={"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                            "kv_connector_extra_config": {"shared_storage_path": str(staging),
                                                          "hidden_states_dtype": hidden_dtype}})
    for first in tqdm(range(0, len(missing), chunk_size), desc="saving hidden states (chunks)", unit="chunk"):
        chunk = missing[first:first + chunk_size]
        results = extractor.generate([{"prompt_token_ids": records[i]["prompt_token_ids"] +
                                       records[i]["answer_token_ids"]} for i in chunk],
                                     SamplingParams(max_tokens=1), use_tqdm=False)
        for i, result in zip(chunk, results):  # written in the data's dtype: moved, not rewritten
            final = out / hidden_file(i)
            final.parent.mkdir(exist_ok=True)
            os.replace(result.kv_transfer_params["hidden_states_path"], final)
    shutil.rmtree(staging, ignore_errors=True)
