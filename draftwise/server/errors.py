"""OpenAI-format errors: ``APIError`` carries status, message, type, param and code.

Handlers raise ``APIError`` (or let the engine's ``ValueError`` through,
which ``from_value_error`` turns into a 400 naming the offending field);
``app`` renders every error as ``{"error": {"message", "type", "param", "code"}}``.
"""
from __future__ import annotations

import re

from fastapi.responses import JSONResponse

from .protocol import ErrorInfo, ErrorResponse

_FIELD = re.compile(r"SamplingParams\.(\w+)=")


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)

    def body(self) -> dict:
        info = ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorResponse(error=info).model_dump()

    @classmethod
    def from_value_error(cls, exc: ValueError, param: str | None = None,
                         aliases: dict[str, str] | None = None) -> "APIError":
        """A 400 for a request the engine or SamplingParams rejected, naming the field when known
        (``aliases``: the request's name for a SamplingParams field, e.g. chat's ``top_logprobs``)."""
        match = _FIELD.search(str(exc))
        if match:
            param = (aliases or {}).get(match.group(1), match.group(1))
        return cls(400, str(exc), param=param)


def error_response(status: int, message: str, type: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None) -> JSONResponse:
    return APIError(status, message, type, param, code).response()
