"""Autoregressive hidden-state drafters (EAGLE, EAGLE-3, MTP): the shared engine side.

Drafter position ``p`` reads token ``p + 1`` and a hidden state for position
``p``, writes its own K/V at slot ``p`` of the sequence's blocks (a parallel
cache in the shared paged pool), and its output predicts token ``p + 2``.

Each engine step, ``ChainProposer.propose``:

1. *Ingests* the target rows computed this step (``TargetHidden``): for every
   scheduled sequence that drafts this step, positions
   ``[drafter_num_computed_tokens, end)`` where ``end`` is the last position
   that has both a target hidden state and a next token (rejected draft rows
   are never read: rollback is free). The rows of a sequence that gets no
   drafts, prefill chunks included, wait in ``pending`` (``pending_rows.py``)
   and join its next ingestion, or are ingested once ``MAX_PENDING_ROWS``
   wait (a memory bound). One batched drafter forward, none when nobody
   drafts. A ``drafter_blocked`` sequence (its cached prefix lacks the
   drafter's K/V) is skipped: it never drafts.
2. *Drafts* a chain for each sequence that decodes next: the first draft
   comes from the ingested output at position ``num_tokens - 2``; step ``s``
   then runs at position ``num_tokens - 2 + s`` on draft ``s`` and the
   previous output (see ``_chain`` for drafters with one layer per step).
   ``disable_padded_drafter_batch`` (default False, as in vLLM) chooses the
   batch shape: padded keeps every sequence in each step
   until the longest chain is done (a finished row reruns at a slot the next
   ingestion rewrites), ragged drops sequences as they finish. Drafts are
   identical either way; ragged does less work.

Drafts are the drafter's argmax (one-hot, verified losslessly). Drafter
positions past ``num_tokens - 2`` are speculative and are overwritten when
the real hidden states arrive, so the engine only clips
``drafter_num_computed_tokens``.

With a token tree (``speculative_token_tree``; ``drafts_trees``), ``_tree`` drafts level by level
instead: a node's children are its drafter output's top-k, in the tree's ranks; each level's
nodes run in one batched forward (``tree_drafting.py``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..layers.attention import AttentionMetadata
from ..paged import ForwardInput, KVCacheSpec, prepare_batch
from .forward_timer import ForwardTimer, RowsTimer
from .interface import DraftBatch, ProposeBatch, Proposer, TargetHidden
from .pending_rows import PendingRows
from .tree_drafting import draft_tree

MAX_PENDING_ROWS = 1024  # a sequence that does not draft is ingested once this many of its rows wait


@dataclass
class IngestBatch:
    token_ids: torch.Tensor  # [num_rows] token p + 1 of each ingested position p
    positions: torch.Tensor  # [num_rows]
    target_features: torch.Tensor  # [num_rows, feature_size] what the target gives for position p
    meta: AttentionMetadata
    cu_num_rows: list[int]  # rows of seq_ids[i] are cu[i]:cu[i+1]
    seq_ids: list[int]


class ChainModel(nn.Module):
    """What a chain drafter's network provides; ``layers`` are its ``DecoderLayer``s (one KV cache each).
    Drafters that read token embeddings set ``embed_tokens`` (their own table, or None to share
    the target's) and ``_target`` (``[target DecoderLM]``, kept outside the module tree)."""

    layers: nn.ModuleList
    embed_tokens: nn.Embedding | None = None
    _target: list = []

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:  # [num_rows] -> [num_rows, hidden] fp32
        table = self.embed_tokens if self.embed_tokens is not None else self._target[0].embed_tokens
        return table(token_ids).float()

    def ingest(self, batch: IngestBatch, kv_cache: torch.Tensor) -> torch.Tensor:  # [num_rows, hidden]
        raise NotImplementedError

    def step(self, step: int, token_ids: torch.Tensor, positions: torch.Tensor,
             hidden: torch.Tensor,  # [num_rows, hidden] the previous step's output
             kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:  # [num_rows, hidden]
        raise NotImplementedError

    def draft_ids(self, step: int, hidden: torch.Tensor) -> torch.Tensor:  # [num_rows] target token ids
        raise NotImplementedError

    def draft_topk(self, step: int, hidden: torch.Tensor, k: int) -> torch.Tensor:  # [num_rows, k] target ids
        """The ``k`` likeliest next tokens, best first (tree drafting; chain-only drafters need not)."""
        raise NotImplementedError

    def cache_index(self, step: int) -> int:
        """Which of ``layers`` (and its KV cache) chain step ``step`` runs."""
        return 0

    def release(self, seq_id: int) -> None:
        """Forget per-sequence state, if any."""

    def tracked(self) -> set[int]:
        return set()


class ChainProposer(Proposer):
    """Base of the chain drafters; a subclass builds ``self.model`` and says what it reads."""

    model: ChainModel

    def __init__(self, config, target):
        super().__init__(config, target)
        self.chain_timer = ForwardTimer()  # one chain step (a forward of the drafting sequences)
        self.ingest_timer = RowsTimer()  # an ingestion forward, by rows (what drafting at all costs a step)
        self.num_seqs = 1  # sequences of the last batch: the rows of a drafting step's ingestion
        self.pending = PendingRows(MAX_PENDING_ROWS)

    def drafting_seconds(self, depth: int) -> float:
        """The first draft comes from the ingested rows (a forward that runs only if someone drafts);
        each further one is a chain step."""
        if depth == 0:
            return 0.0
        return self.ingest_timer.seconds(self.num_seqs) + (depth - 1) * self.chain_timer.seconds

    def target_features(self, hidden: TargetHidden, rows: list[int]) -> torch.Tensor:
        """[num_rows, feature_size], a copy: the auxiliary states side by side if the proposer asked
        for some (EAGLE-3, DFlash), else the final-norm hidden state (EAGLE, MTP), at ``rows``. All
        of the step's rows in order (a decode step whose sequences all wait) take no gather."""
        sources = hidden.aux_hidden_states or [hidden.hidden_states]
        if len(rows) == sources[0].shape[0] and rows == list(range(len(rows))):
            return torch.cat(sources, dim=-1) if len(sources) > 1 else sources[0].clone()
        index = torch.tensor(rows, dtype=torch.int64, device=sources[0].device)
        return torch.cat([source[index] for source in sources], dim=-1)

    def kv_cache_spec(self) -> KVCacheSpec:
        return KVCacheSpec.of_layers(self.model.layers)

    def on_finished(self, seq) -> None:
        self.model.release(seq.seq_id)
        self.pending.drop(seq.seq_id)

    def tracked_seq_ids(self) -> set[int]:
        return self.model.tracked() | self.pending.seq_ids()

    @torch.inference_mode()
    def propose(self, batch: ProposeBatch) -> DraftBatch:
        drafting = self.drafting(batch)
        last = self._ingest(batch.target_hidden, drafting) if batch.target_hidden is not None else {}
        limits = [limit if seq.seq_id in last else 0 for seq, limit in zip(batch.seqs, batch.max_num_drafts)]
        drafts: list[list[int]] = [[] for _ in batch.seqs]
        rows = [i for i, limit in enumerate(limits) if limit > 0]
        tree = self.config.token_tree
        if rows:
            hidden = torch.stack([last[batch.seqs[i].seq_id] for i in rows])  # [num_rows, hidden]
            if tree is None:
                self._chain(batch.seqs, rows, limits, hidden, drafts)
            else:
                self._tree(tree, [batch.seqs[i] for i in rows], [limits[i] for i in rows], hidden,
                           [drafts[i] for i in rows])
        return DraftBatch.from_lists(drafts, parents=list(tree.parents) if tree is not None else None)

    def drafting(self, batch: ProposeBatch) -> set[int]:
        """Ids of the sequences that may draft this step (the others' rows wait). Remembers the batch's
        size: the rows ``drafting_seconds`` prices a drafting step's ingestion at."""
        self.num_seqs = max(1, len(batch.seqs))
        return {seq.seq_id for seq, limit in zip(batch.seqs, batch.max_num_drafts) if limit > 0}

    def _ingest(self, target: TargetHidden, drafting: set[int]) -> dict[int, torch.Tensor]:
        """Run the drafter over the new target rows of the sequences in ``drafting`` (and of those
        whose waiting rows reached the cap); the output at ``num_tokens - 2`` per sequence."""
        prepared = self.ingest_batch(target, drafting)
        if prepared is None:
            return {}
        batch, seqs = prepared
        with self.ingest_timer.timing(len(batch.token_ids)):
            out = self.model.ingest(batch, self.kv_cache)
        return {seq.seq_id: out[batch.cu_num_rows[j + 1] - 1] for j, seq in enumerate(seqs)
                if seq.spec.drafter_num_computed_tokens == seq.num_tokens - 1}

    def ingest_batch(self, target: TargetHidden, drafting: set[int]) -> tuple[IngestBatch, list] | None:
        """The rows to ingest this step (and their sequences, whose drafter position advances), or None.
        The new rows of sequences not in ``drafting`` (ids) wait in ``pending`` (see
        ``pending_rows.py``) until they draft or ``pending.max_rows`` pile up."""
        inputs, seqs, rows = [], [], []
        parts = []  # per ingested sequence: (its waiting pieces, how many new rows follow them)
        waiting = []  # (sequence, its new rows) that wait
        for i, seq in enumerate(target.seqs):
            if seq.is_finished or seq.spec.drafter_blocked:
                continue
            start, first_row = target.starts[i], target.cu_num_tokens[i]
            done = seq.spec.drafter_num_computed_tokens
            have = done + self.pending.count(seq.seq_id, done)  # positions ingested or waiting
            end = min(start + target.cu_num_tokens[i + 1] - first_row, seq.num_tokens - 1)
            if have < start:
                raise RuntimeError(f"{self.method} drafter of {seq} saw positions < {have}, but the target "
                                   f"rows of this step start at {start}")
            new_rows = range(first_row + have - start, first_row + end - start)
            if seq.seq_id not in drafting and end - done < self.pending.max_rows:
                if len(new_rows):
                    waiting.append((seq, new_rows))
            elif end > done:
                inputs.append(ForwardInput(seq.all_token_ids[done + 1:end + 1], done, seq.block_ids))
                parts.append((self.pending.take(seq.seq_id), len(new_rows)))
                rows.extend(new_rows)
                seqs.append(seq)
        self._keep_waiting(target, waiting)
        if not inputs:
            return None
        ids, pos, meta, cu = self._prepare(inputs)
        features = self._assemble(parts, self.target_features(target, rows))
        for seq, item in zip(seqs, inputs):
            seq.spec.drafter_advanced(item.start + len(item.token_ids))
        return IngestBatch(ids, pos, features, meta, cu, [s.seq_id for s in seqs]), seqs

    def _keep_waiting(self, target: TargetHidden, waiting: list) -> None:
        """Gather the features of the rows that wait (one gather) into ``pending``."""
        if not waiting:
            return
        rows = [r for _, new_rows in waiting for r in new_rows]
        features = self.target_features(target, rows)  # [num_rows, feature_size]
        offset = 0
        for seq, new_rows in waiting:
            self.pending.add(seq.seq_id, seq.spec.drafter_num_computed_tokens, features[offset:offset + len(new_rows)])
            offset += len(new_rows)

    @staticmethod
    def _assemble(parts: list[tuple[list[torch.Tensor], int]],
                  features: torch.Tensor  # [num_new_rows, feature_size] the new rows, in sequence order
                  ) -> torch.Tensor:  # [num_rows, feature_size]
        """Per ingested sequence: its waiting pieces, then its share of ``features``."""
        pieces, offset = [], 0
        for waited, num_new in parts:
            pieces.extend(waited)
            pieces.append(features[offset:offset + num_new])
            offset += num_new
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def _prepare(self, inputs: list[ForwardInput]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """``prepare_batch`` with the attention kernel the target's plan picks for each sequence's
        query rows: decodes on the paged CPU kernel, not SDPA over gathered contexts."""
        ids, pos, meta, cu = prepare_batch(inputs, self.target.block_size, None, self.target.device)
        return ids, pos, self.target.model.attention_metadata(meta), cu

    def _tree(self, tree, seqs: list, limits: list[int],
              hidden: torch.Tensor,  # [num_seqs, hidden] each sequence's ingested output at num_tokens - 2
              drafts: list[list[int]]) -> None:
        """``tree_drafting.draft_tree`` from each sequence's last ingested position, ``num_tokens - 2``."""
        top_k = tree.max_children

        def run_level(step: int, inputs: list[ForwardInput], parent_outputs: list) -> tuple[torch.Tensor, list]:
            with self.chain_timer.timing():
                ids, pos, meta, _ = self._prepare(inputs)
                out = self.model.step(step, ids, pos, torch.stack(parent_outputs), self.kv_cache, meta)
                return out, self.model.draft_topk(step, out, top_k).tolist()

        root_top = self.model.draft_topk(0, hidden, top_k).tolist()
        tokens = draft_tree(tree, seqs, limits, [seq.num_tokens - 2 for seq in seqs], root_top, list(hidden),
                            run_level)
        for draft, nodes in zip(drafts, tokens):
            draft.extend(nodes)

    def _chain(self, seqs, rows: list[int], limits: list[int], hidden: torch.Tensor,
               drafts: list[list[int]]) -> None:
        """Steps 1..k-1 of the chain, batched over ``rows`` (indices into ``seqs``).

        Step ``s`` runs cache layer ``model.cache_index(s)`` at position ``num_tokens - 2 + s``. A layer
        that skipped positions this round (MTP with several layers) first fills them from the chain's
        own values, so its K/V never has holes: position ``p`` reads draft ``p - num_tokens + 2`` and
        the chain output at ``p - 1``."""
        outputs = [[h] for h in hidden]  # per row: chain outputs at positions num_tokens - 2, - 1, ...
        for row, token in zip(rows, self.model.draft_ids(0, hidden).tolist()):
            drafts[row].append(token)
        padded = not self.config.disable_padded_drafter_batch
        written: dict[int, list[int]] = {}  # cache layer -> per row, last position written this round
        step = 1
        while True:
            live = [j for j, i in enumerate(rows) if len(drafts[i]) < limits[i]]
            if not live:
                return
            keep = list(range(len(rows))) if padded else live
            last = written.setdefault(self.model.cache_index(step), [seqs[i].num_tokens - 2 for i in rows])
            inputs, inputs_hidden = [], []
            for j in keep:
                seq, chain, base = seqs[rows[j]], drafts[rows[j]], seqs[rows[j]].num_tokens - 2
                if len(chain) >= limits[rows[j]]:  # finished (padded): a slot the next ingestion rewrites
                    inputs.append(ForwardInput([chain[-1]], base + 1, seq.block_ids))
                    inputs_hidden.append(outputs[j][-1])
                    continue
                span = range(last[j] + 1, base + step + 1)
                inputs.append(ForwardInput([chain[p - base - 1] for p in span], span.start, seq.block_ids))
                inputs_hidden.extend(outputs[j][p - 1 - base] for p in span)
                last[j] = base + step
            with self.chain_timer.timing():
                ids, pos, meta, cu = self._prepare(inputs)
                out = self.model.step(step, ids, pos, torch.stack(inputs_hidden), self.kv_cache, meta)
                ends = out[torch.tensor(cu[1:], device=out.device) - 1]  # [len(keep), hidden]
                tokens = self.model.draft_ids(step, ends).tolist()
            for n, j in enumerate(keep):
                if len(drafts[rows[j]]) < limits[rows[j]]:
                    drafts[rows[j]].append(tokens[n])
                    outputs[j].append(ends[n])
            step += 1
