"""Default KV-cache size: enough for the workload, bounded by free memory."""
from __future__ import annotations

import os

import torch

_DEFAULT_FRACTION = 0.25
_DEFAULT_CAP = 2 << 30


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
                           device: torch.device | None = None) -> int:
    """A quarter of free (host or GPU) memory, at most 2 GiB, and no more than the workload can use."""
    wanted = bytes_per_token * max_num_seqs * max_model_len
    return int(min(wanted, _DEFAULT_FRACTION * available_memory_bytes(device), _DEFAULT_CAP))
