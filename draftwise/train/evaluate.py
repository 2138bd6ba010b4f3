"""Held-out acceptance estimate of a trainable drafter: what greedy chain drafting would accept.

For every anchor ``p`` of a held-out sample whose next ``num_steps + 1`` tokens are answer
tokens, the drafter is unrolled ``num_steps`` steps (exactly its inference computation,
on the true tokens, which equal the drafts as long as the drafts are right). Draft ``j``
is right when its argmax, mapped to a target id, is the token the target produced at
``p + 2 + j``. Two figures per depth K:

* ``acceptance_length``: 1 + the number of leading right drafts among the first K, averaged
  over anchors (every position weighs the same);
* ``chain_acceptance_length``: what an engine measures, drafting from the start of each answer,
  accepting the leading right drafts, and drafting again right after them (tokens emitted per
  draft). Easy stretches take fewer drafts than they have positions, so this one is lower where
  acceptance comes in runs; it is the figure to compare with the engine's mean acceptance length
  (before the draft-length policy and the engine's end-of-sequence effects).
"""
from __future__ import annotations

import torch

from .dataset import Sample, batches, prefetched
from .trainable import TrainableDrafter, shift_left


@torch.no_grad()
def evaluate(model: TrainableDrafter, samples: list[Sample], batch_tokens: int, num_steps: int) -> dict:
    model.eval()
    num_steps = min(num_steps, model.max_steps() or num_steps)
    per_sample = []  # per held-out sample [num_anchors, num_steps] bool, anchors in position order
    device = model.device
    draft_ids = model.vocab.draft_ids.to(device)
    for batch in prefetched(batches(samples, batch_tokens, None), device):
        states, _ = model.unroll(batch, num_steps)
        b, p = (batch.loss_mask & shift_left(batch.loss_mask, num_steps)).nonzero(as_tuple=True)  # anchors
        right = torch.stack([draft_ids[model.logits(j, state[b, p]).argmax(-1)] == batch.token_ids[b, p + 2 + j]
                             for j, state in enumerate(states)], dim=-1).cpu()
        counts = torch.unique_consecutive(b, return_counts=True)[1].tolist()  # anchors per sample (row-major)
        per_sample.extend(right.split(counts))
    model.train()
    runs = torch.cat(per_sample) if per_sample else torch.zeros(0, num_steps, dtype=torch.bool)
    if len(runs) == 0:
        return {"num_anchors": 0}
    leading = runs.int().cumprod(dim=-1)  # [N, num_steps] 1 while every draft so far was right
    depths = range(1, num_steps + 1)
    return {"num_anchors": len(runs),
            "step_accuracy": [round(float(runs[:, j].float().mean()), 4) for j in range(num_steps)],
            "acceptance_length": {str(k): round(1 + float(leading[:, :k].sum(-1).float().mean()), 3) for k in depths},
            "chain_acceptance_length": {str(k): round(_chained(per_sample, k), 3) for k in depths}}


def _chained(per_sample: list[torch.Tensor], k: int) -> float:
    """Tokens per draft when each sample's answer is drafted from its start, K drafts at a time,
    the next draft starting right after the accepted ones and the token that follows them."""
    tokens = drafts = 0
    for right in per_sample:
        accepted = right[:, :k].int().cumprod(dim=-1).sum(-1).tolist()  # [num_anchors] leading right drafts
        i = 0
        while i < len(accepted):
            tokens += accepted[i] + 1
            drafts += 1
            i += accepted[i] + 1
    return tokens / max(drafts, 1)
