"""A prompt as ``add_request`` takes it (text, ``{"prompt": ...}`` or ``{"prompt_token_ids": ...}``)
turned into its text (if any) and token ids; a malformed prompt raises ``ValueError``."""
from __future__ import annotations

from .request_checks import check_prompt_text


def tokenize_prompt(tokenizer, prompt) -> tuple[str | None, list[int]]:
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            ids = prompt["prompt_token_ids"]
            if not isinstance(ids, (list, tuple)) or not all(isinstance(t, int) for t in ids):
                raise ValueError("prompt_token_ids must be a list of ints")
            return prompt.get("prompt"), list(ids)
        if "prompt" in prompt:
            prompt = prompt["prompt"]
        else:
            raise ValueError("a dict prompt needs 'prompt' or 'prompt_token_ids'")
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be a str or a dict, got {type(prompt).__name__}")
    check_prompt_text(prompt)
    return prompt, tokenizer.encode(prompt, add_special_tokens=True)
