"""``RayExecutor``: ranks 1..N-1 of a tensor-parallel engine as Ray actors (``distributed_executor_backend="ray"``).

The driver (this process, rank 0) joins a Ray cluster: the one it is already
connected to, else a running one (``RAY_ADDRESS``, or a head started on this
machine with ``ray start --head``), else a local instance it starts itself.
A placement group (strategy ``PACK``) reserves one bundle per rank, the
driver's pinned to its own node, each ``{"CPU": threads}`` on CPU or
``{"GPU": 1}`` on CUDA, so the workers may live on other machines of the
cluster; one that cannot be placed within ``PLACEMENT_TIMEOUT_S`` raises a
``ValueError`` naming ``tensor_parallel_size`` and the cluster's resources.

Each actor runs ``run_worker`` (``worker.py``) against the driver's rendezvous,
which listens on the driver's node IP so other machines reach it; every
machine needs draftwise and the model at the same path. A thread waits on the
actors' runs: an actor that ends before the driver stops it (``ray.kill``, a
lost node, an exception) sets ``dead`` with the rank and Ray's reason, so the
driver's next step raises ``EngineDeadError``. ``shutdown`` lets the actors
leave their loops, kills them, removes the placement group and disconnects;
a Ray instance the engine started goes with its last executor, a cluster it
only joined keeps running.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading

import torch

from ..errors import EngineDeadError
from .executor import Executor
from .group import TPGroup
from .worker import WorkerSpec, run_worker

logger = logging.getLogger("draftwise")

PLACEMENT_TIMEOUT_S = 30.0
_STOP_WAIT_S = 5.0
_WATCH_POLL_S = 0.5

_connection = {"users": 0, "started": False}  # the Ray connection draftwise made in this process
_connection_lock = threading.Lock()


class RankActor:
    """One worker rank inside a Ray actor."""

    def info(self) -> tuple[str, int, str | None]:
        """(node IP, pid, UUID of the GPU Ray gave this actor or None)."""
        import ray

        uuid = str(torch.cuda.get_device_properties(0).uuid) if ray.get_gpu_ids() else None
        return ray.util.get_node_ip_address(), os.getpid(), uuid

    def run(self, spec: WorkerSpec, rank: int, world_size: int, host: str, port: int) -> None:
        if spec.device == "cuda":  # Ray shows the actor only its own GPU
            spec = dataclasses.replace(spec, device="cuda:0")
        run_worker(spec, rank, world_size, host, port)


class RayExecutor(Executor):
    def __init__(self, spec: WorkerSpec, world_size: int):
        super().__init__(world_size)
        ray, self._counted = _connect()
        self._ray = ray
        self.actors: list = []
        self.worker_pids: list[int] = []
        self._runs: dict = {}  # run ref -> rank
        self._pg = None
        self._watcher: threading.Thread | None = None
        try:
            host = ray.util.get_node_ip_address()
            self._pg = _place(ray, spec, world_size, host)
            store = TPGroup.host_store(host, world_size)
            self._start_actors(spec, host, store.port)
        except BaseException:
            self.shutdown()
            raise
        self._join(store, torch.device(spec.device), lambda: True)

    @property
    def actor_ids(self) -> list[str]:
        return [actor._actor_id.hex() for actor in self.actors]

    def _start_actors(self, spec: WorkerSpec, host: str, port: int) -> None:
        ray = self._ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        cuda = spec.device == "cuda"
        remote = ray.remote(RankActor)
        for rank in range(1, self.world_size):
            strategy = PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=rank)
            self.actors.append(remote.options(num_cpus=0 if cuda else spec.num_threads, num_gpus=1 if cuda else 0,
                                              scheduling_strategy=strategy,
                                              name=f"draftwise-tp-{self._pg.id.hex()[:12]}-rank{rank}").remote())
        try:
            infos = ray.get([actor.info.remote() for actor in self.actors])
        except Exception as exc:
            raise EngineDeadError(f"a tensor-parallel Ray actor did not start: {_reason(exc)}") from exc
        driver_gpu = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid) if cuda else None
        for rank, (ip, _, gpu) in enumerate(infos, start=1):
            if gpu is not None and gpu == driver_gpu:
                raise ValueError(f"tensor_parallel_size={self.world_size}: Ray gave rank {rank} the driver's own GPU "
                                 f"on {ip}; keep the driver's GPU out of Ray (CUDA_VISIBLE_DEVICES when starting "
                                 "the node) or use distributed_executor_backend='mp' on one machine")
        self.worker_pids = [pid for _, pid, _ in infos]
        self.local = all(ip == host for ip, _, _ in infos)  # every rank on the driver's machine
        self._runs = {actor.run.remote(spec, rank, self.world_size, host, port): rank
                      for rank, actor in enumerate(self.actors, start=1)}
        self._watcher = threading.Thread(target=self._watch, name="draftwise-tp-ray-watch", daemon=True)
        self._watcher.start()
        logger.info("draftwise: tensor-parallel workers started (ray): %s", ", ".join(
            f"rank {r} actor {a} pid {p} on {ip}" for r, (a, (ip, p, _)) in enumerate(zip(self.actor_ids, infos), 1)))

    def _watch(self) -> None:
        ray, pending = self._ray, dict(self._runs)
        while pending and not self._stopping:
            try:
                done, _ = ray.wait(list(pending), num_returns=1, timeout=_WATCH_POLL_S)
            except Exception:  # Ray disconnected under us: the driver's collectives report it
                return
            for ref in done:
                rank = pending.pop(ref)
                try:
                    ray.get(ref)
                    how = "returned before the engine stopped it"
                except Exception as exc:
                    how = f"died: {_reason(exc)}"
                if not self._stopping and self.dead is None:
                    self.dead = f"tensor-parallel worker rank {rank} (Ray actor {self.actor_ids[rank - 1]}) {how}"
                    logger.error("draftwise: %s", self.dead)

    def _stop_workers(self) -> None:
        ray = self._ray
        try:
            if self._runs:
                ray.wait(list(self._runs), num_returns=len(self._runs), timeout=_STOP_WAIT_S)
            for actor in self.actors:
                ray.kill(actor)
            if self._pg is not None:
                ray.util.remove_placement_group(self._pg)
        except Exception as exc:  # Ray already gone (interpreter exit): nothing left to stop
            logger.debug("draftwise: stopping the Ray workers: %s", exc)
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=2 * _WATCH_POLL_S)
        if self._counted:
            self._counted = False
            _disconnect(ray)


def _place(ray, spec: WorkerSpec, world_size: int, host: str):
    """A ready placement group of one bundle per rank (bundle 0, the driver's, on this node)."""
    unit = {"GPU": 1} if spec.device == "cuda" else {"CPU": spec.num_threads}
    bundles = [dict(unit, **{f"node:{host}": 0.001})] + [dict(unit) for _ in range(1, world_size)]
    pg = ray.util.placement_group(bundles, strategy="PACK")
    ready, _ = ray.wait([pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        ray.util.remove_placement_group(pg)
        raise ValueError(f"tensor_parallel_size={world_size} needs one Ray bundle of {unit} per rank (the driver's "
                         f"on this node, {host}); the Ray cluster has {ray.cluster_resources()} and could not place "
                         f"them within {PLACEMENT_TIMEOUT_S:g} s")
    return pg


def _reason(exc: Exception) -> str:
    """Ray's error in one line: the worker's own exception, or why its actor died."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"


def _connect():
    """(ray connected to a cluster, whether this executor counts as a user of draftwise's own connection)."""
    try:
        import ray
    except ImportError as exc:
        raise ValueError("distributed_executor_backend='ray' needs Ray: pip install draftwise[ray]") from exc
    with _connection_lock:
        if _connection["users"] == 0 and ray.is_initialized():  # the application's own connection: leave it
            return ray, False
        if _connection["users"] == 0:
            try:
                ray.init(address="auto")
                _connection["started"] = False
            except ConnectionError:
                logger.info("draftwise: no running Ray cluster found; starting a local Ray instance")
                ray.init(include_dashboard=False)
                _connection["started"] = True
        _connection["users"] += 1
    return ray, True


def _disconnect(ray) -> None:
    """Drop one use of draftwise's connection; the last disconnects (and stops a Ray instance it started)."""
    with _connection_lock:
        _connection["users"] -= 1
        if _connection["users"] == 0:
            if _connection["started"]:
                logger.info("draftwise: stopping the local Ray instance the engine started")
            ray.shutdown()
