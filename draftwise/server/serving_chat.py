"""``POST /v1/chat/completions``: the model's chat template, then one engine request.

The prompt is rendered and tokenized as ``LLM.chat`` does (template with
``add_generation_prompt``, no extra special tokens), so greedy output over
HTTP equals the offline API's. Message content may be a string or a list of
text parts. ``logprobs`` / ``top_logprobs`` follow OpenAI's chat format.
A stream starts with a role chunk per choice, sends content deltas, ends each
choice with its ``finish_reason`` and, with ``stream_options.include_usage``,
a last chunk with ``usage`` (and the request's ``spec_decode`` figures, and
vLLM's ``metrics`` when asked for). ``add_special_tokens`` (vLLM's) adds the
tokenizer's special tokens on top of what the template renders.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from ..outputs import CompletionOutput
from .errors import APIError
from .protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    ChoiceLogprobs,
    DeltaMessage,
    TokenLogprob,
    TopLogprob,
)
from .serving_base import OpenAIServing, TextDelta, sse, stream_error


class ChatServing(OpenAIServing):
    param_aliases = {"logprobs": "top_logprobs"}

    async def create(self, request: ChatCompletionRequest, is_disconnected):
        self.check_request(request)
        prompt = await self._render(request)
        max_tokens = request.max_completion_tokens or request.max_tokens
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
        self.check_length(prompt["prompt_token_ids"], max_tokens, "messages")
        params = self.sampling_params(request, max_tokens, logprobs)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        handles = await self.add_requests(request_id, [prompt], params, "messages")
        if request.stream:
            return self._stream(request, request_id, handles, params)
        outputs = await self.final_outputs(handles, is_disconnected)
        if outputs is None:
            return None
        choices = [ChatChoice(index=c.index, message=AssistantMessage(content=c.text),
                              logprobs=_chat_logprobs(c, slice(0, None), logprobs) if request.logprobs else None,
                              finish_reason=c.finish_reason, stop_reason=c.stop_reason)
                   for c in outputs[0].outputs]
        return ChatCompletionResponse(id=request_id, model=self.model_name, choices=choices,
                                      usage=self.usage(outputs), spec_decode=self.spec_info(outputs),
                                      metrics=self.request_metrics(handles, outputs))

    async def _render(self, request: ChatCompletionRequest) -> dict:
        return await self.preprocess.render_chat(template_messages(request.messages), request.add_generation_prompt,
                                                 request.chat_template_kwargs or {}, request.chat_template,
                                                 add_special_tokens=request.add_special_tokens)

    async def _stream(self, request: ChatCompletionRequest, request_id: str, handles,
                      params) -> AsyncIterator[str]:
        created = int(time.time())

        def chunk(choices, **extra) -> str:
            return sse(ChatCompletionChunk(id=request_id, created=created, model=self.model_name,
                                           choices=choices, **extra))

        deltas = [TextDelta(params) for _ in range(request.n)]
        final = None
        try:
            yield chunk([ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=""))
                         for i in range(request.n)])
            async for out in handles[0].outputs():
                final = out if out.finished else None
                for completion in out.outputs:
                    text, tokens = deltas[completion.index].next(completion)
                    if not text and completion.finish_reason is None:
                        continue
                    logprobs = _chat_logprobs(completion, tokens, params.logprobs) if request.logprobs else None
                    yield chunk([ChatChunkChoice(index=completion.index, delta=DeltaMessage(content=text),
                                                 logprobs=logprobs, finish_reason=completion.finish_reason)])
        except Exception as exc:  # the response has started: report in-band, then end the stream
            yield stream_error(request_id, exc)
        else:
            if request.stream_options and request.stream_options.include_usage and final is not None:
                yield chunk([], usage=self.usage([final]), spec_decode=self.spec_info([final]),
                            metrics=self.request_metrics(handles, [final]))
        finally:
            handles[0].abort()
        yield "data: [DONE]\n\n"


def template_messages(messages: list[ChatMessage]) -> list[dict]:
    """The request's messages as the chat template reads them (content parts joined into text)."""
    return [{**m.model_dump(exclude_none=True), "content": _text_content(m.content)} for m in messages]


def _text_content(content) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        if part.get("type") != "text":
            raise APIError(400, f"message content part of type {part.get('type')!r} is not supported "
                           "(text only)", param="messages")
        texts.append(str(part.get("text", "")))
    return "".join(texts)


def _chat_logprobs(completion: CompletionOutput, tokens: slice, num_top: int) -> ChoiceLogprobs:
    content = []
    entries = (completion.logprobs or [])[tokens]
    for token_id, entry in zip(completion.token_ids[tokens], entries):
        sampled = entry[token_id]
        top = sorted(entry.values(), key=lambda lp: lp.rank or 0)[:num_top]
        content.append(TokenLogprob(
            token=sampled.decoded_token or "", logprob=sampled.logprob,
            bytes=list((sampled.decoded_token or "").encode()),
            top_logprobs=[TopLogprob(token=lp.decoded_token or "", logprob=lp.logprob,
                                     bytes=list((lp.decoded_token or "").encode())) for lp in top]))
    return ChoiceLogprobs(content=content)
