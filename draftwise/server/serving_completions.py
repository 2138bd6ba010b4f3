"""``POST /v1/completions``: one engine request per prompt, ``n`` choices each.

``prompt`` may be a string, a list of strings, a list of token ids, or a
list of token-id lists; choice ``index`` is ``prompt_index * n + i``. A string
prompt is tokenized by the engine exactly as ``LLM.generate`` does, so greedy
output over HTTP equals the offline API's (``add_special_tokens=false``,
vLLM's field, tokenizes it without the tokenizer's special tokens). ``echo``
prepends the prompt text; ``logprobs=k`` returns the sampled token's logprob
and the top k. vLLM's per-request ``metrics`` come with a one-prompt, ``n=1``
request when the server is asked for them (a stream: on its usage chunk).
``response_format`` and ``structured_outputs`` constrain every choice's text
(``constraints.py``).
"""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from ..outputs import CompletionOutput, RequestOutput
from .constraints import resolve as resolve_constraint
from .errors import APIError
from .protocol import CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse
from .serving_base import OpenAIServing, TextDelta, merge_outputs, sse, stream_error


class CompletionServing(OpenAIServing):
    max_prompts = 2048  # prompts in one request (OpenAI's limit; ServerOptions.max_prompts lowers it)

    async def create(self, request: CompletionRequest, is_disconnected):
        self.check_request(request)
        constraint = resolve_constraint(request)
        raw_prompts = _prompts(request.prompt)
        if len(raw_prompts) > self.max_prompts:  # (n is bounded by the engine's max_n, per prompt)
            raise APIError(400, f"{len(raw_prompts)} prompts are more than the server's --max-prompts="
                           f"{self.max_prompts} per request", param="prompt")
        prompts = [await self._tokenize(p, request.add_special_tokens) for p in raw_prompts]
        for prompt in prompts:
            self.check_length(prompt["prompt_token_ids"], request.max_tokens, "prompt")
        params = self.sampling_params(request, request.max_tokens, request.logprobs, constraint)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        handles = await self.add_requests(request_id, prompts, params, "prompt", constraint)
        if request.stream:
            return self._stream(request, request_id, handles, params)
        outputs = await self.final_outputs(handles, is_disconnected)
        if outputs is None:
            return None
        choices = [self._choice(request, p * request.n + c.index, out, c)
                   for p, out in enumerate(outputs) for c in out.outputs]
        return CompletionResponse(id=request_id, model=self.model_name, choices=choices,
                                  usage=self.usage(outputs), spec_decode=self.spec_info(outputs),
                                  metrics=self.request_metrics(handles, outputs))

    def _choice(self, request: CompletionRequest, index: int, out: RequestOutput,
                completion: CompletionOutput) -> CompletionChoice:
        prefix = self._prompt_text(out) if request.echo else ""
        logprobs = None
        if request.logprobs is not None:
            logprobs = _completion_logprobs(completion, slice(0, None), request.logprobs, len(prefix))
        return CompletionChoice(index=index, text=prefix + completion.text, logprobs=logprobs,
                                finish_reason=completion.finish_reason, stop_reason=completion.stop_reason)

    async def _tokenize(self, prompt, add_special_tokens: bool) -> dict:
        """Engine prompt with token ids; a string is tokenized exactly as the engine would (by default)."""
        if isinstance(prompt, str):
            ids = await self.preprocess.tokenize(prompt, "prompt", add_special_tokens=add_special_tokens)
            return {"prompt": prompt, "prompt_token_ids": ids}
        return {"prompt_token_ids": prompt}

    def _prompt_text(self, out: RequestOutput) -> str:
        return out.prompt if out.prompt is not None else self.tokenizer.decode(out.prompt_token_ids)

    async def _stream(self, request: CompletionRequest, request_id: str, handles, params) -> AsyncIterator[str]:
        created = int(time.time())
        deltas: dict[tuple[int, int], TextDelta] = {}
        finals: dict[int, RequestOutput] = {}
        try:
            async for p, out in merge_outputs(handles):
                if out.finished:
                    finals[p] = out
                for completion in out.outputs:
                    key = (p, completion.index)
                    first = key not in deltas
                    state = deltas.setdefault(key, TextDelta(params))
                    text, tokens = state.next(completion)
                    if first and request.echo:
                        text = self._prompt_text(out) + text
                    if not text and completion.finish_reason is None:
                        continue
                    logprobs = None
                    if request.logprobs is not None:
                        logprobs = _completion_logprobs(completion, tokens, request.logprobs, state.text_offset)
                        state.text_offset += sum(len(t) for t in logprobs.tokens)
                    choice = CompletionChoice(index=p * request.n + completion.index, text=text, logprobs=logprobs,
                                              finish_reason=completion.finish_reason,
                                              stop_reason=completion.stop_reason)
                    yield sse(CompletionResponse(id=request_id, created=created, model=self.model_name,
                                                 choices=[choice]))
        except Exception as exc:  # the response has started: report in-band, then end the stream
            yield stream_error(request_id, exc)
        else:
            outputs = [finals[p] for p in sorted(finals)]
            if request.stream_options and request.stream_options.include_usage:
                yield sse(CompletionResponse(id=request_id, created=created, model=self.model_name, choices=[],
                                             usage=self.usage(outputs), spec_decode=self.spec_info(outputs),
                                             metrics=self.request_metrics(handles, outputs)))
        finally:
            for handle in handles:
                handle.abort()
        yield "data: [DONE]\n\n"


def _prompts(prompt) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise APIError(400, "prompt must not be empty", param="prompt")
    if isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)


def _completion_logprobs(completion: CompletionOutput, tokens: slice, num_top: int,
                         offset: int) -> CompletionLogprobs:
    result = CompletionLogprobs()
    entries = (completion.logprobs or [])[tokens]
    for token_id, entry in zip(completion.token_ids[tokens], entries):
        sampled = entry[token_id]
        result.tokens.append(sampled.decoded_token or "")
        result.token_logprobs.append(sampled.logprob)
        top = sorted(entry.values(), key=lambda lp: lp.rank or 0)[:num_top]
        result.top_logprobs.append({lp.decoded_token or "": lp.logprob for lp in top} if num_top else None)
        result.text_offset.append(offset)
        offset += len(sampled.decoded_token or "")
    return result
