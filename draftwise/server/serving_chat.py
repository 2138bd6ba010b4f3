"""``POST /v1/chat/completions``: the model's chat template, then one engine request.

The prompt is rendered and tokenized as ``LLM.chat`` does (template with
``add_generation_prompt``, no extra special tokens), so greedy output over
HTTP equals the offline API's. Message content may be a string or a list of
text parts. ``logprobs`` / ``top_logprobs`` follow OpenAI's chat format.
Tools (``tools.py``): with ``tool_choice`` ``"required"`` or a named function
the output is constrained to the call's JSON and returned as
``message.tool_calls`` (``content`` ""; ``tool_calls.py``); ``"none"`` gives
text; ``"auto"`` (templates that write Hermes ``<tool_call>`` blocks) leaves the
output free and reads its blocks back as ``tool_calls`` beside the rest as
``content`` (special tokens kept in the text, as vLLM's ``hermes`` parser asks);
every choice renders the tools into the chat template.
``response_format`` / ``structured_outputs`` constrain the text
(``constraints.py``). A stream starts with a role chunk per choice, sends
content deltas (or ``tool_calls`` deltas), ends each choice with its
``finish_reason`` and, with ``stream_options.include_usage``,
a last chunk with ``usage`` (and the request's ``spec_decode`` figures, and
vLLM's ``metrics`` when asked for). ``add_special_tokens`` (vLLM's) adds the
tokenizer's special tokens on top of what the template renders.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from ..outputs import CompletionOutput
from .constraints import resolve as resolve_constraint
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
from .tool_calls import CallStream, ParsedStream, finish_reason, parsed_message, whole_calls
from .tools import ToolPlan, plan_tools, template_takes_tools, template_tool_parser


class ChatServing(OpenAIServing):
    param_aliases = {"logprobs": "top_logprobs"}

    async def create(self, request: ChatCompletionRequest, is_disconnected):
        self.check_request(request)
        tools = plan_tools(request, template_takes_tools(self.tokenizer), template_tool_parser(self.tokenizer))
        if tools is not None and tools.parser is not None:
            request = request.model_copy(update={"skip_special_tokens": False})  # the call tags may be special
        constraint = resolve_constraint(request, tools.source() if tools else None)
        prompt = await self._render(request, tools)
        max_tokens = request.max_completion_tokens or request.max_tokens
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
        self.check_length(prompt["prompt_token_ids"], max_tokens, "messages")
        params = self.sampling_params(request, max_tokens, logprobs, constraint)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        handles = await self.add_requests(request_id, [prompt], params, "messages", constraint)
        calls = tools if tools is not None and (tools.forced or tools.parser is not None) else None
        if request.stream:
            return self._stream(request, request_id, handles, params, calls)
        outputs = await self.final_outputs(handles, is_disconnected)
        if outputs is None:
            return None
        choices = [_choice(c, logprobs, calls) for c in outputs[0].outputs]
        return ChatCompletionResponse(id=request_id, model=self.model_name, choices=choices,
                                      usage=self.usage(outputs), spec_decode=self.spec_info(outputs),
                                      metrics=self.request_metrics(handles, outputs))

    async def _render(self, request: ChatCompletionRequest, tools: ToolPlan | None) -> dict:
        return await self.preprocess.render_chat(template_messages(request.messages), request.add_generation_prompt,
                                                 request.chat_template_kwargs or {}, request.chat_template,
                                                 add_special_tokens=request.add_special_tokens,
                                                 tools=tools.template_tools if tools else None)

    async def _stream(self, request: ChatCompletionRequest, request_id: str, handles, params,
                      tools: ToolPlan | None) -> AsyncIterator[str]:
        created = int(time.time())

        def chunk(choices, **extra) -> str:
            return sse(ChatCompletionChunk(id=request_id, created=created, model=self.model_name,
                                           choices=choices, **extra))

        streams = [_ChoiceStream(params, tools, request.logprobs) for _ in range(request.n)]
        final = None
        try:
            yield chunk([ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=""))
                         for i in range(request.n)])
            async for out in handles[0].outputs():
                final = out if out.finished else None
                for completion in out.outputs:
                    delta, tokens = streams[completion.index].next(completion)
                    if delta is None:
                        continue
                    logprobs = _chat_logprobs(completion, tokens, params.logprobs) if request.logprobs else None
                    reason = streams[completion.index].finish_reason(completion)
                    yield chunk([ChatChunkChoice(index=completion.index, delta=delta, logprobs=logprobs,
                                                 finish_reason=reason)])
        except Exception as exc:  # the response has started: report in-band, then end the stream
            yield stream_error(request_id, exc)
        else:
            if request.stream_options and request.stream_options.include_usage and final is not None:
                yield chunk([], usage=self.usage([final]), spec_decode=self.spec_info([final]),
                            metrics=self.request_metrics(handles, [final]))
        finally:
            handles[0].abort()
        yield "data: [DONE]\n\n"


class _ChoiceStream:
    """One choice of a stream: its text deltas, or its tool-call deltas when a call is forced, or both
    with ``"auto"`` (then the tokens whose text is not decided yet still send their logprobs, in an
    empty delta)."""

    def __init__(self, params, tools: ToolPlan | None, logprobs: bool):
        self.text = TextDelta(params)
        self.calls = None if tools is None else ParsedStream(tools) if tools.parser else CallStream(tools)
        self.logprobs = logprobs

    def next(self, completion: CompletionOutput) -> tuple[DeltaMessage | None, slice]:
        """The delta to send (None: nothing new before the end) and the slice of new tokens."""
        text, tokens = self.text.next(completion)
        last = completion.finish_reason is not None
        if self.calls is None:
            return (DeltaMessage(content=text) if text or last else None), tokens
        if isinstance(self.calls, ParsedStream):
            text, calls = self.calls.feed(text, last)
        else:
            text, calls = "", self.calls.feed(text)
        more = last or (self.logprobs and tokens.stop > tokens.start)
        if not (text or calls or more):
            return None, tokens
        return DeltaMessage(content=text or None, tool_calls=calls or None), tokens

    def finish_reason(self, completion: CompletionOutput) -> str | None:
        if self.calls is None:
            return completion.finish_reason
        return finish_reason(self.calls.plan, completion.finish_reason, self.calls.called)


def _choice(completion: CompletionOutput, logprobs: int | None, tools: ToolPlan | None) -> ChatChoice:
    """A finished choice: its text, or (a forced call) the calls it wrote, with content "" as vLLM has it, or
    (``"auto"``) the calls read from its text and the rest of the text (None when only calls)."""
    if tools is None:
        message, reason = AssistantMessage(content=completion.text), completion.finish_reason
    elif tools.parser is not None:
        content, calls = parsed_message(tools, completion.text)
        message = AssistantMessage(content=content, tool_calls=calls)
        reason = finish_reason(tools, completion.finish_reason, bool(calls))
    else:
        calls = whole_calls(tools, completion.text)
        message = AssistantMessage(content="", tool_calls=calls)
        reason = finish_reason(tools, completion.finish_reason, bool(calls))
    return ChatChoice(index=completion.index, message=message, finish_reason=reason,
                      logprobs=_chat_logprobs(completion, slice(0, None), logprobs) if logprobs is not None else None,
                      stop_reason=completion.stop_reason)


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
