"""AsyncEngine: one engine loop on a background thread, shared by every connection.

The ``LLMEngine`` is owned by a single thread; ``AsyncEngine.build`` also
constructs it there, so every torch op of the server runs on one thread (torch
gives each thread that runs ops its own OpenMP team; on a small CPU two teams
stop spin-waiting and a decode step ran ~30% slower when the engine was built
on the main thread and stepped on this one). Handlers running on the
asyncio event loop never touch it: they post commands (add, abort) to a
thread-safe queue, and the loop thread applies them between steps, so all
requests in flight are batched together in every step (continuous batching,
speculation included). Each step's ``RequestOutput``s (cumulative snapshots:
full text and token ids so far) are handed to the owning request's
``RequestStream`` with ``call_soon_threadsafe``; it keeps only the latest unread
one, so a slow reader's memory stays bounded. A request added with a
``SpecTrace`` has it fed every one of its outputs on the engine thread, before
the output is handed on (``spec_metrics``: per-step speculative figures).

Contract of ``add_request``: it raises ``ValueError`` for a request the
engine rejects (nothing was queued), else returns a ``RequestHandle`` whose
``outputs()`` yields snapshots until the finished one. If the consumer stops
early (client disconnect, cancellation), the request is aborted and its KV
blocks are freed on the next loop iteration. A request the engine failed
(its values broke a step; the engine isolates it, see ``engine/fault_isolation.py``)
ends with ``RequestFailed``; if a step fails beyond that, every request in it
fails and is aborted. The loop keeps serving new requests either way, but for
``EngineDeadError`` (``draftwise/errors.py``: a part of the engine outside this
process died): then every request in flight, and every one queued or added
after, ends with that error (a 500), ``dead`` holds it, the loop ends and
``on_dead()`` is called (the server stops and exits non-zero).

Metrics: the engine records its own (``engine.stats``, read by ``/metrics`` through
``ServerMetrics``). The periodic log lines (``metrics/stat_logger.py``) are due after steps and on
a timer: an idle loop wakes at least once per log interval (and once a second), so the interval
that ends a burst is logged even when no step follows it.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable

from ..engine.engine import LLMEngine
from ..errors import EngineDeadError
from ..outputs import RequestOutput
from ..sampling_params import SamplingParams

logger = logging.getLogger("draftwise")


class RequestFailed(RuntimeError):
    """The engine failed this request; the message names the request id only (details are in the log)."""

    def __init__(self, request_id: str):
        super().__init__(f"the engine could not run request {request_id}; the server log has the details")


class RequestStream:
    """The latest undelivered item of one request: a ``RequestOutput`` snapshot, or an exception that ends it.

    Snapshots are cumulative (full text and token ids so far), so an unread one is replaced by the next:
    a client that reads slowly holds at most one snapshot here, however fast the engine runs."""

    def __init__(self, loop: asyncio.AbstractEventLoop, trace=None):
        self.loop = loop
        self.trace = trace  # a SpecTrace fed on the engine thread, or None
        self._item = None
        self._ready = asyncio.Event()

    def put(self, item) -> None:  # engine thread
        self.loop.call_soon_threadsafe(self._set, item)

    def _set(self, item) -> None:
        if not isinstance(self._item, BaseException):  # an error already ends the request
            self._item = item
            self._ready.set()

    async def get(self):
        await self._ready.wait()
        self._ready.clear()
        item, self._item = self._item, None
        return item


class AsyncEngine:
    def __init__(self, engine: LLMEngine, metrics=None):
        self.engine = engine
        self.engine.detokenize_unfinished = True  # streaming needs the text of every step
        self.metrics = metrics  # ServerMetrics or None: /metrics renders this engine's recorder
        if metrics is not None:
            metrics.bind(engine)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, RequestStream] = {}
        self._stopped = False
        self.dead: EngineDeadError | None = None  # set when the engine died: nothing is served after
        self.on_dead: Callable[[], None] | None = None  # called once, on the engine thread, when it dies
        self._thread = threading.Thread(target=self._run, name="draftwise-engine", daemon=True)
        self._started: threading.Event | None = None  # set by ``build``: the thread waits for start()

    @classmethod
    def build(cls, make_engine: Callable[[], LLMEngine], metrics=None) -> "AsyncEngine":
        """Construct the engine with ``make_engine()`` on the thread that will step it; its errors
        (a bad flag, a missing model) are raised here. The loop runs once ``start()`` is called."""
        built: concurrent.futures.Future = concurrent.futures.Future()
        started = threading.Event()

        def own_thread() -> None:
            try:
                async_engine = cls(make_engine(), metrics)
            except BaseException as exc:  # handed to the caller, which raises it
                built.set_exception(exc)
                return
            built.set_result(async_engine)
            started.wait()
            async_engine._run()

        thread = threading.Thread(target=own_thread, name="draftwise-engine", daemon=True)
        thread.start()
        async_engine = built.result()
        async_engine._thread, async_engine._started = thread, started
        return async_engine

    # ------------------------------------------------------------------ event loop side
    def start(self) -> None:
        if self._started is not None:
            self._started.set()
        else:
            self._thread.start()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        if self._started is not None:
            self._started.set()  # a loop never started exits at once
        self._thread.join(timeout=30)

    async def add_request(self, request_id: str, prompt, params: SamplingParams, trace=None) -> "RequestHandle":
        """Queue a request; raises the engine's ``ValueError`` for a bad one (nothing is queued).
        ``trace`` (a ``SpecTrace``) is fed each of its outputs on the engine thread."""
        stream = RequestStream(asyncio.get_running_loop(), trace)
        added: concurrent.futures.Future = concurrent.futures.Future()
        self._post(("add", request_id, prompt, params, stream, added))
        await asyncio.wrap_future(added)
        return RequestHandle(self, request_id, stream)

    def abort(self, request_id: str) -> None:
        if not self._stopped:
            self._post(("abort", request_id))

    def _post(self, command: tuple) -> None:
        if self.dead is not None:
            raise self.dead
        if self._stopped:
            raise RuntimeError("the engine is shutting down")
        self._commands.put(command)
        self._wake.set()
        if self._stopped:  # the loop ended meanwhile and may have drained the queue already
            self._refuse_queued()

    # ------------------------------------------------------------------ engine thread side
    @property
    def _idle_wait_s(self) -> float:
        """How long an idle loop sleeps: a second, or the log interval if shorter (not under 10 ms)."""
        logger_ = self.engine.stats.logger
        return max(0.01, min(1.0, logger_.interval_s)) if logger_ is not None else 1.0

    def _run(self) -> None:
        try:
            self._serve()
        except EngineDeadError as exc:
            self._die(exc)
        finally:
            self._stopped = True
            self._refuse_queued()

    def _serve(self) -> None:
        while not self._stopped:
            self._apply_commands()
            if not self.engine.has_unfinished_requests():
                self._wake.wait(timeout=self._idle_wait_s)
                self._wake.clear()
                self.engine.stats.record_idle(self.engine)  # the log lines' timer while idle
                continue
            try:
                outputs = self.engine.step()
            except EngineDeadError:
                raise
            except Exception as exc:  # a failed step fails its requests, not the server
                logger.exception("draftwise: engine step failed; failing the requests in flight")
                self._fail_all(exc)
                continue
            for out in outputs:
                stream = self._streams.get(out.request_id)
                if stream is not None:
                    if stream.trace is not None:
                        stream.trace.observe(out.metrics)
                    stream.put(RequestFailed(out.request_id) if out.error else out)
                    if out.finished:
                        del self._streams[out.request_id]

    def _apply_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "add":
                self._add(*command[1:])
            else:
                self._abort(command[1])

    def _add(self, request_id, prompt, params, stream: RequestStream, added: concurrent.futures.Future) -> None:
        if not added.set_running_or_notify_cancel():  # its caller went away before it was queued
            return
        try:
            self.engine.add_request(request_id, prompt, params)
        except Exception as exc:  # ValueError: bad request; anything else: the handler answers 500
            added.set_exception(exc)
            if isinstance(exc, EngineDeadError):
                raise
            return
        self._streams[request_id] = stream
        added.set_result(None)

    def _abort(self, request_id: str) -> None:
        if self._streams.pop(request_id, None) is not None:
            self.engine.abort_request(request_id)

    def _fail_all(self, exc: Exception) -> None:
        for request_id, stream in list(self._streams.items()):
            stream.put(RequestFailed(request_id))
            self._abort(request_id)

    def _die(self, exc: EngineDeadError) -> None:
        """The engine is gone: fail every request in flight with ``exc`` (nothing is aborted: the
        engine cannot be called), stop the loop and tell ``on_dead``."""
        logger.error("draftwise: the engine died (%s); failing %d request(s) in flight, the server stops",
                     exc, len(self._streams))
        self.dead, self._stopped = exc, True
        for stream in self._streams.values():
            stream.put(exc)
        self._streams.clear()
        if self.on_dead is not None:
            self.on_dead()

    def _refuse_queued(self) -> None:
        """Commands posted while the loop ended: their adds get the engine's end (a waiter never hangs)."""
        error = self.dead or RuntimeError("the engine is shutting down")
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "add" and command[-1].set_running_or_notify_cancel():
                command[-1].set_exception(error)


class RequestHandle:
    """One queued request: iterate ``outputs()`` for its snapshots; ``abort()`` if you stop early."""

    def __init__(self, engine: AsyncEngine, request_id: str, stream: RequestStream):
        self.engine = engine
        self.request_id = request_id
        self._stream = stream
        self.trace = stream.trace  # complete once the finished output has been read
        self.finished = False

    async def outputs(self) -> AsyncIterator[RequestOutput]:
        try:
            while not self.finished:
                item = await self._stream.get()
                if isinstance(item, BaseException):
                    self.finished = True
                    raise item
                self.finished = item.finished
                yield item
        finally:
            self.abort()

    def abort(self) -> None:
        """Abort unless finished (idempotent): frees the request's KV blocks on the next loop turn."""
        if not self.finished:
            self.finished = True
            self.engine.abort(self.request_id)
