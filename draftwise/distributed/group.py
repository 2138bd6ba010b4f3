"""``TPGroup``: the collectives of one tensor-parallel group, without global state.

Built on ``torch.distributed``'s process-group objects directly (a ``TCPStore``
the driver hosts, then ``ProcessGroupGloo`` / ``ProcessGroupNCCL``), not on
``init_process_group``: no default group, so several engines can live in one
process and each one's group goes away with it.

* ``device`` group: the model's all-reduces and the logits' gather. gloo on
  CPU, NCCL on CUDA.
* ``cpu`` group (gloo, the same group on CPU): the driver's step messages,
  pickled (``broadcast_object``).
* ``shm`` (``shm_collectives.py``), set by the ``mp`` executor on CPU: ranks of one host
  all-reduce and gather small tensors through shared memory instead of loopback gloo.

``TPGroup.single()`` (one rank) makes every collective a no-op, so the model
code calls them unconditionally. Collectives block until every rank joins;
a rank that died makes them raise (its sockets close) instead of waiting
(``timeout`` bounds a rank that hangs alive).
"""
from __future__ import annotations

import datetime
import pickle

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 300.0


class TPGroup:
    def __init__(self, rank: int, world_size: int, device_pg=None, cpu_pg=None, store=None):
        self.rank, self.world_size = rank, world_size
        self.device_pg, self.cpu_pg = device_pg, cpu_pg
        self.store = store  # kept alive: the driver's hosts the rendezvous
        self.shm = None  # ShmCollectives: small CPU tensors of ranks on one host go through shared memory

    @classmethod
    def single(cls) -> "TPGroup":
        return cls(0, 1)

    @classmethod
    def connect(cls, host: str, port: int, rank: int, world_size: int, device: torch.device,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> "TPGroup":
        """A worker joins the group whose rendezvous the driver hosts on ``host:port``."""
        store = dist.TCPStore(host, port, world_size, False, timeout=datetime.timedelta(seconds=timeout_s))
        return cls.from_store(store, rank, world_size, device, timeout_s)

    @staticmethod
    def host_store(host: str, world_size: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> dist.TCPStore:
        """The rendezvous the driver hosts before its workers start (they need its port)."""
        return dist.TCPStore(host, 0, world_size, True, timeout=datetime.timedelta(seconds=timeout_s),
                             wait_for_workers=False)

    @classmethod
    def from_store(cls, store: dist.TCPStore, rank: int, world_size: int, device: torch.device,
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> "TPGroup":
        timeout = datetime.timedelta(seconds=timeout_s)
        cpu_pg = dist.ProcessGroupGloo(dist.PrefixStore("cpu", store), rank, world_size, timeout)
        device_pg = cpu_pg
        if device.type == "cuda":
            device_pg = dist.ProcessGroupNCCL(dist.PrefixStore("nccl", store), rank, world_size)
        return cls(rank, world_size, device_pg, cpu_pg, store)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place; returns it."""
        if self.shm is not None and self.shm.fits(x):
            return self.shm.all_reduce(x)
        if self.world_size > 1:
            self.device_pg.allreduce([x]).wait()
        return x

    def gather_to_driver(self, x: torch.Tensor  # [num_rows, cols] on every rank, the same shape
                         ) -> torch.Tensor | None:  # [num_rows, world_size * cols] on rank 0, None elsewhere
        if self.world_size == 1:
            return x
        if self.shm is not None and self.shm.fits(x):
            return self.shm.gather_to_driver(x)
        opts = dist.GatherOptions()
        opts.rootRank = 0
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)] if self.rank == 0 else []
        self.device_pg.gather([parts] if self.rank == 0 else [], [x], opts).wait()
        return torch.cat(parts, dim=-1) if self.rank == 0 else None

    def broadcast_object(self, obj=None):
        """Rank 0's ``obj`` on every rank (pickled; tensors should be on the CPU)."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        if self.rank == 0:
            payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
            size = torch.tensor([payload.numel()], dtype=torch.int64)
        else:
            size = torch.zeros(1, dtype=torch.int64)
        self.cpu_pg.broadcast([size], opts).wait()
        if self.rank != 0:
            payload = torch.empty(int(size), dtype=torch.uint8)
        self.cpu_pg.broadcast([payload], opts).wait()
        return obj if self.rank == 0 else pickle.loads(payload.numpy().tobytes())

    def close(self) -> None:
        if self.shm is not None:
            self.shm.unlink()
        self.device_pg = self.cpu_pg = self.store = self.shm = None
