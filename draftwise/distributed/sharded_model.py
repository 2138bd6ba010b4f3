"""The driver's side of a tensor-parallel model: every call that needs the other ranks.

``ShardedPagedModel`` is a ``PagedModel`` whose model is the driver's shard
(rank 0). Each of its calls first sends the workers the message that makes
them run the same thing (``worker.py``), then runs the driver's part inside
``executor.guard()``:

* ``forward`` / ``forward_with_logits``: a step's batch, as plain lists (the
  workers build the same metadata from it); with logit rows, one message
  covers the forward and the logits gathered on the driver;
* ``compute_logits(hidden)``: the lm_head on the driver's tensors (prompt logprobs).

``SharedTarget`` is what a drafter sees as the target model under tensor
parallelism: ``embed_tokens`` and ``compute_logits`` send their message and run
together on every rank; everything else (config, spec, attention metadata) is
the driver's shard's.
"""
from __future__ import annotations

import torch

from ..paged import ForwardInput, PagedModel


class ShardedPagedModel(PagedModel):
    def __init__(self, model, kv_cache: torch.Tensor, block_size: int, device: torch.device, block_table,
                 executor, name: str = "target"):
        super().__init__(model, kv_cache, block_size, device, block_table)
        self.executor, self.name = executor, name
        self.shared = SharedTarget(model, executor, name)  # the lm_head on the driver's tensors

    def forward(self, batch: list[ForwardInput], aux_layer_ids: tuple[int, ...] = ()):
        hidden, aux, cu, _ = self.forward_with_logits(batch, aux_layer_ids, None)
        return hidden, aux, cu

    def forward_with_logits(self, batch: list[ForwardInput], aux_layer_ids: tuple[int, ...],
                            logit_rows: torch.Tensor | None):
        plain = [(item.token_ids, item.start, item.block_ids) for item in batch]
        rows = None if logit_rows is None else logit_rows.cpu()
        self.executor.send(("forward", self.name, plain, tuple(aux_layer_ids), rows))
        with self.executor.guard():
            hidden, aux, cu = PagedModel.forward(self, batch, aux_layer_ids)
            logits = None if logit_rows is None else self.model.compute_logits(hidden[logit_rows])
        return hidden, aux, cu, logits

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [num_rows, H] -> [num_rows, vocab]
        return self.shared.compute_logits(hidden)


class SharedTarget:
    """The target model as a drafter on the driver sees it under tensor parallelism."""

    def __init__(self, model, executor, name: str = "target"):
        self._model, self._executor, self._name = model, executor, name

    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:  # [num_tokens] -> [num_tokens, hidden]
        self._executor.send(("embed", self._name, token_ids.cpu()))
        with self._executor.guard():
            return self._model.embed_tokens(token_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [num_rows, H] -> [num_rows, vocab]
        self._executor.send(("logits_of", self._name, hidden.cpu()))
        with self._executor.guard():
            return self._model.compute_logits(hidden)

    def __getattr__(self, name: str):
        return getattr(self._model, name)
