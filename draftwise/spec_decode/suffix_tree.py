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

Pure Python on dicts: the tree serves one proposer step of a few sequences,
where walking ``max_depth`` nodes costs microseconds.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass

# A node is a two-item list [count, children: dict[token id, node]]: building the tree of a long
# prompt creates ~max_depth nodes per token, and a list literal is several times cheaper to create
# than an instance of a class with __init__ (SmolLM2 code-edit prompts: 1.1 s -> 0.2 s per 20).
COUNT, CHILDREN = 0, 1


def _new_node() -> list:
    return [0, {}]


class _Sequence:
    __slots__ = ("token_ids", "open_nodes")

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        # Deepest node of each suffix that started in the last max_depth - 1 positions, oldest first.
        self.open_nodes: list[list] = []


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
        self.root = _new_node()
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
        with _no_gc():
            _add_tokens(token_ids, seq.open_nodes, self.root, self.max_depth)
        seq.token_ids.extend(token_ids)

    def remove(self, key) -> None:
        seq = self._seqs.pop(key, None)
        if seq is None:
            return
        tokens, depth = seq.token_ids, self.max_depth
        for start in range(len(tokens)):
            self.root[COUNT] -= 1
            node = self.root
            for token in tokens[start:start + depth]:
                child = node[CHILDREN][token]
                child[COUNT] -= 1
                if child[COUNT] == 0:  # nothing else passes here: drop the whole branch
                    del node[CHILDREN][token]
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
            token_ids, probs = _greedy_path(node, budget, min_token_prob)
            score = sum(probs)
            if token_ids and score >= best.score:
                best = SuffixDraft(token_ids, score, match_len, probs)
        return best

    def _find(self, context: list[int], match_len: int) -> list | None:
        node = self.root
        for token in context[len(context) - match_len:]:
            node = node[CHILDREN].get(token)
            if node is None:
                return None
        return node


def _add_tokens(token_ids, open_nodes: list[list], root: list, max_depth: int) -> None:
    """Grow every open suffix (and a new one from the root) by each token in turn."""
    for token in token_ids:
        open_nodes.append(root)
        for i, node in enumerate(open_nodes):
            child = node[CHILDREN].get(token)
            if child is None:
                child = node[CHILDREN][token] = [0, {}]
            child[COUNT] += 1
            open_nodes[i] = child
        root[COUNT] += 1
        if len(open_nodes) >= max_depth:  # the oldest suffix reached max_depth tokens
            del open_nodes[0]


@contextmanager
def _no_gc():
    """Pause the cyclic garbage collector: the tree holds no cycles, but each node is a tracked
    container, and collections triggered while a long prompt adds ~max_depth nodes per token
    would re-scan the whole tree (600-token prompt: 47 ms with collections, 7 ms without)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _greedy_path(node: list, budget: int, min_token_prob: float) -> tuple[list[int], list[float]]:
    token_ids: list[int] = []
    probs: list[float] = []
    prob = 1.0
    while len(token_ids) < budget and node[CHILDREN]:
        token, child = max(node[CHILDREN].items(), key=_by_count)
        prob *= child[COUNT] / node[COUNT]
        if prob < min_token_prob:
            break
        token_ids.append(token)
        probs.append(prob)
        node = child
    return token_ids, probs


def _by_count(item: tuple[int, list]) -> int:
    return item[1][COUNT]
