"""One decoder-only transformer that covers Llama, Mistral, Qwen2, Qwen3 and Gemma3.

The architectures differ only in a handful of switches, gathered in
``ArchSpec`` (see ``models/registry.py``): Gemma's ``(1 + w)`` norms, sandwich
norms and scaled embeddings, Qwen2's qkv bias, per-head q/k norms (Qwen3,
Gemma3), sliding-window layers and logit soft-capping.

``forward`` takes a flat batch of tokens of many requests; the step's
``AttentionMetadata`` and the KV cache come from the forward context
(``layers/forward_context.py``), so the same forward runs eager or compiled.
It returns the final-norm hidden states ``[num_tokens, hidden]`` and, for the
layer ids asked in ``aux_layer_ids`` (in that order),
the residual stream entering those layers, id ``num_layers`` being the last
layer's output before the final norm (what EAGLE-3 and DFlash drafters read).

Tensor parallelism: built with a ``ShardLayout`` and a group (``tp``, a
``distributed.group.TPGroup``), the model is one rank's shard: its layers hold their
share of the heads and of the MLP, o_proj and down_proj sum their partial outputs over
the ranks (one all-reduce each), the embedding is vocab-parallel (each rank looks up its
rows, one all-reduce), and ``compute_logits`` gathers the vocab shards to rank 0 (other
ranks get ``None``). Every rank runs the same forward at once; the residual stream and
the hidden states it returns are whole on every rank.

Precision: weights and matmuls run in the model dtype (bf16 or fp32); the
residual stream and every norm stay in fp32, so bf16 runs drift less from
the fp32 reference than a pure-bf16 stream would.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import native
from ..layers.attention import AttentionMetadata, for_kernel, paged_attention
from ..layers.common import RMSNorm, activation, apply_rope, rope_tables
from ..layers.forward_context import context_attention
from ..layers.gguf_linear import GGUFLinear
from ..layers.linear import PackedLinear, can_pack, pack_linears
from .decoder_stack import run_stack
from .fused_layers import fuses, run_fused
from .shard_layout import ShardLayout


@dataclass(frozen=True)
class ArchSpec:
    norm_offset: float = 0.0  # Gemma: weight is stored as w, applied as 1 + w
    sandwich_norms: bool = False  # Gemma: norms after attention and after the MLP too
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3, Gemma3)
    qkv_bias: bool = False  # Qwen2
    embed_scale: bool = False  # Gemma: embeddings times sqrt(hidden)
    default_act: str = "silu"


class DecoderLayer(nn.Module):
    """Pre-norm attention + MLP block. Drafters reuse it: ``qkv_in_features`` widens the
    attention input (EAGLE-3 attends over [embedding ; hidden], 2 * hidden), and ``attend`` /
    ``feed_forward`` let them build the attention input themselves."""

    def __init__(self, config, spec: ArchSpec, layer_type: str, qkv_in_features: int | None = None,
                 layout: ShardLayout | None = None, tp=None):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        layout = layout or ShardLayout.whole(config)
        self.tp = tp if layout.world_size > 1 else None  # sums o_proj's and down_proj's partial outputs
        self.num_heads = layout.num_heads  # this rank's heads
        self.num_kv_heads = layout.num_kv_heads
        self.head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
        self.sliding = layer_type == "sliding_attention"
        # Gemma scales queries by query_pre_attn_scalar instead of head_dim.
        self.scale = (getattr(config, "query_pre_attn_scalar", None) or self.head_dim) ** -0.5
        bias = bool(getattr(config, "attention_bias", False))
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(qkv_in_features or hidden, q_size + 2 * kv_size, bias=bias or spec.qkv_bias)
        self.o_proj = nn.Linear(q_size, hidden, bias=bias)
        inter, mlp_bias = layout.num_intermediate, bool(getattr(config, "mlp_bias", False))
        self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=mlp_bias)
        self.down_proj = nn.Linear(inter, hidden, bias=mlp_bias)
        act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", spec.default_act)
        self.act, self.act_name = activation(act), act
        off = spec.norm_offset
        self.input_norm = RMSNorm(hidden, eps, off)
        self.pre_mlp_norm = RMSNorm(hidden, eps, off)
        self.post_attn_norm = RMSNorm(hidden, eps, off) if spec.sandwich_norms else None
        self.post_mlp_norm = RMSNorm(hidden, eps, off) if spec.sandwich_norms else None
        self.q_norm = RMSNorm(self.head_dim, eps, off) if spec.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, eps, off) if spec.qk_norm else None
        self.split = (q_size, kv_size, kv_size)
        self.compute_dtype = torch.float32
        self.layer_index = 0  # which KV cache of the forward context it attends with (set by DecoderLM)

    def forward(self, x: torch.Tensor,  # [num_tokens, hidden] fp32 residual stream
                cos: torch.Tensor, sin: torch.Tensor,  # [num_tokens, 1, head_dim]
                kv_cache: torch.Tensor | None,  # [2, num_slots, num_kv_heads, head_dim]; None: the context's
                meta: AttentionMetadata | None) -> torch.Tensor:
        return self.feed_forward(x + self.attend(self.input_norm(x), cos, sin, kv_cache, meta))

    def attend(self, h: torch.Tensor,  # [num_tokens, qkv_in_features] normed attention input
               cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor | None,
               meta: AttentionMetadata | None) -> torch.Tensor:  # [num_tokens, hidden] to add to the residual
        num_tokens = h.shape[0]
        dt = self.compute_dtype
        qkv = self.qkv_proj(h.to(dt))  # [num_tokens, (heads + 2 * kv_heads) * head_dim]
        q_size, kv_size, _ = self.split
        v = qkv[:, q_size + kv_size:].view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is None:  # one rotary pass over the q and k heads together
            qk = apply_rope(qkv[:, :q_size + kv_size].view(num_tokens, -1, self.head_dim), cos, sin)
            q, k = qk.split((self.num_heads, self.num_kv_heads), dim=1)
        else:
            q = self.q_norm(qkv[:, :q_size].view(num_tokens, self.num_heads, self.head_dim)).to(dt)
            k = self.k_norm(qkv[:, q_size:q_size + kv_size].view(num_tokens, self.num_kv_heads,
                                                                 self.head_dim)).to(dt)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kv_cache is None:  # the target model: cache and metadata from the forward context
            attn = context_attention(q, k, v, self.layer_index, self.scale, self.sliding)
        else:  # a drafter's own layer, with its own cache
            attn = paged_attention(q, k, v, kv_cache, meta, self.scale, self.sliding)
        h = self._reduce(self.o_proj(attn))
        return self.post_attn_norm(h) if self.post_attn_norm is not None else h

    def _reduce(self, h: torch.Tensor) -> torch.Tensor:  # [num_tokens, hidden] partial sums under TP
        return self.tp.all_reduce(h) if self.tp is not None else h

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, hidden] fp32 residual
        gate, up = self.gate_up_proj(self.pre_mlp_norm(x).to(self.compute_dtype)).chunk(2, dim=-1)
        h = self._reduce(self.down_proj(self.act(gate) * up))
        if self.post_mlp_norm is not None:
            h = self.post_mlp_norm(h)
        return x + h


class DecoderLM(nn.Module):
    def __init__(self, config, spec: ArchSpec, max_positions: int, layout: ShardLayout | None = None, tp=None):
        super().__init__()
        self.config, self.spec = config, spec
        self.layout = layout or ShardLayout.whole(config)
        self.tp = tp if self.layout.world_size > 1 else None
        num_layers = config.num_hidden_layers
        self.layer_types = list(getattr(config, "layer_types", None) or ["full_attention"] * num_layers)
        if config.model_type in ("mistral", "phi3") and getattr(config, "sliding_window", None):
            self.layer_types = ["sliding_attention"] * num_layers  # one window for every layer
        self.sliding_window = getattr(config, "sliding_window", None)
        if getattr(config, "attn_logit_softcapping", None):
            raise ValueError("attention logit soft-capping (Gemma 2) is not supported")
        _check_rope(config, max_positions)
        self.embed_tokens = (VocabParallelEmbedding(self.layout, config.hidden_size, self.tp) if self.tp
                             else nn.Embedding(config.vocab_size, config.hidden_size,
                                               _weight=_uninitialized(config.vocab_size, config.hidden_size)))
        self.embed_scale = math.sqrt(config.hidden_size) if spec.embed_scale else None
        self.layers = nn.ModuleList(DecoderLayer(config, spec, t, layout=self.layout, tp=self.tp)
                                    for t in self.layer_types)
        for i, layer in enumerate(self.layers):
            layer.layer_index = i
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, spec.norm_offset)
        self.tied = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = None if self.tied else nn.Linear(config.hidden_size, self.embed_tokens.num_embeddings,
                                                        bias=False)
        self.softcap = getattr(config, "final_logit_softcapping", None)
        head_dim = self.layers[0].head_dim
        self.rope_types = sorted(set(self.layer_types))
        self.rope = {t: rope_tables(config, head_dim, t, max_positions) for t in self.rope_types}
        self.requires_grad_(False)
        # Weights one decode step reads: everything but the embedding table, plus the output head.
        embed = self.embed_tokens.weight.numel()
        self.num_streamed_params = sum(p.numel() for p in self.parameters()) - embed \
            + (embed if self.tied else 0)
        self.stack = None  # set where the layers run as one C++ DecoderStack (models/decoder_stack.py)
        self.fused = False  # set where the layers run with the fused Triton kernels (models/fused_layers.py)
        self.kernel_plans: dict[str, dict[int, str]] = {}  # kernel per row bucket, by group (CPU)
        self.set_attention_plan({1: "native"})

    def set_attention_plan(self, plan: dict[int, str]) -> None:
        """Query rows per sequence -> ``paged`` (the C++ kernel), ``native`` or ``fp32`` (SDPA in the
        model's dtype or fp32). One kernel attends every batch, so a row's arithmetic never depends
        on the rows batched with it: the paged kernel where the plan names it and it is built, else
        SDPA in the dtype of the plan's largest SDPA bucket (fp32 if none)."""
        sdpa_buckets = [rows for rows, kernel in plan.items() if kernel != "paged"]
        if len(sdpa_buckets) < len(plan) and native.load():
            self._attention_kernel = "paged"
        else:
            self._attention_kernel = plan[max(sdpa_buckets)] if sdpa_buckets else "fp32"

    @property
    def uses_sliding_window(self) -> bool:
        return "sliding_attention" in self.layer_types and self.sliding_window is not None

    def to_device(self, device: torch.device, dtype: torch.dtype) -> "DecoderLM":
        move_keeping_fp32_norms(self, device, dtype)
        self.rope = {t: (c.to(device, dtype), s.to(device, dtype)) for t, (c, s) in self.rope.items()}
        if can_pack(device, dtype):
            pack_linears(self)
            if self.lm_head is None:  # tied: the embedding table doubles as the output projection
                self.lm_head = PackedLinear(self.embed_tokens.weight.data, None)
        elif self.lm_head is None:
            self.lm_head = _TiedHead(self.embed_tokens)
        self.fused = fuses(self)
        return self

    def attention_metadata(self, meta: AttentionMetadata) -> AttentionMetadata:
        """``meta`` set for the attention kernel this model's plan picks for its query rows."""
        return for_kernel(meta, self._attention_kernel)

    def forward(self, input_ids: torch.Tensor,  # [num_tokens]
                positions: torch.Tensor,  # [num_tokens]
                aux_layer_ids: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Run inside ``forward_context(meta, kv_caches)``; ``meta`` from ``attention_metadata``."""
        x = self.embed_tokens(input_ids)  # [num_tokens, hidden]
        if self.embed_scale is not None:
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        x = x.float()
        if self.fused and not torch.compiler.is_compiling():
            return run_fused(self, x, positions, aux_layer_ids)
        rope = {t: (c[positions].unsqueeze(1), s[positions].unsqueeze(1)) for t, (c, s) in self.rope.items()}
        if self.stack is not None and not torch.compiler.is_compiling():
            x, aux = run_stack(self, x, rope, aux_layer_ids)
            aux[len(self.layers)] = x
            return self.norm(x), [aux[i] for i in aux_layer_ids]
        aux = {}
        for i, layer in enumerate(self.layers):
            if i in aux_layer_ids:
                aux[i] = x
            cos, sin = rope[self.layer_types[i]]
            x = layer(x, cos, sin, None, None)
        aux[len(self.layers)] = x  # id num_layers: the last layer's output, before the final norm
        return self.norm(x), [aux[i] for i in aux_layer_ids]

    def compute_logits(self, hidden: torch.Tensor  # [num_rows, hidden]
                       ) -> torch.Tensor | None:  # [num_rows, vocab]; None on a rank other than 0
        # A head on GGUF blocks quantizes its input to 8 bits anyway: fed fp32, it returns fp32 logits.
        head_dtype = torch.float32 if isinstance(self.lm_head, GGUFLinear) else self.layers[0].compute_dtype
        logits = self.lm_head(hidden.to(head_dtype)).float()
        if self.tp is not None:  # [num_rows, vocab_rows] of this rank -> every rank's, on rank 0
            logits = self.tp.gather_to_driver(logits)
            if logits is None:
                return None
            logits = logits[:, :self.config.vocab_size]
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def _check_rope(config, max_positions: int) -> None:
    """Refuse the rotary embeddings the tables of ``rope_tables`` do not reproduce."""
    params = getattr(config, "rope_parameters", None) or {}
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"partial_rotary_factor={params['partial_rotary_factor']} (rotary embedding on part of "
                         "each head) is not supported; allowed: 1.0")
    original = params.get("original_max_position_embeddings") or getattr(
        config, "original_max_position_embeddings", None)
    if params.get("rope_type") == "longrope" and original and max_positions > original:
        raise ValueError(f"max_model_len={max_positions} is past this model's original context ({original}): "
                         f"its long-context rope factors are not supported; lower max_model_len to {original}")


def move_keeping_fp32_norms(module: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Move ``module`` to ``device`` / ``dtype``; RMSNorm weights stay fp32 and every
    ``DecoderLayer`` computes in ``dtype`` (the residual stream stays fp32)."""
    norms = [(m, m.weight.data) for m in module.modules() if isinstance(m, RMSNorm)]
    module.to(device=device, dtype=dtype)
    for m, weight in norms:
        m.weight.data = weight.to(device)
    for m in module.modules():
        if isinstance(m, DecoderLayer):
            m.compute_dtype = dtype


class _TiedHead(nn.Module):
    """Output projection that reuses the embedding table (tie_word_embeddings)."""

    def __init__(self, embed: nn.Embedding):
        super().__init__()
        self.embed = [embed]  # a list, so the table is not registered twice

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.embed[0].weight)


def _uninitialized(num_rows: int, dim: int) -> torch.Tensor:
    """An embedding table without a random init: it is loaded from the checkpoint (and ``normal_`` on
    the meta device goes through torch's reference ops, whose first use imports the compiler stack)."""
    return torch.empty(num_rows, dim)


class VocabParallelEmbedding(nn.Embedding):
    """One rank's rows of the embedding table (``layout.vocab``, zero-padded to ``vocab_rows``): a
    token outside them looks up zeros, and the all-reduce gives every rank the whole embedding."""

    def __init__(self, layout: ShardLayout, hidden_size: int, tp):
        super().__init__(layout.vocab_rows, hidden_size, _weight=_uninitialized(layout.vocab_rows, hidden_size))
        self.start, self.end = layout.vocab
        self.tp = tp

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [num_tokens] -> [num_tokens, hidden]
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.end - self.start)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(out.masked_fill(outside[:, None], 0))
