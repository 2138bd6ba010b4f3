"""A frequency suffix tree over token sequences, the data structure of suffix decoding.

``SuffixTree(max_depth)`` holds any number of sequences, each under a key.
Every path from the root spells a substring of at most ``max_depth`` tokens
of some held sequence, and each node counts how many (sequence, start
position) pairs pass through it. So for a context whose last ``m`` tokens
spell the path to a node, ``count(child) / count(node)`` is how often the
context continued with the child's token.

* ``extend(key, token_ids)`` appends tokens to a sequence (``O(max_depth)``
  per token: every suffix that started in the last ``max_depth`` positions
  grows by one node).
* ``remove(key)`` takes a sequence out again (counts drop, empty nodes go).
* ``speculate(context, ...)`` is SuffixDecoding's path mode: for every match
  length ``m`` at which the context's last ``m`` tokens are in the tree,
  follow the most frequent child up to ``min(max_spec_tokens, floor(m *
  max_spec_factor))`` tokens while the path probability stays
  ``>= min_token_prob``; the draft's score is the sum of the path
  probabilities, and the best-scored draft wins (ties go to the longer match).

Pure Python on ints: a node is an index into two lists, its count and a dict
from token id to child node. Dicts holding only ints are not tracked by the
cyclic garbage collector, so a tree of millions of nodes (a server's global
tree, long prompts' local trees) adds nothing to a full collection; with a
list object per node a full collection walked every node, pausing the whole
server for 0.3-0.4 s several times a minute (multi-turn chat, 32 clients).
Removed nodes are recycled.
"""
from __future__ import annotations

from dataclasses import dataclass

ROOT = 0  # the root's node id


class _Sequence:
    __slots__ = ("token_ids", "open_nodes")

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        # Deepest node of each suffix that started in the last max_depth - 1 positions, oldest first.
        self.open_nodes: list[int] = []


@dataclass(frozen=True, slots=True)
class SuffixDraft:
    token_ids: list[int]
    score: float  # sum of the path probabilities of the drafted tokens
    match_len: int  # how many trailing context tokens the draft was matched on
    probs: list[float]  # path probability after each drafted token (non-increasing)


EMPTY_DRAFT = SuffixDraft([], 0.0, 0, [])


class SuffixTree:
    def __init__(self, max_depth: int):
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self._counts: list[int] = [0]  # node id -> (sequence, start) pairs passing through it
        self._children: list[dict[int, int]] = [{}]  # node id -> {token id: child node id}
        self._free: list[int] = []  # ids of removed nodes, reused before the lists grow
        self._seqs: dict[object, _Sequence] = {}

    def __contains__(self, key) -> bool:
        return key in self._seqs

    def __len__(self) -> int:
        return len(self._seqs)

    def keys(self) -> list:
        return list(self._seqs)

    def count(self, node: int) -> int:
        return self._counts[node]

    def children(self, node: int) -> dict[int, int]:
        """``{token id: child node id}`` (read only)."""
        return self._children[node]

    @property
    def num_nodes(self) -> int:
        """Live nodes, the root included."""
        return len(self._counts) - len(self._free)

    def num_tokens(self, key) -> int:
        seq = self._seqs.get(key)
        return len(seq.token_ids) if seq else 0

    def extend(self, key, token_ids) -> None:
        seq = self._seqs.get(key)
        if seq is None:
            seq = self._seqs[key] = _Sequence()
        self._add_tokens(token_ids, seq.open_nodes)
        seq.token_ids.extend(token_ids)

    def remove(self, key) -> None:
        seq = self._seqs.pop(key, None)
        if seq is None:
            return
        tokens, depth, counts, children = seq.token_ids, self.max_depth, self._counts, self._children
        for start in range(len(tokens)):
            counts[ROOT] -= 1
            node = ROOT
            for token in tokens[start:start + depth]:
                child = children[node][token]
                counts[child] -= 1
                if counts[child] == 0:  # nothing else passes here: drop the whole branch
                    del children[node][token]
                    self._release_branch(child)
                    break
                node = child

    def _release_branch(self, node: int) -> None:
        """Recycle ``node`` and everything under it (a chain: its count reached 0 before theirs
        were decremented, so each passed only the removed suffix)."""
        counts, children = self._counts, self._children
        while True:
            self._free.append(node)
            counts[node] = 0
            kids = children[node]
            if not kids:
                return
            (node,) = kids.values()
            kids.clear()

    def speculate(self, context: list[int], max_spec_tokens: int, max_spec_factor: float = 1.0,
                  min_token_prob: float = 0.1) -> SuffixDraft:
        """The best-scored draft continuing ``context`` (see the module docstring)."""
        best = EMPTY_DRAFT
        if max_spec_tokens <= 0:
            return best
        for match_len in range(1, min(len(context), self.max_depth) + 1):
            node = self._find(context, match_len)
            if node is None:  # a longer suffix cannot occur either
                break
            budget = min(max_spec_tokens, int(match_len * max_spec_factor))
            if budget <= 0:
                continue
            token_ids, probs = self._greedy_path(node, budget, min_token_prob)
            score = sum(probs)
            if token_ids and score >= best.score:
                best = SuffixDraft(token_ids, score, match_len, probs)
        return best

    def _find(self, context: list[int], match_len: int) -> int | None:
        node, children = ROOT, self._children
        for token in context[len(context) - match_len:]:
            node = children[node].get(token)
            if node is None:
                return None
        return node

    def _add_tokens(self, token_ids, open_nodes: list[int]) -> None:
        """Grow every open suffix (and a new one from the root) by each token in turn."""
        counts, children, free, max_depth = self._counts, self._children, self._free, self.max_depth
        for token in token_ids:
            open_nodes.append(ROOT)
            for i, node in enumerate(open_nodes):
                kids = children[node]
                child = kids.get(token)
                if child is None:
                    if free:
                        child = free.pop()
                    else:
                        child = len(counts)
                        counts.append(0)
                        children.append({})
                    kids[token] = child
                counts[child] += 1
                open_nodes[i] = child
            counts[ROOT] += 1
            if len(open_nodes) >= max_depth:  # the oldest suffix reached max_depth tokens
                del open_nodes[0]

    def _greedy_path(self, node: int, budget: int, min_token_prob: float) -> tuple[list[int], list[float]]:
        counts, children = self._counts, self._children
        token_ids: list[int] = []
        probs: list[float] = []
        prob = 1.0
        while len(token_ids) < budget and children[node]:
            kids = children[node]
            token = max(kids, key=lambda t: counts[kids[t]])
            child = kids[token]
            prob *= counts[child] / counts[node]
            if prob < min_token_prob:
                break
            token_ids.append(token)
            probs.append(prob)
            node = child
        return token_ids, probs
