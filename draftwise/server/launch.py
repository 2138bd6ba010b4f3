"""``draftwise serve``: build the engine (every bad flag fails here, before the port is bound), then run uvicorn."""
from __future__ import annotations

import argparse
import logging

import uvicorn
from transformers import AutoTokenizer

from ..engine.arg_utils import engine_config_from_kwargs
from ..engine.engine import LLMEngine
from ..models.loader import SMOLLM2_NAME
from .app import build_app
from .async_engine import AsyncEngine
from .guards import header_timeout_protocol
from .metrics import ServerMetrics
from .options import ServerOptions, check_vllm_server_flags

logger = logging.getLogger("draftwise")


def run_server(args: argparse.Namespace, engine_kwargs: dict) -> int:
    logging.basicConfig(level=getattr(logging, args.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(message)s")
    options = ServerOptions.from_args(args)
    check_vllm_server_flags(args)
    config = engine_config_from_kwargs(**engine_kwargs)
    names = args.served_model_name or [args.model or SMOLLM2_NAME]
    metrics = ServerMetrics(names[0])
    engine = AsyncEngine.build(lambda: LLMEngine(config), metrics)  # built on the thread that steps it
    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer or config.model_path)
    app = build_app(engine, names, tokenizer, options, metrics)
    spec = config.speculative.to_dict() if config.speculative else None
    logger.info("draftwise: serving %s as %s on http://%s:%d (speculative config: %s)",
                config.model_path, names, args.host, args.port, spec)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5,
                http=header_timeout_protocol(options.header_read_timeout))
    return 0
