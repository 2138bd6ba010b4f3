"""A sequence's speculative decoding state (``Sequence.spec``), changed only through its methods.

Who calls what (the speculation side; ``tests/test_layout.py`` forbids assigning its fields
anywhere else):

* ``engine/drafting/speculator.py``: ``set_drafts`` after the proposer ran, ``observe`` after a verify
  step, ``roll_back`` with the new end ``BlockManager.rollback`` returns;
* the engine: ``clear_drafts`` once a step verified them;
* ``engine/structured_outputs.py``: ``cut_drafts`` where the grammar forbids a draft;
* proposers (``spec_decode/``): ``drafter_advanced`` as the drafter's own KV cache fills;
* ``engine/drafting/length.py``: ``estimate`` / ``decay_estimate``, the draft-length policy's evidence;
* admission and preemption (``engine/scheduler.py``): ``admit`` with what the prefix cache found
  (``BlockManager.match_prefix``), ``reset`` when the K/V is dropped.

Invariants: ``draft_probs`` is None or has one row per draft; ``draft_parents`` is None (a chain)
or has one entry per draft, each before its child (a prefix of the config's token tree);
``drafter_num_computed_tokens`` never passes the target's computed end after a rollback; counters
only grow.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SpecState:
    draft_token_ids: list[int] = field(default_factory=list)  # the drafts the next step verifies
    draft_probs: Any = None  # torch.Tensor [len(draft_token_ids), vocab] draft distribution; None: one-hot
    draft_parents: list[int] | None = None  # tree drafts: each draft's parent (-1: the root); None: a chain
    drafter_num_computed_tokens: int = 0  # positions held by the proposer's own KV cache
    drafter_blocked: bool = False  # its cached prefix lacks the drafter's K/V: it decodes plainly
    num_drafts: int = 0  # steps that verified at least one draft of this sequence
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    draft_accepted: float = 0.0  # decayed counts behind the draft-length policy's acceptance estimate
    draft_tried: float = 0.0

    def set_drafts(self, token_ids: list[int], probs=None, parents: list[int] | None = None) -> None:
        """The drafts to verify next (``probs``: [len(token_ids), vocab] or None; ``parents``: a tree's)."""
        self.draft_token_ids, self.draft_probs, self.draft_parents = token_ids, probs, parents

    def clear_drafts(self) -> None:
        self.draft_token_ids, self.draft_probs, self.draft_parents = [], None, None

    def tree_to_chain(self) -> None:
        """Keep only the tree's first-choice path (each node's first child) as a chain of drafts."""
        if self.draft_parents is None:
            return
        chain, node = [], -1
        while (node := next((i for i, p in enumerate(self.draft_parents) if p == node), None)) is not None:
            chain.append(node)
        self.set_drafts([self.draft_token_ids[i] for i in chain])

    def cut_drafts(self, token_ids: list[int], probs, drafter_end: int) -> None:
        """Keep ``token_ids`` (a prefix of the drafts, or the grammar's forced tokens) and forget the
        drafter's K/V past ``drafter_end`` (positions the cut drafts had been fed at)."""
        self.draft_token_ids, self.draft_probs, self.draft_parents = token_ids, probs, None
        self.drafter_num_computed_tokens = min(self.drafter_num_computed_tokens, drafter_end)

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        """A verify step judged ``num_draft_tokens`` drafts and accepted ``num_accepted``."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted

    def drafter_advanced(self, end: int) -> None:
        """The drafter's KV cache now holds positions ``[0, end)``."""
        self.drafter_num_computed_tokens = end

    def roll_back(self, end: int) -> None:
        """The target kept positions ``[0, end)``; the drafter's K/V past it is forgotten."""
        self.drafter_num_computed_tokens = min(self.drafter_num_computed_tokens, end)

    def admit(self, drafter_tokens: int, blocked: bool) -> None:
        """Admission with cached blocks: the drafter's K/V covers ``drafter_tokens`` of them; ``blocked``:
        too few, the sequence decodes plainly."""
        self.drafter_num_computed_tokens, self.drafter_blocked = drafter_tokens, blocked

    def estimate(self, decay: float, num_accepted: int, tried: float) -> None:
        self.draft_accepted = decay * self.draft_accepted + num_accepted
        self.draft_tried = decay * self.draft_tried + tried

    def decay_estimate(self, factor: float) -> None:
        self.draft_accepted *= factor
        self.draft_tried *= factor

    def reset(self) -> None:
        """Forget drafts and drafter state (after preemption the K/V is recomputed from scratch)."""
        self.clear_drafts()
        self.drafter_num_computed_tokens, self.drafter_blocked = 0, False
