"""Tree drafting for the chain drafters (EAGLE, EAGLE-3): a token tree, one level per forward.

Positions follow ``chain_drafter.py``: with ``base = num_tokens - 2`` (the last ingested drafter
position, whose output predicts the root's children), the drafter runs node ``i`` of depth ``d``
at position ``base + d``, reading node ``i``'s token and its parent's output (the root's: the
ingested one), and writes its K/V at slot ``base + 1 + i``: for a chain, the slots the chain uses.
Each row attends to the ingested context (slots ``<= base``) and its ancestors' slots only
(``TreeRows`` over slots from ``base + 1``). Those slots are speculative, as a chain's are: the
next ingestion rewrites them from ``drafter_num_computed_tokens``.

Level ``d`` runs, per sequence, the nodes of depth ``d - 1`` from the level's first up to the last
one with a child inside the sequence's limit (consecutive slots; a leaf in between costs a row),
then takes each node's top-k: child ``c`` of node ``n`` is the ``ranks[c]``-th best.
"""
from __future__ import annotations

import torch

from ..paged import ForwardInput
from ..paged.batch import TreeRows
from .token_tree import TokenTree


def draft_tree(proposer, tree: TokenTree, seqs: list, limits: list[int],
               hidden: torch.Tensor,  # [num_seqs, hidden] each sequence's ingested output at base
               drafts: list[list[int]]) -> None:
    """Fill ``drafts[j]`` (empty lists) with the first ``limits[j]`` nodes of ``tree`` for ``seqs[j]``."""
    model, num_seqs = proposer.model, len(seqs)
    sizes = [min(limit, len(tree)) for limit in limits]
    tokens = [[-1] * n for n in sizes]
    outputs: list[dict[int, torch.Tensor]] = [{-1: hidden[j]} for j in range(num_seqs)]  # node -> drafter output
    _expand(tree, [[-1]] * num_seqs, model.draft_topk(0, hidden, tree.num_children(-1)).tolist(), sizes, tokens)
    for depth in range(2, tree.max_depth + 1):
        level = tree.level(depth - 1)
        runs = [_nodes_to_run(tree, level, n) for n in sizes]  # per sequence: nodes of depth - 1 to run
        if not any(runs):
            break
        inputs, inputs_hidden, ran = [], [], []
        for j, nodes in enumerate(runs):
            if not nodes:
                continue
            seq, base = seqs[j], seqs[j].num_tokens - 2
            bits = [tree.ancestor_bits[n] >> 1 for n in nodes]  # over slots base + 1 + node
            inputs.append(ForwardInput([tokens[j][n] for n in nodes], base + 1 + nodes[0], seq.block_ids,
                                       positions=[base + depth - 1] * len(nodes), tree=TreeRows(base + 1, bits)))
            inputs_hidden.extend(outputs[j][tree.parents[n]] for n in nodes)
            ran.append(j)
        with proposer.chain_timer.timing():
            ids, pos, meta, _ = proposer._prepare(inputs)
            out = model.step(depth - 1, ids, pos, torch.stack(inputs_hidden), proposer.kv_cache, meta)
            top = model.draft_topk(depth - 1, out, max(tree.num_children(n) for n in level)).tolist()
        row = 0
        for j in ran:
            for n in runs[j]:
                outputs[j][n] = out[row]
                row += 1
        _expand(tree, [runs[j] for j in ran], top, [sizes[j] for j in ran], [tokens[j] for j in ran])
    for j in range(num_seqs):
        drafts[j].extend(tokens[j])


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
