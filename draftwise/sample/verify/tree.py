"""Verification of tree drafts: follow the target's own draw down the tree.

A sequence's drafts form a tree under the root (the token the target emitted last): draft ``i``
has parent ``parents[i]`` (-1: the root), siblings carry distinct tokens, and the logits hold one
row for the root and one per draft, in draft order (row ``i + 1`` is the target's distribution
after the path to draft ``i``). Each row's target token is drawn exactly as plain decoding draws
at that position (greedy argmax, or the sampled draw with plain decoding's per-position noise).

A draft is accepted when its token equals the target token of its parent's row and its parent
was accepted. The accepted drafts then form one path from the root (siblings differ, so at most
one child of an accepted node matches); the emitted tokens are that path's drafts followed by the
target token of the path's last row. Every emitted token is the target's own draw given the
tokens before it, so the output is the target's distribution (greedy: plain decoding's tokens;
seeded sampling: plain decoding's very tokens). A chain is the tree ``parents = [-1, 0, 1, ...]``,
for which this is the standard rule for one-hot drafts.

Batched over sequences; the loops run over tree depth, never over tokens or vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def path_nodes(parents: list[int], node: int) -> list[int]:
    """The drafts from the root's child down to ``node`` (-1: none), in depth order."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def depths_of(parents: list[int]) -> list[int]:
    """Per draft: its depth (1 for the root's children)."""
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


@dataclass
class TreeVerdict:
    num_accepted: torch.Tensor  # [num_seqs] int64: depth of the accepted path
    path: torch.Tensor  # [num_seqs, K] int64 draft index at each depth of the accepted path, -1 past it
    last_row: torch.Tensor  # [num_seqs] int64 the sequence's row (0 = root) whose token ends the output


def tree_accept(target: torch.Tensor,  # [num_seqs, K + 1] target token of each row (row 0: the root)
                drafts: torch.Tensor,  # [num_seqs, K] int64
                parents: torch.Tensor,  # [num_seqs, K] int64, -1 for the root's children
                valid: torch.Tensor,  # [num_seqs, K] bool: a draft (not padding)
                depths: torch.Tensor,  # [num_seqs, K] int64, 1 for the root's children
                max_depth: int) -> TreeVerdict:
    num_seqs, k = drafts.shape
    parent_row = (parents + 1).clamp(min=0)  # [num_seqs, K] row of each draft's parent
    match = (drafts == target.gather(1, parent_row)) & valid
    accepted = match
    root = torch.ones(num_seqs, 1, dtype=torch.bool, device=drafts.device)
    for _ in range(max_depth - 1):  # depth d is settled after d passes
        accepted = match & torch.cat([root, accepted], dim=1).gather(1, parent_row)
    score = torch.where(accepted, depths, 0)
    num_accepted, best = score.max(dim=1)
    node = torch.where(num_accepted > 0, best, -1)  # [num_seqs] deepest accepted draft
    last_row = node + 1
    path = torch.full((num_seqs, k), -1, dtype=torch.int64, device=drafts.device)
    for depth in range(max_depth, 0, -1):  # walk up from the deepest accepted draft
        here = node >= 0
        at = torch.where(here, depths.gather(1, node.clamp(min=0)[:, None])[:, 0], 0) == depth
        if depth <= k:
            path[:, depth - 1] = torch.where(at, node, path[:, depth - 1])
        node = torch.where(at, parents.gather(1, node.clamp(min=0)[:, None])[:, 0], node)
    return TreeVerdict(num_accepted, path, last_row)
