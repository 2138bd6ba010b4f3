"""A decoder's layers on a GPU with the fused Triton kernels (``layers/gpu/``): fewer launches per layer.

``fuses(model)`` says whether they apply: the kernels are enabled on the model's device and dtype
(``layers/gpu.enabled``), the model is whole (no tensor parallelism), its layers are plain pre-norm
blocks (no sandwich or q/k norms), their activation is SiLU and the head dim a power of two.

``run_fused(model, x, positions, aux_layer_ids)`` runs the layers inside the forward context. The
residual add of each block is fused into the next norm, so a layer is: norm, qkv projection, rotary
+ KV write, attention, o projection, add + norm, gate/up projection, SiLU x up, down projection.
A uniform batch of the static step (``meta.static``, what CUDA graphs capture) attends with the
Triton paged kernel; any other batch writes and attends through the forward context's torch path.
It returns what ``DecoderLM.forward`` returns: the final-norm hidden states and the residual stream
entering each layer of ``aux_layer_ids`` (id ``num_layers``: the last layer's output).
"""
from __future__ import annotations

import torch

from ..layers import gpu
from ..layers.common import apply_rope
from ..layers.forward_context import context_attention, get_forward_context


def fuses(model) -> bool:
    layers = list(model.layers)
    if not layers or model.tp is not None:
        return False
    first = layers[0]
    plain = all(layer.q_norm is None and layer.post_attn_norm is None and layer.post_mlp_norm is None
                and layer.act_name in ("silu", "swish") for layer in layers)
    head_dim = first.head_dim
    return plain and head_dim & (head_dim - 1) == 0 and gpu.enabled(model.norm.weight.device, first.compute_dtype)


def run_fused(model, x: torch.Tensor,  # [num_tokens, hidden] fp32 embeddings
              positions: torch.Tensor,  # [num_tokens]
              aux_layer_ids: tuple[int, ...]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    from ..layers.gpu.elementwise import add_rms_norm, silu_mul

    aux, delta = {}, None
    for i, layer in enumerate(model.layers):
        x, h = add_rms_norm(x, delta, layer.input_norm.weight, layer.input_norm.eps, layer.compute_dtype)
        if i in aux_layer_ids:
            aux[i] = x
        attn = _attend(model, layer, layer.qkv_proj(h), positions)
        x, h = add_rms_norm(x, layer.o_proj(attn), layer.pre_mlp_norm.weight, layer.pre_mlp_norm.eps,
                            layer.compute_dtype)
        delta = layer.down_proj(silu_mul(layer.gate_up_proj(h)))
    x, out = add_rms_norm(x, delta, model.norm.weight, model.norm.eps, torch.float32)
    aux[len(model.layers)] = x
    return out, [aux[i] for i in aux_layer_ids]


def _attend(model, layer, qkv: torch.Tensor,  # [num_tokens, (heads + 2 * kv_heads) * head_dim]
            positions: torch.Tensor) -> torch.Tensor:  # [num_tokens, heads * head_dim]
    from ..layers.gpu.elementwise import rope_and_cache
    from ..layers.gpu.static_attention import static_paged_attention

    cos, signed_sin = model.rope[model.layer_types[layer.layer_index]]
    heads, kv_heads, head_dim = layer.num_heads, layer.num_kv_heads, layer.head_dim
    context = get_forward_context()
    meta = context.meta
    if meta.static is None:  # ragged: the torch rotary and the forward context's attention (it writes K/V)
        num_tokens = qkv.shape[0]
        q_size, kv_size, _ = layer.split
        qk = apply_rope(qkv[:, :q_size + kv_size].view(num_tokens, -1, head_dim),
                        cos[positions].unsqueeze(1), signed_sin[positions].unsqueeze(1))
        q, k = qk.split((heads, kv_heads), dim=1)
        v = qkv[:, q_size + kv_size:].view(num_tokens, kv_heads, head_dim)
        return context_attention(q, k, v, layer.layer_index, layer.scale, layer.sliding)
    kv_cache = context.kv_caches[layer.layer_index]
    q = rope_and_cache(qkv, cos, signed_sin, positions, kv_cache, meta.slot_mapping, heads, kv_heads, head_dim)
    window = meta.sliding_window if layer.sliding else None
    return static_paged_attention(q, kv_cache, meta.block_table, meta.static.context_lens, meta.block_size,
                                  layer.scale, window)
