"""What identifies this CPU for kernel speed: its model name and ISA flags (for cache keys and reports)."""
from __future__ import annotations

import platform
from pathlib import Path

_ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8")


def cpu_signature() -> dict:
    """The CPU model and the ISA flags that decide kernel speed (from /proc/cpuinfo)."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return {"cpu": name, "flags": sorted(f for f in _ISA_FLAGS if f in flags)}
