"""Tensor parallelism with distributed_executor_backend="ray" (a Ray head on this machine, gloo, fp32).

The driver is rank 0 and the other ranks are Ray actors placed by a placement group: TP=2, and
TP=3 with two actors, give TP=1's tokens; a Ray cluster the engine joined keeps running after it, one it started goes with it; a
killed actor ends the engine with a clear error within seconds; ranks the cluster cannot place
raise ValueError naming tensor_parallel_size; without Ray installed the error names the extra.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")  # the ray extra
from conftest import free_port, greedy

from draftwise import LLM
from draftwise.distributed import ray_executor
from draftwise.errors import EngineDeadError

PROMPTS = [[5, 9, 31, 77, 120, 3, 44], [200, 13, 13, 13, 99, 150, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]]


@pytest.fixture(scope="module")
def ray_head():
    """A 3-CPU Ray head on 127.0.0.1 (its own temp dir, no auth), found by the engine through RAY_ADDRESS."""
    temp_dir = tempfile.mkdtemp(prefix="dwray", dir="/tmp")  # Ray's socket paths must stay short
    port = free_port()
    with pytest.MonkeyPatch.context() as env:
        # Ray reads RAY_AUTH_MODE when it is imported (unset: auth off), but `ray start` turns token auth on
        # when ~/.ray/auth_token exists: pin both sides off, whatever that file holds.
        env.setenv("RAY_AUTH_MODE", "disabled")
        log_path = Path(temp_dir) / "ray-start.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
                                     "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "3",
                                     "--num-gpus", "0", "--include-dashboard=false", "--disable-usage-stats",
                                     "--temp-dir", temp_dir], stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while "Ray runtime started" not in log_path.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.2)
            env.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)  # `ray start --block` stops the head's processes, then exits
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # anything of the head left behind
            except ProcessLookupError:
                pass
            shutil.rmtree(temp_dir, ignore_errors=True)


def _generate(llm, prompts=PROMPTS, max_tokens=12) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(max_tokens=max_tokens), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def _plain(model) -> list[list[int]]:
    llm = LLM(model=str(model), dtype="float32")
    try:
        return _generate(llm)
    finally:
        llm.llm_engine.shutdown()


def _wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_without_a_cluster_the_engine_starts_and_stops_its_own(tiny_model_dir, monkeypatch):
    temp_dir = tempfile.mkdtemp(prefix="dwray", dir="/tmp")  # Ray's socket paths must stay short
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", temp_dir)  # no running cluster is found there; the local one lives there
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # else it writes ~/.ray/auth_token (see ray_head)
    plain = _plain(tiny_model_dir)
    try:
        llm = LLM(model=str(tiny_model_dir), dtype="float32", tensor_parallel_size=2,
                  distributed_executor_backend="ray")
        try:
            assert ray_executor._connection["started"]
            assert _generate(llm) == plain
            raylet = ray._private.worker.global_worker.node.all_processes["raylet"][0].process
        finally:
            llm.llm_engine.shutdown()
        assert not ray.is_initialized()
        assert raylet.poll() is not None  # the local instance it started is gone
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_tp2_on_ray_equals_tp1_and_leaves_the_cluster_running(ray_head, tiny_model_dir):
    plain = _plain(tiny_model_dir)
    llm = LLM(model=str(tiny_model_dir), dtype="float32", tensor_parallel_size=2, distributed_executor_backend="ray")
    executor = llm.llm_engine.executor
    try:
        assert isinstance(executor, ray_executor.RayExecutor) and len(executor.actor_ids) == 1
        assert not ray_executor._connection["started"]  # it joined the head above
        assert executor.local  # every rank on this machine
        names = ray.util.list_named_actors()
        assert len(names) == 1 and names[0].endswith("-rank1"), names
        (pid,) = executor.worker_pids
        assert pid != os.getpid()
        os.kill(pid, 0)  # the actor's process runs on this machine
        assert _generate(llm) == plain
    finally:
        llm.llm_engine.shutdown()
    assert _wait_gone(pid), "the actor outlived the engine"
    assert not ray.is_initialized()  # disconnected ...
    assert ray_head.poll() is None  # ... from a cluster it did not start, which keeps running


@pytest.fixture(scope="module")
def three_group_model(tmp_path_factory):
    """A random fp32 Llama with 6 heads in 3 KV groups (one group per rank at TP=3), with the tiny tokenizer."""
    import torch
    from conftest import _build_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("three-groups")
    tokenizer = _build_tokenizer(path)
    torch.manual_seed(3)
    config = LlamaConfig(hidden_size=96, intermediate_size=192, num_hidden_layers=2, num_attention_heads=6,
                         num_key_value_heads=3, vocab_size=len(tokenizer), max_position_embeddings=512,
                         initializer_range=0.2)
    LlamaForCausalLM(config).float().save_pretrained(path)
    return path


def test_tp3_on_ray_has_two_actors_and_equals_tp1(ray_head, three_group_model):
    plain = _plain(three_group_model)
    llm = LLM(model=str(three_group_model), dtype="float32", tensor_parallel_size=3,
              distributed_executor_backend="ray")
    try:
        assert len(llm.llm_engine.executor.actor_ids) == 2
        assert sorted(name[-5:] for name in ray.util.list_named_actors()) == ["rank1", "rank2"]
        assert _generate(llm) == plain
    finally:
        llm.llm_engine.shutdown()


def test_killed_actor_ends_the_engine_with_a_clear_error(ray_head, tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", tensor_parallel_size=2, distributed_executor_backend="ray")
    executor = llm.llm_engine.executor
    try:
        assert _generate(llm, PROMPTS[:1], 4)
        (actor_id,) = executor.actor_ids
        ray.kill(executor.actors[0])
        start = time.monotonic()
        with pytest.raises(EngineDeadError, match=rf"worker rank 1 \(Ray actor {actor_id}\) died: .*ray\.kill"):
            _generate(llm, PROMPTS[1:], 64)
        assert time.monotonic() - start < 10
        with pytest.raises(EngineDeadError):  # and stays dead
            _generate(llm, PROMPTS[:1], 4)
    finally:
        llm.llm_engine.shutdown()
    assert not ray.is_initialized()


def test_ranks_the_cluster_cannot_place_name_tensor_parallel_size(ray_head, tiny_model_dir, monkeypatch):
    monkeypatch.setattr(ray_executor, "PLACEMENT_TIMEOUT_S", 2.0)
    with pytest.raises(ValueError) as err:  # 4 bundles of 1 CPU on a 3-CPU head
        LLM(model=str(tiny_model_dir), dtype="float32", tensor_parallel_size=4, distributed_executor_backend="ray")
    assert "tensor_parallel_size=4" in str(err.value) and "'CPU': 3.0" in str(err.value), str(err.value)
    assert not ray.is_initialized()
    assert ray_executor._connection["users"] == 0


def test_without_ray_installed_the_error_names_the_extra(tiny_model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ValueError, match=r"distributed_executor_backend='ray' needs Ray: pip install draftwise\[ray\]"):
        LLM(model=str(tiny_model_dir), dtype="float32", tensor_parallel_size=2, distributed_executor_backend="ray")
