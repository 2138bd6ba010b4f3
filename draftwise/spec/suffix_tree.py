"""A frequency suffix tree over token sequences, the data structure of suffix decoding.

``SuffixTree(max_depth)`` holds any number of sequences, each under a key.
Every path from the root spells a substring of at most ``max_depth`` tokens
of some held sequence, and each node counts how many (sequence, start
position) pairs pass through it. So for a context whose last ``m`` tokens
spell the path to a node, ``child.count / node.count`` is how often the
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

Pure Python on dicts: the tree serves one proposer step of a few sequences,
where walking ``max_depth`` nodes costs microseconds.
"""
from __future__ import annotations

from dataclasses import dataclass


class _Node:
    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] = {}


class _Sequence:
    __slots__ = ("token_ids", "open_nodes")

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        # Deepest node of each suffix that started in the last max_depth - 1 positions, oldest first.
        self.open_nodes: list[_Node] = []


@dataclass(frozen=True, slots=True)
class SuffixDraft:
    token_ids: list[int]
    score: float  # sum of the path probabilities of the drafted tokens
    match_len: int  # how many trailing context tokens the draft was matched on


EMPTY_DRAFT = SuffixDraft([], 0.0, 0)


class SuffixTree:
    def __init__(self, max_depth: int):
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.root = _Node()
        self._seqs: dict[object, _Sequence] = {}

    def __contains__(self, key) -> bool:
        return key in self._seqs

    def __len__(self) -> int:
        return len(self._seqs)

    def keys(self) -> list:
        return list(self._seqs)

    def num_tokens(self, key) -> int:
        seq = self._seqs.get(key)
        return len(seq.token_ids) if seq else 0

    def extend(self, key, token_ids) -> None:
        seq = self._seqs.get(key)
        if seq is None:
            seq = self._seqs[key] = _Sequence()
        max_depth, root = self.max_depth, self.root
        open_nodes = seq.open_nodes
        for token in token_ids:
            open_nodes.append(root)
            for i, node in enumerate(open_nodes):
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _Node()
                child.count += 1
                open_nodes[i] = child
            root.count += 1
            if len(open_nodes) >= max_depth:  # the oldest suffix reached max_depth tokens
                del open_nodes[0]
        seq.token_ids.extend(token_ids)

    def remove(self, key) -> None:
        seq = self._seqs.pop(key, None)
        if seq is None:
            return
        tokens, depth = seq.token_ids, self.max_depth
        for start in range(len(tokens)):
            self.root.count -= 1
            node = self.root
            for token in tokens[start:start + depth]:
                child = node.children[token]
                child.count -= 1
                if child.count == 0:  # nothing else passes here: drop the whole branch
                    del node.children[token]
                    break
                node = child

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
            token_ids, score = _greedy_path(node, budget, min_token_prob)
            if token_ids and score >= best.score:
                best = SuffixDraft(token_ids, score, match_len)
        return best

    def _find(self, context: list[int], match_len: int) -> _Node | None:
        node = self.root
        for token in context[len(context) - match_len:]:
            node = node.children.get(token)
            if node is None:
                return None
        return node


def _greedy_path(node: _Node, budget: int, min_token_prob: float) -> tuple[list[int], float]:
    token_ids: list[int] = []
    prob, score = 1.0, 0.0
    while len(token_ids) < budget and node.children:
        token, child = max(node.children.items(), key=_by_count)
        prob *= child.count / node.count
        if prob < min_token_prob:
            break
        token_ids.append(token)
        score += prob
        node = child
    return token_ids, score


def _by_count(item: tuple[int, _Node]) -> int:
    return item[1].count
