"""``SpecDecodeMetadata``: where a step's drafts and their target rows are, flat (as vLLM's).

The logits of a verify step hold, per sequence that samples, one row per draft
(the target's distribution at that draft's position) and then its bonus row.
Flat fields index the ``num_draft_tokens_total`` drafts of the whole batch in
sequence order; ``cu_num_draft_tokens[i]`` is the end of sequence ``i``'s run.

Example: drafts ``[[7, 8], [], [9]]`` give ``num_draft_tokens = [2, 0, 1]``,
``cu_num_draft_tokens = [2, 2, 3]``, ``draft_token_ids = [7, 8, 9]``,
``target_logits_indices = [0, 1, 4]``, ``bonus_logits_indices = [2, 3, 5]``.

Structured outputs: a sequence whose next draft the grammar forbade (and cut) while the drafts
carry probabilities gives that draft's distribution ``q`` as its row of ``residual_probs``;
its bonus token is then drawn as the cut draft's rejection would have drawn it
(``verify/rejection_sampler.py``).

The rejection sampler works on the padded ``[num_seqs, max_spec_len]`` view
(``draft_index``, ``draft_valid``), derived once here with tensor ops: no loop
over tokens, and draft probabilities are packed with one gather.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .verify.tree import depths_of

PLACEHOLDER_TOKEN_ID = -1  # pads the [num_seqs, max_spec_len + 1] results past each sequence's tokens


@dataclass
class SpecDecodeMetadata:
    draft_token_ids: torch.Tensor  # [num_draft_tokens_total] int64
    num_draft_tokens: list[int]  # [num_seqs]
    cu_num_draft_tokens: torch.Tensor  # [num_seqs] int64, inclusive cumulative sum
    target_logits_indices: torch.Tensor  # [num_draft_tokens_total] logits row verifying each draft
    bonus_logits_indices: torch.Tensor  # [num_seqs] logits row of each sequence's bonus token
    draft_probs: torch.Tensor | None = None  # [num_draft_tokens_total, vocab]; None: all drafts one-hot
    has_probs: torch.Tensor | None = None  # [num_seqs] bool: this sequence's drafts carry probs
    residual_probs: torch.Tensor | None = None  # [num_seqs, vocab] q of the draft the grammar cut, zeros if none
    has_residual: torch.Tensor | None = None  # [num_seqs] bool: a row of residual_probs applies
    # Tree drafts (``verify/tree.py``): padded like ``padded_drafts``; a chain's parents are i - 1.
    draft_parents: torch.Tensor | None = None  # [num_seqs, max_spec_len] int64, -1 for the root's children
    draft_depths: torch.Tensor | None = None  # [num_seqs, max_spec_len] int64, 0 where padded
    # Derived, padded views (filled in __post_init__):
    max_spec_len: int = field(init=False)
    draft_counts: torch.Tensor = field(init=False)  # [num_seqs] int64: num_draft_tokens as a tensor
    draft_index: torch.Tensor = field(init=False)  # [num_seqs, max_spec_len] flat index, 0 where padded
    draft_valid: torch.Tensor = field(init=False)  # [num_seqs, max_spec_len] bool

    def __post_init__(self) -> None:
        device = self.draft_token_ids.device
        self.max_spec_len = max(self.num_draft_tokens, default=0)
        self.draft_counts = torch.tensor(self.num_draft_tokens, dtype=torch.int64, device=device)
        offsets = torch.arange(self.max_spec_len, device=device)
        self.draft_valid = offsets[None, :] < self.draft_counts[:, None]
        first = self.cu_num_draft_tokens - self.draft_counts  # [num_seqs] flat index of each first draft
        self.draft_index = torch.where(self.draft_valid, first[:, None] + offsets[None, :], 0)

    @classmethod
    def from_drafts(cls, drafts: list[list[int]],
                    draft_probs: list[torch.Tensor | None] | None,  # per sequence [>= len(draft), vocab]
                    device: torch.device,
                    residual_probs: list[torch.Tensor | None] | None = None,  # per sequence [vocab] or None
                    parents: list[list[int] | None] | None = None  # per sequence: tree drafts' parents; None: chain
                    ) -> "SpecDecodeMetadata":
        """Logits laid out as the model runner computes them: ``len(drafts[i]) + 1`` rows per sequence."""
        num = torch.tensor([len(d) for d in drafts], dtype=torch.int64)
        cu_drafts = num.cumsum(0)
        rows_end = (num + 1).cumsum(0)  # exclusive end of each sequence's logits rows
        bonus = rows_end - 1
        seq_of_draft = torch.repeat_interleave(torch.arange(len(drafts)), num)  # [num_draft_tokens_total]
        within = torch.arange(int(num.sum())) - (cu_drafts - num)[seq_of_draft]
        target = (rows_end - num - 1)[seq_of_draft] + within
        flat_ids = torch.tensor([t for d in drafts for t in d], dtype=torch.int64)
        probs = has_probs = None
        if draft_probs is not None and any(p is not None for p in draft_probs):
            probs, has_probs = _pack_probs(drafts, draft_probs, device)
        residual = has_residual = None
        if residual_probs is not None and any(q is not None for q in residual_probs):
            vocab = next(q for q in residual_probs if q is not None).shape[-1]
            residual = torch.stack([q.to(device=device, dtype=torch.float32) if q is not None
                                    else torch.zeros(vocab, device=device) for q in residual_probs])
            has_residual = torch.tensor([q is not None for q in residual_probs], device=device)
        tree_parents = tree_depths = None
        if parents is not None and any(p is not None for p in parents):
            tree_parents, tree_depths = _tree_layout(drafts, parents, device)
        return cls(flat_ids.to(device), [len(d) for d in drafts], cu_drafts.to(device), target.to(device),
                   bonus.to(device), probs, has_probs, residual, has_residual, tree_parents, tree_depths)

    def padded_drafts(self) -> torch.Tensor:  # [num_seqs, max_spec_len] int64, PLACEHOLDER where padded
        return torch.where(self.draft_valid, self.draft_token_ids[self.draft_index], PLACEHOLDER_TOKEN_ID)

    def padded_probs(self) -> torch.Tensor | None:  # [num_seqs, max_spec_len, vocab], zeros where padded
        if self.draft_probs is None:
            return None
        return torch.where(self.draft_valid[..., None], self.draft_probs[self.draft_index], 0.0)

    def row_index(self) -> torch.Tensor:
        """[num_seqs, max_spec_len + 1] logits row of (sequence, position): drafts, then the bonus
        row at position ``num_draft_tokens[i]``; 0 past it."""
        positions = torch.arange(self.max_spec_len + 1, device=self.bonus_logits_indices.device)
        num = self.draft_counts[:, None]  # [num_seqs, 1]
        rows = self.target_logits_indices[self.draft_index]  # [num_seqs, max_spec_len]
        rows = torch.cat([rows, torch.zeros_like(num)], dim=1)
        rows = torch.where(positions[None, :] < num, rows, 0)
        return torch.where(positions[None, :] == num, self.bonus_logits_indices[:, None], rows)


def _tree_layout(drafts: list[list[int]], parents: list[list[int] | None],
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(parents, depths), each [num_seqs, max_spec_len] int64: a chain where ``parents[i]`` is None."""
    width = max((len(d) for d in drafts), default=0)
    rows_parents, rows_depths = [], []
    for draft, tree in zip(drafts, parents):
        tree = tree if tree is not None else list(range(-1, len(draft) - 1))
        pad = width - len(draft)
        rows_parents.append(list(tree) + [-1] * pad)
        rows_depths.append(depths_of(tree) + [0] * pad)
    return (torch.tensor(rows_parents, dtype=torch.int64, device=device),
            torch.tensor(rows_depths, dtype=torch.int64, device=device))


def _pack_probs(drafts: list[list[int]], draft_probs: list[torch.Tensor | None],
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """([num_draft_tokens_total, vocab] draft probs, zeros for one-hot sequences; [num_seqs] has_probs)."""
    vocab = next(p for p in draft_probs if p is not None).shape[-1]
    parts = [p[:len(d)] if p is not None else torch.zeros(len(d), vocab, device=device)
             for d, p in zip(drafts, draft_probs)]
    has_probs = torch.tensor([p is not None for p in draft_probs], device=device)
    return torch.cat(parts).to(device=device, dtype=torch.float32), has_probs
