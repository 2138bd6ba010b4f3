"""What the completion and chat endpoints share.

``OpenAIServing`` checks the model name and unsupported fields, builds
``SamplingParams`` from a request (with its output constraint:
``constraints.py``), queues engine requests (all or nothing; an engine
error about the constraint names the request field it came from),
and renders usage and per-request speculative figures (draftwise's
``spec_decode``, and vLLM's ``metrics`` when the server is asked for them:
``spec_metrics.py``). ``TextDelta`` turns
the engine's cumulative snapshots into stream deltas: text still able to
become part of a stop string, or ending in an incomplete UTF-8 character, is
held back until the next snapshot decides it.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

from pydantic import BaseModel

from ..outputs import CompletionOutput, RequestOutput
from ..sampling_params import SamplingParams
from .async_engine import AsyncEngine, RequestFailed, RequestHandle
from .constraints import Constraint
from .errors import APIError
from .preprocess import Preprocessor
from .protocol import PerRequestMetrics, PromptTokensDetails, SpecDecodeInfo, UsageInfo, _SamplingRequest
from .spec_metrics import SpecTrace, per_request_metrics

logger = logging.getLogger("draftwise")


class OpenAIServing:
    param_aliases: dict[str, str] = {}  # this endpoint's name for a SamplingParams field

    def __init__(self, engine: AsyncEngine, served_model_names: list[str], tokenizer, preprocess: Preprocessor,
                 spec_metrics: str = "none"):
        self.engine = engine
        self.served_model_names = served_model_names
        self.tokenizer = tokenizer  # the event loop's own copy (short decodes only): the engine thread uses another
        self.preprocess = preprocess  # tokenization and chat templates, off the event loop
        self.spec_metrics = spec_metrics  # --per-request-spec-decode-metrics: none, summary or detailed

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.served_model_names:
            raise APIError(404, f"The model `{model}` does not exist; this server serves "
                           f"{self.served_model_names}", param="model", code="model_not_found")

    def check_request(self, request: _SamplingRequest) -> None:
        self.check_model(request.model)
        unsupported = request.unsupported_field()
        if unsupported:
            raise APIError(400, unsupported[1], param=unsupported[0])
        broken = request.cross_field_error()
        if broken:
            raise APIError(400, broken[1], param=broken[0])

    def check_length(self, prompt_token_ids: list[int], max_tokens: int | None, param: str) -> None:
        """As vLLM's server: the prompt plus ``max_tokens`` must fit in the context (else 400)."""
        limit, num = self.engine.engine.max_model_len, len(prompt_token_ids)
        if num >= limit:  # (the preprocessor cuts a longer prompt at limit + 1 tokens)
            has = f"{num} tokens" if num <= limit else f"more than {limit} tokens"
            raise APIError(400, f"This model's maximum context length is {limit} tokens; the prompt has {has} "
                           "and leaves no room for output", param=param)
        if max_tokens is not None and num + max_tokens > limit:
            raise APIError(400, f"This model's maximum context length is {limit} tokens; you requested "
                           f"{num + max_tokens} ({num} in the prompt, {max_tokens} in the completion)",
                           param="max_tokens")

    @property
    def aliases(self) -> dict[str, str]:
        """The request's name for each SamplingParams field it names differently."""
        return {"extra_args": "vllm_xargs", **self.param_aliases}

    def sampling_params(self, request: _SamplingRequest, max_tokens: int | None, logprobs: int | None,
                        constraint: Constraint | None = None) -> SamplingParams:
        """The request's sampling params; a field it leaves out takes the model's default
        (``generation_config``: ``LLMEngine.sampling_defaults``), as vLLM's server does, else the API's."""
        model_defaults = self.engine.engine.sampling_defaults

        def given(value, default, name: str):
            return model_defaults.get(name, default) if value is None else value

        try:
            return SamplingParams(
                n=request.n, temperature=given(request.temperature, 1.0, "temperature"),
                top_p=given(request.top_p, 1.0, "top_p"), top_k=given(request.top_k, 0, "top_k"),
                min_p=given(request.min_p, 0.0, "min_p"), seed=request.seed,
                max_tokens=max_tokens, min_tokens=request.min_tokens, stop=request.stop or None,
                stop_token_ids=request.stop_token_ids, ignore_eos=request.ignore_eos,
                presence_penalty=given(request.presence_penalty, 0.0, "presence_penalty"),
                frequency_penalty=given(request.frequency_penalty, 0.0, "frequency_penalty"),
                repetition_penalty=given(request.repetition_penalty, 1.0, "repetition_penalty"), logprobs=logprobs,
                skip_special_tokens=request.skip_special_tokens,
                include_stop_str_in_output=request.include_stop_str_in_output,
                structured_outputs=constraint.params if constraint else None, extra_args=request.extra_args())
        except ValueError as exc:
            raise APIError.from_value_error(exc, aliases=self.aliases) from None

    async def add_requests(self, request_id: str, prompts: list, params: SamplingParams, prompt_param: str,
                           constraint: Constraint | None = None) -> list[RequestHandle]:
        """Queue one engine request per prompt; if one is rejected, abort the others (400, naming the
        request field of the constraint when the engine refused that). A request of one sequence gets a
        ``SpecTrace`` when vLLM's per-request spec metrics are asked for."""
        speculative = self.engine.engine.config.speculative
        traced = self.spec_metrics != "none" and speculative is not None and len(prompts) == 1 and params.n == 1
        detailed = self.spec_metrics == "detailed"
        adds = [self.engine.add_request(f"{request_id}-{i}", prompt, params,
                                        SpecTrace(speculative.num_speculative_tokens, detailed) if traced else None)
                for i, prompt in enumerate(prompts)]
        # Every add is posted before any is awaited, so the engine thread takes a batch of prompts in one turn.
        results = await asyncio.gather(*adds, return_exceptions=True)
        handles: list[RequestHandle] = [r for r in results if isinstance(r, RequestHandle)]
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            for handle in handles:
                handle.abort()
            exc = failure
            if isinstance(exc, ValueError):
                if constraint is not None and constraint.error_param(str(exc)):
                    raise APIError(400, str(exc), param=constraint.error_param(str(exc))) from None
                raise APIError.from_value_error(exc, prompt_param, self.aliases) from None
            raise exc
        return handles

    @staticmethod
    async def final_outputs(handles: list[RequestHandle], is_disconnected) -> list[RequestOutput] | None:
        """Wait for every request to finish; None (all aborted) if the client went away."""
        finals: list[RequestOutput | None] = [None] * len(handles)
        try:
            async for i, out in merge_outputs(handles):
                finals[i] = out
                if await is_disconnected():
                    return None
        finally:
            for handle in handles:
                handle.abort()
        return finals

    @staticmethod
    def usage(outputs: list[RequestOutput]) -> UsageInfo:
        prompt = sum(len(o.prompt_token_ids) for o in outputs)
        completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
        cached = PromptTokensDetails(cached_tokens=sum(o.num_cached_tokens for o in outputs))
        return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                         prompt_tokens_details=cached)

    @staticmethod
    def spec_info(outputs: list[RequestOutput]) -> SpecDecodeInfo | None:
        metrics = [o.metrics for o in outputs if o.metrics is not None]
        drafts = sum(m.spec_num_drafts for m in metrics)
        if not drafts:
            return None
        draft_tokens = sum(m.spec_num_draft_tokens for m in metrics)
        accepted = sum(m.spec_num_accepted_tokens for m in metrics)
        return SpecDecodeInfo(num_drafts=drafts, num_draft_tokens=draft_tokens, num_accepted_tokens=accepted,
                              acceptance_rate=accepted / draft_tokens if draft_tokens else 0.0,
                              mean_acceptance_length=1.0 + accepted / drafts)


    @staticmethod
    def request_metrics(handles: list[RequestHandle], outputs: list[RequestOutput]) -> PerRequestMetrics | None:
        """vLLM's per-request ``metrics`` (one traced request only), else None."""
        if len(handles) != 1 or not outputs:
            return None
        return per_request_metrics(handles[0].trace, outputs[0])


def stream_error(request_id: str, exc: Exception) -> str:
    """The in-band error event of a stream that failed after it started (the details go to the log only)."""
    if not isinstance(exc, RequestFailed):
        logger.error("draftwise: stream %s failed: %s: %s", request_id, type(exc).__name__, exc)
    return sse(APIError(500, f"generation failed for request {request_id}; the server log has the details",
                        type="server_error").body())


async def merge_outputs(handles: list[RequestHandle]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Snapshots of several requests as they come: ``(index of the handle, snapshot)``."""
    if len(handles) == 1:
        async for out in handles[0].outputs():
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, handle: RequestHandle) -> None:
        try:
            async for out in handle.outputs():
                queue.put_nowait((i, out))
        except Exception as exc:
            queue.put_nowait((i, exc))
        queue.put_nowait((i, None))

    tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()


class TextDelta:
    """Streaming state of one choice: how much text and how many tokens were sent."""

    def __init__(self, params: SamplingParams):
        self.holdback = max((len(s) for s in params.stop_strings), default=1) - 1
        self.num_chars = 0
        self.num_tokens = 0
        self.text_offset = 0  # completions logprobs: where the next token's text starts

    def next(self, completion: CompletionOutput) -> tuple[str, slice]:
        """New text safe to send, and the slice of new token ids (and logprobs) since the last call."""
        text = completion.text
        end = len(text)
        if completion.finish_reason is None:
            end -= self.holdback
            while end > self.num_chars and text[end - 1] == "\ufffd":
                end -= 1
        delta = text[self.num_chars:end] if end > self.num_chars else ""
        self.num_chars += len(delta)
        tokens = slice(self.num_tokens, len(completion.token_ids))
        self.num_tokens = len(completion.token_ids)
        return delta, tokens


def sse(payload: BaseModel | dict) -> str:
    """One server-sent event carrying ``payload`` as JSON (empty ``usage``/``spec_decode``/``metrics``
    and unset delta fields left out, as OpenAI's and vLLM's chunks do)."""
    data = payload.model_dump() if isinstance(payload, BaseModel) else payload
    for key in ("usage", "spec_decode", "metrics"):
        if key in data and data[key] is None:
            del data[key]
    if "metrics" in data:
        data["metrics"] = _without_nulls(data["metrics"])
    for choice in data.get("choices", ()):
        if "delta" in choice:
            choice["delta"] = _without_nulls(choice["delta"])
    return f"data: {json.dumps(data)}\n\n"


def _without_nulls(value):
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
