"""``draftwise serve --data-parallel-size N``: N engine replicas, each in its own process, behind one server.

``DataParallelEngine`` has the interface the app uses of ``AsyncEngine`` (``add_request``,
``abort``, ``start``, ``stop``, ``metrics``, ``engine``, ``dead``, ``on_dead``). ``build`` starts
the replicas (``replica.py``; multiprocessing "spawn" context), each building its engine from the
same ``LLM`` keywords (``data_parallel_size=1``) in parallel, and returns once all are ready (a
replica that cannot build raises here, before the port is bound, and the others are stopped).
Each replica gets ``cpu_count // N`` torch threads (unless ``OMP_NUM_THREADS`` is set) and, on
CUDA, its own ``tensor_parallel_size`` GPUs.

Placement: a new request goes to the replica with the fewest unfinished requests (ties: the lowest
index); a request id is unique across replicas. Each replica has two pipes: one sender thread writes
its commands (so a large prompt never blocks the event loop while the replica steps), one reader
thread receives its answers and outputs and hands each output to its request's ``RequestStream``
(``call_soon_threadsafe``, as ``AsyncEngine``), so the event loop never waits on a replica. A
replica's ``ValueError`` at ``add_request`` reaches the client as a 400.

``/metrics``: each scrape asks every replica for its snapshot (series labelled ``engine="<i>"``;
a replica that does not answer within ``METRICS_TIMEOUT_S`` gives its last one).

A replica that dies (killed, out of memory, its engine's ``EngineDeadError``) makes the whole
engine dead, as a dead engine core makes vLLM's: the requests in flight on it end with
``EngineDeadError`` (500), later requests are refused with it, and ``on_dead()`` is called (the
server stops, and exits non-zero). ``stop`` tells every replica to stop, waits up to
``STOP_TIMEOUT_S``, then kills those left: no replica outlives the server.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait

from ..compat.vllm.data_parallel_flags import replica_devices
from ..errors import EngineDeadError
from ..metrics.reader import Metric
from ..sampling_params import SamplingParams
from .async_engine import RequestFailed, RequestHandle, RequestStream
from .replica import ReplicaInfo, ReplicaSpec, run_replica

logger = logging.getLogger("draftwise")

METRICS_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class EngineView:
    """What the server reads of ``AsyncEngine.engine`` (``app``, ``serving_*``), for replicas elsewhere."""
    config: object  # the EngineConfig of replica 0's engine (every replica's is the same)
    max_model_len: int
    sampling_defaults: dict
    hf_config: object


class _Replica:
    """The API server's side of one replica: its process, pipes, answers and requests."""

    def __init__(self, index: int, process, commands, results):
        self.index, self.process, self.commands, self.results = index, process, commands, results
        self.pid = process.pid
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()  # commands for the sender thread; None ends it
        self.sender = threading.Thread(target=self._send, name=f"draftwise-replica-{index}-send", daemon=True)
        self.sender.start()
        self.streams: dict[str, RequestStream] = {}  # its unfinished requests (the load)
        self.adds: dict[str, concurrent.futures.Future] = {}
        self.metric_waits: dict[int, concurrent.futures.Future] = {}
        self.last_metrics: list[Metric] = []
        self.lost: EngineDeadError | None = None
        self.stopping = False
        self.dead_message: str | None = None  # its own report of why its engine died
        self.lock = threading.Lock()
        self._reaping = threading.Lock()  # one thread at a time waits for the process (two would race)
        self.reader = threading.Thread(target=self._read, name=f"draftwise-replica-{index}", daemon=True)
        self.on_lost: Callable[[_Replica], None] = lambda replica: None

    def wait_ready(self) -> ReplicaInfo:
        """Block until the replica reports its engine built (``ValueError``/``RuntimeError`` if not)."""
        try:
            message = self.results.recv() if self.results in wait([self.results, self.process.sentinel]) else None
        except EOFError:  # it exited without a word
            message = None
        if message is not None and message[0] == "ready":
            return message[1]
        if message is not None and message[0] == "error":
            _, is_value_error, text = message
            raise (ValueError if is_value_error else RuntimeError)(text)
        raise RuntimeError(f"data-parallel replica {self.index} exited before its engine was built "
                           f"({_exit_status(self.join(5))})")

    def join(self, timeout: float, kill: bool = False, warn: bool = True) -> int | None:
        """Wait up to ``timeout`` seconds for the process to exit, then (``kill``) kill it (saying so
        if ``warn``) and wait for that; its exit code, or None while it runs."""
        with self._reaping:
            self.process.join(timeout)
            if kill and self.process.exitcode is None:
                if warn:
                    logger.warning("draftwise: data-parallel replica %d did not stop; killing it", self.index)
                self.process.kill()
                self.process.join(5)
            return self.process.exitcode

    # ------------------------------------------------------------------ event loop side
    def add(self, request_id: str, prompt, params: SamplingParams, stream: RequestStream):
        added: concurrent.futures.Future = concurrent.futures.Future()
        with self.lock:
            if self.lost is not None:
                raise self.lost
            self.streams[request_id] = stream
            self.adds[request_id] = added
        self.post(("add", request_id, prompt, params))
        return added

    def abort(self, request_id: str) -> bool:
        with self.lock:
            found = self.streams.pop(request_id, None) is not None and self.lost is None
        if found:
            self.post(("abort", request_id))
        return found

    async def metrics(self, token: int, model_name: str) -> list[Metric]:
        waiting: concurrent.futures.Future = concurrent.futures.Future()
        with self.lock:
            if self.lost is not None or self.stopping:
                return self.last_metrics
            self.metric_waits[token] = waiting
        self.post(("metrics", token, model_name))
        try:
            return await asyncio.wait_for(asyncio.wrap_future(waiting), METRICS_TIMEOUT_S) or self.last_metrics
        except asyncio.TimeoutError:
            with self.lock:
                self.metric_waits.pop(token, None)
            return self.last_metrics

    def post(self, command: tuple | None) -> None:
        """Queue ``command`` for the replica (``None`` ends the sender thread)."""
        self._outbox.put(command)

    # ------------------------------------------------------------------ sender and reader threads
    def _send(self) -> None:
        while (command := self._outbox.get()) is not None:
            try:
                self.commands.send(command)
            except OSError:  # the replica is gone: its reader reports it
                return

    def _read(self) -> None:
        try:
            while self.dead_message is None and self.results in wait([self.results, self.process.sentinel]):
                self._handle(self.results.recv())
        except (EOFError, OSError):
            pass  # the replica's end of the pipe closed: it exited
        how = self.dead_message or f"exited ({_exit_status(self.join(5))})"  # (a dead engine's: at once)
        error = EngineDeadError(f"data-parallel replica {self.index} (pid {self.pid}) {how}")
        with self.lock:
            self.lost = error
            streams, adds, waits = self.streams, self.adds, self.metric_waits
            self.streams, self.adds, self.metric_waits = {}, {}, {}
        ending = error if not self.stopping else RuntimeError("the engine is shutting down")
        for stream in streams.values():
            stream.put(ending)
        for added in adds.values():
            if added.set_running_or_notify_cancel():  # (False: its caller went away)
                added.set_exception(ending)
        for waiting in waits.values():
            if waiting.set_running_or_notify_cancel():
                waiting.set_result(None)
        if not self.stopping:
            self.on_lost(self)

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "outputs":
            self._deliver(message[1])
        elif kind == "added":
            _, request_id, error = message
            with self.lock:
                added = self.adds.pop(request_id, None)
                if error is not None:
                    self.streams.pop(request_id, None)
            if added is None or not added.set_running_or_notify_cancel():
                if error is None:  # its caller went away while it was queued: nobody reads it
                    self.abort(request_id)
                return
            if error is None:
                added.set_result(None)
            else:
                added.set_exception((ValueError if error[0] else RuntimeError)(error[1]))
        elif kind == "failed":
            with self.lock:
                failed = [(rid, self.streams.pop(rid, None)) for rid in message[1]]
            for request_id, stream in failed:
                if stream is not None:
                    stream.put(RequestFailed(request_id))
        elif kind == "metrics":
            _, token, snapshot = message
            self.last_metrics = snapshot
            with self.lock:
                waiting = self.metric_waits.pop(token, None)
            if waiting is not None and waiting.set_running_or_notify_cancel():  # (False: timed out)
                waiting.set_result(snapshot)
        elif kind == "dead":  # its engine raised EngineDeadError; it exits next
            self.dead_message = f"died: {message[1]}"

    def _deliver(self, outputs: list) -> None:
        for out in outputs:
            with self.lock:
                stream = self.streams.get(out.request_id)
                if out.finished:
                    self.streams.pop(out.request_id, None)
            if stream is None:
                continue
            if stream.trace is not None:
                stream.trace.observe(out.metrics)
            stream.put(RequestFailed(out.request_id) if out.error else out)


def _exit_status(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


class DataParallelEngine:
    def __init__(self, replicas: list[_Replica], engine: EngineView, metrics=None):
        self.replicas = replicas
        self.engine = engine  # what the app reads of an LLMEngine
        self.metrics = metrics  # ServerMetrics or None: /metrics asks every replica
        self.dead: EngineDeadError | None = None
        self.on_dead: Callable[[], None] | None = None  # called once, on a reader thread, when a replica dies
        self._stopped = False
        self._tokens = itertools.count()
        self._lock = threading.Lock()
        for replica in replicas:
            replica.on_lost = self._replica_lost
        if metrics is not None:
            metrics.bind_source(lambda: self.metrics_snapshot(metrics.model_name))

    @property
    def pids(self) -> list[int]:
        """The replicas' process ids, by index."""
        return [replica.pid for replica in self.replicas]

    @classmethod
    def build(cls, engine_kwargs: dict, size: int, config, metrics=None, log_level: int = logging.INFO,
              log_format: str = logging.BASIC_FORMAT) -> "DataParallelEngine":
        """Start ``size`` replicas building their engines from ``engine_kwargs`` (``config``: the
        ``EngineConfig`` they make) and wait until all are ready; the loops run at ``start()``."""
        threads = None if "OMP_NUM_THREADS" in os.environ else max(1, (os.cpu_count() or 1) // size)
        devices = replica_devices(config, size)
        context = multiprocessing.get_context("spawn")
        replicas = []
        for index in range(size):
            spec = ReplicaSpec(index, engine_kwargs, threads, devices[index], log_level, log_format)
            (their_commands, commands), (results, their_results) = (context.Pipe(duplex=False) for _ in range(2))
            process = context.Process(target=run_replica, args=(spec, their_commands, their_results),
                                      name=f"draftwise-replica-{index}", daemon=True)
            process.start()
            their_commands.close()  # the replica holds the only copies of its ends: either side's exit is
            their_results.close()  # EOF on the other's
            replicas.append(_Replica(index, process, commands, results))
        try:
            infos = [replica.wait_ready() for replica in replicas]
        except BaseException:
            cls(replicas, EngineView(config, 0, {}, None)).stop(timeout=0)
            raise
        for replica in replicas:
            logger.info("draftwise: data-parallel replica %d runs in process %d%s", replica.index, replica.pid,
                        f" on GPU(s) {','.join(devices[replica.index])}" if devices[replica.index] else "")
        info = infos[0]
        return cls(replicas, EngineView(info.config, info.max_model_len, info.sampling_defaults, info.hf_config),
                   metrics)

    # ------------------------------------------------------------------ event loop side
    def start(self) -> None:
        for replica in self.replicas:
            if not replica.reader.is_alive():
                replica.reader.start()

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop every replica: ask, wait up to ``timeout`` seconds in all, then kill (0: kill at once,
        quietly). Idempotent."""
        self._stopped = True
        for replica in self.replicas:
            replica.stopping = True
            replica.post(("stop",))
            replica.post(None)
        deadline = time.monotonic() + timeout
        for replica in self.replicas:
            replica.join(max(0.0, deadline - time.monotonic()), kill=True, warn=timeout > 0)
        for replica in self.replicas:
            for thread in (replica.sender, replica.reader):
                if thread.is_alive():
                    thread.join(5)
            replica.commands.close()

    async def add_request(self, request_id: str, prompt, params: SamplingParams, trace=None) -> RequestHandle:
        """Queue a request on the least-loaded replica; raises its ``ValueError`` for a bad one."""
        if self.dead is not None:
            raise self.dead
        if self._stopped:
            raise RuntimeError("the engine is shutting down")
        if any(request_id in replica.streams for replica in self.replicas):
            raise ValueError(f"request_id {request_id!r} is already in the engine")
        replica = min(self.replicas, key=lambda r: (len(r.streams), r.index))
        stream = RequestStream(asyncio.get_running_loop(), trace)
        await asyncio.wrap_future(replica.add(request_id, prompt, params, stream))
        return RequestHandle(self, request_id, stream)

    def abort(self, request_id: str) -> None:
        for replica in self.replicas:
            if replica.abort(request_id):
                return

    async def metrics_snapshot(self, model_name: str) -> list[Metric]:
        """Every replica's metrics (its series labelled ``engine="<index>"``), by index."""
        token = next(self._tokens)
        snapshots = await asyncio.gather(*(replica.metrics(token, model_name) for replica in self.replicas))
        return [metric for snapshot in snapshots for metric in snapshot]

    # ------------------------------------------------------------------ reader threads
    def _replica_lost(self, replica: _Replica) -> None:
        with self._lock:
            first = self.dead is None
            if first:
                self.dead = replica.lost
        if not first:
            return
        logger.error("draftwise: %s; its requests in flight failed, the server stops", replica.lost)
        if self.on_dead is not None:
            self.on_dead()
