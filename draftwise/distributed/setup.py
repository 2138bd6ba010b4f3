"""What an engine with ``tensor_parallel_size`` > 1 sets up before it loads its shard.

``start_tensor_parallel(config, max_model_len)`` checks that the backend can place the
ranks (the engine has checked that the model splits over them: ``ShardLayout``'s
rule, a ``ValueError`` naming ``tensor_parallel_size``), gives each rank its share of the CPU
threads (this process included, unless ``OMP_NUM_THREADS`` says otherwise, until the
executor shuts down), and starts the executor; the driver's group is ``executor.group``.
"""
from __future__ import annotations

import logging
import os

import torch

from .executor import Executor, resolve_backend, start_executor
from .worker import WorkerSpec

logger = logging.getLogger("draftwise")


def start_tensor_parallel(config, max_model_len: int) -> Executor | None:
    """The executor of a tensor-parallel engine (None for one rank)."""
    world_size = config.tensor_parallel_size
    backend = resolve_backend(config.distributed_executor_backend, world_size)
    if world_size == 1:
        return None
    device = config.torch_device
    if device.type == "cuda" and backend == "mp" and world_size > torch.cuda.device_count():
        raise ValueError(f"tensor_parallel_size={world_size} needs {world_size} GPUs on this machine; it has "
                         f"{torch.cuda.device_count()} (the 'ray' backend places ranks on several machines)")
    previous = torch.get_num_threads()
    threads = max(1, previous // world_size)
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(threads)
    spec = WorkerSpec(str(config.model_path), str(config.torch_dtype).removeprefix("torch."), device.type,
                      max_model_len, config.block_size, threads)
    logger.info("draftwise: tensor parallelism over %d ranks (%s backend, %s, %d threads per rank)",
                world_size, backend, "NCCL" if device.type == "cuda" else "gloo", torch.get_num_threads())
    try:
        executor = start_executor(backend, spec, world_size)
    except BaseException:
        torch.set_num_threads(previous)
        raise
    executor.restore_threads = previous  # this process's thread count once the workers are gone
    return executor
