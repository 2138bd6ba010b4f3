"""A decoder's layers on GGUF blocks run by one C++ object, with no Python between their ops.

``build_stack(model)`` hands every layer of a ``DecoderLM`` to ``draftwise_cpu.DecoderStack``
(``kernels/csrc/stack/decoder_stack.cpp``): its norm weights and its four projections as the GGUF blocks
they already hold (``GGUFLinear``, or a ``ConcatLinear`` of them), shared, not copied. It applies
where every layer's projections are blocks, the model is whole (no tensor parallelism), its
activation is silu or tanh-gelu and its dtype bf16 or fp32; elsewhere it returns None and the
model keeps its Python layers.

``run_stack(model, x, rope, aux_layer_ids)`` runs the layers inside the forward context. A step
whose every sequence attends with the paged kernel (every causal step where it built) is one C++
call per run of layers between the requested aux layers; any other step (a non-causal drafter
block, a plan on SDPA) runs each layer as two C++ halves around the Python attention of the
forward context. Both paths give a row the same result: the halves and the whole share their
arithmetic, and attention of a paged-kernel row is the same kernel on the same inputs.
"""
from __future__ import annotations

import torch

from ..kernels import native
from ..layers.forward_context import context_attention, get_forward_context
from ..layers.gguf_linear import ConcatLinear, GGUFLinear

POST_ATTENTION_ROWS = 512  # rows whose MLP activations exist at once (a row's result does not depend on it)
ACTIVATIONS = {"silu": 0, "swish": 0, "gelu_pytorch_tanh": 1, "gelu_tanh": 1, "gelu_new": 1}  # the stack's codes
_PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def _parts(module) -> tuple[list[GGUFLinear], torch.Tensor | None] | None:
    """(the GGUF weights side by side, the projection's bias) of a projection on blocks, else None."""
    if isinstance(module, GGUFLinear):
        return [module], module.bias
    if isinstance(module, ConcatLinear) and all(isinstance(p, GGUFLinear) and p.bias is None for p in module.parts):
        return list(module.parts), module.bias
    return None


def _rope_index(model, i: int) -> int:  # which of the model's rope tables layer i uses
    return model.rope_types.index(model.layer_types[i])


def _norm(module) -> torch.Tensor:  # an RMSNorm's fp32 weight, or an empty tensor for none
    return torch.empty(0) if module is None else module.weight.detach().float()


def build_stack(model):
    """A ``DecoderStack`` over ``model``'s layers, or None where it does not apply."""
    layers = list(model.layers)
    if (not native.load() or model.tp is not None or not layers or model.norm.weight.device.type != "cpu"
            or layers[0].compute_dtype not in (torch.float32, torch.bfloat16)):
        return None
    first = layers[0]
    act = ACTIVATIONS.get(getattr(first, "act_name", None))
    projections = [[_parts(getattr(layer, name)) for name in _PROJECTIONS] for layer in layers]
    if act is None or any(p is None for layer in projections for p in layer):
        return None
    stack = torch.classes.draftwise_cpu.DecoderStack(model.config.hidden_size, first.num_heads, first.num_kv_heads,
                                                     first.head_dim, float(first.input_norm.eps), act)
    for i, layer in enumerate(layers):
        norms = [_norm(n) for n in (layer.input_norm, layer.pre_mlp_norm, layer.post_attn_norm, layer.post_mlp_norm,
                                    layer.q_norm, layer.k_norm)]
        parts = [part for weights, _ in projections[i] for part in weights]
        biases = [torch.empty(0) if bias is None else bias.detach().float() for _, bias in projections[i]]
        stack.add_layer(norms, [p.blocks for p in parts], [p.qtype_id for p in parts], [int(p.packed) for p in parts],
                        [len(weights) for weights, _ in projections[i]], biases, float(layer.scale), layer.sliding,
                        _rope_index(model, i))
    return stack


def run_stack(model, x: torch.Tensor,  # [num_tokens, hidden] fp32 residual stream
              rope: dict[str, tuple[torch.Tensor, torch.Tensor]],  # layer type -> cos, sin [num_tokens, 1, head_dim]
              aux_layer_ids: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """The residual stream after every layer and ``{layer id: the stream entering it}`` for the
    ``aux_layer_ids`` below ``len(model.layers)``."""
    context = get_forward_context()
    meta, stack = context.meta, model.stack
    cos = [rope[t][0] for t in model.rope_types]
    sin = [rope[t][1] for t in model.rope_types]
    num_layers = len(model.layers)
    whole = meta.cu_query_lens is not None and x.shape[0] == meta.slot_mapping.numel()
    bounds = sorted({i for i in aux_layer_ids if 0 < i < num_layers} | {num_layers})
    aux, start = {}, 0
    for end in bounds:
        if start in aux_layer_ids:
            aux[start] = x
        if whole:
            x = stack.forward(x, cos, sin, context.kv_caches, meta.slot_mapping, meta.block_table, meta.cu_query_lens,
                              meta.seq_lens, meta.block_size, meta.sliding_window or 0, start, end, meta.tree_mask)
        else:
            x = _layer_by_layer(model, x, cos, sin, context.kv_caches.dtype == torch.bfloat16, start, end)
        start = end
    return x, aux


def _layer_by_layer(model, x: torch.Tensor, cos: list[torch.Tensor], sin: list[torch.Tensor], bf16: bool,
                    start: int, end: int) -> torch.Tensor:
    """Layers [start, end), each as the stack's two halves around the forward context's attention."""
    for i in range(start, end):
        layer = model.layers[i]
        t = _rope_index(model, i)
        q, k, v = model.stack.pre_attention(i, x, cos[t], sin[t], bf16)
        attn = context_attention(q, k, v, i, layer.scale, layer.sliding)
        if x.shape[0] <= POST_ATTENTION_ROWS:
            x = model.stack.post_attention(i, x, attn)
        else:  # a long prefill chunk: the MLP's activations for a slice of rows at a time
            x = torch.cat([model.stack.post_attention(i, x[s:s + POST_ATTENTION_ROWS], attn[s:s + POST_ATTENTION_ROWS])
                           for s in range(0, x.shape[0], POST_ATTENTION_ROWS)])
    return x
