"""The paged KV pool: every KV tensor of the engine (target and drafters), sized together.

A member is anything with a paged KV cache: the target model, a draft model,
a hidden-state drafter's layers. Each declares a ``KVCacheSpec`` (layers, KV
heads, head size); all members share the block ids the ``BlockManager``
hands out, so slot ``s`` of a sequence holds position ``p`` in every member's
tensor at once, and one block table addresses them all.

``KVPool.allocate(budget)`` turns a byte budget (or the default: a quarter
of free host or GPU memory, at most 2 GiB, no more than the workload can
use, split between the tensor-parallel ranks that share a host's memory;
a budget is per rank, sized by the driver's, which holds the most KV heads)
into a number of blocks, allocates one tensor per member,
``[num_layers, 2, (num_blocks + 1) * block_size, num_kv_heads, head_dim]``, and the
``BlockManager`` over its ``num_blocks`` blocks. The one block past them (id ``num_blocks``,
``spare_block``) is never handed out: rows that must write K/V somewhere but belong to no
sequence (the padding rows of a CUDA graph's fixed-shape step) write there. On CPU the tensors
are zero pages that the OS maps when first written (``calloc``), so a large pool costs neither
start-up time nor resident memory until sequences fill it, and blocks already touched are handed
out again before new ones (``free_blocks.py``).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
import torch

from .block_manager import BlockManager

logger = logging.getLogger("draftwise")

_DEFAULT_FRACTION = 0.25
_DEFAULT_CAP = 2 << 30
_GPU_ACTIVATION_RESERVE = 0.05  # of a GPU's memory, kept for a step's activations


@dataclass(frozen=True)
class KVCacheSpec:
    num_layers: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def of_layers(cls, layers) -> "KVCacheSpec":
        """The spec of a stack of attention layers (each with ``num_kv_heads`` and ``head_dim``)."""
        return cls(len(layers), layers[0].num_kv_heads, layers[0].head_dim)

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * dtype.itemsize


class KVPool:
    def __init__(self, block_size: int, dtype: torch.dtype, device: torch.device, num_local_ranks: int = 1):
        self.block_size, self.dtype, self.device = block_size, dtype, device
        self.num_local_ranks = num_local_ranks  # tensor-parallel ranks sharing this host's memory
        self.specs: dict[str, KVCacheSpec] = {}
        self.tensors: dict[str, torch.Tensor] = {}
        self.block_manager: BlockManager | None = None

    def add(self, name: str, spec: KVCacheSpec) -> None:
        if self.tensors:
            raise RuntimeError("the KV pool is already allocated")
        self.specs[name] = spec

    @property
    def bytes_per_token(self) -> int:
        return sum(spec.bytes_per_token(self.dtype) for spec in self.specs.values())

    def allocate(self, budget_bytes: int | None, max_num_seqs: int, max_model_len: int,
                 enable_prefix_caching: bool = False, drafter_kv: bool = False,
                 key_lookahead: int = 0, gpu_memory_utilization: float | None = None) -> BlockManager:
        """Size the pool (``budget_bytes`` None: ``gpu_memory_utilization`` of a GPU's memory, else the
        default) and allocate every member's tensor."""
        per_token = self.bytes_per_token
        if budget_bytes is None and gpu_memory_utilization is not None and self.device.type == "cuda":
            budget_bytes = gpu_kv_cache_bytes(gpu_memory_utilization, self.device)
        budget = budget_bytes or default_kv_cache_bytes(per_token, max_num_seqs, max_model_len, self.device,
                                                        self.num_local_ranks)
        num_blocks = budget // (per_token * self.block_size)
        self.block_manager = BlockManager(num_blocks, self.block_size, enable_prefix_caching, drafter_kv,
                                          key_lookahead)
        self.allocate_blocks(num_blocks)
        return self.block_manager

    def allocate_blocks(self, num_blocks: int) -> None:
        """Every member's tensor for ``num_blocks`` blocks and the spare one (a tensor-parallel worker: the
        driver's count)."""
        for name, spec in self.specs.items():
            shape = (spec.num_layers, 2, (num_blocks + 1) * self.block_size, spec.num_kv_heads, spec.head_dim)
            self.tensors[name] = _zeros(shape, self.dtype, self.device)

    @property
    def spare_block(self) -> int:
        """The block past the manager's, which no sequence gets (padding rows write there)."""
        return self.block_manager.num_blocks

    def tensor(self, name: str) -> torch.Tensor:  # [num_layers, 2, num_slots, num_kv_heads, head_dim]
        return self.tensors[name]


_SAME_SIZE_INT = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros; on CPU from numpy's ``calloc`` (untouched pages stay unmapped) viewed as ``dtype``."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    return torch.from_numpy(np.zeros(shape, dtype=_SAME_SIZE_INT[dtype.itemsize])).view(dtype)


def available_memory_bytes(device: torch.device | None = None) -> int:
    if device is not None and device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def default_kv_cache_bytes(bytes_per_token: int, max_num_seqs: int, max_model_len: int,
                           device: torch.device | None = None, num_local_ranks: int = 1) -> int:
    """A quarter of free (host or GPU) memory, at most 2 GiB, and no more than the workload can use;
    on a host whose memory ``num_local_ranks`` tensor-parallel ranks share, each rank's share of that."""
    wanted = bytes_per_token * max_num_seqs * max_model_len
    return int(min(wanted, _DEFAULT_FRACTION * available_memory_bytes(device) / num_local_ranks,
                   _DEFAULT_CAP / num_local_ranks))


def gpu_kv_cache_bytes(utilization: float, device: torch.device) -> int:
    """vLLM's ``gpu_memory_utilization``: the engine may use that share of the GPU's memory; the KV
    cache gets what the loaded weights leave, less a reserve for activations, and never more than the
    GPU has free (other processes may hold some of it)."""
    free, total = torch.cuda.mem_get_info(device)
    reserve = _GPU_ACTIVATION_RESERVE * total
    wanted = utilization * total - torch.cuda.memory_reserved(device) - reserve
    if wanted > free - reserve:
        logger.warning("draftwise: gpu_memory_utilization=%s asks for more than the %.1f GiB the GPU has free; "
                       "the KV cache takes what is free", utilization, free / 2**30)
    return max(0, int(min(wanted, free - reserve)))
