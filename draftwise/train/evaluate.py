"""Held-out acceptance estimate of a trainable drafter: what greedy chain drafting would accept.

For every anchor ``p`` of a held-out sample whose next ``num_steps + 1`` tokens are answer
tokens, the drafter is unrolled ``num_steps`` steps (exactly its inference computation,
on the true tokens, which equal the drafts as long as the drafts are right). Draft ``j``
is right when its argmax, mapped to a target id, is the token the target produced at
``p + 2 + j``. Acceptance length at depth K = 1 + the number of leading right drafts
among the first K, averaged over anchors: the mean acceptance length a greedy run with
``num_speculative_tokens = K`` would see (before the draft-length policy and the
engine's end-of-sequence effects).
"""
from __future__ import annotations

import torch

from .dataset import Sample, batches, prefetched
from .trainable import TrainableDrafter, shift_left


@torch.no_grad()
def evaluate(model: TrainableDrafter, samples: list[Sample], batch_tokens: int, num_steps: int) -> dict:
    model.eval()
    num_steps = min(num_steps, model.max_steps() or num_steps)
    right_runs = []  # per anchor [num_steps] bool
    device = model.device
    draft_ids = model.vocab.draft_ids.to(device)
    for batch in prefetched(batches(samples, batch_tokens, None), device):
        states, _ = model.unroll(batch, num_steps)
        b, p = (batch.loss_mask & shift_left(batch.loss_mask, num_steps)).nonzero(as_tuple=True)  # anchors
        right_runs.append(torch.stack([draft_ids[model.logits(j, state[b, p]).argmax(-1)]
                                       == batch.token_ids[b, p + 2 + j] for j, state in enumerate(states)], dim=-1))
    model.train()
    runs = torch.cat(right_runs).cpu() if right_runs else torch.zeros(0, num_steps, dtype=torch.bool)
    if len(runs) == 0:
        return {"num_anchors": 0}
    leading = runs.int().cumprod(dim=-1)  # [N, num_steps] 1 while every draft so far was right
    return {"num_anchors": len(runs),
            "step_accuracy": [round(float(runs[:, j].float().mean()), 4) for j in range(num_steps)],
            "acceptance_length": {str(k): round(1 + float(leading[:, :k].sum(-1).float().mean()), 3)
                                  for k in range(1, num_steps + 1)}}
