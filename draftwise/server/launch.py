"""``draftwise serve``: build the engine (every bad flag fails here, before the port is bound), then run uvicorn.

One engine (``AsyncEngine``), or with ``--data-parallel-size N`` (> 1) N replicas in processes of
their own (``DataParallelEngine``). ``run_server`` returns 0 after a normal shutdown (Ctrl-C,
SIGTERM), and 1 when the engine died (``EngineDeadError``: a worker or replica process died): the
requests in flight got 500, uvicorn was told to stop, and a supervisor restarts the server.
"""
from __future__ import annotations

import argparse
import logging

import uvicorn

from ..compat.vllm.data_parallel_flags import data_parallel_plan
from ..engine.arg_utils import engine_config_from_kwargs
from ..engine.engine import LLMEngine
from ..models.loader import SMOLLM2_NAME
from ..models.registry import load_tokenizer
from .app import build_app
from .async_engine import AsyncEngine
from .data_parallel import DataParallelEngine
from .guards import header_timeout_protocol
from .metrics import ServerMetrics
from .options import ServerOptions, check_vllm_server_flags

logger = logging.getLogger("draftwise")

LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"


def run_server(args: argparse.Namespace, engine_kwargs: dict) -> int:
    log_level = getattr(logging, args.log_level.upper())
    logging.basicConfig(level=log_level, format=LOG_FORMAT)
    options = ServerOptions.from_args(args)
    check_vllm_server_flags(args)
    replicas, engine_kwargs = data_parallel_plan(engine_kwargs)
    config = engine_config_from_kwargs(**engine_kwargs)
    names = args.served_model_name or [args.model or SMOLLM2_NAME]
    metrics = ServerMetrics(names[0])
    if replicas > 1:
        engine = DataParallelEngine.build(engine_kwargs, replicas, config, metrics, log_level, LOG_FORMAT)
    else:
        engine = AsyncEngine.build(lambda: LLMEngine(config), metrics)  # built on the thread that steps it
    try:
        config = engine.engine.config  # as the engine resolved it (model_path)
        tokenizer = load_tokenizer(config.tokenizer or config.model_path)
        app = build_app(engine, names, tokenizer, options, metrics)
        spec = config.speculative.to_dict() if config.speculative else None
        logger.info("draftwise: serving %s as %s on http://%s:%d (speculative config: %s%s)",
                    config.model_path, names, args.host, args.port, spec,
                    f", {replicas} data-parallel replicas" if replicas > 1 else "")
        server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                               timeout_graceful_shutdown=5,
                                               http=header_timeout_protocol(options.header_read_timeout)))
        engine.on_dead = lambda: setattr(server, "should_exit", True)  # uvicorn polls it: a graceful stop
        try:
            server.run()
        except KeyboardInterrupt:  # as uvicorn.run: Ctrl-C is a normal shutdown
            pass
    finally:
        engine.stop()  # (the app's shutdown stopped it already unless uvicorn never started it)
    if engine.dead is not None:
        logger.error("draftwise: exiting with status 1: %s", engine.dead)
        return 1
    return 0
