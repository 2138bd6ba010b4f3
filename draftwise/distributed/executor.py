"""Executors: start the ranks of a tensor-parallel engine, message them, watch them.

The driver (the engine's process) is rank 0: it holds the scheduler, the
drafts and the sampling, and its own shard of the model. An executor starts
ranks 1..N-1 and gives the driver its ``TPGroup``; ``send(message)`` hands every
worker the driver's next message (``worker.py`` lists them), after which all
ranks run the same forward together.

Backends (vLLM's ``distributed_executor_backend`` names):

* ``"mp"`` (``MPExecutor``): worker processes on this machine
  (``python -m draftwise.distributed.worker``); the default for N > 1;
* ``"ray"`` (``ray_executor.RayExecutor``): Ray actors placed by a placement
  group, so ranks may live on several machines of a Ray cluster;
* ``"uni"`` / ``None`` with one rank: no executor at all.

A worker that dies (killed, out of memory, an exception) closes its sockets,
so the collective the driver is in raises at once; ``guard()`` turns that,
or any failure inside a step's collectives, into ``EngineDeadError`` naming
the worker and its exit, after stopping every other worker: a half-run
collective leaves the ranks out of step, so the group cannot be used again.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from ..errors import EngineDeadError
from .group import TPGroup
from .shm_collectives import ShmCollectives
from .worker import WorkerSpec

logger = logging.getLogger("draftwise")

BACKENDS = ("mp", "ray", "uni")
SHM_SLOT_BYTES = 8 << 20  # the largest tensor a shared-memory collective carries (per rank)
_START_POLL_S = 0.2


def resolve_backend(backend: str | None, world_size: int) -> str:
    """vLLM's rule: ``None`` means ``"uni"`` for one rank, ``"mp"`` for more on one machine."""
    if backend is None:
        return "uni" if world_size == 1 else "mp"
    if backend not in BACKENDS:
        raise ValueError(f"distributed_executor_backend={backend!r} is invalid; allowed: {list(BACKENDS)} or None")
    if backend == "uni" and world_size > 1:
        raise ValueError(f"distributed_executor_backend='uni' runs one rank, but tensor_parallel_size="
                         f"{world_size}; use 'mp' or 'ray'")
    return backend


class Executor:
    """Base of the executors: the driver's group, ``send``, ``guard`` and ``shutdown``."""

    local = True  # every rank on this machine (they share its memory)

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.group: TPGroup | None = None
        self.dead: str | None = None  # why the workers can no longer be used
        self.restore_threads: int | None = None  # torch threads this process had before the ranks split them
        self._stopping = False

    def send(self, message: tuple) -> None:
        with self.guard():
            self.group.broadcast_object(message)
        if self.group.shm is not None and self.group.shm.linked:  # every worker mapped it before its first
            self.group.shm.unlink()  # message: the file can go

    @contextmanager
    def guard(self):
        """Run the driver's part of a collective step; any failure in it ends the engine."""
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        try:
            yield
        except Exception as exc:
            reason = self._death_reason(wait_s=2.0) or f"a tensor-parallel step failed: {type(exc).__name__}: {exc}"
            self.dead = reason
            logger.error("draftwise: %s; stopping the tensor-parallel workers", reason)
            self.shutdown()
            raise EngineDeadError(reason) from exc

    def _death_reason(self, wait_s: float) -> str | None:
        """Why a worker is gone, once the watcher has seen it (waits up to ``wait_s``)."""
        deadline = time.monotonic() + wait_s
        while self.dead is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.dead

    def _join(self, store, device: torch.device, alive) -> None:
        """The driver joins the group (rank 0); raises if a worker dies before every rank joined."""
        joined: dict = {}

        def connect() -> None:
            try:
                joined["group"] = TPGroup.from_store(store, 0, self.world_size, device)
            except Exception as exc:  # reported below
                joined["error"] = exc

        thread = threading.Thread(target=connect, name="draftwise-tp-join", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(_START_POLL_S)
            if self.dead is not None or not alive():
                self.shutdown()
                raise EngineDeadError(self._death_reason(1.0) or "a tensor-parallel worker did not start")
        if "error" in joined:
            self.shutdown()
            raise EngineDeadError(f"the tensor-parallel group did not form: {joined['error']}")
        self.group = joined["group"]

    def shutdown(self) -> None:
        """Stop every worker (politely if the group still works) and release the group; idempotent."""
        if self._stopping:
            return
        self._stopping = True
        if self.group is not None and self.dead is None:
            try:
                self.group.broadcast_object(("stop",))
            except Exception:  # a worker already gone: the ones left are stopped below
                pass
        self._stop_workers()
        if self.group is not None:
            self.group.close()
        if self.restore_threads is not None:
            torch.set_num_threads(self.restore_threads)

    def _stop_workers(self) -> None:
        raise NotImplementedError


class MPExecutor(Executor):
    """Ranks 1..N-1 as processes of this machine, watched by one thread each."""

    def __init__(self, spec: WorkerSpec, world_size: int, host: str = "127.0.0.1"):
        super().__init__(world_size)
        store = TPGroup.host_store(host, world_size)
        shm = None
        if spec.device == "cpu":  # every rank on this host: small collectives through shared memory
            spec = dataclasses.replace(spec, shm_path=ShmCollectives.new_path(), shm_slot_bytes=SHM_SLOT_BYTES)
            shm = ShmCollectives(spec.shm_path, 0, world_size, SHM_SLOT_BYTES, create=True,
                                 alive=lambda: self.dead is None)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (_package_root(),
                                                                        os.environ.get("PYTHONPATH")))))
        self.procs = [subprocess.Popen([sys.executable, "-m", "draftwise.distributed.worker", "--spec",
                                        spec.to_json(), "--rank", str(rank), "--world-size", str(world_size),
                                        "--host", host, "--port", str(store.port)], env=env)
                      for rank in range(1, world_size)]
        for rank, proc in enumerate(self.procs, start=1):
            threading.Thread(target=self._watch, args=(rank, proc), name=f"draftwise-tp-watch-{rank}",
                             daemon=True).start()
        logger.info("draftwise: tensor-parallel workers started (mp): %s",
                    ", ".join(f"rank {r} pid {p.pid}" for r, p in enumerate(self.procs, start=1)))
        try:
            self._join(store, torch.device(spec.device), lambda: all(p.poll() is None for p in self.procs))
        finally:
            if shm is not None and self.group is None:
                shm.unlink()
        self.group.shm = shm

    @property
    def worker_pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def _watch(self, rank: int, proc: subprocess.Popen) -> None:
        code = proc.wait()
        if not self._stopping and self.dead is None:
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            self.dead = f"tensor-parallel worker rank {rank} (pid {proc.pid}) {how}"
            logger.error("draftwise: %s", self.dead)

    def _stop_workers(self) -> None:
        deadline = time.monotonic() + 5.0
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def start_executor(backend: str, spec: WorkerSpec, world_size: int) -> Executor:
    if backend == "ray":
        from .ray_executor import RayExecutor

        return RayExecutor(spec, world_size)
    return MPExecutor(spec, world_size)


def _package_root() -> str:
    """The directory holding the ``draftwise`` package (workers import it from there)."""
    return str(Path(__file__).resolve().parents[2])
