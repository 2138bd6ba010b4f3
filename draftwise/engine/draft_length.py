"""How many drafts each sequence gets: only as many as pay for their verification.

Verifying drafts adds rows to the target forward. Where extra rows are nearly
free (a GPU, bf16 on AMX) long drafts cost nothing; on an AVX2 CPU in fp32
the second row alone costs ~40% of a step (the one-row matrix-vector kernel
gives way to a matrix-matrix one) and each further row a few percent more,
so drafts that will be rejected make decoding slower than plain.
``DraftLengthPolicy`` picks, per sequence and step, the length that
maximises expected tokens per unit of time under two estimates:

* ``step_costs[k]``: the time of a step verifying ``k`` drafts relative to a
  plain one-row step (``step_costs[0] == 1``), measured once at start-up for
  1 and K drafts and interpolated linearly between (``measure_step_costs``).
* ``alpha``: the sequence's chance that a draft token is accepted given the
  ones before it were, a decayed count of its own verified drafts
  (``accepted / tried``) pulled towards a prior of ``PRIOR`` by ``PSEUDO``
  pseudo-trials. Steps in which the policy withheld drafts decay the counts
  slowly, so a sequence whose drafts failed is probed again after a while.

    k* = argmax over k in [0, limit] of (1 + alpha + ... + alpha^k) / step_costs[k]

The choice only changes speed: verification is lossless whatever the length.
"""
from __future__ import annotations

import operator
import time
from itertools import accumulate

import torch

from ..paged import ForwardInput
from ..sequence import Sequence

PRIOR = 0.5  # acceptance assumed before a sequence has verified anything
PSEUDO = 1.0  # weight of the prior, in trials
DECAY = 0.92  # per verified draft: evidence older than ~12 drafts fades
WITHHELD_DECAY = 0.97  # per step without drafts: a failing sequence is probed again after ~40 steps


def best_num_drafts(alpha: float, step_costs: list[float], limit: int) -> int:
    """The draft length with the most expected tokens per unit of step time, when each draft
    is accepted with probability ``alpha`` given the ones before it were."""
    num = min(limit, len(step_costs) - 1)
    return best_prefix(list(accumulate([alpha] * num, operator.mul)), step_costs)


def best_prefix(confidence: list[float], step_costs: list[float]) -> int:
    """The draft length with the most expected tokens per unit of step time, given the
    estimate ``confidence[i]`` that the first i + 1 drafts are all accepted."""
    best_k, best_rate, expected = 0, 1.0, 1.0
    for k, prob in enumerate(confidence[:len(step_costs) - 1], start=1):
        expected += prob
        rate = expected / step_costs[k]
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k


def linear_step_costs(row_cost: float, max_num_drafts: int) -> list[float]:
    """Step costs when every verify row adds ``row_cost`` of a one-row step."""
    return [1.0 + row_cost * k for k in range(max_num_drafts + 1)]


class DraftLengthPolicy:
    def __init__(self, step_costs: list[float]):
        self.step_costs = step_costs  # [K + 1]; step_costs[0] == 1
        self.free = all(c <= 1.0 for c in step_costs)

    def cut(self, num_drafts: int, confidence: list[float]) -> int:
        """Cut a proposed draft to the prefix worth verifying by the proposer's own confidence."""
        if self.free or num_drafts == 0:
            return num_drafts
        return min(num_drafts, best_prefix(confidence, self.step_costs))

    def limit(self, seq: Sequence, max_num_drafts: int) -> int:
        """Cut ``max_num_drafts`` to the length worth verifying for ``seq``."""
        if max_num_drafts <= 0 or self.free:
            return max_num_drafts
        k = best_num_drafts(self.alpha(seq), self.step_costs, max_num_drafts)
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
def measure_step_costs(target, block_manager, max_num_drafts: int, context_len: int = 128,
                       repeats: int = 3) -> list[float]:
    """``step_costs`` for 0..``max_num_drafts`` drafts, timed on this machine.

    Runs a throw-away sequence through the target (its blocks are freed after):
    one prefill, then the best of ``repeats`` timings (after a warm-up) of a
    forward with logits over 1, 2 and ``max_num_drafts + 1`` rows.
    """
    if max_num_drafts < 1 or context_len < 1:
        return [1.0] * (max_num_drafts + 1)
    with block_manager.scratch("step-cost", context_len, context_len + max_num_drafts + 1) as dummy:
        if dummy is None:
            return [1.0] * (max_num_drafts + 1)
        target.forward([ForwardInput(dummy.all_token_ids, 0, dummy.block_ids)])
        times = {rows: _best_time(target, dummy, context_len, rows, repeats)
                 for rows in sorted({1, 2, max_num_drafts + 1})}
    first, last = times[2] / times[1], times[max_num_drafts + 1] / times[1]
    span = max(1, max_num_drafts - 1)
    return [1.0] + [first + (last - first) * (k - 1) / span for k in range(1, max_num_drafts + 1)]


def _best_time(target, dummy: Sequence, context_len: int, rows: int, repeats: int) -> float:
    batch = [ForwardInput([0] * rows, context_len, dummy.block_ids)]
    samples = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        hidden, _, _ = target.forward(batch)
        target.compute_logits(hidden).max(dim=-1).indices.tolist()
        samples.append(time.perf_counter() - start)
    return min(samples[1:])
