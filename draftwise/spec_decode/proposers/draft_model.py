"""``draft_model``: a smaller model with the target's vocabulary drafts ``k`` tokens.

The drafter is any model draftwise can load (``speculative_config["model"]``:
a local HF directory, a .gguf file or a bundled name). Its KV cache lives in
the same paged pool as the target's: a parallel tensor addressed by the
sequences' own block tables, so it grows, rolls back and is freed with them.

Each step, per sequence: run the tokens the drafter has not seen yet
(``all_token_ids[drafter_num_computed_tokens:]``: the prompt on first sight,
then the accepted drafts and the new target token), then ``k - 1`` single-
token steps feeding its own drafts. All sequences run batched, one ragged
forward per draft position. After verification the engine clips
``drafter_num_computed_tokens`` to the accepted positions.

``draft_sample_method``: ``greedy`` (default, as vLLM: drafts are the
drafter's argmax, verified as one-hot) or ``probabilistic`` (sampled
requests draw drafts from the drafter's own temperature/top-k/top-p
distribution and keep it as ``q`` for standard speculative sampling).

With ``speculative_token_tree`` the drafter drafts the tree level by level
(``tree_drafting.py``, its root the sequence's last token): a node's children are
its top-k there. Drafts are then its argmax and top-k (one-hot, ``greedy`` only),
and its K/V counts as computed through the root only: the accepted path is fed
again next step, so no tree slot's K/V is ever read as a position's.

``draft_tensor_parallel_size`` 1 (default): the draft model runs whole on the
driver's rank; equal to the target's ``tensor_parallel_size``: every rank holds a
shard of it, as of the target, and each draft forward runs on all of them.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from itertools import accumulate

import torch

from ...distributed.sharded_model import ShardedPagedModel
from ...models.loader import resolve_model
from ...models.registry import build_model, load_config
from ...paged import ForwardInput, KVCacheSpec, PagedModel
from ...sample import build_sampling_metadata
from ...sample.logits import target_probs, uniform_noise
from ...validate import PREFIX, check_choice
from ..forward_timer import ForwardTimer, RowsTimer
from ..interface import DraftBatch, ProposeBatch, Proposer, ProposerNeeds, register
from ..tree_drafting import draft_tree

DRAFT_STREAM = 3  # noise stream of probabilistic drafts, independent of the target's
WARM_UP_TOKENS = 64


@register
class DraftModelProposer(Proposer):
    method = "draft_model"
    needs = ProposerNeeds(kv_cache=True)
    shards_drafter = True
    drafts_trees = True

    @dataclass
    class Options:
        draft_sample_method: str = "greedy"

        def __post_init__(self) -> None:
            check_choice("draft_sample_method", self.draft_sample_method, ("greedy", "probabilistic"))

    @classmethod
    def check_config(cls, config) -> None:
        if not config.model:
            raise ValueError(f"{PREFIX}: method 'draft_model' needs 'model' (the draft model's path or name)")
        if config.token_tree is not None and config.options.draft_sample_method != "greedy":
            raise ValueError(f"{PREFIX}['draft_sample_method']={config.options.draft_sample_method!r} is invalid "
                             "with 'speculative_token_tree': tree drafts are the drafter's top-k ('greedy')")

    def __init__(self, config, target):
        super().__init__(config, target)
        path = resolve_model(config.model)
        hf_config = load_config(path)
        if hf_config.vocab_size != target.vocab_size:
            raise ValueError(f"{PREFIX}['model']={config.model!r}: the draft model's vocabulary "
                             f"({hf_config.vocab_size} tokens) differs from the target's ({target.vocab_size}); "
                             "draft_model needs the same tokenizer")
        limit = getattr(hf_config, "max_position_embeddings", None) or target.max_model_len
        if limit < target.max_model_len:
            raise ValueError(f"{PREFIX}['model']={config.model!r}: the draft model handles {limit} positions, "
                             f"fewer than max_model_len={target.max_model_len}; lower max_model_len")
        # draft_tensor_parallel_size equal to the target's (> 1): every rank holds a shard of the draft model too
        self.executor = target.executor if config.draft_tensor_parallel_size > 1 else None
        if self.executor is not None:
            self.executor.send(("build", "draft", str(path)))
        self.model = build_model(path, hf_config, target.dtype, target.device, target.max_model_len,
                                 tp=self.executor and self.executor.group, gguf_weights=target.gguf_weights)
        self.paged: PagedModel | None = None
        self.first_timer = RowsTimer()  # a step's first forward, by rows: the positions each sequence skipped
        self.timer = ForwardTimer()  # each further forward (one draft for each drafting sequence)
        self.num_seqs = 1  # sequences of the last batch: the rows a steady step's first forward runs

    def drafting_seconds(self, depth: int) -> float:
        """A steady step: the first forward feeds each sequence's new target token (and its accepted
        drafts), each further one a draft."""
        if depth == 0:
            return 0.0
        return self.first_timer.seconds(self.num_seqs) + (depth - 1) * self.timer.seconds

    def catch_up_seconds(self, seqs) -> list[float]:
        """The first forward's rows past a steady step's (the prompt on first sight, the positions of
        the steps it was withheld), priced by the timed first forwards."""
        steady = self.config.num_speculative_tokens + 1
        base = self.first_timer.seconds(steady)
        return [max(0.0, self.first_timer.seconds(lag) - base) if lag > steady else 0.0
                for lag in (seq.num_tokens - seq.spec.drafter_num_computed_tokens for seq in seqs)]

    def kv_cache_spec(self) -> KVCacheSpec:
        return PagedModel.kv_cache_spec(self.model)

    def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        if self.executor is None:
            self.paged = PagedModel(self.model, kv_cache, self.target.block_size, self.target.device)
        else:
            self.paged = ShardedPagedModel(self.model, kv_cache, self.target.block_size, self.target.device, None,
                                           self.executor, name="draft")

    @torch.inference_mode()
    def warm_up(self, block_manager) -> None:
        """A forward of a short throw-away prompt (the drafter's first one costs ~50 of its later ones),
        then timed ones: a step's first forward at that size and at a steady step's, and a draft's
        (so a catch-up is priced before any request paid one)."""
        num_tokens = min(WARM_UP_TOKENS, self.target.max_model_len)
        with block_manager.scratch("drafter-warm-up", num_tokens, num_tokens) as seq:
            if seq is None:
                return
            steady = min(num_tokens, self.config.num_speculative_tokens + 1)
            for rows, timing in ((num_tokens, None), (num_tokens, self.first_timer.timing(num_tokens)),
                                 (steady, self.first_timer.timing(steady)), (1, self.timer.timing())):
                with timing or contextlib.nullcontext():
                    self.paged.forward_with_logits([ForwardInput(seq.all_token_ids[:rows], 0, seq.block_ids)], (),
                                                   torch.tensor([rows - 1]))

    @torch.inference_mode()
    def propose(self, batch: ProposeBatch) -> DraftBatch:
        if self.config.token_tree is not None:
            return self._propose_tree(batch)
        drafts: list[list[int]] = [[] for _ in batch.seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in batch.seqs]
        rows = [i for i, limit in enumerate(batch.max_num_drafts) if limit > 0]
        starts = {i: batch.seqs[i].spec.drafter_num_computed_tokens for i in rows}
        inputs = [ForwardInput(batch.seqs[i].all_token_ids[starts[i]:], starts[i], batch.seqs[i].block_ids)
                  for i in rows]
        step = 0
        self.num_seqs = max(1, len(batch.seqs))
        while rows:
            with self._timing(inputs, step == 0):
                last = torch.tensor(list(accumulate(len(item.token_ids) for item in inputs))) - 1
                _, _, _, logits = self.paged.forward_with_logits(inputs, (), last)  # [num_rows, vocab]
                tokens, q = self._draw(logits, [batch.seqs[i] for i in rows], step)
            next_rows, inputs = [], []
            for row, (i, token) in enumerate(zip(rows, tokens.tolist())):
                seq = batch.seqs[i]
                drafts[i].append(token)
                if q is not None:
                    probs[i].append(q[row])
                seq.spec.drafter_advanced(seq.num_tokens + step)  # K/V of the positions fed so far
                if len(drafts[i]) < batch.max_num_drafts[i]:
                    next_rows.append(i)
                    inputs.append(ForwardInput([token], seq.num_tokens + step, seq.block_ids))
            rows, step = next_rows, step + 1
        return DraftBatch.from_lists(drafts, _stack(probs, drafts))

    def _timing(self, inputs: list[ForwardInput], first: bool):
        """Times a forward: a step's first by its rows, a further one as one draft."""
        return self.first_timer.timing(sum(len(item.token_ids) for item in inputs)) if first else self.timer.timing()

    def _propose_tree(self, batch: ProposeBatch) -> DraftBatch:
        """Feed each drafting sequence's unseen tokens through its last one (the root), then draft
        the tree level by level from there."""
        tree, drafts = self.config.token_tree, [[] for _ in batch.seqs]
        rows = [i for i, limit in enumerate(batch.max_num_drafts) if limit > 0]
        if not rows:
            return DraftBatch.from_lists(drafts, parents=list(tree.parents))
        seqs = [batch.seqs[i] for i in rows]
        top_k = tree.max_children

        self.num_seqs = max(1, len(batch.seqs))

        def forward(inputs: list[ForwardInput], logit_rows: torch.Tensor,
                    first: bool = False) -> tuple[torch.Tensor, list]:
            with self._timing(inputs, first):
                _, _, _, logits = self.paged.forward_with_logits(inputs, (), logit_rows)  # [num_rows, vocab]
                return logits, logits.topk(top_k, dim=-1).indices.tolist()

        inputs = [ForwardInput(seq.all_token_ids[seq.spec.drafter_num_computed_tokens:],
                               seq.spec.drafter_num_computed_tokens, seq.block_ids) for seq in seqs]
        _, root_top = forward(inputs, torch.tensor(list(accumulate(len(item.token_ids) for item in inputs))) - 1, True)
        for seq in seqs:
            seq.spec.drafter_advanced(seq.num_tokens)  # through the root; tree slots stay speculative
        tokens = draft_tree(tree, seqs, [batch.max_num_drafts[i] for i in rows], [seq.num_tokens - 1 for seq in seqs],
                            root_top, [None] * len(seqs),
                            lambda _, level, __: forward(level, torch.arange(sum(len(x.token_ids) for x in level))))
        for i, nodes in zip(rows, tokens):
            drafts[i] = nodes
        return DraftBatch.from_lists(drafts, parents=list(tree.parents))

    def _draw(self, logits: torch.Tensor,  # [num_rows, vocab]
              seqs, step: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Drafts of one position: argmax, or (probabilistic) a draw from q, returned with q."""
        token_ids = logits.argmax(dim=-1)
        if self.options.draft_sample_method == "greedy" or all(s.params.greedy for s in seqs):
            return token_ids, None
        meta = build_sampling_metadata(seqs, [[]] * len(seqs), self.target.vocab_size, [], self.target.device)
        meta.penalties = meta.suppress_rows = meta.suppress_ids = None
        q = target_probs(logits.float(), meta)
        noise = uniform_noise(meta.seeds, meta.positions + step, q.shape[-1], DRAFT_STREAM)
        sampled = (q / -torch.log(noise)).argmax(dim=-1)
        return torch.where(meta.greedy, token_ids, sampled), q


def _stack(probs: list[list[torch.Tensor]], drafts: list[list[int]]) -> torch.Tensor | None:
    """[num_seqs, max_num_drafts, vocab] zero-padded, or None when no draft carries probs."""
    if not any(probs):
        return None
    vocab = next(p for p in probs if p)[0].shape[-1]
    width = max(len(d) for d in drafts)
    out = torch.zeros(len(probs), width, vocab, device=next(p for p in probs if p)[0].device)
    for i, rows in enumerate(probs):
        if rows:
            out[i, :len(rows)] = torch.stack(rows)
    return out
