"""``draftwise make-data``: the target writes its own training data for a drafter.

``make_data(model, sources, out, ...)`` runs in two passes over one prompt list:

1. *Generate*: the target answers every prompt greedily (``LLM.chat`` / ``LLM.generate``,
   so all prompts share continuous batching). Greedy answers are what a drafter must
   predict for greedy decoding.
2. *Extract*: prompt + answer go through the target again as prompts with the
   ``extract_hidden_states`` method (``ExampleHiddenStatesConnector``), which writes
   ``out/hidden/{request}.safetensors`` (``token_ids``, ``hidden_states``
   [num_tokens, num_layers, hidden] fp32) for every sample.

``out/manifest.json`` records the target (path, layer count, hidden size, vocabulary),
the saved ``layer_ids`` (default EAGLE-3's aux layers (2, L // 2, L - 3) and ``L``, the
last layer's output before the final norm, which EAGLE, Medusa and MTP read) and per
sample its file, ``num_prompt_tokens`` and ``num_tokens``. Training reads only this
directory (``dataset.load_dataset``).
"""
from __future__ import annotations

import gc
import json
import random
import time
from pathlib import Path

from ..llm import LLM
from ..models.loader import SMOLLM2_NAME
from ..sampling_params import SamplingParams
from ..workloads import WORKLOADS, BenchPrompt, load_workload
from .prompts import load_instruct

MANIFEST = "manifest.json"
SOURCES = ("instruct",) + WORKLOADS


def load_prompts(sources: list[str], num_samples: int | None, seed: int) -> list[BenchPrompt]:
    """Prompts from each source (``instruct``, a benchmark workload, or a .jsonl file), shuffled together."""
    if not sources:
        raise ValueError(f"--prompts is empty; give one or more of {', '.join(SOURCES)} or a .jsonl file")
    prompts: list[BenchPrompt] = []
    for source in sources:
        if source == "instruct":
            prompts.extend(load_instruct(seed=seed))
        elif source in WORKLOADS or source.endswith(".jsonl"):
            prompts.extend(load_workload(source, seed=seed))
        else:
            raise ValueError(f"--prompts: unknown source {source!r}; use {', '.join(SOURCES)} or a .jsonl file")
    random.Random(seed).shuffle(prompts)
    if num_samples is not None:
        if num_samples < 1:
            raise ValueError(f"--num-samples must be >= 1, got {num_samples}")
        prompts = prompts[:num_samples]
    return prompts


def generate_answers(llm: LLM, prompts: list[BenchPrompt], max_tokens: int) -> list[tuple[list[int], list[int]]]:
    """(prompt_token_ids, greedy answer token ids) per prompt, in order."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    chat = [i for i, p in enumerate(prompts) if p.messages is not None]
    raw = [i for i, p in enumerate(prompts) if p.messages is None]
    outputs = {}
    if chat:
        outputs.update(zip(chat, llm.chat([prompts[i].messages for i in chat], params)))
    if raw:
        outputs.update(zip(raw, llm.generate([prompts[i].prompt for i in raw], params)))
    return [(list(outputs[i].prompt_token_ids), list(outputs[i].outputs[0].token_ids)) for i in range(len(prompts))]


def eagle3_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's auxiliary layers (2, L // 2, L - 3), kept inside [0, L] for very shallow models."""
    return [min(2, num_layers), num_layers // 2, max(0, num_layers - 3)]


def default_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's auxiliary layers and ``L`` (the last layer's output, for EAGLE, Medusa and MTP)."""
    return sorted(set(eagle3_layer_ids(num_layers)) | {num_layers})


def make_data(model: str | None, sources: list[str], out: str | Path, max_tokens: int = 256,
              num_samples: int | None = None, max_num_seqs: int = 64, layer_ids: list[int] | None = None,
              seed: int = 0, dtype: str = "auto", device: str = "auto") -> dict:
    """Generate, extract and write ``out``; returns the manifest."""
    out = Path(out)
    if max_tokens < 1:
        raise ValueError(f"--max-tokens must be >= 1, got {max_tokens}")
    if (out / MANIFEST).exists():
        raise ValueError(f"--out {out} already holds a dataset ({MANIFEST}); choose a new directory")
    prompts = load_prompts(sources, num_samples, seed)
    engine_args = dict(dtype=dtype, device=device, seed=seed, max_num_seqs=max_num_seqs)
    start = time.perf_counter()
    llm = LLM(model, **engine_args)
    hf_config = llm.llm_engine.hf_config
    num_layers = hf_config.num_hidden_layers
    layer_ids = list(layer_ids) if layer_ids else default_layer_ids(num_layers)
    if not all(0 <= i <= num_layers for i in layer_ids):
        raise ValueError(f"--layer-ids {layer_ids} must be in [0, {num_layers}]")
    max_len = llm.llm_engine.max_model_len
    pairs = [(p, a) for p, a in generate_answers(llm, prompts, max_tokens) if a and len(p) + len(a) <= max_len]
    generated = time.perf_counter() - start
    del llm
    gc.collect()
    extractor = LLM(model, **engine_args, speculative_config={
        "method": "extract_hidden_states", "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layer_ids}}},
        kv_transfer_config={"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                            "kv_connector_extra_config": {"shared_storage_path": str(out / "hidden")}})
    results = extractor.generate([{"prompt_token_ids": p + a} for p, a in pairs], SamplingParams(max_tokens=1))
    samples = [{"file": str(Path(r.kv_transfer_params["hidden_states_path"]).relative_to(out)),
                "num_prompt_tokens": len(p), "num_tokens": len(p) + len(a)} for r, (p, a) in zip(results, pairs)]
    manifest = {"model": str(model) if model else SMOLLM2_NAME, "num_hidden_layers": num_layers,
                "hidden_size": hf_config.hidden_size, "vocab_size": hf_config.vocab_size,
                "layer_ids": layer_ids, "max_tokens": max_tokens, "sources": sources, "seed": seed,
                "num_samples": len(samples), "num_tokens": sum(s["num_tokens"] for s in samples),
                "num_answer_tokens": sum(len(a) for _, a in pairs),
                "generate_seconds": round(generated, 1), "seconds": round(time.perf_counter() - start, 1),
                "samples": samples}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest
