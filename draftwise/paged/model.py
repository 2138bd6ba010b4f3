"""``PagedModel``: a decoder-only model bound to its tensor of the KV pool.

``forward(batch, aux_layer_ids)`` runs any ragged batch of ``ForwardInput``
in one pass, writing the new tokens' K/V into the model's paged cache, and
returns the final-norm hidden states ``[num_tokens, hidden]`` (fp32), the
auxiliary hidden states asked for, and ``cu_num_tokens``. The target's model
runner and the ``draft_model`` proposer both run their model this way.

The model runs inside the forward context (metadata + this model's cache);
``run_with`` swaps the callable that runs it (the engine's ``CompiledForward``), and
``run_static_with`` hands uniform decode and verify batches to a ``StaticStep`` (CUDA graphs).
"""
from __future__ import annotations

import torch

from ..layers.forward_context import forward_context
from .batch import ForwardInput, prepare_batch
from .block_table import BlockTable
from .kv_pool import KVCacheSpec


class PagedModel:
    def __init__(self, model, kv_cache: torch.Tensor,  # [num_layers, 2, num_slots, num_kv_heads, head_dim]
                 block_size: int, device: torch.device, block_table: BlockTable | None = None):
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.device = device
        self.block_table = block_table  # the block manager's, where the batch's rows come from
        self.sliding_window = model.sliding_window if model.uses_sliding_window else None
        self.run = model  # (input_ids, positions, aux_layer_ids) -> (hidden, aux); see run_with
        self.static_step = None  # (batch, aux_layer_ids) -> forward's result, or None; see run_static_with

    def run_with(self, run) -> None:
        """Run the model through ``run`` (same signature as the model's forward), e.g. compiled."""
        self.run = run

    def run_static_with(self, static_step) -> None:
        """Run the batches ``static_step`` takes through it (``compilation/static_step.py``)."""
        self.static_step = static_step

    @staticmethod
    def kv_cache_spec(model) -> KVCacheSpec:
        return KVCacheSpec.of_layers(model.layers)

    @torch.inference_mode()
    def forward(self, batch: list[ForwardInput], aux_layer_ids: tuple[int, ...] = ()
                ) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
        """(hidden [num_tokens, H] fp32, aux hidden list, cu_num_tokens [len(batch) + 1])."""
        if self.static_step is not None:
            result = self.static_step.forward(batch, aux_layer_ids)
            if result is not None:
                return result
        ids, pos, meta, cu = prepare_batch(batch, self.block_size, self.sliding_window, self.device,
                                           block_table=self.block_table)
        with forward_context(self.model.attention_metadata(meta), self.kv_cache):
            hidden, aux = self.run(ids, pos, aux_layer_ids)
        return hidden, aux, cu

    def forward_with_logits(self, batch: list[ForwardInput], aux_layer_ids: tuple[int, ...],
                            logit_rows: torch.Tensor | None  # [num_rows] rows of the hidden states to score
                            ) -> tuple[torch.Tensor, list[torch.Tensor], list[int], torch.Tensor | None]:
        """``forward``, then the logits ``[num_rows, vocab]`` of ``logit_rows`` (None: none)."""
        hidden, aux, cu = self.forward(batch, aux_layer_ids)
        logits = None if logit_rows is None else self.compute_logits(hidden[logit_rows])
        return hidden, aux, cu, logits

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [num_rows, H] -> [num_rows, vocab]
        return self.model.compute_logits(hidden)
