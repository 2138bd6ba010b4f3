"""How many drafts each sequence gets: only as many as pay for their verification.

Verifying a draft adds one row to the target forward. Where extra rows are
nearly free (a GPU, bf16 on AMX) long drafts cost nothing; on an AVX2 CPU in
fp32 each extra row costs several percent of a step, so drafts that will be
rejected make decoding slower than plain. ``DraftLengthPolicy`` picks, per
sequence and step, the length that maximises expected tokens per unit of
time under two estimates:

* ``row_cost``: the cost of one more verify row, as a fraction of a one-row
  decode step, measured once at start-up (``measure_row_cost``).
* ``alpha``: the sequence's chance that a draft token is accepted given the
  ones before it were, a decayed count of its own verified drafts
  (``accepted / tried``) pulled towards a prior of ``PRIOR`` by ``PSEUDO``
  pseudo-trials. Steps in which the policy withheld drafts decay the counts
  slowly, so a sequence whose drafts failed is probed again after a while.

    k* = argmax over k in [0, limit] of (1 + alpha + ... + alpha^k) / (1 + row_cost * k)

The choice only changes speed: verification is lossless whatever the length.
"""
from __future__ import annotations

import time

import torch

from ..sampling_params import SamplingParams
from .model_runner import ForwardInput
from .sequence import Sequence

PRIOR = 0.5  # acceptance assumed before a sequence has verified anything
PSEUDO = 1.0  # weight of the prior, in trials
DECAY = 0.92  # per verified draft: evidence older than ~12 drafts fades
WITHHELD_DECAY = 0.97  # per step without drafts: a failing sequence is probed again after ~40 steps


def best_num_drafts(alpha: float, row_cost: float, limit: int) -> int:
    """The draft length with the most expected tokens per unit of step time."""
    best_k, best_rate = 0, 1.0
    expected, power = 1.0, 1.0
    for k in range(1, limit + 1):
        power *= alpha
        expected += power
        rate = expected / (1.0 + row_cost * k)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k


class DraftLengthPolicy:
    def __init__(self, row_cost: float):
        self.row_cost = max(0.0, row_cost)

    def limit(self, seq: Sequence, max_num_drafts: int) -> int:
        """Cut ``max_num_drafts`` to the length worth verifying for ``seq``."""
        if max_num_drafts <= 0 or self.row_cost == 0.0:
            return max_num_drafts
        k = best_num_drafts(self.alpha(seq), self.row_cost, max_num_drafts)
        if k == 0:  # withheld: let the evidence fade so the sequence is probed again later
            seq.draft_accepted *= WITHHELD_DECAY
            seq.draft_tried *= WITHHELD_DECAY
        return k

    @staticmethod
    def alpha(seq: Sequence) -> float:
        return (seq.draft_accepted + PRIOR * PSEUDO) / (seq.draft_tried + PSEUDO)

    @staticmethod
    def observe(seq: Sequence, num_drafts: int, num_accepted: int) -> None:
        """Record one verified draft: ``num_accepted`` of ``num_drafts`` tokens accepted."""
        tried = num_accepted + (1 if num_accepted < num_drafts else 0)
        seq.draft_accepted = DECAY * seq.draft_accepted + num_accepted
        seq.draft_tried = DECAY * seq.draft_tried + tried


@torch.inference_mode()
def measure_row_cost(runner, block_manager, num_rows: int, context_len: int = 128, repeats: int = 3) -> float:
    """Extra time of each of ``num_rows - 1`` more verify rows, as a fraction of a one-row step.

    Runs a throw-away sequence through the target (its blocks are freed after):
    one prefill, then the best of ``repeats`` timings of a 1-row and of a
    ``num_rows``-row forward with logits, after one warm-up of each.
    """
    if num_rows <= 1 or context_len < 1:
        return 0.0
    dummy = Sequence("row-cost", 0, [0] * context_len, SamplingParams(temperature=0.0), 0, 0.0)
    if not block_manager.ensure(dummy, context_len + num_rows):
        return 0.0
    try:
        runner.forward([ForwardInput(dummy.all_token_ids, 0, dummy.block_ids)])
        times = {}
        for rows in (1, num_rows):
            batch = [ForwardInput([0] * rows, context_len, dummy.block_ids)]
            samples = []
            for _ in range(repeats + 1):
                start = time.perf_counter()
                hidden, _, _ = runner.forward(batch)
                runner.model.compute_logits(hidden).max(dim=-1).indices.tolist()
                samples.append(time.perf_counter() - start)
            times[rows] = min(samples[1:])
    finally:
        block_manager.free(dummy)
    return max(0.0, (times[num_rows] - times[1]) / ((num_rows - 1) * times[1]))

