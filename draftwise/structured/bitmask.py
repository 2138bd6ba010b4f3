"""One step's token bitmask: one row per sampled row of the constrained sequences.

``fill_bitmask(executor, entries, num_rows, vocab_size)`` returns an int32 tensor
``[num_rows, ceil(vocab_size / 32)]`` (bit ``t % 32`` of word ``t // 32`` set: token ``t`` is
allowed). Each entry ``(matcher, first_row, drafts)`` owns rows ``first_row .. first_row +
len(drafts)``: row ``first_row + j`` is the grammar's mask after drafts ``[0, j)`` (llguidance
advances a copy of the state over the drafts and rolls it back, all matchers in parallel on
the executor's threads). Every draft must be valid: the call writes one row per draft, and
rows after a draft the grammar refuses keep their initial all-allowed value. Where the grammar
is complete or in error, a row allows only EOS. ``sample.logits.apply_token_bitmask`` applies it.
"""
from __future__ import annotations

import llguidance
import torch


def fill_bitmask(executor: llguidance.LLExecutor,
                 entries: list[tuple[llguidance.LLMatcher, int, list[int]]],
                 num_rows: int, vocab_size: int) -> torch.Tensor:  # [num_rows, ceil(vocab_size / 32)] int32
    for _, first, drafts in entries:  # llguidance writes past the tensor otherwise
        if not 0 <= first or first + len(drafts) >= num_rows:
            raise ValueError(f"rows {first}..{first + len(drafts)} do not fit a {num_rows}-row bitmask")
    import llguidance.torch  # here, not at import: it imports torch's compiler stack

    bitmask = torch.full(llguidance.torch.get_bitmask_shape(num_rows, vocab_size), -1, dtype=torch.int32)
    plain = [(matcher, first) for matcher, first, drafts in entries if not drafts]
    drafted = [entry for entry in entries if entry[2]]  # (llguidance refuses empty drafts here)
    if plain:
        llguidance.torch.fill_next_token_bitmask_par(executor, plain, bitmask)
    if drafted:
        llguidance.torch.fill_next_token_bitmask_par_with_draft_tokens(executor, drafted, bitmask)
    return bitmask

