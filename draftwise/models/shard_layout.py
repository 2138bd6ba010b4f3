"""``ShardLayout``: which slice of a decoder's dimensions one tensor-parallel rank holds.

Megatron-style sharding, by rank ``r`` of ``world_size``:

* attention heads by KV group (a KV head and the query heads that read it), so each
  rank keeps plain grouped-query attention. With at most as many ranks as KV heads the
  groups are split into contiguous runs, the longer first (3 groups over 2 ranks give 2
  and 1: rank 0, which sizes the KV cache, holds the most KV heads); with more ranks,
  each KV head is replicated on ``world / K`` ranks that split its query heads, which
  needs ``world % K == 0`` and ``H % world == 0``. Any other size cannot be split and is a ``ValueError`` naming ``tensor_parallel_size``.
* the MLP's intermediate dimension in contiguous runs (gate/up rows, down columns);
* the vocabulary (embedding rows, lm_head rows) in runs of ``ceil(V / world)`` rows,
  the last one zero-padded, so every rank's logits have the same width and the
  gathered ``[rows, world * padded]`` logits trimmed to ``V`` are in vocabulary order.

``ShardLayout.whole(config)`` is the one-rank layout (everything).
"""
from __future__ import annotations

from dataclasses import dataclass

FIELD = "tensor_parallel_size"


@dataclass(frozen=True)
class ShardLayout:
    rank: int
    world_size: int
    q_heads: tuple[int, int]  # [start, end) of the query heads
    kv_heads: tuple[int, int]  # [start, end) of the KV heads
    intermediate: tuple[int, int]  # [start, end) of the MLP's intermediate dimension
    vocab: tuple[int, int]  # [start, end) of the vocabulary rows
    vocab_rows: int  # rows every rank holds: ceil(vocab / world_size), the last rank's zero-padded

    @classmethod
    def whole(cls, config) -> "ShardLayout":
        vocab = getattr(config, "vocab_size", 0)
        return cls(0, 1, (0, config.num_attention_heads), (0, config.num_key_value_heads),
                   (0, config.intermediate_size), (0, vocab), vocab)

    @classmethod
    def of(cls, config, rank: int, world_size: int) -> "ShardLayout":
        check_divisible(config, world_size)
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        group = heads // kv_heads
        if world_size <= kv_heads:
            kv = (_cut(kv_heads, world_size, rank), _cut(kv_heads, world_size, rank + 1))
            q = (kv[0] * group, kv[1] * group)
        else:  # each KV head replicated on `per_head` ranks, which split its query heads
            per_head = world_size // kv_heads
            kv_head, part = divmod(rank, per_head)
            kv = (kv_head, kv_head + 1)
            width = group // per_head
            q = (kv_head * group + part * width, kv_head * group + (part + 1) * width)
        inter = config.intermediate_size
        rows = -(-config.vocab_size // world_size)
        vocab = (min(rank * rows, config.vocab_size), min((rank + 1) * rows, config.vocab_size))
        return cls(rank, world_size, q, kv, (_cut(inter, world_size, rank), _cut(inter, world_size, rank + 1)),
                   vocab, rows)

    @property
    def num_heads(self) -> int:
        return self.q_heads[1] - self.q_heads[0]

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads[1] - self.kv_heads[0]

    @property
    def num_intermediate(self) -> int:
        return self.intermediate[1] - self.intermediate[0]


def check_divisible(config, world_size: int, field: str = FIELD) -> None:
    """``ValueError`` naming ``field`` when ``world_size`` ranks cannot split this model."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if world_size <= kv_heads:
        pass
    elif world_size % kv_heads or heads % world_size:
        raise ValueError(f"{field}={world_size} cannot split this model: it has {heads} attention heads in "
                         f"{kv_heads} KV groups; use at most {kv_heads} ranks, or a multiple of {kv_heads} that "
                         f"divides {heads}")
    if config.intermediate_size < world_size or config.vocab_size < world_size:
        raise ValueError(f"{field}={world_size} is more ranks than the model's MLP width "
                         f"({config.intermediate_size}) or vocabulary ({config.vocab_size}) can be split over")


def _cut(n: int, world_size: int, rank: int) -> int:
    """Start of rank ``rank``'s run when ``n`` items are split into ``world_size`` contiguous runs, the
    longer runs first: rank 0 (the driver, which sizes the KV cache for every rank) holds the most."""
    return n - n * (world_size - rank) // world_size
