"""Tree drafting, one tree level per drafter forward, for any drafter that reads its own K/V.

``draft_tree`` fills each sequence's drafts with the first ``limit`` nodes of a ``TokenTree``: a
node's children are its drafter output's top-k, in the tree's ranks. With ``root`` the drafter
position whose output predicts the root's children (a chain drafter's last ingested position,
``num_tokens - 2``; a draft model's last token, ``num_tokens - 1``), node ``i`` of depth ``d``
runs at position ``root + d`` and writes its K/V at slot ``root + 1 + i``: for a chain, the slots
a chain uses. Each node attends to the drafter's context (slots ``<= root``) and its ancestors'
slots only (``TreeRows`` over slots from ``root + 1``). Those slots are speculative: the drafter
must not count them as computed (the next round rewrites them).

Level ``d`` runs, per sequence, the nodes of depth ``d - 1`` from the level's first up to the last
one with a child inside the sequence's limit (consecutive slots; a leaf in between costs a row).
``run_level(depth, inputs, parent_outputs)`` runs them in one batched forward and returns each
row's output and its top-k ids; ``parent_outputs`` are the outputs the rows' parents produced
(the root's: ``root_outputs``), for drafters that read their previous output (EAGLE).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from ..paged import ForwardInput
from ..paged.batch import TreeRows
from .token_tree import TokenTree

# (depth - 1, inputs, parent output of each row) -> (outputs [num_rows, ...], top-k ids per row)
RunLevel = Callable[[int, list[ForwardInput], list], tuple[torch.Tensor, list[list[int]]]]


def draft_tree(tree: TokenTree, seqs: list, limits: list[int], roots: list[int],
               root_top: list[list[int]],  # per sequence: its root's top-k ids, k >= tree.num_children(-1)
               root_outputs: list,  # per sequence: the root's output (passed to its children's rows)
               run_level: RunLevel) -> list[list[int]]:
    """The first ``limits[j]`` nodes of ``tree`` for ``seqs[j]``, whose root sits at ``roots[j]``."""
    sizes = [min(limit, len(tree)) for limit in limits]
    tokens = [[-1] * n for n in sizes]
    outputs: list[dict[int, object]] = [{-1: out} for out in root_outputs]  # per sequence: node -> output
    _expand(tree, [[-1]] * len(seqs), root_top, sizes, tokens)
    for depth in range(2, tree.max_depth + 1):
        level = tree.level(depth - 1)
        runs = [_nodes_to_run(tree, level, n) for n in sizes]  # per sequence: nodes of depth - 1 to run
        if not any(runs):
            break
        inputs, parent_outputs, ran = [], [], []
        for j, nodes in enumerate(runs):
            if nodes:
                bits = [tree.ancestor_bits[n] >> 1 for n in nodes]  # over slots root + 1 + node
                inputs.append(ForwardInput([tokens[j][n] for n in nodes], roots[j] + 1 + nodes[0],
                                           seqs[j].block_ids, positions=[roots[j] + depth - 1] * len(nodes),
                                           tree=TreeRows(roots[j] + 1, bits)))
                parent_outputs.extend(outputs[j][tree.parents[n]] for n in nodes)
                ran.append(j)
        out, top = run_level(depth - 1, inputs, parent_outputs)
        row = 0
        for j in ran:
            for n in runs[j]:
                outputs[j][n] = out[row]
                row += 1
        _expand(tree, [runs[j] for j in ran], top, [sizes[j] for j in ran], [tokens[j] for j in ran])
    return tokens


def _nodes_to_run(tree: TokenTree, level: range, size: int) -> list[int]:
    """The nodes of ``level`` from its first to the last one with a child among the first ``size``."""
    last = max((tree.parents[c] for c in range(size) if tree.parents[c] in level), default=None)
    return list(range(level.start, last + 1)) if last is not None else []


def _expand(tree: TokenTree, runs: list[list[int]], top: list[list[int]], sizes: list[int],
            tokens: list[list[int]]) -> None:
    """Set each run node's children (within each sequence's size) from its row of ``top``."""
    row = 0
    for nodes, size, seq_tokens in zip(runs, sizes, tokens):
        for n in nodes:
            for c in range(size):
                if tree.parents[c] == n:
                    seq_tokens[c] = top[row][tree.ranks[c]]
            row += 1
