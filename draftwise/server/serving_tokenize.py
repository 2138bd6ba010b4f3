"""``POST /tokenize`` and ``POST /detokenize``, as vLLM serves them (no ``/v1`` prefix).

``/tokenize`` takes vLLM's completion form ``{"model", "prompt",
"add_special_tokens"}`` or, when the body has ``messages``, its chat form
``{"model", "messages", "add_generation_prompt", "add_special_tokens",
"chat_template", "chat_template_kwargs", "tools"}``; either may ask for
``return_token_strs``. It answers ``{"count", "max_model_len", "tokens",
"token_strs"}`` with the ids the completion and chat endpoints would build
from the same fields (every token: a prompt longer than ``max_model_len`` is
counted, not refused, as vLLM does). ``/detokenize`` takes ``{"model",
"tokens"}`` and answers ``{"prompt"}``, the ids decoded; an id outside the
vocabulary is a 400 naming ``tokens``. Unknown fields and unimplemented
values are refused as on every route (``compat.vllm.request_fields``), an unknown model
is a 404.
"""
from __future__ import annotations

from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from ..compat.vllm.request_fields import extra_field_error
from .errors import APIError
from .protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
)
from .serving_base import OpenAIServing
from .serving_chat import template_messages
from .tools import template_tools


class TokenizeServing(OpenAIServing):
    async def tokenize(self, body: dict[str, Any]) -> TokenizeResponse:
        form = TokenizeChatRequest if "messages" in body else TokenizeCompletionRequest
        request = _parse(form, body)
        self._check(request)
        if isinstance(request, TokenizeChatRequest):
            rendered = await self.preprocess.render_chat(
                template_messages(request.messages), request.add_generation_prompt,
                request.chat_template_kwargs or {}, request.chat_template,
                add_special_tokens=request.add_special_tokens, cut=False,
                tools=template_tools(request.tools) if request.tools else None)
            ids = rendered["prompt_token_ids"]
        else:
            ids = await self.preprocess.tokenize(request.prompt, "prompt",
                                                 add_special_tokens=request.add_special_tokens, cut=False)
        strings = await self.preprocess.token_strings(ids) if request.return_token_strs else None
        return TokenizeResponse(count=len(ids), max_model_len=self.engine.engine.max_model_len, tokens=ids,
                                token_strs=strings)

    async def detokenize(self, request: DetokenizeRequest) -> DetokenizeResponse:
        self._check(request)
        bound = max(len(self.tokenizer), self.engine.engine.hf_config.vocab_size)
        outside = [t for t in request.tokens if not 0 <= t < bound]
        if outside:
            raise APIError(400, f"token id {outside[0]} is out of vocabulary: tokens must be in [0, {bound})",
                           param="tokens")
        return DetokenizeResponse(prompt=await self.preprocess.detokenize(request.tokens))

    def _check(self, request: BaseModel) -> None:
        self.check_model(request.model)
        unsupported = extra_field_error(request.model_extra)
        if unsupported:
            raise APIError(400, unsupported[1], param=unsupported[0])


def _parse(form: type[BaseModel], body: dict[str, Any]) -> BaseModel:
    """``body`` validated as ``form``; a violation is answered like any request body's (400 naming the field)."""
    try:
        return form.model_validate(body)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None
