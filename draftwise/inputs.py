"""Prompt shapes for ``LLM.generate`` / ``LLMEngine.add_request``, as ``vllm.inputs`` names them.

Both are plain dicts (``TypedDict``): ``TextPrompt(prompt="...")`` is tokenized by the engine;
``TokensPrompt(prompt_token_ids=[...])`` is used as given (``prompt``, if set, is only echoed back in
``RequestOutput.prompt``). A bare string is the same as a ``TextPrompt``.
"""
from __future__ import annotations

from typing import NotRequired, TypedDict



class TextPrompt(TypedDict):
    prompt: str


class TokensPrompt(TypedDict):
    prompt_token_ids: list[int]
    prompt: NotRequired[str]


PromptType = str | TextPrompt | TokensPrompt
