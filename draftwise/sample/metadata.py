"""Per-row sampling settings for one step (``SamplingMetadata``), including the rows that verify drafts.

A sequence that samples contributes ``num_drafts + 1`` rows: row ``j`` draws
the token at position ``seq.num_tokens + j`` as if drafts ``[0, j)`` were
already part of the output. So penalties count those drafts as output
tokens, min-tokens suppression uses the output length at that row, and the
noise is keyed by that row's position: exactly what plain decoding would do
at that point, which keeps verification lossless and seeds reproducible.

Tree drafts (``parents``): row ``j > 0`` verifies the children of draft ``j - 1``, so it draws
the token at ``seq.num_tokens + depth`` as if the drafts on the path to draft ``j - 1`` were
already part of the output.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sequence import Sequence
from .verify.tree import depths_of, path_nodes


@dataclass
class SamplingMetadata:
    """Per-row sampling settings for one step; each tensor is ``[num_rows]`` unless noted."""
    all_greedy: bool
    greedy: torch.Tensor  # bool
    temperature: torch.Tensor  # float32, 1.0 on greedy rows
    top_k: torch.Tensor | None  # int64, vocab_size where disabled; None if no row uses it
    top_p: torch.Tensor | None  # float32
    min_p: torch.Tensor | None  # float32
    seeds: torch.Tensor  # int64
    positions: torch.Tensor  # int64, position of the token being sampled
    penalties: "Penalties | None" = None
    suppress_rows: torch.Tensor | None = None  # int64 [num_pairs] with suppress_ids: banned (row, id)
    suppress_ids: torch.Tensor | None = None
    max_num_logprobs: int | None = None
    # Structured outputs: rows constrained by a grammar and their token bitmask (set by the model
    # runner): grammar_rows [num_masked] int64, grammar_bitmask [num_masked, ceil(vocab / 32)] int32.
    grammar_rows: torch.Tensor | None = None
    grammar_bitmask: torch.Tensor | None = None


@dataclass
class Penalties:
    presence: torch.Tensor  # [num_rows]
    frequency: torch.Tensor  # [num_rows]
    repetition: torch.Tensor  # [num_rows]
    output_counts: torch.Tensor  # [num_rows, vocab] float32 occurrences in the output
    seen: torch.Tensor  # [num_rows, vocab] bool, token occurs in prompt or output


def build_sampling_metadata(seqs: list[Sequence], drafts: list[list[int]], vocab_size: int,
                            eos_token_ids: list[int], device: torch.device,
                            parents: list[list[int] | None] | None = None) -> SamplingMetadata:
    """Rows are grouped per sequence: ``len(drafts[i]) + 1`` rows for ``seqs[i]``; ``parents[i]``
    (None: a chain) places tree drafts."""
    params = [s.params for s in seqs]
    reps = torch.tensor([len(d) + 1 for d in drafts])
    depths = _row_depths(drafts, parents)  # per sequence, per row: how many drafts precede its token
    offsets = torch.tensor([d for seq_depths in depths for d in seq_depths])  # [num_rows]

    def rows(values, dtype=None) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).repeat_interleave(reps).to(device)

    greedy = [p.greedy for p in params]
    top_k = [min(p.top_k, vocab_size) if p.top_k > 0 else vocab_size for p in params]
    top_p = [p.top_p for p in params]
    min_p = [p.min_p for p in params]
    logprobs = [p.logprobs for p in params if p.logprobs is not None]
    meta = SamplingMetadata(
        all_greedy=all(greedy),
        greedy=rows(greedy),
        temperature=rows([p.temperature or 1.0 for p in params], torch.float32),
        top_k=rows(top_k) if any(k < vocab_size for k in top_k) else None,
        top_p=rows(top_p, torch.float32) if any(p < 1.0 for p in top_p) else None,
        min_p=rows(min_p, torch.float32) if any(m > 0 for m in min_p) else None,
        seeds=rows([s.seed for s in seqs], torch.int64),
        positions=rows([s.num_tokens for s in seqs], torch.int64) + offsets.to(device),
        max_num_logprobs=max(logprobs) if logprobs else None,
    )
    if any(p.has_penalties for p in params):
        meta.penalties = _penalties(seqs, _row_paths(drafts, parents), reps, vocab_size, device)
    _suppress(seqs, depths, meta, eos_token_ids, device)
    return meta


def _row_depths(drafts: list[list[int]], parents: list[list[int] | None] | None) -> list[list[int]]:
    """Per sequence, per row: the number of drafts before that row's token (a chain's row ``j``: ``j``;
    a tree's row ``j``: the depth of draft ``j - 1``)."""
    trees = parents if parents is not None else [None] * len(drafts)
    return [list(range(len(draft) + 1)) if tree is None else [0] + depths_of(tree)
            for draft, tree in zip(drafts, trees)]


def _row_paths(drafts: list[list[int]], parents: list[list[int] | None] | None) -> list[list[list[int]]]:
    """Per sequence, per row: the draft tokens before that row's token (a chain's row ``j``: the first
    ``j`` drafts; a tree's row ``j``: the path to draft ``j - 1``)."""
    out = []
    for i, draft in enumerate(drafts):
        tree = parents[i] if parents is not None else None
        if tree is None:
            out.append([draft[:j] for j in range(len(draft) + 1)])
        else:
            out.append([[]] + [[draft[n] for n in path_nodes(tree, j)] for j in range(len(draft))])
    return out


def _penalties(seqs: list[Sequence], paths: list[list[list[int]]], reps: torch.Tensor, vocab_size: int,
               device: torch.device) -> Penalties:
    outputs = _padded([s.output_token_ids for s in seqs], vocab_size)
    prompts = _padded([s.prompt_token_ids for s in seqs], vocab_size)
    counts = torch.zeros(len(seqs), vocab_size + 1)
    counts.scatter_add_(1, outputs, torch.ones_like(outputs, dtype=torch.float32))
    seen = torch.zeros(len(seqs), vocab_size + 1, dtype=torch.bool)
    seen.scatter_(1, prompts, True)
    counts, seen = counts.repeat_interleave(reps, 0), seen.repeat_interleave(reps, 0)
    # A row also counts the drafts before it (its path) as output tokens.
    draft_rows, draft_ids, row = [], [], 0
    for rows in paths:
        for j, path in enumerate(rows):
            draft_rows += [row + j] * len(path)
            draft_ids += path
        row += len(rows)
    if draft_rows:
        counts.index_put_((torch.tensor(draft_rows), torch.tensor(draft_ids)), torch.tensor(1.0), accumulate=True)
    counts, seen = counts[:, :-1], seen[:, :-1] | (counts[:, :-1] > 0)
    p = [s.params for s in seqs]
    return Penalties(
        presence=torch.tensor([x.presence_penalty for x in p]).repeat_interleave(reps).to(device),
        frequency=torch.tensor([x.frequency_penalty for x in p]).repeat_interleave(reps).to(device),
        repetition=torch.tensor([x.repetition_penalty for x in p]).repeat_interleave(reps).to(device),
        output_counts=counts.to(device), seen=seen.to(device))


def _suppress(seqs: list[Sequence], depths: list[list[int]], meta: SamplingMetadata,
              eos_token_ids: list[int], device: torch.device) -> None:
    """Ban EOS and stop ids on rows that have not reached min_tokens yet."""
    rows, ids, row = [], [], 0
    for seq, seq_depths in zip(seqs, depths):
        banned = list(seq.params.stop_token_ids) + ([] if seq.params.ignore_eos else eos_token_ids)
        for j, depth in enumerate(seq_depths):
            if seq.num_output_tokens + depth < seq.params.min_tokens:
                rows += [row + j] * len(banned)
                ids += banned
        row += len(seq_depths)
    if rows:
        meta.suppress_rows = torch.tensor(rows, dtype=torch.int64, device=device)
        meta.suppress_ids = torch.tensor(ids, dtype=torch.int64, device=device)


def _padded(rows: list[list[int]], pad: int) -> torch.Tensor:  # [num_rows, max_len] int64
    width = max(1, max(len(r) for r in rows))
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.int64)
