"""One replica of a data-parallel server: an ``LLMEngine`` in its own process, driven by the API server.

``run_replica(spec, commands, results)`` is the target of a process started with multiprocessing's
"spawn" context (``data_parallel.py`` starts one per replica). It ignores SIGINT (Ctrl-C reaches
the whole process group: the API server stops its replicas itself), sets up the server's logging,
torch's intra-op threads (``spec.num_threads``; ``None`` when the user set ``OMP_NUM_THREADS``)
and the replica's GPUs (``CUDA_VISIBLE_DEVICES``), builds its engine from ``spec.engine_kwargs``
as ``LLM(**kwargs)`` would, and serves until told to stop (then shuts its engine down: its
tensor-parallel workers, if any, stop with it). Its metrics carry ``engine="<index>"``
and its log lines "Engine <index>" (``StatsRecorder.engine_index``).

Messages are pickled tuples. In, on ``commands`` (the receive end of a pipe the API server writes):

* ``("add", request_id, prompt, params)``: answered ``("added", request_id, None)``, or
  ``("added", request_id, (is_value_error, message))`` when the engine refuses it;
* ``("abort", request_id)``: no answer;
* ``("metrics", token, model_name)``: answered ``("metrics", token, [Metric, ...])``;
* ``("stop",)``: the loop ends, the process exits 0.

Out, on ``results`` (the send end of a pipe; one thread of the API server reads it):

* ``("ready", ReplicaInfo)`` once the engine is built, or ``("error", is_value_error, message)``
  when it cannot be (the process exits 1);
* ``("outputs", [RequestOutput, ...])`` after each step (cumulative snapshots, as ``step()`` gives);
* ``("failed", [request_id, ...])``: a step failed beyond fault isolation; those requests are aborted;
* ``("dead", message)``: the engine raised ``EngineDeadError``; the process exits 1.

A replica whose API server is gone (either pipe closes) exits too, so no replica outlives its server.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import traceback
from dataclasses import dataclass

import torch

from ..engine.arg_utils import engine_config_from_kwargs
from ..engine.engine import LLMEngine
from ..errors import EngineDeadError

logger = logging.getLogger("draftwise")


@dataclass(frozen=True)
class ReplicaSpec:
    index: int
    engine_kwargs: dict  # LLM keywords, with data_parallel_size=1
    num_threads: int | None  # torch's intra-op threads; None: OMP_NUM_THREADS decides
    devices: tuple[str, ...] | None  # its CUDA_VISIBLE_DEVICES; None off CUDA
    log_level: int
    log_format: str


@dataclass(frozen=True)
class ReplicaInfo:
    """What the API server reads of a replica's engine (the same for every replica)."""
    pid: int
    config: object  # the EngineConfig its engine runs (model_path resolved)
    max_model_len: int
    sampling_defaults: dict
    hf_config: object


def run_replica(spec: ReplicaSpec, commands, results) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=spec.log_level, format=spec.log_format)
    if spec.devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(spec.devices)
    engine = _build(spec, results)
    if engine is None:
        sys.exit(1)
    try:
        _Loop(spec.index, engine, commands, results).run()
    except EngineDeadError as exc:
        logger.error("draftwise: data-parallel replica %d: the engine died: %s", spec.index, exc)
        _send(results, ("dead", str(exc)))
        sys.exit(1)
    except (BrokenPipeError, EOFError, ConnectionError):
        sys.exit(1)  # the API server is gone
    finally:
        engine.shutdown()  # its tensor-parallel workers, if any (idempotent)


def _build(spec: ReplicaSpec, results):
    """The replica's engine, after sending ``("ready", info)``; None after sending ``("error", ...)``."""
    if spec.num_threads is not None:
        torch.set_num_threads(spec.num_threads)
    try:
        engine = LLMEngine(engine_config_from_kwargs(**spec.engine_kwargs))
    except Exception as exc:
        message = str(exc) if isinstance(exc, ValueError) else traceback.format_exc()
        _send(results, ("error", isinstance(exc, ValueError), message))
        return None
    engine.detokenize_unfinished = True  # streaming needs the text of every step
    engine.stats.engine_index = spec.index
    info = ReplicaInfo(os.getpid(), engine.config, engine.max_model_len, dict(engine.sampling_defaults),
                       engine.hf_config)
    _send(results, ("ready", info))
    return engine


def _send(results, message: tuple) -> None:
    try:
        results.send(message)
    except (BrokenPipeError, EOFError, ConnectionError, OSError):
        pass  # the API server is gone; the caller exits


class _Loop:
    """Commands between steps; outputs after each. Owns the engine (one thread)."""

    def __init__(self, index: int, engine, commands, results):
        self.index = index
        self.engine = engine
        self.commands = commands
        self.results = results
        self.requests: set[str] = set()  # added, not finished nor aborted

    @property
    def idle_wait_s(self) -> float:
        """How long an idle replica waits for a command: a second, or the log interval if shorter."""
        logger_ = self.engine.stats.logger
        return max(0.01, min(1.0, logger_.interval_s)) if logger_ is not None else 1.0

    def run(self) -> None:
        while self._apply_commands(block=not self.requests):
            if self.requests:
                self._step()
            else:
                self.engine.stats.record_idle(self.engine)  # the log lines' timer while idle

    def _apply_commands(self, block: bool) -> bool:
        """Apply every queued command (waiting up to ``idle_wait_s`` for one if ``block``); False once
        told to stop. ``EOFError`` when the API server is gone."""
        timeout = self.idle_wait_s if block else 0.0
        while self.commands.poll(timeout):
            command = self.commands.recv()
            if command[0] == "stop":
                return False
            self._apply(command)
            timeout = 0.0
        return True

    def _apply(self, command: tuple) -> None:
        kind = command[0]
        if kind == "add":
            _, request_id, prompt, params = command
            try:
                self.engine.add_request(request_id, prompt, params)
            except EngineDeadError:
                raise
            except Exception as exc:  # ValueError: a bad request (400); anything else: 500
                self.results.send(("added", request_id, (isinstance(exc, ValueError), str(exc))))
                return
            self.requests.add(request_id)
            self.results.send(("added", request_id, None))
        elif kind == "abort":
            if command[1] in self.requests:
                self.requests.discard(command[1])
                self.engine.abort_request(command[1])
        elif kind == "metrics":
            _, token, model_name = command
            self.results.send(("metrics", token, self.engine.stats.snapshot(model_name)))
        else:
            raise ValueError(f"data-parallel replica {self.index}: unknown command {kind!r}")

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except EngineDeadError:
            raise
        except Exception:  # a failed step fails its requests, not the replica
            logger.exception("draftwise: data-parallel replica %d: engine step failed; failing the requests "
                             "in flight", self.index)
            failed = sorted(self.requests)
            self.requests.clear()
            self.engine.abort_request(failed)
            self.results.send(("failed", failed))
            return
        for out in outputs:
            if out.finished:
                self.requests.discard(out.request_id)
        if outputs:
            self.results.send(("outputs", outputs))
