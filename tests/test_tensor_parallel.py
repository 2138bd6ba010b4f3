"""Tensor parallelism (mp executor, gloo on 127.0.0.1, one thread per rank on this machine).

A sharded model must give the tokens the whole model gives: TP=2 == TP=1 in fp32, greedy and
seeded, on every architecture we load (tied and untied heads, sliding windows, Gemma's soft-cap),
with fewer KV heads than ranks (replicated), oversubscribed (TP=4 on 2 cores), with speculation
(every method; the draft model whole on the driver or sharded), and on SmolLM2. A worker that dies
ends the engine with a clear error within seconds, never a hang.
"""
from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from conftest import _build_tokenizer, greedy

from draftwise import LLM, SamplingParams
from draftwise.errors import EngineDeadError
from test_model_parity import ARCHS, random_checkpoint

PROMPTS = [[5, 9, 31, 77, 120, 3, 44], [200, 13, 13, 13, 99, 150, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18],
           [42] * 20]


def _run(model, prompts, params, tp: int = 1, stats: dict | None = None, **kwargs) -> list[list[int]]:
    """Token ids of each prompt's output; ``stats`` (if given) receives the speculative counters."""
    llm = LLM(model=str(model), dtype="float32", seed=0, tensor_parallel_size=tp, device="cpu", **kwargs)
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        if stats is not None:
            stats.update(llm.get_spec_decode_stats())
        return [o.outputs[0].token_ids for o in outs]
    finally:
        llm.llm_engine.shutdown()


@pytest.fixture(scope="module")
def arch_dirs(tmp_path_factory):
    """A random fp32 checkpoint (with the tiny tokenizer) per architecture of test_model_parity."""
    dirs = {}
    for name in ARCHS:
        path = tmp_path_factory.mktemp(f"tp-{name}")
        random_checkpoint(name, path)
        _build_tokenizer(path)
        dirs[name] = path
    return dirs


@pytest.mark.parametrize("arch", ARCHS)
def test_tp2_equals_tp1_on_every_architecture(arch_dirs, arch):
    params = greedy(max_tokens=12)
    assert _run(arch_dirs[arch], PROMPTS, params, tp=2) == _run(arch_dirs[arch], PROMPTS, params)


def test_tp4_oversubscribed_replicates_kv_heads(arch_dirs):
    """4 ranks on 2 cores; the model has 2 KV heads, so each is held by two ranks."""
    params = greedy(max_tokens=10)
    assert _run(arch_dirs["llama"], PROMPTS, params, tp=4) == _run(arch_dirs["llama"], PROMPTS, params)


def test_seeded_sampling_equal(arch_dirs):
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=12)
    assert _run(arch_dirs["qwen3"], PROMPTS, params, tp=2) == _run(arch_dirs["qwen3"], PROMPTS, params)


def test_each_rank_holds_its_shard(tiny_model_dir):
    """The driver's shard holds its share of the heads, MLP and vocabulary rows, and the KV heads it reads;
    the ranks split the process's threads while the engine runs."""
    threads = torch.get_num_threads()
    llm = LLM(model=str(tiny_model_dir), dtype="float32", tensor_parallel_size=2, device="cpu")
    try:
        assert torch.get_num_threads() == max(1, threads // 2) or "OMP_NUM_THREADS" in os.environ
        model = llm.llm_engine.runner.model
        config = llm.llm_engine.hf_config
        assert model.layers[0].num_heads == config.num_attention_heads // 2
        assert model.layers[0].num_kv_heads == config.num_key_value_heads // 2
        assert model.layers[0].down_proj.in_features == config.intermediate_size // 2
        assert model.embed_tokens.weight.shape[0] == -(-config.vocab_size // 2)
        assert llm.llm_engine.runner.paged.kv_cache.shape[-2] == config.num_key_value_heads // 2
    finally:
        llm.llm_engine.shutdown()
    assert torch.get_num_threads() == threads


SPEC_CASES = {
    "ngram": lambda d: {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3},
    "draft_model": lambda d: {"method": "draft_model", "model": str(d["draft"]), "num_speculative_tokens": 3},
    "draft_model_sharded": lambda d: {"method": "draft_model", "model": str(d["draft"]), "num_speculative_tokens": 3,
                                      "draft_tensor_parallel_size": 2},
    "eagle": lambda d: {"method": "eagle", "model": str(d["eagle"]), "num_speculative_tokens": 3},
    "eagle3": lambda d: {"method": "eagle3", "model": str(d["eagle3"]), "num_speculative_tokens": 3,
                         "draft_tensor_parallel_size": 2},
    "medusa": lambda d: {"method": "medusa", "model": str(d["medusa"]), "num_speculative_tokens": 3},
    "dflash": lambda d: {"method": "dflash", "model": str(d["dflash"]), "num_speculative_tokens": 3},
}


@pytest.mark.parametrize("case", list(SPEC_CASES))
def test_speculation_under_tp_equals_plain(tiny_model_dir, spec_dirs, monkeypatch, case):
    monkeypatch.setenv("DRAFTWISE_VERIFY_ROW_COST", "0")  # every draft is verified, whatever the timing says
    prompts = [[int(t) for t in torch.randint(3, 300, (12,), generator=torch.Generator().manual_seed(i))] * 2
               for i in range(3)]
    params, stats = greedy(max_tokens=16), {}
    spec = _run(tiny_model_dir, prompts, params, tp=2, stats=stats, speculative_config=SPEC_CASES[case](spec_dirs))
    assert spec == _run(tiny_model_dir, prompts, params)
    assert stats["spec_decode_num_draft_tokens"] > 0


def test_mtp_under_tp_equals_plain(spec_dirs, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_VERIFY_ROW_COST", "0")
    target, params = spec_dirs["mtp_target"], greedy(max_tokens=16)
    spec = _run(target, PROMPTS, params, tp=2, speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    assert spec == _run(target, PROMPTS, params)


@pytest.mark.slow
def test_smollm2_tp2_equals_tp1_plain_and_eagle3(monkeypatch):
    monkeypatch.setenv("DRAFTWISE_VERIFY_ROW_COST", "0")
    llm = LLM(dtype="float32", device="cpu")
    prompts = [llm.get_tokenizer().encode(p) for p in ("The capital of France is", "def fibonacci(n):")]
    params = greedy(max_tokens=24)
    plain = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                                          use_tqdm=False)]
    del llm
    assert _run("HuggingFaceTB/SmolLM2-135M-Instruct", prompts, params, tp=2) == plain
    eagle3 = {"method": "eagle3", "model": "draftwise/SmolLM2-135M-Instruct-eagle3", "num_speculative_tokens": 3}
    assert _run("HuggingFaceTB/SmolLM2-135M-Instruct", prompts, params, tp=2, speculative_config=eagle3) == plain


def test_killed_worker_ends_the_engine_with_a_clear_error(tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", tensor_parallel_size=2, device="cpu")
    executor = llm.llm_engine.executor
    assert llm.generate([{"prompt_token_ids": PROMPTS[0]}], greedy(max_tokens=4), use_tqdm=False)
    pid = executor.worker_pids[0]
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(EngineDeadError, match=rf"worker rank 1 \(pid {pid}\) was killed by signal 9"):
        llm.generate([{"prompt_token_ids": PROMPTS[1]}], greedy(max_tokens=64), use_tqdm=False)
    assert time.monotonic() - start < 10
    with pytest.raises(EngineDeadError):  # and stays dead
        llm.generate([{"prompt_token_ids": PROMPTS[1]}], greedy(max_tokens=4), use_tqdm=False)
    assert all(proc.poll() is not None for proc in executor.procs)


@pytest.mark.parametrize("kwargs, words", [
    ({"tensor_parallel_size": 3}, ["tensor_parallel_size=3", "4 attention heads", "2 KV groups"]),
    ({"tensor_parallel_size": 16}, ["tensor_parallel_size=16"]),
    ({"tensor_parallel_size": 2, "distributed_executor_backend": "threads"},
     ["distributed_executor_backend='threads'", "'mp', 'ray', 'uni'"]),
    ({"tensor_parallel_size": 2, "distributed_executor_backend": "uni"}, ["'uni' runs one rank"]),
    ({"pipeline_parallel_size": 2}, ["pipeline_parallel_size", "pipeline parallelism"]),
    ({"tensor_parallel_size": 2, "speculative_config": {"method": "ngram", "num_speculative_tokens": 2,
                                                        "draft_tensor_parallel_size": 3}},
     ["draft_tensor_parallel_size", "1 or the target's tensor_parallel_size (2)"]),
])
def test_sizes_that_cannot_work_name_the_field(tiny_model_dir, kwargs, words):
    with pytest.raises(ValueError) as err:
        LLM(model=str(tiny_model_dir), dtype="float32", **kwargs)
    assert all(w in str(err.value) for w in words), str(err.value)
