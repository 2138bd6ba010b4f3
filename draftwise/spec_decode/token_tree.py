"""A static draft token tree (``speculative_config["speculative_token_tree"]``, vLLM's format).

The tree is a list of paths, each a tuple of top-k ranks: ``(0,)`` is the drafter's best guess for
the next token, ``(1,)`` its second best, ``(0, 2)`` the third-best continuation of ``(0,)``. Every
path's proper prefixes must be in the tree too, so the nodes form a tree under the root (the last
token the target emitted). Nodes are kept in breadth-first order (by depth, then by ranks, as
vLLM sorts them), so:

* a node's parent always comes before it, and any prefix of the node list is itself a tree: the
  engine cuts a sequence's tree to its first ``n`` nodes when it may verify only ``n`` drafts;
* the nodes of one depth are consecutive (``level(d)``).

A chain of ``k`` drafts is the tree ``[(0,), (0, 0), ...]``; ``TokenTree.chain(k)`` builds it.

Verification and attention address nodes by index: node ``i`` sits in the row (and the cache slot)
``i + 1`` after the root; ``parents[i]`` is the index of its parent, ``-1`` for the root.
``ancestor_bits[i]`` has bit ``0`` for the root and bit ``j + 1`` for every node ``j`` on the path
to node ``i``, itself included: the attention mask of its row over the root and the tree.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cached_property

from ..sample.verify.tree import depths_of, path_nodes
from ..validate import PREFIX

__all__ = ["KEY", "MAX_NODES", "TokenTree", "ancestor_bits", "depths_of", "path_nodes"]

KEY = "speculative_token_tree"
MAX_NODES = 62  # the root and the tree fit one signed 64-bit ancestor mask per row


@dataclass(frozen=True)
class TokenTree:
    paths: tuple[tuple[int, ...], ...]  # breadth-first

    @classmethod
    def parse(cls, value) -> "TokenTree":
        """A tree from vLLM's string (``"[(0,), (1,), (0, 0)]"``) or a list of paths; ``ValueError``
        naming the key where it is not a tree of at most ``MAX_NODES`` nodes."""
        if isinstance(value, str):
            try:
                value = ast.literal_eval(value)
            except (ValueError, SyntaxError) as exc:
                raise ValueError(f"{PREFIX}[{KEY!r}]={value!r} is invalid: must be a list of tuples of "
                                 f"top-k ranks, e.g. '[(0,), (1,), (0, 0)]' ({exc})") from None
        if not isinstance(value, (list, tuple)) or not value:
            raise ValueError(f"{PREFIX}[{KEY!r}]={value!r} is invalid: must be a non-empty list of paths "
                             "(tuples of top-k ranks), e.g. [(0,), (1,), (0, 0)]")
        paths = []
        for path in value:
            if (not isinstance(path, (list, tuple)) or not path
                    or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in path)):
                raise ValueError(f"{PREFIX}[{KEY!r}]: path {path!r} is invalid: must be a non-empty tuple of "
                                 "ranks (ints >= 0)")
            paths.append(tuple(path))
        unique = set(paths)
        if len(unique) != len(paths):
            raise ValueError(f"{PREFIX}[{KEY!r}]: a path appears twice")
        missing = sorted({p[:i] for p in paths for i in range(1, len(p))} - unique)
        if missing:
            raise ValueError(f"{PREFIX}[{KEY!r}]: path(s) {missing} missing: every prefix of a path must be in "
                             "the tree")
        if len(paths) > MAX_NODES:
            raise ValueError(f"{PREFIX}[{KEY!r}] has {len(paths)} nodes: at most {MAX_NODES} are allowed")
        return cls(tuple(sorted(paths, key=lambda p: (len(p), p))))

    @classmethod
    def chain(cls, num_nodes: int) -> "TokenTree":
        return cls(tuple((0,) * d for d in range(1, num_nodes + 1)))

    def __len__(self) -> int:
        return len(self.paths)

    def describe(self) -> str:
        return str(list(self.paths))

    @cached_property
    def parents(self) -> tuple[int, ...]:
        index = {p: i for i, p in enumerate(self.paths)}
        return tuple(index[p[:-1]] if len(p) > 1 else -1 for p in self.paths)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        return tuple(len(p) for p in self.paths)

    @property
    def ranks(self) -> tuple[int, ...]:
        """Each node's rank among its parent's candidates (0: the drafter's best)."""
        return tuple(p[-1] for p in self.paths)

    @property
    def max_children(self) -> int:
        """The most candidates any node expands into: the top-k a drafter must give."""
        return max(self.ranks) + 1

    @property
    def max_depth(self) -> int:
        return self.depths[-1]

    @property
    def is_chain(self) -> bool:
        return self.paths == TokenTree.chain(len(self)).paths

    @cached_property
    def ancestor_bits(self) -> tuple[int, ...]:
        return tuple(ancestor_bits(list(self.parents)))

    def chunk_aligned(self, root: int, chunk: int) -> int:
        """The longest prefix of nodes whose slot (``root + 1 + i``) lies in the same ``chunk``-key
        block as its position (``root + depth``), verifying after a root at ``root``. The paged
        attention kernel sums each block of keys apart, by slot: where every visible key's block
        is its position's, a tree row adds the same numbers in the same order as plain decoding
        does at that position, bit for bit."""
        for i, depth in enumerate(self.depths):
            if (root + 1 + i) // chunk != (root + depth) // chunk:
                return i
        return len(self)

    def level(self, depth: int) -> range:
        """Indices of the nodes at ``depth`` (consecutive: the order is breadth-first)."""
        first = next((i for i, d in enumerate(self.depths) if d == depth), len(self))
        end = next((i for i, d in enumerate(self.depths) if d > depth), len(self))
        return range(first, max(first, end))

    def num_children(self, node: int) -> int:
        """How many candidates node ``node`` (-1: the root) expands into: its largest child rank + 1."""
        ranks = [r for r, p in zip(self.ranks, self.parents) if p == node]
        return max(ranks) + 1 if ranks else 0


def ancestor_bits(parents: list[int]) -> list[int]:
    """Per draft: bit 0 (the root) and bit ``j + 1`` for each draft ``j`` on its path, itself included."""
    bits: list[int] = []
    for i, parent in enumerate(parents):
        bits.append((1 if parent < 0 else bits[parent]) | 1 << (i + 1))
    return bits
