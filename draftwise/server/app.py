"""The FastAPI application: routes, API-key check, request guards, and OpenAI-format errors.

``build_app`` wires an ``AsyncEngine`` (or a ``DataParallelEngine``) to the OpenAI routes (``/v1/models``,
``/v1/completions``, ``/v1/chat/completions``) and vLLM's (``/tokenize``,
``/detokenize``, ``/version``). Every error a client can cause is a JSON
``{"error": {"message", "type", "param", "code"}}``: malformed JSON, invalid
fields and fields draftwise does not implement are 400, an unknown model
404, a missing, wrong or malformed API key 401 (on every route but
``/health``, ``/version`` and ``/metrics``; the API docs need the key when
one is set), a body past the limit
413, a body that does not arrive 408 (``guards.py``), and an unexpected
failure inside one request 500, which fails that request only and never
echoes the exception: the client gets an error id, the log gets the details.
A dead engine (``EngineDeadError``) is a 500 for every request in flight and
after, and ``/health`` answers 503 until the server, told by the engine's
``on_dead``, has stopped (as vLLM's).
"""
from __future__ import annotations

import logging
import uuid
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Body, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..errors import EngineDeadError
from .async_engine import AsyncEngine, RequestFailed
from .errors import APIError, error_response
from .guards import KEY_MESSAGE, RequestGuard, authorized
from .metrics import ServerMetrics
from .options import ServerOptions
from .preprocess import Preprocessor
from .protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, ModelCard, ModelList
from .serving_chat import ChatServing
from .serving_completions import CompletionServing
from .serving_tokenize import TokenizeServing
from .template_sandbox import TemplateSandbox

logger = logging.getLogger("draftwise")


def build_app(engine: AsyncEngine, served_model_names: list[str], tokenizer, options: ServerOptions | None = None,
              metrics: ServerMetrics | None = None) -> FastAPI:
    options = options or ServerOptions()
    spec_metrics = options.per_request_spec_decode_metrics
    if spec_metrics != "none" and engine.engine.config.speculative is None:
        raise ValueError(f"--per-request-spec-decode-metrics={spec_metrics} needs speculative decoding: "
                         "set --speculative-config")
    sandbox = TemplateSandbox(timeout=options.chat_template_timeout) if options.trust_request_chat_template else None
    preprocess = Preprocessor(tokenizer, engine.engine.max_model_len, sandbox)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        yield
        engine.stop()
        preprocess.close()

    app = FastAPI(title="draftwise", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None if options.disable_fastapi_docs or options.api_key else "/openapi.json")
    app.add_middleware(RequestGuard, max_request_body_bytes=options.max_request_body_bytes,
                       body_read_timeout=options.body_read_timeout, send_timeout=options.send_timeout,
                       api_key=options.api_key)
    _add_error_handlers(app)
    key_check = Depends(_api_key_check(options.api_key))
    if not options.disable_fastapi_docs:
        _add_docs(app, key_check)
    _add_open_routes(app, engine, metrics)
    completions = CompletionServing(engine, served_model_names, tokenizer, preprocess, spec_metrics)
    completions.max_prompts = options.max_prompts
    chat = ChatServing(engine, served_model_names, tokenizer, preprocess, spec_metrics)
    app.include_router(_v1_routes(completions, chat, key_check))
    app.include_router(_tokenize_routes(TokenizeServing(engine, served_model_names, tokenizer, preprocess)))
    return app


def _add_open_routes(app: FastAPI, engine: AsyncEngine, metrics: ServerMetrics | None) -> None:
    """The routes that need no API key."""
    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=503 if engine.dead is not None else 200)

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/metrics")
    async def prometheus() -> Response:
        body = await metrics.render() if metrics else b""
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


def _v1_routes(completions: CompletionServing, chat: ChatServing, key_check) -> APIRouter:
    v1 = APIRouter(prefix="/v1", dependencies=[key_check])
    served_model_names, max_model_len = completions.served_model_names, completions.engine.engine.max_model_len

    @v1.get("/models")
    async def models() -> ModelList:  # root: the served name, never a path on this server
        return ModelList(data=[ModelCard(id=name, root=name, max_model_len=max_model_len)
                               for name in served_model_names])

    @v1.post("/completions")
    async def create_completion(body: CompletionRequest, raw: Request):
        return _respond(await completions.create(body, raw.is_disconnected))

    @v1.post("/chat/completions")
    async def create_chat_completion(body: ChatCompletionRequest, raw: Request):
        return _respond(await chat.create(body, raw.is_disconnected))

    return v1


def _tokenize_routes(tokens: TokenizeServing) -> APIRouter:
    """vLLM's ``/tokenize`` and ``/detokenize``: no ``/v1`` prefix and, as in vLLM (whose key guards
    ``/v1`` only), open without the API key, so ``vllm bench serve`` aligns its tokenizer with ours."""
    router = APIRouter()

    @router.post("/tokenize")
    async def tokenize(body: dict[str, Any] = Body()):  # vLLM's completion or chat form, told by "messages"
        return _respond(await tokens.tokenize(body))

    @router.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        return _respond(await tokens.detokenize(body))

    return router


def _respond(result):
    if result is None:  # the client disconnected; its requests were aborted
        return Response(status_code=499)
    if hasattr(result, "model_dump"):
        return JSONResponse(result.model_dump())
    return StreamingResponse(result, media_type="text/event-stream")


def _api_key_check(api_key: str | None):
    """A dependency: 401 unless ``Authorization: Bearer KEY`` (``guards.authorized``; ``RequestGuard``
    already answers such requests before their body, this keeps every keyed route guarded by itself)."""
    expected = api_key.encode() if api_key is not None else None

    async def check(request: Request) -> None:
        if not authorized(request.scope["headers"], expected):
            raise APIError(401, KEY_MESSAGE, code="invalid_api_key")

    return check


def _add_docs(app: FastAPI, key_check) -> None:
    """``/docs`` and ``/redoc`` (and ``/openapi.json`` behind the key when there is one)."""
    openapi_url = "/openapi.json"
    if app.openapi_url is None:
        @app.get(openapi_url, include_in_schema=False, dependencies=[key_check])
        async def openapi() -> JSONResponse:
            return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=[key_check])
    async def docs():
        return get_swagger_ui_html(openapi_url=openapi_url, title="draftwise API")

    @app.get("/redoc", include_in_schema=False, dependencies=[key_check])
    async def redoc():
        return get_redoc_html(openapi_url=openapi_url, title="draftwise API")


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            return error_response(400, f"malformed JSON body: {first.get('ctx', {}).get('error', first.get('msg'))}")
        loc = [str(part) for part in first.get("loc", ()) if part != "body"]
        param = ".".join(loc) or None
        message = f"{param}: {first.get('msg', 'invalid value')}" if param else first.get("msg", "invalid request")
        return error_response(400, message, param=param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail),
                              type="invalid_request_error" if exc.status_code < 500 else "server_error")

    @app.exception_handler(RequestFailed)
    async def request_failed(request: Request, exc: RequestFailed) -> JSONResponse:
        return error_response(500, str(exc), type="server_error")

    @app.exception_handler(EngineDeadError)
    async def engine_dead(request: Request, exc: EngineDeadError) -> JSONResponse:  # the log has what died
        return error_response(500, "the engine died (a worker or replica process is gone): the server is "
                              "shutting down", type="server_error")

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        error_id = uuid.uuid4().hex[:12]
        logger.exception("draftwise: request %s %s failed (error id %s)", request.method, request.url.path, error_id)
        return error_response(500, f"internal error (error id {error_id}); the server log has the details",
                              type="server_error")
