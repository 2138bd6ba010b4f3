"""Long-lived CPU buffers on transparent huge pages, where the operating system grants them.

A decode step streams every weight byte once. On 4 KiB pages the quantized blocks of a
1B-parameter model span some 200k pages, far more than the CPU's TLB holds, so the stream also
pays a page walk every few KiB; on 2 MiB pages the same bytes span a few hundred. Linux backs
anonymous memory with 2 MiB pages when transparent huge pages are ``always`` on, or ``madvise``
(the common default) and the memory asked for them, which ``torch.empty`` never does.

``empty(shape, dtype)`` is an uninitialised CPU tensor in a private anonymous mapping advised
for huge pages (``MADV_HUGEPAGE``), its start aligned to 2 MiB; the tensor's storage holds the
mapping, which is unmapped with it. It is a plain ``torch.empty`` where the buffer is smaller than
``MIN_BYTES``, transparent huge pages are ``never``, the platform has no ``MADV_HUGEPAGE``, or
``DRAFTWISE_HUGE_PAGES=0``. Use it for buffers written once and read whole every step (weights):
a huge page is resident as soon as one byte of it is touched, so a buffer filled little by little
(a KV cache) would hold up to 2 MiB more per region touched.
"""
from __future__ import annotations

import math
import mmap
import os
from functools import lru_cache
from pathlib import Path

import torch

HUGE_PAGE_BYTES = 2 << 20
MIN_BYTES = 2 * HUGE_PAGE_BYTES  # below this a buffer spans few pages anyway
ENV = "DRAFTWISE_HUGE_PAGES"  # "0": plain allocations
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@lru_cache(maxsize=1)
def thp_mode() -> str:
    """The kernel's transparent huge page mode (``always``, ``madvise`` or ``never``); ``never``
    where it cannot be read (not Linux)."""
    try:
        text = THP_MODE.read_text()
    except OSError:
        return "never"
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else "never"


def enabled() -> bool:
    """True where ``empty`` maps huge pages for large buffers."""
    return (os.environ.get(ENV, "1") != "0" and hasattr(mmap, "MADV_HUGEPAGE")
            and thp_mode() in ("always", "madvise"))


def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor of ``shape``, on huge pages where they are granted (see above)."""
    num_bytes = math.prod(shape) * dtype.itemsize
    if num_bytes < MIN_BYTES or not enabled():
        return torch.empty(shape, dtype=dtype)
    mapping = mmap.mmap(-1, num_bytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.madvise(mmap.MADV_HUGEPAGE)
    whole = torch.frombuffer(mapping, dtype=torch.uint8)  # (its storage keeps the mapping alive)
    start = -whole.data_ptr() % HUGE_PAGE_BYTES
    return whole[start:start + num_bytes].view(dtype).view(shape)
