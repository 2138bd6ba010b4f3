"""A decoder's layers on a GPU with the fused Triton kernels (``layers/gpu/``): fewer launches per layer.

``fuses(model)`` says whether they apply: the kernels are enabled on the model's device and dtype
(``layers/gpu.enabled``), the model is whole (no tensor parallelism), its layers are plain pre-norm
blocks (no sandwich or q/k norms), their activation is SiLU and the head dim a power of two.

``run_fused(model, x, positions, aux_layer_ids)`` runs the layers inside the forward context. The
residual add of each block is fused into the next norm, so a layer is: norm, qkv projection, rotary
+ KV write, attention, o projection, add + norm, gate/up projection, SiLU x up, down projection.
A uniform batch of the static step (``meta.static``, what CUDA graphs capture) attends with the
Triton paged kernel; any other batch runs the layer's own ``attend`` (torch rotary, the forward
context's attention).
It returns what ``DecoderLM.forward`` returns: the final-norm hidden states and the residual stream
entering each layer of ``aux_layer_ids`` (id ``num_layers``: the last layer's output).
"""
from __future__ import annotations

import torch

from ..layers import gpu
from ..layers.forward_context import get_forward_context


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
    static = get_forward_context().meta.static is not None
    rows = None if static else {t: (c[positions].unsqueeze(1), s[positions].unsqueeze(1))
                                for t, (c, s) in model.rope.items()}  # ragged: each table's rows, once
    for i, layer in enumerate(model.layers):
        x, h = add_rms_norm(x, delta, layer.input_norm.weight, layer.input_norm.eps, layer.compute_dtype)
        if i in aux_layer_ids:
            aux[i] = x
        kind = model.layer_types[i]
        if static:
            attn = layer.o_proj(_static_attend(layer, layer.qkv_proj(h), *model.rope[kind], positions))
        else:  # ragged: the layer's own torch rotary and the forward context's attention (it writes K/V)
            attn = layer.attend(h, *rows[kind], None, None)
        x, h = add_rms_norm(x, attn, layer.pre_mlp_norm.weight, layer.pre_mlp_norm.eps, layer.compute_dtype)
        delta = layer.down_proj(silu_mul(layer.gate_up_proj(h)))
    x, out = add_rms_norm(x, delta, model.norm.weight, model.norm.eps, torch.float32)
    aux[len(model.layers)] = x
    return out, [aux[i] for i in aux_layer_ids]


def _static_attend(layer, qkv: torch.Tensor,  # [num_tokens, (heads + 2 * kv_heads) * head_dim]
                   cos: torch.Tensor, signed_sin: torch.Tensor,  # [max_positions, head_dim]
                   positions: torch.Tensor) -> torch.Tensor:  # [num_tokens, heads * head_dim]
    """A uniform batch of the static step: rotary + KV write, then the Triton paged attention."""
    from ..layers.gpu.elementwise import rope_and_cache
    from ..layers.gpu.static_attention import static_paged_attention

    context = get_forward_context()
    meta, kv_cache = context.meta, context.kv_caches[layer.layer_index]
    q = rope_and_cache(qkv, cos, signed_sin, positions, kv_cache, meta.slot_mapping, layer.num_heads,
                       layer.num_kv_heads, layer.head_dim)
    window = meta.sliding_window if layer.sliding else None
    return static_paged_attention(q, kv_cache, meta.block_table, meta.static.context_lens, meta.block_size,
                                  layer.scale, window)
