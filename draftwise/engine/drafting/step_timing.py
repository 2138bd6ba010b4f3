"""Start-up timings that seed the ``StepCostModel`` (``step_cost.py``): forwards of throw-away
sequences on the loaded target, in the engine's own KV cache, freed after.

* ``measure_step_seconds``: a step's wall time by its number of rows, at a short context;
* ``measure_key_seconds``: the cost of one key read by a sequence's first (decode) row, from
  decode rows at a short and a long context;
* ``measure_further_key_seconds``: the same for the further rows of one sequence (its drafts),
  which read the keys its first row brought into the caches.

The settings of one measurement take turns (after a warm-up round) and each keeps its best time,
so a busy moment of the machine hits them alike and a stall does not count. A measurement the KV
cache cannot hold, or whose two contexts are too close to tell apart, returns nothing (0 or None).
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import torch

from ...paged import ForwardInput

LONG_FORWARD_SECONDS = 0.5  # a timed forward this long is not repeated (_best_of_turns)
KEY_SEQS = 4  # sequences decoding one row each when the key cost is timed
KEY_CONTEXTS = (128, 1024)  # the short and long contexts it is timed at
FURTHER_ROWS = 4  # rows of the sequence whose further rows' key cost is timed


@torch.inference_mode()
def measure_step_seconds(target, block_manager, rows: list[int], context_len: int = 128,
                         repeats: int = 3) -> dict[int, float]:
    """``{num_rows: seconds}``: the best of ``repeats`` timed forwards of a throw-away sequence of
    ``context_len`` cached tokens plus ``num_rows`` new ones, logits over every row. The row
    counts take turns (after a warm-up round), so a busy moment of the machine hits them alike.
    Its blocks are freed after; empty when the KV cache cannot hold it."""
    rows = sorted({r for r in rows if r >= 1})
    if not rows or context_len < 1:
        return {}
    with block_manager.scratch("step-cost", context_len, context_len + rows[-1]) as dummy:
        if dummy is None:
            return {}
        target.forward([ForwardInput(dummy.all_token_ids, 0, dummy.block_ids)])
        return _best_of_turns(lambda r: _time_forward(target, [ForwardInput([0] * r, context_len, dummy.block_ids)]),
                              rows, repeats)


@torch.inference_mode()
def measure_key_seconds(target, block_manager, num_seqs: int = KEY_SEQS, contexts: tuple[int, int] = KEY_CONTEXTS,
                        repeats: int = 3) -> float:
    """Seconds per key a decode row reads: ``num_seqs`` throw-away sequences decode one row each at
    the short and at the long context of ``contexts`` (taking turns, the best of ``repeats`` after
    a warm-up), the difference divided by the extra keys. Their K/V is left as the cache holds it
    (the time does not depend on it). 0 when the cache cannot hold them or the contexts are too
    close to tell apart."""
    short, long = contexts
    if long < 2 * short:
        return 0.0
    with contextlib.ExitStack() as stack:
        seqs = [stack.enter_context(block_manager.scratch(f"key-cost-{i}", long, long + 1)) for i in range(num_seqs)]
        if any(seq is None for seq in seqs):
            return 0.0
        best = _best_of_turns(lambda c: _time_forward(target, [ForwardInput([0], c, seq.block_ids) for seq in seqs]),
                              [short, long], repeats)
    return max(0.0, (best[long] - best[short]) / (num_seqs * (long - short)))


@torch.inference_mode()
def measure_further_key_seconds(target, block_manager, num_rows: int = FURTHER_ROWS,
                                contexts: tuple[int, int] = KEY_CONTEXTS, repeats: int = 3) -> float | None:
    """Seconds per key that each row after the first of one sequence adds (a draft verified at that
    context): one throw-away sequence runs 1 and ``num_rows`` rows at the short and the long
    context of ``contexts`` (taking turns, the best of ``repeats`` after a warm-up); the growth of
    the rows' difference with context, per extra row and key. None when it cannot be told."""
    short, long = contexts
    if long < 2 * short or num_rows < 2:
        return None
    settings = [(1, short), (num_rows, short), (1, long), (num_rows, long)]
    with block_manager.scratch("further-key-cost", long, long + num_rows) as seq:
        if seq is None:
            return None
        best = _best_of_turns(lambda i: _time_forward(target, [ForwardInput([0] * settings[i][0], settings[i][1],
                                                                            seq.block_ids)]),
                              list(range(len(settings))), repeats)
    growth = (best[3] - best[2]) - (best[1] - best[0])
    return max(0.0, growth / ((num_rows - 1) * (long - short)))


def _best_of_turns(time_one: Callable[[int], float], settings: list[int], repeats: int) -> dict[int, float]:
    """``{setting: seconds}``: the best of ``repeats`` rounds in which every setting is timed in
    turn, after a warm-up round, so a busy moment of the machine hits them alike. A setting whose
    warm-up takes ``LONG_FORWARD_SECONDS`` or more keeps that timing and is not run again: beside
    it, warm-up effects and a busy moment are small, and repeating it would cost seconds per start
    (a 256-row forward of an 8B model)."""
    best = {setting: float("inf") for setting in settings}
    for round_ in range(repeats + 1):
        for setting in settings:
            if round_ > 0 and best[setting] >= LONG_FORWARD_SECONDS and best[setting] != float("inf"):
                continue
            seconds = time_one(setting)
            if round_ > 0 or seconds >= LONG_FORWARD_SECONDS:
                best[setting] = min(best[setting], seconds)
    return best


def _time_forward(target, batch: list[ForwardInput]) -> float:
    start = time.perf_counter()
    hidden, _, _ = target.forward(batch)
    target.compute_logits(hidden).max(dim=-1).indices.tolist()
    return time.perf_counter() - start
