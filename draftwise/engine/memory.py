"""Default KV-cache size: enough for the workload, bounded by free memory."""
from __future__ import annotations

import os

_DEFAULT_FRACTION = 0.25
_DEFAULT_CAP = 4 << 30


def available_memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def default_kv_cache_bytes(bytes_per_token: int, max_num_seqs: int, max_model_len: int) -> int:
    """A quarter of free memory, at most 4 GiB, and no more than the workload can use."""
    wanted = bytes_per_token * max_num_seqs * max_model_len
    return int(min(wanted, _DEFAULT_FRACTION * available_memory_bytes(), _DEFAULT_CAP))
