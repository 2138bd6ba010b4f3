"""The FastAPI application: routes, API-key check, and OpenAI-format errors.

``build_app`` wires an ``AsyncEngine`` to the OpenAI routes. Every error a
client can cause is a JSON ``{"error": {"message", "type", "param", "code"}}``:
malformed JSON and invalid fields are 400, an unknown model 404, a missing or
wrong API key 401 (``/health``, ``/version`` and ``/metrics`` stay open), and
an unexpected failure inside one request 500, which fails that request only.
"""
from __future__ import annotations

import logging
import secrets
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from .async_engine import AsyncEngine
from .errors import APIError, error_response
from .metrics import ServerMetrics
from .protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from .serving_chat import ChatServing
from .serving_completions import CompletionServing

logger = logging.getLogger("draftwise")


def build_app(engine: AsyncEngine, served_model_names: list[str], tokenizer,
              api_key: str | None = None, metrics: ServerMetrics | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        yield
        engine.stop()

    app = FastAPI(title="draftwise", version=__version__, lifespan=lifespan)
    completions = CompletionServing(engine, served_model_names, tokenizer)
    chat = ChatServing(engine, served_model_names, tokenizer)
    _add_error_handlers(app)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/metrics")
    async def prometheus() -> Response:
        body = metrics.render() if metrics else b""
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(_api_key_check(api_key))])

    @v1.get("/models")
    async def models() -> ModelList:
        info = engine.engine
        return ModelList(data=[ModelCard(id=name, root=str(info.config.model_path), max_model_len=info.max_model_len)
                               for name in served_model_names])

    @v1.post("/completions")
    async def create_completion(body: CompletionRequest, raw: Request):
        return _respond(await completions.create(body, raw.is_disconnected))

    @v1.post("/chat/completions")
    async def create_chat_completion(body: ChatCompletionRequest, raw: Request):
        return _respond(await chat.create(body, raw.is_disconnected))

    app.include_router(v1)
    return app


def _respond(result):
    if result is None:  # the client disconnected; its requests were aborted
        return Response(status_code=499)
    if hasattr(result, "model_dump"):
        return JSONResponse(result.model_dump())
    return StreamingResponse(result, media_type="text/event-stream")


def _api_key_check(api_key: str | None):
    async def check(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip(), api_key):
            raise APIError(401, "Incorrect API key provided: pass it as 'Authorization: Bearer KEY'",
                           code="invalid_api_key")

    return check


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

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("draftwise: request %s %s failed", request.method, request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error")
