"""ModelRunner: turns a scheduled batch into one target forward and emitted tokens.

``execute`` is one engine step of the target: flatten the scheduled tokens
(each sequence's new tokens, then its drafts) into one ragged batch for the
``PagedModel``, compute logits only for the rows that sample (the last row
of a sequence, plus one row per draft; the rows are known before the forward,
so a tensor-parallel step is one message to the workers), hand them to
``sample/`` once (with ``SpecDecodeMetadata`` when drafts are verified), and
read the fixed-shape result back to the host once.

Tree drafts (``speculative_token_tree``): a sequence whose drafts carry parents runs each draft
at its depth's position, attending to the context and its ancestors only (``TreeRows``), and
verifies by following the target's draw down the tree (``sample/verify/tree.py``). Draft ``i``'s
K/V is written at slot ``root + 1 + i``; after verification the accepted path's K/V is moved to
the slots of its positions (``root + depth``) and the step's hidden-state rows are reordered the
same way, so the cache and a proposer reading the rows see the accepted tokens in position order.

Structured outputs: ``grammar`` (``structured_outputs.py``) gives the token bitmask of the
constrained sequences' rows; the sampler applies it to their logits before sampling and
verification (logprobs stay the raw model's). Steps without constrained sequences get none.

A sequence that scores its prompt (``prompt_logprobs.py``) adds the rows of its
prompt positions in the step: their logits are computed together, in slices of
``prompt_rows_per_slice`` rows (so a long chunk never holds a ``[chunk, vocab]``
tensor), and their figures reach the host in one transfer. Steps without such a
sequence compute nothing more.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate

import torch

from ..paged import ForwardInput, PagedModel
from ..paged.batch import TreeRows
from ..sample import (SpecDecodeMetadata, build_sampling_metadata, gather_logprobs, pack_logprobs, sample,
                      unpack_logprobs)
from ..sample.verify.rules import STANDARD, VerifyRule
from ..sequence import Sequence
from ..spec_decode.interface import ProposerNeeds, TargetHidden
from ..spec_decode.token_tree import ancestor_bits, depths_of
from .prompt_logprobs import PromptLogprobs, prompt_rows
from .scheduler import ScheduledSeq


@dataclass
class StepResult:
    seqs: list[Sequence]  # the sequences that emitted tokens this step
    token_ids: list[list[int]]  # per sequence: accepted drafts, then one sampled token
    num_draft_tokens: list[int]  # per sequence: drafts verified this step
    logprobs: list[list[float]] | None = None  # per sequence, per emitted token
    ranks: list[list[int]] | None = None
    top_ids: list[list[list[int]]] | None = None
    top_logprobs: list[list[list[float]]] | None = None
    target_hidden: TargetHidden | None = None  # rows of every scheduled sequence, when a proposer needs them
    prompt_logprobs: list[PromptLogprobs] = field(default_factory=list)  # prompt tokens scored this step

    @property
    def num_accepted(self) -> list[int]:
        """Per sequence: drafts accepted (every emitted token but the last)."""
        return [len(tokens) - 1 for tokens in self.token_ids]


class ModelRunner:
    prompt_rows_per_slice = 512  # prompt-scoring rows whose logits exist at once

    def __init__(self, paged: PagedModel, eos_token_ids: set[int],
                 verify_rule: VerifyRule = STANDARD, grammar=None):
        self.paged = paged
        self.grammar = grammar  # step_masks(seqs, drafts) -> GrammarMasks | None (structured outputs)
        self.model = paged.model
        self.device = paged.device
        self.verify_rule = verify_rule  # how sampled drafts are accepted (sample/verify/rules.py)
        self.eos_token_ids = sorted(eos_token_ids)
        self.vocab_size = paged.model.config.vocab_size

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledSeq], needs: ProposerNeeds | None = None) -> StepResult:
        parents = [_tree_parents(s) for s in scheduled]
        batch = [_forward_input(s, tree) for s, tree in zip(scheduled, parents)]
        sampling = [(i, s) for i, s in enumerate(scheduled) if s.samples]
        ends = list(accumulate(len(item.token_ids) for item in batch))  # cu_num_tokens[1:]
        rows = [r for i, s in sampling for r in range(ends[i] - len(s.spec_token_ids) - 1, ends[i])]
        aux_ids = needs.aux_layer_ids if needs else ()
        hidden, aux, cu, logits = self.paged.forward_with_logits(  # logits: [num_rows, V]
            batch, aux_ids, torch.tensor(rows, device=self.device) if rows else None)
        target_hidden = None
        if needs and (needs.hidden_states or aux_ids):
            target_hidden = TargetHidden(hidden, aux, cu, [s.seq for s in scheduled],
                                         [s.seq.num_computed_tokens for s in scheduled])
        prompt_scores = self._score_prompts(scheduled, hidden, cu)
        if not sampling:
            return StepResult([], [], [], target_hidden=target_hidden, prompt_logprobs=prompt_scores)
        seqs = [s.seq for _, s in sampling]
        drafts = [s.spec_token_ids for _, s in sampling]
        trees = [parents[i] for i, _ in sampling] if any(p is not None for p in parents) else None
        meta = build_sampling_metadata(seqs, drafts, self.vocab_size, self.eos_token_ids, self.device, trees)
        masks = self.grammar.step_masks(seqs, drafts) if self.grammar is not None else None
        residual = None
        if masks is not None:
            meta.grammar_rows, meta.grammar_bitmask = masks.rows.to(self.device), masks.bitmask.to(self.device)
            residual = masks.residual_probs
        spec = None
        if any(drafts) or residual:
            spec = SpecDecodeMetadata.from_drafts(drafts, [s.spec.draft_probs for s in seqs], self.device, residual,
                                                  trees)
        host = sample(logits, meta, spec, self.verify_rule).to_host()
        if host.accepted_path is not None:
            target_hidden = self._keep_accepted_paths([s for _, s in sampling], trees, host.accepted_path,
                                                      [cu[i] for i, _ in sampling], target_hidden)
        return StepResult(seqs, host.token_ids, [len(d) for d in drafts], host.logprobs, host.ranks,
                          host.top_ids, host.top_logprobs, target_hidden, prompt_scores)

    def _keep_accepted_paths(self, scheduled: list[ScheduledSeq], trees: list[list[int] | None],
                             paths: list[list[int]], first_rows: list[int],
                             target_hidden: TargetHidden | None) -> TargetHidden | None:
        """Move each tree's accepted drafts to their positions: K/V from slot ``root + 1 + node`` to
        ``root + depth`` (every layer of the target's cache), and the hidden-state rows alike."""
        src, dst, rows_from, rows_to = [], [], [], []
        block_size = self.paged.block_size
        for s, tree, path, first in zip(scheduled, trees, paths, first_rows):
            if tree is None:
                continue
            root = s.seq.num_computed_tokens + s.num_new_tokens - 1
            root_row = first + s.num_new_tokens - 1
            for depth, node in enumerate(path, 1):
                if node != depth - 1:
                    for pos, out in ((root + 1 + node, src), (root + depth, dst)):
                        out.append(s.seq.block_ids[pos // block_size] * block_size + pos % block_size)
                    rows_from.append(root_row + 1 + node)
                    rows_to.append(root_row + depth)
        if not src:
            return target_hidden
        kv = self.paged.kv_cache  # [num_layers, 2, num_slots, num_kv_heads, head_dim]
        kv[:, :, torch.tensor(dst, device=kv.device)] = kv[:, :, torch.tensor(src, device=kv.device)]
        if target_hidden is None:
            return None
        order = torch.arange(target_hidden.hidden_states.shape[0], device=self.device)
        order[torch.tensor(rows_to, device=self.device)] = torch.tensor(rows_from, device=self.device)
        return TargetHidden(target_hidden.hidden_states[order], [aux[order] for aux in target_hidden.aux_hidden_states],
                            target_hidden.cu_num_tokens, target_hidden.seqs, target_hidden.starts)

    def _score_prompts(self, scheduled: list[ScheduledSeq], hidden: torch.Tensor, cu: list[int]
                       ) -> list[PromptLogprobs]:
        """The figures of the prompt tokens this step scores (none for plain requests: nothing runs)."""
        plan = prompt_rows(scheduled, cu, self.vocab_size)
        if plan is None:
            return []
        rows = torch.tensor(plan.rows, device=self.device)
        targets = torch.tensor(plan.targets, dtype=torch.int64, device=self.device)
        num_top, step = plan.num_top, self.prompt_rows_per_slice
        packed = [pack_logprobs(gather_logprobs(self.paged.compute_logits(hidden[rows[s:s + step]]),
                                                targets[s:s + step], num_top))
                  for s in range(0, len(plan.rows), step)]
        return plan.split(unpack_logprobs(torch.cat(packed), num_top))


def _tree_parents(s: ScheduledSeq) -> list[int] | None:
    """The parents of the tree drafts ``s`` verifies (a prefix of its sequence's), None for a chain."""
    parents = s.seq.spec.draft_parents
    return parents[:len(s.spec_token_ids)] if parents is not None and s.spec_token_ids else None


def _forward_input(s: ScheduledSeq, tree: list[int] | None) -> ForwardInput:
    """The scheduled tokens, then the drafts: a chain at the next positions, a tree at its depths."""
    seq, start = s.seq, s.seq.num_computed_tokens
    tokens = seq.all_token_ids[start:][:s.num_new_tokens] + s.spec_token_ids
    if tree is None:
        return ForwardInput(tokens, start, seq.block_ids, seq.block_table_row)
    root = start + s.num_new_tokens - 1
    positions = list(range(start, root + 1)) + [root + d for d in depths_of(tree)]
    bits = [0] * (s.num_new_tokens - 1) + [1] + ancestor_bits(tree)
    return ForwardInput(tokens, start, seq.block_ids, seq.block_table_row, positions, TreeRows(root, bits))
