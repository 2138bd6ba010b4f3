"""What the engine reads from the model's config: its context length (``max_model_len``
resolved against ``max_position_embeddings``), its EOS token ids, and the step's token budget
(``max_num_batched_tokens``) when the user leaves it unset.

On a CPU the budget is ``CPU_PREFILL_CHUNK`` tokens: the linears reach their throughput at a few
hundred rows, while a step's activations grow with every row (a long prompt in one chunk costs
hundreds of MB of transient memory at 1B-8B shapes, and holds decoding sequences back as long). On
a GPU, larger chunks keep the device busy: up to 8,192 tokens, as vLLM's offline default.
"""
from __future__ import annotations

from ..config import EngineConfig


def resolve_max_model_len(config: EngineConfig, hf_config) -> int:
    limit = getattr(hf_config, "max_position_embeddings", None) or 2048
    if config.max_model_len is None:
        return limit
    if config.max_model_len > limit:
        raise ValueError(f"max_model_len={config.max_model_len} exceeds the model's "
                         f"max_position_embeddings={limit}")
    return config.max_model_len


CPU_PREFILL_CHUNK = 1024


def default_max_num_batched_tokens(max_model_len: int, device: str) -> int:
    """The step's token budget when ``max_num_batched_tokens`` is unset (prefill is chunked to it)."""
    if device == "cpu":
        return CPU_PREFILL_CHUNK
    return max(2048, min(max_model_len, 8192))


def eos_token_ids(hf_config, tokenizer) -> set[int]:
    ids = getattr(hf_config, "eos_token_id", None)
    ids = set(ids if isinstance(ids, (list, tuple)) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
