"""Prompt preparation off the event loop: tokenization and chat templates in worker threads.

Tokenizing a prompt of a few MB takes seconds; on the event loop it froze
every connection, ``/health`` included. ``Preprocessor`` runs that work on
a small thread pool (each thread with its own tokenizer copy: a fast
tokenizer is not meant to be shared across threads); the event loop only
awaits it. Text is checked for encodability first (a lone surrogate is a
400 naming the field, not a tokenizer crash). Token ids of a prompt to
generate from are cut at ``max_prompt_tokens`` (the context length: a longer
prompt is refused anyway, and turning a million ids into a Python list holds
the GIL for tens of milliseconds); ids under the cut are exactly the uncut
ones. ``/tokenize`` asks for them uncut (``cut=False``: vLLM counts every
token; the request body limit bounds them), and ``detokenize`` /
``token_strings`` decode ids in the pool too.

Chat templates: the model's own template is rendered in the pool like
tokenization. A request's ``chat_template`` (vLLM's field, also inside
``chat_template_kwargs``) is refused unless the server trusts request
templates; then it is rendered in ``TemplateSandbox`` (a worker process
with time, memory and output bounds). ``chat_template_kwargs`` may not
override ``apply_chat_template``'s own arguments (``tokenize``,
``return_dict``, ...).
"""
from __future__ import annotations

import asyncio
import copy
import inspect
import json
import threading
from concurrent.futures import ThreadPoolExecutor

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from ..engine.request_checks import check_prompt_text
from .errors import APIError
from .template_sandbox import TemplateSandbox

NUM_THREADS = 2
_RESERVED_KWARGS = frozenset(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters) - {
    "self", "kwargs"}


class Preprocessor:
    def __init__(self, tokenizer, max_prompt_tokens: int, sandbox: TemplateSandbox | None = None,
                 num_threads: int = NUM_THREADS):
        self._tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix="draftwise-preprocess")
        self.sandbox = sandbox  # None: request chat templates are refused
        started = threading.Barrier(num_threads)  # each thread copies its tokenizer now, not in a request
        for _ in range(num_threads):
            self._pool.submit(lambda: (started.wait(), self._thread_tokenizer()))

    async def tokenize(self, text: str, param: str, add_special_tokens: bool = True, cut: bool = True) -> list[int]:
        """``text`` tokenized as the engine does for a string prompt (by default: special tokens added)."""
        check_text(text, param)
        return await self._run(lambda tok: self._encode(tok, text, add_special_tokens, cut))

    async def detokenize(self, token_ids: list[int]) -> str:
        return await self._run(lambda tok: tok.decode(token_ids))

    async def token_strings(self, token_ids: list[int]) -> list[str]:
        return await self._run(lambda tok: tok.convert_ids_to_tokens(token_ids))

    def _encode(self, tok, text: str, add_special_tokens: bool, cut: bool = True) -> list[int]:
        """Token ids of ``text``; with ``cut``, a text longer than ``max_prompt_tokens`` tokens is cut one past it."""
        if not cut:
            return tok(text, add_special_tokens=add_special_tokens)["input_ids"]
        return tok(text, add_special_tokens=add_special_tokens, truncation=True,
                   max_length=self.max_prompt_tokens + 1)["input_ids"]

    async def render_chat(self, messages: list[dict], add_generation_prompt: bool, template_kwargs: dict,
                          chat_template: str | None, add_special_tokens: bool = False, cut: bool = True,
                          tools: list[dict] | None = None) -> dict:
        """The chat prompt as ``LLM.chat`` builds it (by default): ``{"prompt", "prompt_token_ids"}``;
        ``tools`` (chat's, as sent) go to the template's ``tools``."""
        template_kwargs = dict(template_kwargs)
        if "chat_template" in template_kwargs:
            chat_template = template_kwargs.pop("chat_template")
            param = "chat_template_kwargs.chat_template"
        else:
            param = "chat_template"
        reserved = sorted(set(template_kwargs) & _RESERVED_KWARGS)
        if reserved:
            raise APIError(400, f"chat_template_kwargs may not set {reserved}", param="chat_template_kwargs")
        for i, message in enumerate(messages):
            check_text(json.dumps(message, ensure_ascii=False, default=str), f"messages[{i}]")
        check_text(json.dumps(template_kwargs, ensure_ascii=False, default=str), "chat_template_kwargs")
        if tools:
            check_text(json.dumps(tools, ensure_ascii=False, default=str), "tools")
            template_kwargs["tools"] = tools  # (a reserved name: chat_template_kwargs cannot set it)
        if chat_template is not None:
            if self.sandbox is None:
                raise APIError(400, "a request-supplied chat template is refused: this server does not trust "
                               "request chat templates (start it with --trust-request-chat-template)", param=param)
            if not isinstance(chat_template, str):
                raise APIError(400, "chat_template must be a string", param=param)
            check_text(chat_template, param)

            def render(tok) -> str:
                return self._render_untrusted(tok, chat_template, param, messages, add_generation_prompt,
                                              template_kwargs)
        else:
            def render(tok) -> str:
                return self._render_own(tok, messages, add_generation_prompt, template_kwargs)

        def work(tok) -> dict:
            text = render(tok)
            return {"prompt": text, "prompt_token_ids": self._encode(tok, text, add_special_tokens, cut)}

        return await self._run(work)

    def _render_untrusted(self, tok, template: str, param: str, messages: list[dict], add_generation_prompt: bool,
                          template_kwargs: dict) -> str:
        kwargs = {**tok.special_tokens_map, **template_kwargs, "add_generation_prompt": add_generation_prompt}
        try:
            return self.sandbox.render(template, messages, kwargs)
        except ValueError as exc:
            raise APIError(400, str(exc), param=param) from None

    def _render_own(self, tok, messages: list[dict], add_generation_prompt: bool, template_kwargs: dict) -> str:
        try:
            return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                           **template_kwargs)
        except (TemplateError, ValueError, TypeError) as exc:
            raise APIError(400, f"cannot apply the chat template: {exc}", param="messages") from None

    async def _run(self, work):
        return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: work(self._thread_tokenizer()))

    def _thread_tokenizer(self):
        tok = getattr(self._local, "tokenizer", None)
        if tok is None:
            tok = self._local.tokenizer = copy.deepcopy(self._tokenizer)
        return tok

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.sandbox is not None:
            self.sandbox.close()


def check_text(text: str, param: str) -> None:
    """The engine's text check (``check_prompt_text``), answered as a 400 naming ``param``."""
    try:
        check_prompt_text(text, param)
    except ValueError as exc:
        raise APIError(400, str(exc), param=param) from None
