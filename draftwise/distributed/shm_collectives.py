"""``ShmCollectives``: all-reduce and gather through shared memory, for ranks on one CPU host.

A decode step makes dozens of all-reduces of small tensors, for which gloo's loopback TCP is
much slower than a shared-memory exchange. So ranks of one host (the ``mp`` executor on CPU)
exchange small tensors through a file in ``/dev/shm`` that every rank maps:

    [flags: one 64-byte line per rank][buffer 0: one slot per rank][buffer 1: one slot per rank]

A collective writes the rank's tensor into its slot of buffer ``seq % 2``, publishes ``seq`` in
its flag, and spins until every rank's flag reaches ``seq``; then each rank sums the slots in rank
order (so every rank gets the same bits) or rank 0 concatenates them (gather). Two buffers make
it safe for a fast rank to start the next collective while a slow one still reads this one: it
cannot get two ahead, since it waits for every flag at each call. (x86's ordered stores make a
flag's new value visible only after the slot's.) Tensors over ``slot_bytes`` take gloo instead; the
choice depends only on the size, which is the same on every rank.

A rank that never arrives: the spin checks ``alive()`` (the driver: no worker died; a worker: its
driver still runs) every few thousand turns and raises after ``timeout_s``.
"""
from __future__ import annotations

import os
import time
import uuid

import numpy as np
import torch

_LINE = 64  # bytes per rank's flag (one cache line)
_CHECK_EVERY = 4096  # spin turns between liveness checks
_MAX_VIEWS = 256  # cached slot views (one per buffer, dtype and shape)


class ShmCollectives:
    def __init__(self, path: str, rank: int, world_size: int, slot_bytes: int, create: bool,
                 alive=lambda: True, timeout_s: float = 300.0):
        self.path, self.rank, self.world_size, self.slot_bytes = path, rank, world_size, slot_bytes
        size = _LINE * world_size + 2 * world_size * slot_bytes
        if create:
            with open(path, "wb") as f:
                f.truncate(size)
        self.raw = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)  # [size], mapped
        self.flags = self.raw[:_LINE * world_size].numpy().view(np.int64)[::_LINE // 8]  # [world_size]
        self.seq = 0
        self.alive, self.timeout_s = alive, timeout_s
        self.linked = True  # the file still exists
        self._views: dict[tuple, list[torch.Tensor]] = {}  # (buffer, dtype, shape) -> every rank's slot

    @staticmethod
    def new_path() -> str:
        return f"/dev/shm/draftwise-tp-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def fits(self, x: torch.Tensor) -> bool:
        return x.device.type == "cpu" and x.numel() * x.element_size() <= self.slot_bytes

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place (in rank order: the same result on every rank)."""
        slots = self._exchange(x)
        x.copy_(slots[0])
        for slot in slots[1:]:
            x += slot
        return x

    def gather_to_driver(self, x: torch.Tensor) -> torch.Tensor | None:  # [rows, cols] -> [rows, world * cols]
        slots = self._exchange(x)
        return torch.cat(slots, dim=-1) if self.rank == 0 else None

    def _exchange(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Publish ``x`` in this rank's slot; once every rank has, every rank's (views of the buffer)."""
        self.seq += 1
        slots = self._slots(self.seq % 2, x.dtype, x.shape)
        slots[self.rank].copy_(x)
        self.flags[self.rank] = self.seq
        self._wait(self.seq)
        return slots

    def _slots(self, buffer: int, dtype: torch.dtype, shape: torch.Size) -> list[torch.Tensor]:
        """Views of every rank's slot of ``buffer`` as ``dtype`` / ``shape`` (made once per shape: a
        step's 61 all-reduces share one)."""
        key = (buffer, dtype, tuple(shape))
        if key not in self._views:
            if len(self._views) >= _MAX_VIEWS:  # prefill chunks of every length: keep the map small
                self._views.clear()
            base = _LINE * self.world_size + buffer * self.world_size * self.slot_bytes
            nbytes = shape.numel() * dtype.itemsize
            self._views[key] = [self.raw[base + r * self.slot_bytes:base + r * self.slot_bytes + nbytes]
                                .view(dtype).view(shape) for r in range(self.world_size)]
        return self._views[key]

    def _wait(self, seq: int) -> None:
        flags, turns, start = self.flags, 0, None
        while flags.min() < seq:
            turns += 1
            if turns % _CHECK_EVERY == 0:
                start = start or time.monotonic()
                if not self.alive() or time.monotonic() - start > self.timeout_s:
                    raise RuntimeError(f"a tensor-parallel rank did not reach collective {seq} "
                                       f"(flags {flags.tolist()})")
                time.sleep(0)  # let this process's other threads run

    def unlink(self) -> None:
        """Remove the file (the ranks keep their mappings); once every rank has mapped it."""
        if self.linked:
            self.linked = False
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
