"""Training-time test attention (EAGLE-3): one drafter layer unrolled on its own outputs.

A chain drafter at inference runs step 0 over the context (real target features) and
then steps ``1..K-1`` at positions ``p + 1 .. p + K - 1`` on its own outputs, each
attending to the context K/V up to ``p`` and to the chain's own K/V. Training unrolls
the same computation for every anchor ``p`` of a sequence at once: step ``j`` has one
row per index ``p`` (position ``p + j``), and its query attends to

* step 0's keys at indices ``<= p`` (the context, causal), and
* the keys of steps ``1..j`` at index ``p`` only (the chain of anchor ``p``).

``TTTCache`` holds the per-step K/V; ``ttt_attend`` is ``DecoderLayer.attend`` with that
mask instead of the paged KV cache, differentiable, over right-padded batches
(causality keeps real rows from seeing padding).
"""
from __future__ import annotations

import torch

from ..layers.common import apply_rope
from ..models.decoder import DecoderLayer
from ..spec_decode.drafter_modules import RopeCache


class TTTCache:
    def __init__(self):
        self.keys: list[torch.Tensor] = []  # per step [B, heads, T, head_dim] (kv heads repeated)
        self.values: list[torch.Tensor] = []


def ttt_attend(layer: DecoderLayer, h: torch.Tensor,  # [B, T, qkv_in_features] normed attention input
               rope: RopeCache, step: int, cache: TTTCache) -> torch.Tensor:  # [B, T, hidden]
    num_batch, length, _ = h.shape
    q_size, kv_size, _ = layer.split
    qkv = layer.qkv_proj(h)
    q = qkv[..., :q_size].view(num_batch, length, layer.num_heads, layer.head_dim)
    k = qkv[..., q_size:q_size + kv_size].view(num_batch, length, layer.num_kv_heads, layer.head_dim)
    v = qkv[..., q_size + kv_size:].view(num_batch, length, layer.num_kv_heads, layer.head_dim)
    if layer.q_norm is not None:
        q, k = layer.q_norm(q), layer.k_norm(k)
    cos, sin = rope(torch.arange(step, step + length, device=h.device))  # positions p + step
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    group = layer.num_heads // layer.num_kv_heads
    q = q.transpose(1, 2)  # [B, heads, T, head_dim]
    cache.keys.append(k.repeat_interleave(group, dim=2).transpose(1, 2))
    cache.values.append(v.repeat_interleave(group, dim=2).transpose(1, 2))
    context = torch.matmul(q, cache.keys[0].transpose(-1, -2)) * layer.scale  # [B, heads, T, T]
    causal = torch.ones(length, length, dtype=torch.bool, device=h.device).tril()
    context = context.masked_fill(~causal, float("-inf"))
    chain = [(q * k_i).sum(-1, keepdim=True) * layer.scale for k_i in cache.keys[1:]]  # each [B, heads, T, 1]
    probs = torch.softmax(torch.cat([context] + chain, dim=-1), dim=-1)
    out = torch.matmul(probs[..., :length], cache.values[0])
    for i, v_i in enumerate(cache.values[1:]):
        out = out + probs[..., length + i:length + i + 1] * v_i
    out = out.transpose(1, 2).reshape(num_batch, length, layer.num_heads * layer.head_dim)
    h = layer.o_proj(out)
    return layer.post_attn_norm(h) if layer.post_attn_norm is not None else h
